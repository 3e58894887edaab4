"""Deterministic simulation at scale (SPEC §15): many seeds, then planning past one machine.

Run as ``.venv/bin/python bench/simulation.py [--seeds 2000] [--first-seed 0]
[--seconds 180] [--workers N] [--plan 30,100,1000] [--plan-slices 80]
[--plan-budget 240] [--skip-seeds] [--skip-plan] [--faults]`` (about 10
minutes with the defaults).

1. **Seeds.**  ``overlay.testing.sim``'s ``SimCluster`` runs seeds 0, 1, 2, …
   (from ``--first-seed``: a sweep past the seeds already run; the
   same scenarios as ``tests/test_simulation.py``, which runs the first few
   hundred) on ``--workers`` processes until ``--seeds`` are done or
   ``--seconds`` have passed.  Printed: seeds/s, what the runs exercised
   (migrations, aborts, replications, splits, merges, faults), and every
   failing seed with its first violations — replay one with
   ``SimCluster(random_config(seed), seed, keep_trace=True).run()``.
   Exit status 1 when a seed failed.
   With ``--faults`` the seeds are node-fault runs (``SimCluster.for_fault_seed``:
   crashes and restarts, partitions, pauses; SPEC §16's promise checked, as
   ``tests/test_simulation_faults.py`` does for the first few hundred), the
   planning runs are skipped, and it also prints how many seeds passed, the
   wall time per seed, and how often each kind of violation was found —
   replay one with ``SimCluster.for_fault_seed(seed, keep_trace=True).run()``.
2. **Planning** (SPEC §15, last bullet).  For each ``--plan`` size, ``n`` real
   ``NodeCore``s on a simulated network (2 ms per hop, in time order), all
   channels starting on the initializer as at start-up, every node an access
   node publishing ``--events-per-node`` events per slice (prices on a
   golden-ratio sequence, so slice loads carry no sampling noise) against
   ``--subs-per-node`` narrow subscriptions per node.  Slices are 1 s of
   simulated time, p = 0.5, δ = 0.1.  Per slice it records S/dc̄ from every
   node's slice report, the control messages of each type and the migrations
   (sessions, subscriptions moved, Σ mig_cost, bytes).  Printed: a per-size
   table — slices until S/dc̄ ≤ 0.10 (first reached; and whether it stayed),
   LIEMs per slice against n(n−1), UpdateRoutingTable per table change
   against n−1, migrations and their cost, and the wall time per simulated
   slice.  A size that exceeds ``--plan-budget`` seconds stops where it is
   and says so; the growth of the wall time per slice from the sizes that ran
   tells what the next size would cost.

LIEMs are handed to their receivers right after the slice's ticks (they
matter only at the next slice end), everything else travels through the
time-ordered queue; the planning runs skip the codec (the seed runs use it).

What one run on a shared 2-core machine measured (python 3.11): 2,000 seeds
in 314 s (6.4 seeds/s); n=30 and n=100 reach S/dc̄ ≤ 0.10 at slices 18 and
48 and stay there (slices to converge ∝ n^0.8, ~300 extrapolated for
n=1,000); LIEMs ≈ 1.08·n(n−1) per slice (a second LIEM when the decision
changes the provisional state), UpdateRoutingTable exactly n−1 per table
change; 1,000 real cores cost ~25 s of wall time per simulated slice (∝
n^1.5 from 30 to 1,000: the n² LIEMs dominate), so only the first 12 slices
of n=1,000 fit a 5-minute budget — enough for traffic and cost per slice,
not for convergence.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import logging
import math
import os
import random
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Final

from overlay.actions import ToPeer
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node import NodeCore
from overlay.testing.sim.cluster import SimCluster
from overlay.testing.sim.setup import make_config, random_config

SPREAD_TARGET: Final = 0.10
GOLDEN: Final = 0.6180339887498949
HOP: Final = 0.002  # simulated seconds per peer message
SUBSTEPS: Final = 10  # publishing rounds per slice


# == 1. seeds ===================================================================================


def _one_seed(seed: int, faults: bool = False) -> tuple[int, bool, list[str], dict[str, int], int, int, float]:
    t0 = time.perf_counter()
    r = SimCluster.for_fault_seed(seed).run() if faults else SimCluster(random_config(seed), seed).run()
    totals = Counter(r.stats)
    totals.update(r.faults)
    totals.update({f"admin {k}": v for k, v in r.admin.items()})
    totals.update(dict.fromkeys((f"violation: {_kind(f)}" for f in r.failures), 1))  # seeds, not lines
    return seed, r.ok, r.failures[:5], dict(totals), r.deliveries, r.steps, time.perf_counter() - t0


# What kind of violation a failure line reports (``sim.invariants``' rules),
# by the words each check writes; checked in this order.
_KINDS: Final = (
    ("crash at step", "a core raised"),
    (": Notifies of ", "rule 8: a Notifies action that is not one Notify per session"),
    ("to closed session", "a node answered a session after it heard it closed"),
    (" rejected ", "a node rejected a peer's message (protocol error)"),
    ("refused: undeliverable", "an event given up unconfirmed (undeliverable after event_ttl)"),
    (" lost for ", "rule 6: a PubAck'd event not delivered to a promised subscription"),
    ("never matched", "rule 6: a PubAck'd event never matched"),
    ("out of rank order", "rule 6: a key's events out of rank order"),
    (" times of event ", "rules 1/6: an event notified twice to one subscription"),
    ("non-matching", "rules 1/6: a notification the filter does not match"),
    ("unknown event", "rules 1/6: a notification of an unknown event"),
    ("matched 0 times", "rule 1: an event never matched"),
    ("delivered 0 times", "rule 1: an event not delivered"),
    ("never answered", "rule 2: a request never answered"),
    ("still waits to be sent", "rule 2: a request still waiting for a retry"),
    ("still reconnecting", "rule 2: a client still reconnecting"),
    ("still stored", "rule 3: a subscription given up but still stored"),
    ("should be in", "rule 3: a subscription stored in the wrong places"),
    ("unknown subscription", "rule 3: an unknown subscription stored"),
    ("routing table of node", "rule 4: routing tables differ"),
    ("table says", "rule 4: a channel not on exactly its owners"),
    ("lies in", "rule 4: the channels do not partition the space"),
    ("not quiet", "rule 5: not quiet at the end of the drain"),
    ("waits for answers", "rule 5: a client still waits for answers"),
    ("messages queued", "rule 5: messages still queued"),
    ("(un)subscriptions waiting", "rule 5: (un)subscriptions waiting at a node"),
    ("table updates", "rule 5: table updates waiting"),
    ("sessions", "rule 5: a migration session still open"),
    ("BUSY", "rule 5: a node still BUSY"),
    ("reforwards", "rule 5: a Reforward still armed"),
    ("unroutable", "rule 5: something dropped as unroutable"),
    ("never became ready", "rule 5: a node never became ready"),
    ("fault is under way", "rule 5: a fault still under way"),
    ("recovering from the last fault", "rule 5: still recovering"),
    ("declared dead", "a node declared dead in a run without node faults"),
    ("closed client session", "a node closed a session without a fault of its own"),
    ("refused", "a request refused"),
)


def _kind(failure: str) -> str:
    for words, kind in _KINDS:
        if words in failure:
            return kind
    return "other: " + (failure.splitlines()[0][:70] if failure else "?")


def run_seeds(count: int, seconds: float, workers: int, *, faults: bool = False, first: int = 0) -> int:
    what = "node-fault seeds" if faults else "seeds"
    print(f"== {what}: up to {count} seeds from {first} or {seconds:.0f} s on {workers} process(es)")
    start = time.perf_counter()
    totals: Counter[str] = Counter()
    failed: list[tuple[int, list[str]]] = []
    done = deliveries = steps = 0
    seed_seconds = 0.0
    seeds = iter(range(first, first + count))
    with ProcessPoolExecutor(workers) as pool:
        running: set[Future[Any]] = set()

        def feed() -> None:
            while len(running) < workers * 4 and time.perf_counter() - start < seconds:
                seed = next(seeds, None)
                if seed is None:
                    return
                running.add(pool.submit(_one_seed, seed, faults))

        feed()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                running.discard(fut)
                seed, ok, failures, t, d, s, w = fut.result()
                done += 1
                seed_seconds += w
                deliveries += d
                steps += s
                totals.update(t)
                if not ok:
                    failed.append((seed, failures))
                    print(f"  FAIL seed {seed}: {failures[0][:300] if failures else '?'}", flush=True)
            feed()
    elapsed = time.perf_counter() - start
    print(
        f"{done} seeds in {elapsed:.1f} s: {done / elapsed:.1f} seeds/s, "
        f"{deliveries / elapsed:,.0f} deliveries/s, {steps:,} scheduler steps"
    )
    violations = {k: v for k, v in totals.items() if k.startswith("violation: ")}
    print("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items()) if k not in violations))
    if faults and done:
        print(
            f"{done - len(failed)} of {done} seeds passed; {seed_seconds / done * 1000:.0f} ms per seed "
            f"({elapsed / done * 1000:.0f} ms of wall time per seed on {workers} process(es))"
        )
        print("seeds finding each kind of violation:")
        for k, v in sorted(violations.items(), key=lambda kv: -kv[1])[:20]:
            print(f"  {v:>7} × {k[len('violation: ') :]}")
    if failed:
        print(f"{len(failed)} failing seed(s): {sorted(s for s, _ in failed)}")
        for seed, failures in sorted(failed)[:10]:
            print(f"  seed {seed}:")
            for f in failures:
                print(f"    {f[:400]}")
    else:
        print("no failure")
    return 1 if failed else 0


# == 2. planning ================================================================================


@dataclass
class SliceRow:
    slice_no: int
    ratio: float  # S / dc̄
    messages: Counter[str]
    migrations: int
    splits: int
    merges: int
    subscriptions_moved: int
    mig_cost: float
    bytes_moved: int
    wall: float
    aborted: int = 0


@dataclass
class PlanResult:
    n: int
    rows: list[SliceRow] = field(default_factory=list)
    setup_wall: float = 0.0
    stopped: str = ""

    def converged(self) -> tuple[int | None, bool]:
        first = next((r.slice_no for r in self.rows if r.ratio <= SPREAD_TARGET), None)
        if first is None:
            return None, False
        stayed = all(r.ratio <= SPREAD_TARGET * 1.5 for r in self.rows if r.slice_no >= first)
        return first, stayed


class PlanCluster:
    """``n`` real cores on a time-ordered network: constant latency per hop keeps
    every link FIFO."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.config = make_config(n, probability=0.5, slice_seconds=1.0, peer_timeout=3.0)
        self.cores = [NodeCore(self.config, i) for i in range(n)]
        for c in self.cores:
            c.rng.seed(f"plan:{seed}:{c.id}")
        self.rng = random.Random(seed)
        self.heap: list[tuple[float, int, int, int, pm.PeerMessage]] = []
        self.seq = itertools.count()
        self.liems: list[tuple[int, int, pm.PeerMessage]] = []
        self.counts: Counter[str] = Counter()
        self.sessions = [c.client_opened() for c in self.cores]
        self.pub_seq = 0
        self.k = 0
        for c, sid in zip(self.cores, self.sessions):
            c.handle_client(sid, cm.Hello(f"p{c.id}"), 0.0)

    def emit(self, src: int, acts: list[Any], now: float) -> None:
        for a in acts:
            if type(a) is ToPeer:
                kind = type(a.msg)
                self.counts[kind.__name__] += 1
                if kind is pm.LIEM:
                    self.liems.append((src, a.node, a.msg))
                else:
                    heapq.heappush(self.heap, (now + HOP, next(self.seq), src, a.node, a.msg))

    def run_until(self, t: float) -> None:
        heap = self.heap
        cores = self.cores
        while heap and heap[0][0] <= t:
            when, _, src, dst, msg = heapq.heappop(heap)
            self.emit(dst, cores[dst].handle_peer(src, msg, when), when)

    def drain(self, now: float) -> float:
        while self.heap:
            now = max(now, self.heap[0][0])
            self.run_until(now)
        return now

    def start(self, subs_per_node: int) -> float:
        self.emit(0, self.cores[0].start(0.0), 0.0)
        now = self.drain(0.0)
        for c, sid in zip(self.cores, self.sessions):
            for j in range(subs_per_node):
                lo = self.rng.uniform(0, 990)
                w = self.rng.uniform(0.2, 2.0)
                expr = f"price >= {lo:.1f} and price < {lo + w:.1f}"
                self.emit(c.id, c.handle_client(sid, cm.Subscribe(j + 1, f"s{j}", expr), now), now)
        now = self.drain(now)
        for c in self.cores:  # the first tick starts every node's slice clock
            self.emit(c.id, c.tick(now), now)
        return now

    def publish_round(self, count: int, now: float) -> None:
        cores, sessions = self.cores, self.sessions
        for _ in range(count):
            self.k += 1
            i = self.k % self.n
            price = round(((self.k * GOLDEN) % 1.0) * 1000.0, 1)
            self.pub_seq += 1
            msg = cm.Publish(self.pub_seq, {"price": price, "sym": "A", "qty": 1})
            self.emit(i, cores[i].handle_client(sessions[i], msg, now), now)

    def tick_all(self, now: float) -> None:
        for c in self.cores:
            self.emit(c.id, c.tick(now), now)

    def end_slice(self, now: float) -> None:
        for c in self.cores:
            self.emit(c.id, c.tick(now), now)
        liems, self.liems = self.liems, []
        cores = self.cores
        for src, dst, msg in liems:
            self.emit(dst, cores[dst].handle_peer(src, msg, now), now)


