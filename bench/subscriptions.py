"""A million subscriptions on five nodes (issue 18 item 4): load, memory, SubAck latency.

Run as ``flock /tmp/bench.lock .venv/bin/python bench/subscriptions.py
[--subs N] [--probes P] [--rate R] [--window W] [--churn R] [--logs DIR] [--json F]``
(the lock: never two benchmarks at once on the machine).

What it does:

1. **Cluster.**  Five ``overlay node`` processes (``overlay.testing.NodeProcesses``)
   of a config of this bench's own (``bench_config``): the schema below,
   balancing off (the placement of rule 2 is the balance measured; a
   balancing session moving 200,000 subscriptions would be a different
   bench), ``[limits] max_subscriptions = 0`` (one loader holds a fifth of
   the load on one node, far past the default 10,000 per client id), and
   ``suspect_timeout`` 10 s (a node indexing a burst of subscriptions on a
   shared 2-core machine must not be taken for dead).
2. **Channels.**  The whole space is split on ``price`` into five bands of
   200 (admin ``split``) and band ``b`` is placed on node ``b`` (admin
   ``place``): every node owns one fifth of the event space.
3. **Load.**  One loader process per access node (``--loader``, rule 5)
   subscribes ``N/5`` subscriptions over a raw client connection, ``W`` in
   flight at once (pipelined: each Subscribe goes out without waiting for
   the SubAck of the one before).  Subscription ``k`` of every loader lies
   in band ``k mod 5``: the owners hold ``N/5`` each, and four in five
   Subscriptions travel from the access node to a peer and back
   (SubscriptionApplied, then the SubAck).  Each has 2 to 20 predicates
   (uniform): a ``price`` range inside its band, a ``sym`` equality or
   small set over 10,000 symbols, and up to 18 more over ``x01``…``x14``
   (ranges, bounds, equality) and ``t1``…``t4`` (equality, prefix, sets,
   inequality) — research-like filters, selective enough that an event
   notifies a handful of the million, not thousands.
4. **Measures.**  *Load rate*: SubAcks per second over the whole load.
   *Held per node*: the subscriptions in each node's channels (``status``).
   *Memory per subscription per node*: each node's RSS growth over the
   load divided by the subscriptions its channels hold (it is also the
   access node of ``N/5`` of them: the session's bookkeeping is in the
   same figure).  *CPU per subscription per node*: the node's user+system
   CPU over the load, per subscription it holds.  *Live latency*, with
   the ``N`` held and a background publisher at ``--rate`` events/s over
   every node: ``P`` probe subscriptions, one at a time, each through the
   next access node in turn (``overlay.client.Client``), timed from
   ``subscribe`` to its SubAck; then an event that matches it (its ``id``
   is the probe's own: no other probe's event does; loaded subscriptions
   may match it too, as any event) is published through another node and
   must be delivered to the probe (the SubAck's promise) —
   a probe whose event does not arrive within ``DELIVERY_TIMEOUT`` counts
   as *not live*.  The probe is unsubscribed before the next.
5. **Loaders** are processes of their own (``--loader``): the bench's
   memory stays bounded (a subscription is generated, sent and forgotten;
   nothing per subscription is kept on the client side but its SubAck
   count), and a loader's CPU is not the nodes'.  Each keeps its
   connection — its subscriptions — open until its standard input closes,
   acking every tagged notification it gets (as the client library does).
6. **Churn** (``--churn R``, after the probes): ``R`` rounds in which every
   loader unsubscribes all its subscriptions and subscribes as many new
   ones (same ids, new filters), waiting for every answer; each node's RSS
   after each round shows whether memory stays bounded under churn (it
   must: nothing of a dropped subscription may stay behind).

Targets (issue 18 item 4): 1,000,000 subscriptions of up to 20 predicates
held by 5 nodes, balanced; SubAck p99 ≤ 1 s under that load.  For the
report: Amazon SNS allows 200 filter policies per topic and takes up to
15 min to apply one; Amazon EventBridge 300 rules per event bus.

The workload (rules 2 and 3) is ``bench/subscriptions_workload.py``'s, a
loader process (rules 5 and 6) ``bench/subscriptions_loader.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from overlay.client import Client
from overlay.errors import OverlayError
from overlay.testing import NodeProcesses, free_ports, write_cluster_config
from subscriptions_loader import SUBACK_TIMEOUT, loader
from subscriptions_workload import (
    BAND,
    NODES,
    PROBE_ID,
    SCHEMA,
    event,
    probe_subscription,
)

TARGET_SUBS: Final = 1_000_000
TARGET_LIVE_P99: Final = 1.0
DELIVERY_TIMEOUT: Final = 5.0
PROGRESS_EVERY: Final = 5.0  # s between two progress lines of the load
PUBLISH_WINDOW: Final = 64


# -- the bench -------------------------------------------------------------------------------


@dataclass
class Result:
    subs: int = 0
    acked: int = 0
    refused: int = 0
    first_error: str = ""
    load_seconds: float = 0.0
    load_wall: float = 0.0  # with the loaders' start-up
    load_rate: float = 0.0
    held: list[int] = field(default_factory=list)  # per node, in its channels
    rss_before: list[int] = field(default_factory=list)  # bytes
    rss_after: list[int] = field(default_factory=list)
    cpu_load: list[float] = field(default_factory=list)  # s of CPU during the load
    loader_rss: list[int] = field(default_factory=list)
    probes: int = 0
    suback: list[float] = field(default_factory=list)  # s, Subscribe → SubAck
    delivery: list[float] = field(default_factory=list)  # s, publish → notification
    not_live: int = 0
    probe_errors: list[str] = field(default_factory=list)
    published: int = 0
    notified_loaded: int = 0
    churn_rss: list[list[int]] = field(default_factory=list)  # per round, per node (bytes)
    churn_held: list[list[int]] = field(default_factory=list)
    churn_seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def bench_config(path: Path, addresses: list[tuple[str, int]], admin_ports: list[int]) -> Path:
    """Rule 1."""
    return write_cluster_config(
        path,
        addresses,
        name="subscriptions",
        settings={"balancing": False, "slice_seconds": 2.0, "suspect_timeout": 10.0, "peer_timeout": 30.0},
        admin_ports=admin_ports,
        tables={"limits": {"max_subscriptions": 0}},
        schema=SCHEMA,
    )


def rss(pid: int) -> int:
    """Resident bytes of process ``pid`` (``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1)]


