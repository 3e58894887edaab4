"""Failover: ``kill -9`` of the busiest owner of a balanced 5-node cluster under load.

Run as ``flock /tmp/bench.lock .venv/bin/python bench/failover.py [--rate R]
[--warmup S] [--before S] [--after S] [--slice T] [--logs DIR]`` (the lock:
never two benchmarks at once on the machine).

What it does:

1. **Cluster.**  Five ``overlay node`` processes (``overlay.testing.NodeProcesses``)
   with the capacities of ``cluster_configs/hetero5.toml`` (1, 2, 1, 4, 2),
   free loopback ports, balancing on, slices of ``--slice`` s, and the
   failure settings' defaults (heartbeats every 0.25 s, suspected after 1.5 s
   of silence, dead when a majority suspects it).
2. **Workload.**  400 price ranges carrying a ``venue`` pattern no event
   matches, spread over plain clients on every node — the matcher tests
   them (the load, SPEC §5) but nothing is notified; 20 bands tiling the
   price range, held by an ``AgentClient`` on two access nodes each, so every
   event is delivered, timed and audited exactly once.  An ``AgentClient``
   publishes ``--rate`` events/s over every node from 16 tasks, each waiting
   for its PubAck; 70 % of the prices in [0, 200] (``skewed_price``).
3. **Timeline.**  Warm-up until balancing converged (S/dc̄ ≤ 0.10 for three
   slices in a row, at most ``--warmup`` s); ``--before`` s of steady state;
   then the node owning the channel with the highest load in the last slice
   is killed with SIGKILL; ``--after`` s more of publishing; then until every
   acknowledged pair is delivered or nothing arrives for 3 s.
4. **Measures.**  *Detection*: from the kill to the first survivor's log line
   saying the node is dead.  *Recovery*: from that to the first moment an
   event of the dead node's channels published after the kill had been both
   acknowledged and delivered.  *Re-sent*: publishes the publisher's agent
   sent again to another node, and any re-send the nodes count.  *Lost* and
   *duplicated*: the audit of acknowledged (event, subscription) pairs
   (``overlay.testing.Audit``; a subscription counts from its SubAck, an
   event from its PubAck).  *p99 publish→delivery* of the events published
   before the kill, between the kill and the recovery, and after it.
   *S/dc̄* per slice over the survivors (the dc each reports in its journal),
   for the slices after the recovery until publishing stops.

Targets: detection ≤ 3 s; recovery ≤ 2 s after detection; 0 lost; 0
duplicated; S/dc̄ ≤ 0.10 within 5 slices after the recovery.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from overlay.channels import parse_subscription
from overlay.client import AgentClient, Client, FailoverSubscription
from overlay.config import load_config
from overlay.testing import (
    Audit,
    NodeProcesses,
    bench_event,
    consume,
    free_ports,
    load_ranges,
    log_time,
    price_bands,
    publish_steadily,
    write_cluster_config,
)

NODES: Final = 5
CAPACITIES: Final = (1.0, 2.0, 1.0, 4.0, 2.0)  # hetero5's
COST_SUBS: Final = 400
BANDS: Final = 20
PUBLISH_TASKS: Final = 16
SUB_QUEUE: Final = 1_000_000
TARGET_DETECT: Final = 3.0
TARGET_RECOVER: Final = 2.0
TARGET_SPREAD: Final = 0.10
TARGET_SLICES: Final = 5
CONVERGED_SLICES: Final = 3  # slices in a row at or under the target: balanced before the kill
QUIET: Final = 3.0  # s without a delivery after publishing: nothing more is coming
SETTLE: Final = 30.0
TICK: Final = 0.1  # the nodes' tick: slices close on a common grid to within it
BENCH_NICE: Final = -10
JOURNAL_PAGE: Final = 500


@dataclass
class Result:
    victim: int = -1
    busiest: str = ""
    moves: str = ""  # the coordinator's reassignment, channel->node
    converged_before: bool = False
    killed: float = 0.0
    stopped: float = 0.0  # publishing stopped: the slices after it are not at the steady rate
    detected: float | None = None
    reassigned: float | None = None
    recovered: float | None = None
    published: int = 0
    acked: int = 0
    expected: int = 0
    lost: int = 0
    duplicated: int = 0
    resent_client: int = 0
    resent_nodes: int = 0
    lat: dict[str, list[float]] = field(default_factory=lambda: {"before": [], "during": [], "after": []})
    spread: list[tuple[float, float]] = field(default_factory=list)  # (slice end, S/dc̄) after the kill
    notes: list[str] = field(default_factory=list)


def cost_subscriptions() -> list[str]:
    return load_ranges(COST_SUBS)


def bands() -> list[str]:
    return price_bands(BANDS)


def values(qty: int) -> dict[str, Any]:
    return bench_event(qty)


def ratio(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    if mean <= 0:
        return 0.0
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)) / mean


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def journal(admin: Client) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while page := await admin.admin("journal", since=len(out), limit=JOURNAL_PAGE):
        out += page
    return out


def spread_series(journals: dict[int, list[dict[str, Any]]], since: float) -> list[tuple[float, float]]:
    """(time, S/dc̄) per slice of the lowest node, over the nodes of ``journals``,
    each at its last slice by then (as ``bench/balancing.py`` does)."""
    per = {n: [e for e in j if e["kind"] == "slice"] for n, j in journals.items()}
    ref = min(per)
    out = []
    for e in per[ref]:
        if e["time"] <= since:
            continue
        near = [
            max((x for x in per[n] if x["time"] <= e["time"] + TICK), key=lambda x: x["time"], default=None)
            for n in per
        ]
        if any(x is None or e["time"] - x["time"] > x["slice_seconds"] + TICK for x in near):
            continue
        out.append((e["time"], ratio([x["dc"] for x in near if x is not None])))
    return out


def in_space(constraints: list[dict[str, Any]], event: dict[str, Any]) -> bool:
    """Does ``event`` lie in a channel space given as ``/routing`` constraints?"""
    for c in constraints:
        v = event.get(c["attr"])
        if c["kind"] == "range":
            lo_ok = v > c["lo"] if c["lo_open"] else v >= c["lo"]
            hi_ok = v < c["hi"] if c["hi_open"] else v <= c["hi"]
            inside = lo_ok and hi_ok
        else:
            inside = v in c["values"] if c["kind"] == "set" else v not in c["excluded"]
        if not inside:
            return False
    return True


async def routing(admin_port: int) -> list[dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{admin_port}/routing") as r:
        body: dict[str, Any] = await r.json()
        return list(body["channels"])


async def run(args: argparse.Namespace, workdir: Path) -> Result:
    res = Result()
    ports = free_ports(2 * NODES)
    addresses = [("127.0.0.1", p) for p in ports[:NODES]]
    settings = {"slice_seconds": args.slice, "balancing": True, "peer_timeout": 2.0}
    config = write_cluster_config(
        workdir / "failover.toml",
        addresses,
        name="failover",
        settings=settings,
        capacities=CAPACITIES,
        admin_ports=ports[NODES:],
    )
    schema = load_config(config).schema
    procs = NodeProcesses(config, addresses, workdir)
    clients: list[Client | AgentClient] = []
    tasks: list[asyncio.Task[None]] = []
    audit = Audit()
    stop = asyncio.Event()
    try:
        procs.start_all()
        await procs.all_ready()
        admins = [await Client([a], client_id=f"admin-{n}").connect() for n, a in enumerate(addresses)]
        clients += admins
        # The load: subscriptions tested, never notified, spread over the nodes.
        cost = [await Client([a], client_id=f"cost-{n}").connect() for n, a in enumerate(addresses)]
        clients += cost
        await asyncio.gather(*(cost[k % NODES].subscribe(e, queue_size=16) for k, e in enumerate(cost_subscriptions())))
        # The timed, audited subscriptions: every event matches one band.
        subs = AgentClient(addresses, client_id="bands")
        clients.append(subs)
        await subs.connect()
        band_subs: list[FailoverSubscription] = []
        for k, expr in enumerate(bands()):
            name = f"band{k}"
            audit.subscription(name, expr, parse_subscription(expr, schema))
            fs = await subs.subscribe(expr, sub_id=name, queue_size=SUB_QUEUE)
            audit.subacked(name)
            band_subs.append(fs)
            tasks.append(asyncio.create_task(consume(fs, audit, name)))
        pub = AgentClient(addresses, client_id="publisher")
        clients.append(pub)
        await pub.connect()
        total = int(args.rate * (args.warmup + args.before + args.after + 10))
        started = time.time()
        publishing = asyncio.create_task(
            publish_steadily(pub.publish, audit, values, range(total), rate=args.rate, tasks=PUBLISH_TASKS, stop=stop)
        )
        tasks.append(publishing)

        # Warm-up: until balancing converged, at most --warmup s.
        print(f"warm-up: up to {args.warmup:.0f}s at {args.rate:.0f} events/s …", flush=True)
        while time.time() - started < args.warmup:
            await asyncio.sleep(args.slice)
            journals = {n: await journal(a) for n, a in enumerate(admins)}
            series = spread_series(journals, started + args.slice)
            if len(series) >= CONVERGED_SLICES and all(r <= TARGET_SPREAD for _, r in series[-CONVERGED_SLICES:]):
                res.converged_before = True
                break
        print(f"steady: {args.before:.0f}s …", flush=True)
        await asyncio.sleep(args.before)

        # The victim: the owner of the channel with the highest load last slice.
        journals = {n: await journal(a) for n, a in enumerate(admins)}
        loads = []
        for n, j in journals.items():
            last = [e for e in j if e["kind"] == "slice"][-1]
            loads += [(load, ch, n) for ch, load in last["channels"].items()]
        _, res.busiest, res.victim = max(loads)
        survivors = [n for n in range(NODES) if n != res.victim]
        dead_channels = [
            c["constraints"] for c in await routing(ports[NODES + survivors[0]]) if res.victim in c["owners"]
        ]
        print(f"kill -9 node {res.victim} (owner of {res.busiest}, {len(dead_channels)} channels) …", flush=True)
        res.killed = procs.kill(res.victim)
        await admins[res.victim].close()
        await asyncio.sleep(args.after)
        stop.set()
        res.stopped = time.time()
        await publishing

        # Until every acknowledged pair is delivered, or nothing arrives for QUIET s.
        seen, since, deadline = -1, time.monotonic(), time.monotonic() + SETTLE
        while time.monotonic() < deadline and audit.missing():
            n = sum(audit.delivered.values())
            if n != seen:
                seen, since = n, time.monotonic()
            elif time.monotonic() - since > QUIET:
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(0.5)

        # Detection and reassignment, from the survivors' logs.
        dead = [log_time(x) for n in survivors for x in procs.lines(n, f"node {res.victim} is dead")]
        res.detected = min(dead) if dead else None
        moved = [x for n in survivors for x in procs.lines(n, f"channels of dead node {res.victim}")]
        res.reassigned = min(log_time(x) for x in moved) if moved else None
        res.moves = ", ".join(x.rpartition(": ")[2] for x in moved)
        # Recovery: the first event of the dead node's channels, published after
        # the kill, both acknowledged and delivered.
        back = [
            max(e.acked, audit.first_delivery[q])
            for q, e in audit.events.items()
            if e.started > res.killed
            and e.acked < math.inf
            and q in audit.first_delivery
            and any(in_space(c, e.values) for c in dead_channels)
        ]
        res.recovered = min(back) if back else None

        verdict = audit.verdict()
        res.published = len(audit.events)
        res.acked = sum(1 for e in audit.events.values() if e.acked < math.inf)
        res.expected, res.lost, res.duplicated = verdict.expected, len(verdict.lost), len(verdict.duplicated)
        if not verdict.ok:
            res.notes.append(str(verdict).splitlines()[0])
            res.notes += [line[:300] for line in str(verdict).splitlines()[1:4]]
        res.resent_client = pub.resent
        res.notes += [f"node {n} logged a traceback (see --logs)" for n in range(NODES) if "Traceback" in procs.log(n)]
        for n in survivors:
            stats = (await admins[n].admin("status"))["stats"]
            res.resent_nodes += sum(v for k, v in stats.items() if "resen" in k)
        end_of_outage = res.recovered or res.killed
        for t, lat in audit.latencies:
            phase = "before" if t < res.killed else "during" if t < end_of_outage else "after"
            res.lat[phase].append(lat)
        journals = {n: await journal(admins[n]) for n in survivors}
        res.spread = [(t, r) for t, r in spread_series(journals, end_of_outage) if t <= res.stopped]
        return res
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for c in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)
        procs.stop()


def report(res: Result, args: argparse.Namespace) -> bool:
    def s(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f} s"

    def ms(x: float | None) -> str:
        return "—" if x is None else f"{x * 1000:.1f} ms"

    detect = None if res.detected is None else res.detected - res.killed
    recover = None if res.recovered is None or res.detected is None else res.recovered - res.detected
    within = next(
        (k + 1 for k in range(len(res.spread)) if all(r <= TARGET_SPREAD for _, r in res.spread[k:])),
        None,
    )
    first5 = [r for _, r in res.spread[:TARGET_SLICES]]
    rows = [
        ("node killed", f"{res.victim} (owner of {res.busiest})", ""),
        ("balanced before the kill", "yes" if res.converged_before else "no (warm-up bound)", ""),
        ("detection (kill → first 'dead')", s(detect), f"≤ {TARGET_DETECT:g} s"),
        (
            "reassigned (kill → update)",
            s(None if res.reassigned is None else res.reassigned - res.killed) + f" ({res.moves})",
            "",
        ),
        ("recovery (detection → accepted and delivered)", s(recover), f"≤ {TARGET_RECOVER:g} s"),
        ("events published / acknowledged", f"{res.published} / {res.acked}", ""),
        ("acknowledged pairs", str(res.expected), ""),
        ("re-sent (publisher agent / nodes)", f"{res.resent_client} / {res.resent_nodes}", ""),
        ("lost", str(res.lost), "0"),
        ("duplicated", str(res.duplicated), "0"),
        ("p99 publish→delivery before", ms(pct(res.lat["before"], 99)), ""),
        ("p99 publish→delivery during", ms(pct(res.lat["during"], 99)), ""),
        ("p99 publish→delivery after", ms(pct(res.lat["after"], 99)), ""),
        ("S/dc̄, 5 slices after recovery", " ".join(f"{r:.3f}" for r in first5) or "—", f"≤ {TARGET_SPREAD:g}"),
        ("slices until S/dc̄ ≤ 0.10 for good", "—" if within is None else str(within), f"≤ {TARGET_SLICES}"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print()
    print(
        f"failover: 5 nodes (capacities {', '.join(f'{c:g}' for c in CAPACITIES)}), {args.rate:g} events/s, T = {args.slice:g} s"
    )
    print(f"{'':{w0}}  {'measured':{w1}}  target")
    for name, value, target in rows:
        print(f"{name:{w0}}  {value:{w1}}  {target}")
    for note in res.notes:
        print(f"  {note}")
    print()
    print("S/dc̄ per slice over the survivors, from the recovery on (t after the kill):")
    print("  " + "  ".join(f"{t - res.killed:.1f}s:{r:.3f}" for t, r in res.spread))
    ok = (
        detect is not None
        and detect <= TARGET_DETECT
        and recover is not None
        and recover <= TARGET_RECOVER
        and res.lost == 0
        and res.duplicated == 0
        and within is not None
        and within <= TARGET_SLICES
    )
    print()
    print("targets met" if ok else "TARGET MISSED")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=500.0, help="events/s over all publishing tasks (default 500)")
    ap.add_argument(
        "--warmup", type=float, default=30.0, help="at most this long for balancing to converge (default 30)"
    )
    ap.add_argument("--before", type=float, default=5.0, help="steady seconds before the kill (default 5)")
    ap.add_argument("--after", type=float, default=15.0, help="seconds of publishing after the kill (default 15)")
    ap.add_argument("--slice", type=float, default=1.0, help="T in seconds (default 1)")
    ap.add_argument("--logs", type=Path, help="copy the nodes' logs into this directory")
    args = ap.parse_args()
    for name in ("rate", "warmup", "before", "after", "slice"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name} must be positive")
    with contextlib.suppress(OSError):
        os.nice(BENCH_NICE)
    # uvloop's run and asyncio's differ in their keywords: typed as what both take.
    runner: Callable[[Coroutine[Any, Any, Any]], Any]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        t0 = time.monotonic()
        try:
            res = runner(run(args, Path(tmp)))
        finally:
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.logs / log.name)
        print(f"(run in {time.monotonic() - t0:.0f} s)")
        return 0 if report(res, args) else 1


if __name__ == "__main__":
    sys.exit(main())
