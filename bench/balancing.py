"""Balancing on hetero5: from one hot node to an even load, with balancing and without.

Run as ``.venv/bin/python bench/balancing.py [--seconds S] [--rate R] [--slice T] [--probability P]``.

What it does:

1. **Cluster.**  ``cluster_configs/hetero5.toml`` (capacities 1, 2, 1, 4, 2
   and its bandwidth links), its ports rewritten to free ones, written to a
   temporary file with the run's ``[cluster]`` settings; every node is its own
   process, ``sys.executable -m overlay node --config <tmp> --id N``.  As the
   initializer always does, node 0 starts with the whole event space.
2. **Workload.**  One publisher per node (each node is an access node), at a
   fixed total rate, with skewed prices: 70 % of events in [0, 200], a
   golden-ratio sequence so the offered load is smooth.  Subscriptions: many
   price ranges carrying a ``venue`` pattern no event matches — the matcher
   tests them (they are the load, SPEC §5) but nothing is notified — and
   plain price ranges whose notifications are timed and counted: a few
   random ones, and bands tiling the whole price range so that *every* event
   is timed and checked (a p99 over the few dozen events of the migration
   windows would be their maximum).  Every subscription is made before
   publishing starts, so every matching (event, subscription) pair must
   arrive exactly once: lost = expected − delivered.
3. **Measures**, from the nodes' journals (``admin("journal")``) and the
   subscribers: per slice S/dc̄ (dc as the nodes report it, the two-slice
   window they act on, and the last slice alone); the slice at which the
   offered load settles (cluster load ≥ 90 % of its steady value) and the
   number of slices from there until S/dc̄ ≤ 0.10 for good; migrations,
   Σ mig_cost (subscriptions moved / bw) and subscriptions moved; splits and
   merges; publish→notify latency p50/p99 of events published during a
   migration (from its <1> to its end) against those of the steady state
   (after convergence, away from any migration).  Then the same workload with
   ``balancing = false``.
4. The machine may be shared: every process of the bench runs at a raised
   priority (inherited), as ``bench/throughput.py`` does.  ``--journal F``
   keeps the balancing run's journals and latency samples (JSON);
   ``--profile DIR`` samples every node with py-spy (speedscope files).

Targets: S/dc̄ ≤ 0.10 within 5 slices of the load settling; p99 during
migration ≤ 2× the steady p99; zero loss.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from overlay.channels import parse_subscription
from overlay.channels.schema import Value
from overlay.client import Client
from overlay.config import load_config
from overlay.messages import client as cm
from overlay.testing import free_ports, skewed_price

ROOT: Final = Path(__file__).resolve().parent.parent
CONFIG: Final = ROOT / "cluster_configs" / "hetero5.toml"
# Load subscriptions (tested, never notified) and timed ones.
COST_SUBS: Final = 400
LIVE_SUBS: Final = 12
BANDS: Final = 20  # timed subscriptions tiling [0, 1000] on price
SUB_QUEUE: Final = 1_000_000
# qty identifies an event: it must stay under the schema's max (100,000).
MAX_EVENTS: Final = 100_000
STARTUP_TIMEOUT: Final = 20.0
DRAIN_GRACE: Final = 2.0
# A notification whose event was published this close to a migration window
# counts as neither "during" nor "steady".
WINDOW_MARGIN: Final = 0.5
SETTLED: Final = 0.9
TICK: Final = 0.1
BENCH_NICE: Final = -10
TARGET_SPREAD: Final = 0.10
TARGET_SLICES: Final = 5
TARGET_P99_RATIO: Final = 2.0


# == the cluster ========================================================================


def write_config(
    directory: Path,
    *,
    balancing: bool,
    slice_seconds: float | None,
    probability: float | None,
    slow_ms: float | None = None,
) -> Path:
    """hetero5.toml with free ports, an ephemeral admin port and the run's settings."""
    text = CONFIG.read_text()
    ports = iter(free_ports(text.count("\nport = ")))
    text = re.sub(r"(?m)^port = \d+$", lambda _: f"port = {next(ports)}", text)
    text = re.sub(r"(?m)^admin_port = \d+$", "admin_port = 0", text)
    # Plain TCP: balancing is measured here, and the copy has no certificates beside it.
    text = re.sub(r"(?ms)^\[tls\]\n.*?(?=^\[)", f'[tls]\ninsecure = true\nsecret = "{SECRET}"\n\n', text)
    settings = {"balancing": "true" if balancing else "false"}
    if slice_seconds is not None:
        settings["slice_seconds"] = repr(slice_seconds)
    if probability is not None:
        settings["probability"] = repr(probability)
    if slow_ms is not None:
        settings["slow_ms"] = repr(slow_ms)
    for key, value in settings.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        if not n:
            text = text.replace("[cluster]\n", f"[cluster]\n{key} = {value}\n", 1)
    path = directory / f"hetero5-{'on' if balancing else 'off'}.toml"
    path.write_text(text)
    return path