async def place_bands(admin: Client) -> None:
    """Rule 2: channels [0, 200], (200, 400], … and band b on node b."""
    chan = "0.0"
    for b in range(1, NODES):
        reply = await admin.admin("split", channel=chan, attr="price", at=b * BAND, timeout=30.0)
        low, high = _split_ids(reply, b * BAND)
        await _place(admin, low, b - 1)
        chan = high
    await _place(admin, chan, NODES - 1)


def _split_ids(reply: Any, at: float) -> tuple[str, str]:
    """The two channels a split made: (price ≤ at, price > at)."""
    kids = reply.get("children", []) if isinstance(reply, dict) else []
    low = [k["id"] for k in kids if f", {at}]" in k["space"]]
    high = [k["id"] for k in kids if f"({at}, " in k["space"]]
    if len(kids) != 2 or len(low) != 1 or len(high) != 1:
        raise RuntimeError(f"unexpected split reply: {reply!r}")
    return str(low[0]), str(high[0])


async def _place(admin: Client, chan: str, node: int) -> None:
    if node != 0:  # node 0, the initializer, made them all
        await admin.admin("place", channel=chan, node=node, timeout=60.0)


async def held(procs: NodeProcesses) -> list[int]:
    out = []
    for n in range(NODES):
        status = await procs.status(n, timeout=30.0)
        channels = status["channels"]
        assert isinstance(channels, list)
        out.append(sum(int(c["subscriptions"]) for c in channels))
    return out