def plan(n: int, slices: int, events_per_node: int, subs_per_node: int, budget: float, seed: int) -> PlanResult:
    logging.getLogger("overlay").setLevel(logging.CRITICAL)  # aborted sessions are expected, not news
    t0 = time.perf_counter()
    pc = PlanCluster(n, seed)
    now = pc.start(subs_per_node)
    res = PlanResult(n, setup_wall=time.perf_counter() - t0)
    base = pc.cores[0].config.cluster.slice_seconds
    prev: Counter[str] = Counter()
    for s in range(1, slices + 1):
        w0 = time.perf_counter()
        pc.counts = Counter()
        per_round = max(1, events_per_node * n // SUBSTEPS)
        for j in range(SUBSTEPS):
            t = now + base * j / SUBSTEPS
            pc.publish_round(per_round, t)
            pc.run_until(t)
            if j:
                pc.tick_all(t)  # timeouts, and the balancing decision once the slice's LIEMs are in
        now += base
        pc.run_until(now)
        pc.end_slice(now)
        pc.run_until(now + base / (2 * SUBSTEPS))
        tot: Counter[str] = Counter()
        for c in pc.cores:
            for k in (
                "migrations",
                "replications",
                "splits",
                "merges",
                "subscriptions_moved",
                "migration_bytes",
                "migrations_aborted",
            ):
                tot[k] += c.stats.get(k, 0)
        reports = [c.last_report for c in pc.cores]
        dcs = [r.dc for r in reports if r is not None]
        mean = sum(dcs) / len(dcs) if dcs else 0.0
        spread = math.sqrt(sum((d - mean) ** 2 for d in dcs) / len(dcs)) if dcs else 0.0
        moved = tot["subscriptions_moved"] - prev["subscriptions_moved"]
        res.rows.append(
            SliceRow(
                s,
                spread / mean if mean else float("inf"),
                pc.counts,
                tot["migrations"] + tot["replications"] - prev["migrations"] - prev["replications"],
                tot["splits"] - prev["splits"],
                tot["merges"] - prev["merges"],
                moved,
                moved / pc.config.bandwidth.default,  # SPEC §5: mig_chsize / bw (uniform bw here)
                tot["migration_bytes"] - prev["migration_bytes"],
                time.perf_counter() - w0,
                tot["migrations_aborted"] - prev["migrations_aborted"],
            )
        )
        prev = tot
        if time.perf_counter() - t0 > budget:
            res.stopped = f"stopped after {s} slices: over the {budget:.0f} s budget"
            break
    return res


def print_plan(results: list[PlanResult]) -> None:
    print()
    print("== planning: balancing convergence, control traffic, migration cost (SPEC §15)")
    hdr = (
        f"{'n':>5} {'slices run':>10} {'S/dc̄≤0.10 at':>14} {'stayed':>6} {'final S/dc̄':>10} "
        f"{'LIEM/slice':>11} {'n(n-1)':>9} {'moves':>6} {'URT':>8} {'URT/move':>8} {'n-1':>5} "
        f"{'migr':>5} {'subs moved':>10} {'Σmig_cost':>9} {'KiB moved':>9} {'wall/slice s':>12} {'setup s':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        rows = r.rows
        if not rows:
            print(f"{r.n:>5} (no slice ran) {r.stopped}")
            continue
        first, stayed = r.converged()
        full = [x for x in rows if x.messages.get("LIEM")]
        liem = sum(x.messages.get("LIEM", 0) for x in full) / max(len(full), 1)
        urt = sum(x.messages.get("UpdateRoutingTable", 0) for x in rows)
        moves = sum(x.migrations + x.splits + x.merges for x in rows)
        migr = sum(x.migrations for x in rows)
        subs = sum(x.subscriptions_moved for x in rows)
        cost = sum(x.mig_cost for x in rows)
        kib = sum(x.bytes_moved for x in rows) / 1024
        wall = sum(x.wall for x in rows) / len(rows)
        print(
            f"{r.n:>5} {len(rows):>10} {str(first) if first is not None else 'not reached':>14} "
            f"{('yes' if stayed else 'no') if first is not None else '-':>6} {rows[-1].ratio:>10.3f} "
            f"{liem:>11,.0f} {r.n * (r.n - 1):>9,} {moves:>6} {urt:>8,} {urt / moves if moves else 0:>8.1f} "
            f"{r.n - 1:>5} {migr:>5} {subs:>10,} {cost:>9.2f} {kib:>9.1f} {wall:>12.2f} {r.setup_wall:>8.1f}"
        )
        if r.stopped:
            print(f"      {r.stopped}")
    print()
    for r in results:
        if r.rows:
            trail = " ".join(f"{x.ratio:.2f}" for x in r.rows)
            print(f"S/dc̄ per slice, n={r.n}: {trail}")
    conv = [(r.n, r.converged()[0]) for r in results if r.converged()[0]]
    if len(conv) >= 2:
        (na, ca), (nb, cb) = conv[0], conv[-1]
        k = math.log(cb / ca) / math.log(nb / na) if ca and cb and na != nb else float("nan")
        print(f"\nslices to S/dc̄ ≤ {SPREAD_TARGET} grow as n^{k:.2f} between n={na} ({ca}) and n={nb} ({cb})")
        for r in results:
            if not r.converged()[0]:
                print(f"  extrapolated for n={r.n}: ~{cb * (r.n / nb) ** k:.0f} slices")
    ran = [r for r in results if len(r.rows) >= 3]
    if len(ran) >= 2:
        a, b = ran[0], ran[-1]
        wa = sum(x.wall for x in a.rows[2:]) / max(len(a.rows) - 2, 1)
        wb = sum(x.wall for x in b.rows[2:]) / max(len(b.rows) - 2, 1)
        if wa > 0 and wb > 0 and b.n != a.n:
            k = math.log(wb / wa) / math.log(b.n / a.n)
            print(
                f"\nwall time per simulated slice grows as n^{k:.2f} between n={a.n} and n={b.n} "
                f"({wa:.2f} s -> {wb:.2f} s); LIEMs alone are n(n-1) per slice"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2000)
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds run are first-seed, first-seed + 1, ...")
    ap.add_argument("--seconds", type=float, default=180.0, help="time bound of the seed runs")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--plan", default="30,100,1000", help="cluster sizes to plan for")
    ap.add_argument("--plan-slices", type=int, default=80)
    ap.add_argument("--plan-budget", type=float, default=240.0, help="seconds per size")
    ap.add_argument("--events-per-node", type=int, default=40)
    ap.add_argument("--subs-per-node", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-seeds", action="store_true")
    ap.add_argument("--skip-plan", action="store_true")
    ap.add_argument("--faults", action="store_true", help="node-fault seeds (crash, restart, partition, pause) only")
    args = ap.parse_args()
    status = 0
    if not args.skip_seeds:
        status = run_seeds(args.seeds, args.seconds, args.workers, faults=args.faults, first=args.first_seed)
    if not args.skip_plan and not args.faults:
        results = []
        for n in (int(x) for x in args.plan.split(",") if x):
            print(f"planning n={n} …", flush=True)
            results.append(
                plan(n, args.plan_slices, args.events_per_node, args.subs_per_node, args.plan_budget, args.seed)
            )
        print_plan(results)
    return status


if __name__ == "__main__":
    sys.exit(main())