SECRET: Final = "balancing bench secret"


class Processes:
    """One ``overlay node`` process per node; stopped with SIGTERM, killed if slow."""

    def __init__(self, config: Path, ids: list[int], logdir: Path) -> None:
        self.procs = []
        for i in ids:
            with open(logdir / f"node{i}.log", "wb") as log:  # the child keeps its own descriptor
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "overlay", "node", "--config", str(config), "--id", str(i)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                    )
                )

    def profile(self, directory: Path) -> None:
        """Sample every node with py-spy (the bench extra) until stop()."""
        spy = Path(sys.executable).with_name("py-spy")
        self.spies = [
            subprocess.Popen(
                [
                    str(spy),
                    "record",
                    "--pid",
                    str(p.pid),
                    "--rate",
                    "250",
                    "--format",
                    "speedscope",
                    "--output",
                    str(directory / f"node{k}.json"),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for k, p in enumerate(self.procs)
        ]

    def stop(self) -> None:
        for spy in getattr(self, "spies", []):
            spy.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(10)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# == one run ==============================================================================


def subscriptions() -> tuple[list[str], list[str]]:
    """(load subscriptions, timed subscriptions), the same every run."""
    import random

    rng = random.Random(11)
    cost, live = [], []
    for _ in range(COST_SUBS):
        lo = rng.uniform(0, 950)
        cost.append(f'price >= {lo:.1f} and price < {min(1000.0, lo + rng.uniform(20, 200)):.1f} and venue prefix "zz"')
    for _ in range(LIVE_SUBS):
        lo = rng.uniform(0, 950)
        live.append(f"price >= {lo:.1f} and price < {min(1000.0, lo + rng.uniform(10, 60)):.1f}")
    width = 1000 / BANDS
    for k in range(BANDS):
        top = "price <= 1000" if k == BANDS - 1 else f"price < {(k + 1) * width:g}"
        live.append(f"price >= {k * width:g} and {top}")
    return cost, live


@dataclass
class Run:
    balancing: bool
    slice_seconds: float
    series: list[tuple[float, float, float, float]] = field(default_factory=list)  # (t, S/dc̄, S/dc̄ of one slice, Σd)
    settled_at: int | None = None
    converged_at: int | None = None
    migrations: list[dict[str, Any]] = field(default_factory=list)
    journal: list[dict[str, Any]] = field(default_factory=list)
    published: int = 0
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    lat_during: list[float] = field(default_factory=list)
    lat_steady: list[float] = field(default_factory=list)
    offered: float = 0.0
    start: float = 0.0
    latency: list[tuple[float, float, str]] = field(default_factory=list)  # (publish time, publish→notify, event id)

    @property
    def slices_to_converge(self) -> int | None:
        if self.converged_at is None or self.settled_at is None:
            return None
        return max(0, self.converged_at - self.settled_at)

    def count(self, kind: str) -> int:
        return sum(1 for e in self.journal if e["kind"] == kind)


async def wait_ready(addresses: list[tuple[str, int]]) -> list[Client]:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    admins = [
        await Client([a], client_id=f"bench-admin-{k}", reconnect=False).connect(STARTUP_TIMEOUT)
        for k, a in enumerate(addresses)
    ]
    while True:
        states = [await c.admin("status") for c in admins]
        if all(s["ready"] for s in states):
            return admins
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not become ready")
        await asyncio.sleep(0.05)


async def fetch_journal(admin: Client) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while page := await admin.admin("journal", since=len(out)):
        out += page
    return out


async def run_mode(balancing: bool, args: argparse.Namespace, workdir: Path) -> Run:
    path = write_config(
        workdir, balancing=balancing, slice_seconds=args.slice, probability=args.probability, slow_ms=args.slow_ms
    )
    cfg = load_config(path)
    ids = cfg.node_ids
    addresses = [(n.host, n.port) for n in cfg.nodes]
    run = Run(balancing, cfg.cluster.slice_seconds)
    procs = Processes(path, ids, workdir)
    if args.profile and balancing:
        args.profile.mkdir(parents=True, exist_ok=True)
        procs.profile(args.profile)
    clients: list[Client] = []
    try:
        admins = await wait_ready(addresses)
        clients += admins
        schema = cfg.schema
        cost, live = subscriptions()
        subs = [await Client([a], client_id=f"sub-{i}", reconnect=False).connect() for i, a in zip(ids, addresses)]
        clients += subs
        delivered: collections.Counter[tuple[int, str, int]] = collections.Counter()
        latency: list[tuple[float, float, str]] = []  # (publish time, latency, event id)

        def hook(k: int, client: Client) -> None:
            inner = client._on_message

            def on_message(msg: cm.ClientMessage) -> None:
                if type(msg) is cm.Notify:
                    now = time.time()
                    latency.append((msg.publish_time, now - msg.publish_time, msg.event_id))
                    for sid in msg.sub_ids:
                        delivered[(k, sid, msg.event["qty"])] += 1  # type: ignore[index]
                inner(msg)

            client._on_message = on_message  # type: ignore[method-assign]

        for k, c in enumerate(subs):
            hook(k, c)
        await asyncio.gather(*(subs[k % len(subs)].subscribe(e, queue_size=SUB_QUEUE) for k, e in enumerate(cost)))
        live_subs = []
        for k, e in enumerate(live):
            sid = f"live{k}"
            await subs[k % len(subs)].subscribe(e, sub_id=sid, queue_size=SUB_QUEUE)
            live_subs.append((k % len(subs), sid, parse_subscription(e, schema)))

        pubs = [await Client([a], client_id=f"pub-{i}", reconnect=False).connect() for i, a in zip(ids, addresses)]
        clients += pubs
        events: dict[int, dict[str, Any]] = {}
        per = args.rate / len(pubs)
        total = min(MAX_EVENTS, int(args.rate * args.seconds))
        start = time.time()

        async def publisher(i: int, c: Client) -> None:
            k = 0
            while True:
                due = min(int((time.time() - start) * per), total // len(pubs))
                while k < due:
                    qty = k * len(pubs) + i
                    ev: dict[str, Value] = {
                        "price": skewed_price(k, i / len(pubs)),
                        "sym": "A",
                        "qty": qty,
                        "venue": "x",
                    }
                    events[qty] = ev
                    await c.publish_windowed(ev)
                    k += 1
                if k >= total // len(pubs):
                    break
                await asyncio.sleep(0.002)
            await c.flush(timeout=60)

        await asyncio.gather(*(publisher(i, c) for i, c in enumerate(pubs)))
        stop = time.time()
        run.start = start
        run.published = len(events)
        run.offered = len(events) / (stop - start)
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < DRAIN_GRACE:
            now_total = sum(delivered.values())
            if now_total != last:
                last, quiet_since = now_total, time.monotonic()
            await asyncio.sleep(0.1)

        # Loss and duplicates over the timed subscriptions.
        for k, sid, f in live_subs:
            for qty, ev in events.items():
                if f.matches(ev):
                    run.expected += 1
                    n = delivered.get((k, sid, qty), 0)
                    run.delivered += min(n, 1)
                    run.lost += n == 0
                    run.duplicated += max(0, n - 1)

        journals = [await fetch_journal(a) for a in admins]
        run.journal = sorted((e for j in journals for e in j), key=lambda e: e["time"])
        analyse(run, cfg, start, stop, latency)
        return run
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()
        procs.stop()


def analyse(run: Run, cfg: Any, start: float, stop: float, latency: list[tuple[float, float, str]]) -> None:
    run.latency = latency
    ids = cfg.node_ids
    caps = {n.id: n.capacity for n in cfg.nodes}
    per = {i: [e for e in run.journal if e["kind"] == "slice" and e["node"] == i] for i in ids}
    ref = cfg.cluster.initializer
    for e in per[ref]:
        if not start + run.slice_seconds < e["time"] <= stop:
            continue  # whole slices of traffic only
        # What every node reported last by then (slices close on a common grid,
        # to a tick; a node with a stretched T reports less often).
        near = [
            max((x for x in per[i] if x["time"] <= e["time"] + TICK), key=lambda x: x["time"], default=None)
            for i in ids
        ]
        if any(x is None or e["time"] - x["time"] > x["slice_seconds"] + TICK for x in near):
            continue
        dcs = [x["dc"] for x in near]  # type: ignore[index]
        one = [x.get("d_slice", x["d"]) / caps[i] for x, i in zip(near, ids)]  # type: ignore[union-attr, index]
        run.series.append((e["time"] - start, ratio(dcs), ratio(one), sum(x["d"] for x in near)))  # type: ignore[index]
    if run.series:
        loads = [s[3] for s in run.series]
        steady = statistics.median(loads[len(loads) // 2 :])
        run.settled_at = next((k for k, v in enumerate(loads) if v >= SETTLED * steady), None)
        for k in range(len(run.series) - 1, -1, -1):
            if run.series[k][1] > TARGET_SPREAD:
                break
            run.converged_at = k
    run.migrations = [e for e in run.journal if e["kind"] == "migration" and not e.get("forced")]
    windows = [(m["time"] - m["duration"], m["time"]) for m in run.migrations]
    converged = start + run.series[run.converged_at][0] if run.converged_at is not None else stop - (stop - start) / 3
    if not run.balancing:
        converged = start + run.series[run.settled_at][0] if run.settled_at is not None else start
    for t, lat, _eid in latency:
        if any(a <= t <= b for a, b in windows):
            run.lat_during.append(lat)
        elif t >= converged and not any(a - WINDOW_MARGIN <= t <= b + WINDOW_MARGIN for a, b in windows):
            run.lat_steady.append(lat)


def ratio(dcs: list[float]) -> float:
    mean = sum(dcs) / len(dcs)
    if mean <= 0:
        return 0.0
    return math.sqrt(sum((d - mean) ** 2 for d in dcs) / len(dcs)) / mean


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


# == report ===============================================================================


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:.1f} ms"


def report(on: Run, off: Run) -> bool:
    print()
    print("Per slice (balancing on): t, S/dc̄ (two-slice window the nodes act on), S/dc̄ (that slice alone), Σd")
    for k, (t, r, r1, d) in enumerate(on.series):
        mark = " <- settled" if k == on.settled_at else " <- converged" if k == on.converged_at else ""
        print(f"  {k:3d} {t:7.2f}s  {r:6.3f}  {r1:6.3f}  {d:9.0f}{mark}")
    print()
    on_cost = sum(m["mig_cost"] for m in on.migrations)
    on_moved = sum(m["subscriptions"] for m in on.migrations)
    p99_d, p99_s = pct(on.lat_during, 99), pct(on.lat_steady, 99)
    ratio99 = p99_d / p99_s if p99_d is not None and p99_s else None

    def tail(r: Run) -> float | None:
        return statistics.mean(s[1] for s in r.series[-5:]) if r.series else None

    rows = [
        (
            "slice T / offered rate",
            f"{on.slice_seconds:g} s / {on.offered:.0f} ev/s",
            f"{off.slice_seconds:g} s / {off.offered:.0f} ev/s",
            "",
        ),
        (
            "S/dc̄ at the first whole slice",
            f"{on.series[0][1]:.3f}" if on.series else "—",
            f"{off.series[0][1]:.3f}" if off.series else "—",
            "",
        ),
        (
            "S/dc̄, mean of the last 5 slices",
            f"{tail(on):.3f}" if on.series else "—",
            f"{tail(off):.3f}" if off.series else "—",
            f"≤ {TARGET_SPREAD}",
        ),
        (
            "slices from settled load to S/dc̄ ≤ 0.10 for good",
            str(on.slices_to_converge) if on.slices_to_converge is not None else "never",
            str(off.slices_to_converge) if off.slices_to_converge is not None else "never",
            f"≤ {TARGET_SLICES}",
        ),
        ("migrations (natural)", str(len(on.migrations)), str(len(off.migrations)), ""),
        ("Σ mig_cost (subscriptions / bw)", f"{on_cost:.2f}", "0", ""),
        ("subscriptions moved", str(on_moved), "0", ""),
        (
            "splits / merges / aborted sessions",
            f"{on.count('split')} / {on.count('merge')} / {on.count('abort')}",
            f"{off.count('split')} / {off.count('merge')} / {off.count('abort')}",
            "",
        ),
        ("latency p50 during migrations", ms(pct(on.lat_during, 50)), "—", ""),
        ("latency p99 during migrations", ms(p99_d), "—", f"≤ {TARGET_P99_RATIO}× steady"),
        ("latency p50 steady", ms(pct(on.lat_steady, 50)), ms(pct(off.lat_steady, 50)), ""),
        ("latency p99 steady", ms(p99_s), ms(pct(off.lat_steady, 99)), ""),
        ("p99 during / steady", f"{ratio99:.2f}×" if ratio99 is not None else "—", "—", f"≤ {TARGET_P99_RATIO}"),
        (
            "notifications timed (during / steady)",
            f"{len(on.lat_during)} / {len(on.lat_steady)}",
            f"0 / {len(off.lat_steady)}",
            "",
        ),
        ("events published", str(on.published), str(off.published), ""),
        ("(event, subscription) pairs expected", str(on.expected), str(off.expected), ""),
        ("lost / duplicated", f"{on.lost} / {on.duplicated}", f"{off.lost} / {off.duplicated}", "0 / 0"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in [*rows, ("", "balancing on", "", "")])
    w2 = max(len(r[2]) for r in [*rows, ("", "", "balancing off", "")])
    print(f"{'':{w0}}  {'balancing on':>{w1}}  {'balancing off':>{w2}}  target")
    for name, on_text, off_text, target in rows:
        print(f"{name:{w0}}  {on_text:>{w1}}  {off_text:>{w2}}  {target}")
    ok = (
        on.slices_to_converge is not None
        and on.slices_to_converge <= TARGET_SLICES
        and (ratio99 is None or ratio99 <= TARGET_P99_RATIO)
        and on.lost == 0
        and on.duplicated == 0
        and off.lost == 0
        and off.duplicated == 0
    )
    print()
    print("targets met" if ok else "TARGET MISSED")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="publishing time per run (default 40)")
    ap.add_argument("--rate", type=float, default=1000.0, help="events/s over all publishers (default 1000)")
    ap.add_argument("--slice", type=float, default=None, help="T in seconds (default: the config's)")
    ap.add_argument("--probability", type=float, default=None, help="scheduling probability p (default: the config's)")
    ap.add_argument(
        "--slow-ms",
        type=float,
        default=None,
        help="the nodes journal handlers slower than this (default: the config's)",
    )
    ap.add_argument("--only", choices=("on", "off"), help="run one mode only")
    ap.add_argument("--journal", type=Path, help="write the balancing-on run's journals (JSON) here")
    ap.add_argument("--profile", type=Path, help="py-spy every node of the balancing-on run into this directory")
    ap.add_argument("--logs", type=Path, help="copy the nodes' logs into this directory")
    args = ap.parse_args()
    with contextlib.suppress(OSError):
        os.nice(BENCH_NICE)
    # uvloop's run and asyncio's differ in their keywords: typed as what both take.
    runner: Callable[[Coroutine[Any, Any, Any]], Any]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with tempfile.TemporaryDirectory(prefix="bench-balancing-") as tmp:
        workdir = Path(tmp)
        t0 = time.monotonic()
        on = runner(run_mode(True, args, workdir)) if args.only != "off" else Run(True, 0.0)
        off = runner(run_mode(False, args, workdir)) if args.only != "on" else Run(False, 0.0)
        print(f"(both runs in {time.monotonic() - t0:.0f} s; node logs were in {workdir})")
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in workdir.rglob("*.log"):
                shutil.copy(log, args.logs / f"{log.parent.name}-{log.name}")
        if args.journal:
            args.journal.write_text(json.dumps({"start": on.start, "journal": on.journal, "latency": on.latency}))
        return 0 if report(on, off) else 1


if __name__ == "__main__":
    sys.exit(main())