async def load(
    args: argparse.Namespace, procs: NodeProcesses, res: Result, loaders: list[asyncio.subprocess.Process]
) -> None:
    """Rule 3: one loader per access node, each in ``loaders`` as soon as it
    starts (the caller ends them, whatever happens here); they stay holding."""
    per = [args.subs // NODES + (1 if n < args.subs % NODES else 0) for n in range(NODES)]
    for n in range(NODES):
        host, port = procs.addr(n)
        loaders.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--loader",
                "--addr",
                f"{host}:{port}",
                "--node",
                str(n),
                "--count",
                str(per[n]),
                "--window",
                str(args.window),
                "--seed",
                str(args.seed),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        )
    last: list[dict[str, Any]] = [{} for _ in range(NODES)]

    async def follow(n: int) -> None:
        stdout = loaders[n].stdout
        assert stdout is not None
        while line := await stdout.readline():
            last[n] = json.loads(line)
            if last[n].get("finished"):
                return
        raise RuntimeError(f"loader {n} ended before its subscriptions were acknowledged: {last[n]}")

    cpu0 = [cpu(procs.procs[n].pid) for n in range(NODES)]
    started = time.monotonic()
    following = asyncio.gather(*(follow(n) for n in range(NODES)))
    deadline = started + args.load_timeout
    try:
        while not following.done():
            await asyncio.wait([following], timeout=PROGRESS_EVERY)
            acked = sum(x.get("acked", 0) for x in last)
            t = time.monotonic() - started
            print(
                f"  {t:6.0f}s  {acked:>9,} acknowledged  ({acked / t:,.0f}/s)  node RSS MB "
                + " ".join(f"{rss(procs.procs[n].pid) / 2**20:.0f}" for n in range(NODES)),
                flush=True,
            )
            for n in range(NODES):
                assert procs.alive(n), f"node {n} died during the load\n{procs.tail(n)}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"load not done after {args.load_timeout:.0f}s: {acked:,} of {args.subs:,}")
        following.result()
    finally:
        if not following.done():
            following.cancel()
            with contextlib.suppress(BaseException):
                await following
    # From each loader's first Subscribe (its process started and connected)
    # to its last SubAck: the slowest loader's is the load's.
    res.load_wall = time.monotonic() - started
    res.load_seconds = max(float(x.get("seconds", 0.0)) for x in last) or res.load_wall
    res.cpu_load = [cpu(procs.procs[n].pid) - cpu0[n] for n in range(NODES)]
    res.acked = sum(x["acked"] for x in last)
    res.refused = sum(x["errors"] for x in last)
    res.first_error = next((x["first_error"] for x in last if x["first_error"]), "")
    res.load_rate = res.acked / res.load_seconds if res.load_seconds else 0.0
    res.loader_rss = [rss(p.pid) for p in loaders]


async def background(clients: list[Client], rate: float, stop: asyncio.Event, res: Result) -> None:
    """Events at ``rate``/s over every node, each tested against the loaded subscriptions."""
    rng = random.Random(7)
    started = time.monotonic()
    for i in itertools.count():
        if stop.is_set():
            break
        ahead = started + i / rate - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
        await clients[i % len(clients)].publish_windowed(event(rng, rng.randrange(PROBE_ID)), window=PUBLISH_WINDOW)
        res.published += 1


async def probe(args: argparse.Namespace, procs: NodeProcesses, res: Result) -> None:
    """Rule 4's live latency, under the background publisher."""
    subs = [await Client([procs.addr(n)], client_id=f"probe-{n}").connect() for n in range(NODES)]
    pubs = [await Client([procs.addr(n)], client_id=f"probe-pub-{n}").connect() for n in range(NODES)]
    bg = [await Client([procs.addr(n)], client_id=f"background-{n}").connect() for n in range(NODES)]
    stop = asyncio.Event()
    publishing = asyncio.create_task(background(bg, args.rate, stop, res)) if args.rate > 0 else None
    rng = random.Random(args.seed + 99)
    try:
        for i in range(args.probes):
            if publishing is not None and publishing.done():
                publishing.result()  # its error, now
            ev = event(rng, PROBE_ID + i)
            expr = probe_subscription(rng, ev)
            client = subs[i % NODES]
            t0 = time.perf_counter()
            try:
                sub = await client.subscribe(expr, sub_id=f"probe{i}", timeout=SUBACK_TIMEOUT)
            except (TimeoutError, OverlayError) as exc:  # counted: a SubAck that never came is the worst case
                res.probe_errors.append(f"probe {i}: {type(exc).__name__}: {exc}")
                res.not_live += 1
                continue
            res.suback.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            await pubs[(i + 2) % NODES].publish(ev, timeout=SUBACK_TIMEOUT)
            try:
                note = await sub.next(DELIVERY_TIMEOUT)
                if note.event.get("id") != ev["id"]:
                    res.probe_errors.append(f"probe {i}: got event {note.event} instead of id {ev['id']}")
                    res.not_live += 1
                else:
                    res.delivery.append(time.perf_counter() - t1)
            except TimeoutError:
                res.not_live += 1
                res.probe_errors.append(f"probe {i}: its event not delivered in {DELIVERY_TIMEOUT}s: {expr}")
            await client.unsubscribe(f"probe{i}", timeout=SUBACK_TIMEOUT)
            res.probes += 1
            await asyncio.sleep(args.probe_gap)
    finally:
        stop.set()
        if publishing is not None:
            with contextlib.suppress(BaseException):
                await publishing
        for c in subs + pubs + bg:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)


async def churn(
    args: argparse.Namespace, procs: NodeProcesses, res: Result, loaders: list[asyncio.subprocess.Process]
) -> None:
    """Rule 6: ``--churn`` rounds of unsubscribing and subscribing everything again."""
    for r in range(1, args.churn + 1):
        print(f"churn: round {r} of {args.churn} …", flush=True)
        for p in loaders:
            assert p.stdin is not None
            p.stdin.write(b"churn\n")
            await p.stdin.drain()
        seconds = 0.0
        for n, p in enumerate(loaders):
            assert p.stdout is not None
            while True:
                line = await asyncio.wait_for(p.stdout.readline(), args.load_timeout)
                if not line:
                    raise RuntimeError(f"loader {n} ended during churn round {r}")
                got = json.loads(line)
                if got.get("round") == r:
                    seconds = max(seconds, float(got["seconds"]))
                    break
        res.churn_seconds.append(seconds)
        res.churn_rss.append([rss(procs.procs[n].pid) for n in range(NODES)])
        res.churn_held.append(await held(procs))
        for n in range(NODES):
            assert procs.alive(n), f"node {n} died during churn\n{procs.tail(n)}"


async def run(args: argparse.Namespace, workdir: Path) -> Result:
    res = Result(subs=args.subs)
    ports = free_ports(2 * NODES)
    addresses = [("127.0.0.1", p) for p in ports[:NODES]]
    config = bench_config(workdir / "subscriptions.toml", addresses, ports[NODES:])
    procs = NodeProcesses(config, addresses, workdir)
    loaders: list[asyncio.subprocess.Process] = []
    try:
        procs.start_all()
        await procs.all_ready()
        async with Client([procs.addr(0)], client_id="admin") as admin:
            await place_bands(admin)
        res.rss_before = [rss(procs.procs[n].pid) for n in range(NODES)]
        print(f"load: {args.subs:,} subscriptions, {args.window} in flight per loader …", flush=True)
        await load(args, procs, res, loaders)
        res.held = await held(procs)
        res.rss_after = [rss(procs.procs[n].pid) for n in range(NODES)]
        print(f"probes: {args.probes} new subscriptions, background {args.rate:.0f} events/s …", flush=True)
        await probe(args, procs, res)
        if args.churn:
            await churn(args, procs, res, loaders)
        res.notes += [f"node {n} logged a traceback (see --logs)" for n in range(NODES) if "Traceback" in procs.log(n)]
        return res
    finally:
        for p in loaders:
            if p.stdin is not None:
                with contextlib.suppress(Exception):
                    p.stdin.close()
        for p in loaders:
            try:
                out, _ = await asyncio.wait_for(p.communicate(), 10)
                lines = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
                if lines:
                    res.notified_loaded += int(lines[-1].get("notified", 0))
            except (TimeoutError, ValueError):
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        procs.stop()


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:.1f} ms"


def report(res: Result) -> str:
    lines = [f"subscriptions on {NODES} nodes (issue 18 item 4)", ""]
    total = sum(res.held)
    lines.append(
        f"load         {res.acked:,} acknowledged of {res.subs:,} ({res.refused:,} refused) in "
        f"{res.load_seconds:.1f} s: {res.load_rate:,.0f} subscriptions/s ({res.load_wall:.1f} s with the loaders' start)"
    )
    if res.first_error:
        lines.append(f"             first refusal: {res.first_error}")
    lines.append(f"held         {total:,} in all; per node " + ", ".join(f"{h:,}" for h in res.held))
    mean = total / NODES if total else 0.0
    if mean:
        lines.append(f"balance      max/mean {max(res.held) / mean:.3f}")
    growth = [a - b for a, b in zip(res.rss_after, res.rss_before, strict=True)]
    per_sub = [g / h if h else math.nan for g, h in zip(growth, res.held, strict=True)]
    lines.append(
        "RSS          per node before/after (MB): "
        + ", ".join(f"{b / 2**20:.0f}/{a / 2**20:.0f}" for b, a in zip(res.rss_before, res.rss_after, strict=True))
    )
    lines.append("memory/sub   per node: " + ", ".join(f"{x / 1024:.2f} KB" for x in per_sub))
    cpu_sub = [c / h * 1e6 if h else math.nan for c, h in zip(res.cpu_load, res.held, strict=True)]
    lines.append("CPU/sub      per node: " + ", ".join(f"{x:.0f} µs" for x in cpu_sub) + " (access + owner side)")
    if res.loader_rss:
        lines.append(f"loaders      RSS {max(res.loader_rss) / 2**20:.0f} MB at most (bench side, bounded)")
    lines.append(
        f"live         {res.probes} probes: SubAck p50 {_ms(pct(res.suback, 50))}, p99 {_ms(pct(res.suback, 99))}, "
        f"max {_ms(max(res.suback) if res.suback else None)}; not live {res.not_live}"
    )
    lines.append(
        f"             then their event: publish → delivered p50 {_ms(pct(res.delivery, 50))}, "
        f"p99 {_ms(pct(res.delivery, 99))}; background {res.published:,} events, "
        f"{res.notified_loaded:,} notifications to loaded subscriptions"
    )
    for r, (sizes, kept, secs) in enumerate(zip(res.churn_rss, res.churn_held, res.churn_seconds, strict=True), 1):
        lines.append(
            f"churn {r:<7}{sum(kept):,} held after dropping and re-subscribing all in {secs:.0f} s; RSS per node (MB) "
            + ", ".join(f"{x / 2**20:.0f}" for x in sizes)
        )
    lines.append("")
    p99 = pct(res.suback, 99)
    ok_subs = total >= TARGET_SUBS
    ok_live = p99 is not None and p99 <= TARGET_LIVE_P99 and res.not_live == 0
    lines.append(f"{'':14}{'target':>22}{'measured':>22}   SNS / EventBridge")
    lines.append(
        f"{'held':14}{TARGET_SUBS:>22,}{total:>22,}   200 policies per topic / 300 rules per bus"
        + ("" if ok_subs else "   (a smaller run)")
    )
    lines.append(
        f"{'SubAck p99':14}{'≤ 1000 ms':>22}{_ms(p99):>22}   up to 15 min to apply" + ("" if ok_live else "   MISSED")
    )
    if not ok_subs and total and res.load_rate:
        mem = sum(growth) / total
        cpu_all = sum(res.cpu_load) / total
        lines.append("")
        lines.append(
            f"at 1,000,000 (linear from this run): load {TARGET_SUBS / res.load_rate / 60:.1f} min, "
            f"{TARGET_SUBS / NODES * mem / 2**30:.2f} GB RSS growth per node, "
            f"{TARGET_SUBS * cpu_all / 60:.1f} CPU-min over the nodes"
        )
    for e in res.probe_errors[:5]:
        lines.append(f"  {e[:300]}")
    lines += [f"note: {n}" for n in res.notes]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subs", type=int, default=100_000, help="subscriptions to load (issue: 1,000,000)")
    ap.add_argument("--probes", type=int, default=200, help="new subscriptions timed under load")
    ap.add_argument("--probe-gap", type=float, default=0.05, help="s between two probes")
    ap.add_argument("--rate", type=float, default=200.0, help="background events/s during the probes")
    ap.add_argument("--window", type=int, default=256, help="subscribes in flight per loader")
    ap.add_argument(
        "--churn", type=int, default=0, help="rounds of unsubscribing and re-subscribing everything (rule 6)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load-timeout", type=float, default=3600.0, help="s the load may take")
    ap.add_argument("--logs", type=Path, help="keep the nodes' logs here")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    # A loader process (rule 5): started by the bench itself.
    ap.add_argument("--loader", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--node", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loader:
        asyncio.run(loader(args))
        return
    if args.subs < 0 or args.probes < 0 or args.churn < 0 or args.window < 1 or not 0 <= args.rate < 1e6:
        ap.error("--subs, --probes and --churn must be ≥ 0, --window ≥ 1, --rate in [0, 1e6)")
    workdir = args.logs or Path(tempfile.mkdtemp(prefix="overlay-subs-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        res = asyncio.run(run(args, workdir))
    finally:
        if args.logs is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(asdict(res)))


if __name__ == "__main__":
    main()
