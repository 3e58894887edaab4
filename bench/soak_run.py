"""One run of ``bench/soak.py``: the node processes, the clients, the
traffic, the drain and re-join, the samples, and the audit they feed.

1. ``Soak`` owns the run (the items 1–4 of ``soak.py``'s docstring): it
   starts the cluster of ``NODES`` processes and the clients (``setup``),
   the publishers and lanes (``start_traffic``), drains and re-joins node
   ``DRAINED`` midway (``drain_and_rejoin``), samples every ``--every`` s
   and prints each sample as a row of the table (``sample``,
   ``print_sample``), then waits until nothing more arrives (``settle``).
2. Every publish and delivery goes into ``Soak.audit`` (an
   ``overlay.testing.Audit``); ``soak_report.py`` judges what it holds.
3. ``close`` ends every task and client and stops the processes, whatever
   happened before.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from overlay.auth import generate_keys
from overlay.auth.keys import local_token
from overlay.channels import parse_subscription
from overlay.client import AgentClient
from overlay.config import ClusterConfig, load_config
from overlay.errors import OverlayError, RequestError
from overlay.security import client_ssl
from overlay.testing import (
    Audit,
    NodeProcesses,
    bench_event,
    consume,
    dev_tls,
    free_ports,
    insecure_tls,
    load_ranges,
    price_bands,
    publish_steadily,
    write_cluster_config,
)

NODES: Final = 3
DRAINED: Final = 2  # the node drained and re-joined (not the initializer: any node would do)
LOAD_SUBS: Final = 400
BANDS: Final = 8
GROUP: Final = "workers"
GROUP_EXPR: Final = 'sym = "A"'
INSTANCES: Final = 3
PUBLISH_TASKS: Final = 16
SUB_QUEUE: Final = 1_000_000  # the audit reads every notification: never a client-side drop
KEYED_BASE: Final = 500_000_000  # the qty of the first keyed event (unkeyed ones count from 0)
CHURN_HOLD: Final = (3.0, 10.0)  # s a churned subscription is kept
CHURN_WIDTH: Final = (20.0, 100.0)
# A churned subscription keeps reading this long after it asked to unsubscribe:
# what was PubAck'ed before is owed to it (Audit rule 6) and may still be on its way.
CHURN_GRACE: Final = 2.0
QUIET: Final = 5.0  # s without a delivery after publishing: nothing more is coming
SETTLE: Final = 60.0
DRAIN_TIMEOUT: Final = 120.0
TOKEN_MARGIN: Final = 3600.0  # tokens outlive the run: no session ends on its token here
MB: Final = 1024 * 1024


# -- what is measured -------------------------------------------------------------------


@dataclass
class NodeSample:
    pid: int
    rss: int  # bytes
    fds: int


@dataclass
class Sample:
    t: float  # s since the traffic started
    span: float  # s since the previous sample
    events: int  # PubAck'ed in the interval
    deliveries: int  # handed to the application in the interval
    p99: float | None  # s, publish→delivery of those deliveries
    nodes: dict[int, NodeSample | None]
    notes: list[str]


@dataclass
class Timeline:
    start: float = 0.0
    drain: float | None = None
    drained: float | None = None
    stopped: float | None = None
    started: float | None = None
    ready: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    failure: str = ""


def proc_sample(pid: int) -> NodeSample | None:
    """RSS and open descriptors of a live process, from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            rss = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None
    return NodeSample(pid, rss, fds)


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


# -- the run ----------------------------------------------------------------------------------


def load_subscriptions() -> list[str]:
    return load_ranges(LOAD_SUBS)


def bands() -> list[str]:
    return price_bands(BANDS)


def values(qty: int) -> dict[str, Any]:
    return bench_event(qty)


class Soak:
    """One run: the processes, the clients, the traffic and the audit."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.duration = args.minutes * 60.0
        ports = free_ports(2 * NODES)
        self.addresses = [("127.0.0.1", p) for p in ports[:NODES]]
        self.admin_ports = ports[NODES:]
        private, public = generate_keys(workdir / "keys")
        settings = {"slice_seconds": args.slice, "balancing": True, "peer_timeout": 2.0}
        if args.capture:  # SPEC §13: every node's publishes, subscriptions and deliveries, for a post-mortem
            settings["capture_dir"] = str(args.capture.resolve())
        self.config_path = write_cluster_config(
            workdir / "soak.toml",
            self.addresses,
            name="soak",
            settings=settings,
            admin_ports=self.admin_ports,
            tls=insecure_tls() if args.no_tls else dev_tls(range(NODES)),
            tables={"auth": {"public_keys": [str(public)], "signing_key": str(private)}},
        )
        self.config: ClusterConfig = load_config(self.config_path)
        self.ssl = client_ssl(self.config)  # None without TLS
        self.procs = NodeProcesses(self.config_path, self.addresses, workdir)
        self.audit = Audit()
        self.clients: list[AgentClient] = []
        self.tasks: list[asyncio.Task[None]] = []  # consumers: cancelled at the end
        self.traffic: list[asyncio.Task[None]] = []  # publishers and churn: they end on ``stop``
        self.stop = asyncio.Event()
        self.samples: list[Sample] = []
        self.timeline = Timeline()
        self.starts: dict[int, list[tuple[float, int]]] = {}  # node -> (start time, pid) of each process
        self.notes: list[str] = []  # what happened since the last sample
        self.churned = 0
        self.attempts: collections.Counter[int] = collections.Counter()  # qty -> publishes sent (agents' re-sends)
        self.client_errors: collections.Counter[str] = collections.Counter()  # what the nodes told the clients
        self.churn_failures: list[str] = []
        # Each churned subscription's access nodes (node ids) at its SubAck and at its end: a post-mortem's first question.
        self.churn_homes: dict[str, list[list[int]]] = {}
        self.lane_errors: list[str] = []

    def token(self, subject: str, *roles: str) -> str:
        return local_token(self.config, subject, *roles, ttl=self.duration + TOKEN_MARGIN)

    async def agent(self, name: str, *roles: str) -> AgentClient:
        a = AgentClient(
            self.addresses, client_id=name, token=self.token(name, *roles), error_cb=self.client_error, ssl=self.ssl
        )
        self.clients.append(a)
        await a.connect()
        if "publish" in roles:
            self.spy_attempts(a)
        return a

    def client_error(self, error: OverlayError) -> None:
        """Counted, printed at the end (``error_cb``: not a log line per error mid-table)."""
        code = error.code if isinstance(error, RequestError) else type(error).__name__
        self.client_errors[str(code)] += 1

    def spy_attempts(self, agent: AgentClient) -> None:
        """Count every attempt of each event (by qty) the agent sends to a node:
        more than one is a re-send after a timeout (``AgentClient`` rule 3)."""
        for c in agent.clients:
            inner = c.publish_once

            async def publish_once(event: Any, *args: Any, _inner: Any = inner, **kw: Any) -> Any:
                if isinstance(event, dict):
                    self.attempts[int(event["qty"])] += 1
                return await _inner(event, *args, **kw)

            c.publish_once = publish_once  # type: ignore[method-assign]  # a spy, by design

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  [{time.time() - self.timeline.start:6.1f}s] {text}", flush=True)

    def process_started(self, node: int) -> None:
        self.starts.setdefault(node, []).append((time.time(), self.procs.procs[node].pid))

    # -- setup -----------------------------------------------------------------------------

    async def setup(self) -> None:
        self.procs.start_all()
        for n in range(NODES):
            self.process_started(n)
        await self.procs.all_ready()
        schema = self.config.schema
        load = await self.agent("load", "subscribe")
        await asyncio.gather(
            *(
                load.subscribe(e, queue_size=16, redundancy=1, sub_id=f"load{k}")
                for k, e in enumerate(load_subscriptions())
            )
        )
        subs = await self.agent("bands", "subscribe")
        for k, expr in enumerate(bands()):
            name = f"band{k}"
            self.audit.subscription(name, expr, parse_subscription(expr, schema))
            fs = await subs.subscribe(expr, sub_id=name, queue_size=SUB_QUEUE)
            self.audit.subacked(name)
            self.tasks.append(asyncio.create_task(consume(fs, self.audit, name)))
        self.audit.group(GROUP, GROUP_EXPR, parse_subscription(GROUP_EXPR, schema))
        for i in range(INSTANCES):
            name = f"{GROUP}.{i}"
            worker = await self.agent(f"worker-{i}", "subscribe")
            self.audit.instance(name, GROUP)
            fs = await worker.subscribe(GROUP_EXPR, sub_id=name, group=GROUP, queue_size=SUB_QUEUE)
            self.audit.subacked(name)
            self.tasks.append(asyncio.create_task(consume(fs, self.audit, name)))

    # -- traffic ---------------------------------------------------------------------------

    async def start_traffic(self) -> None:
        pub = await self.agent("publisher", "publish")
        keyed = await self.agent("keyed", "publish")
        churn = await self.agent("churn", "subscribe")
        total = self.args.max_events or int(self.args.rate * self.duration)
        self.timeline.start = time.time()
        self.traffic.append(
            asyncio.create_task(
                publish_steadily(
                    pub.publish,
                    self.audit,
                    values,
                    range(total),
                    rate=self.args.rate,
                    tasks=PUBLISH_TASKS,
                    stop=self.stop,
                )
            )
        )
        qtys = itertools.count(KEYED_BASE)
        for lane in range(self.args.keys):
            self.traffic.append(
                asyncio.create_task(self.guarded(f"keyed lane {lane}", self.keyed_lane(keyed, lane, qtys)))
            )
        for lane in range(self.args.churn):
            self.traffic.append(asyncio.create_task(self.guarded(f"churn lane {lane}", self.churn_lane(churn, lane))))

    async def guarded(self, what: str, work: Awaitable[None]) -> None:
        """A lane that fails is said, not silent (the run goes on without it)."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 — a lane's bug is a finding of the run, reported at the end
            self.lane_errors.append(f"{what}: {type(exc).__name__}: {exc}")
            self.note(f"{what} ended: {type(exc).__name__}: {exc}")

    async def keyed_lane(self, pub: AgentClient, lane: int, qtys: itertools.count[int]) -> None:
        """One key at a time, ranks 1…R in order, each publish waiting for its PubAck."""
        period = self.args.keys / self.args.keyed_rate
        due = time.monotonic() + lane * period / self.args.keys
        for key_no in itertools.count():
            key = f"order-{lane}-{key_no}"
            for rank in range(1, self.args.ranks + 1):
                if self.stop.is_set():
                    return
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                due += period
                qty = next(qtys)
                v = values(qty)
                self.audit.publishing(qty, v, key=key, rank=rank)
                try:
                    event_id = await pub.publish(v, key=key, rank=rank)
                except (OverlayError, TimeoutError) as exc:
                    self.audit.publish_failed(qty, f"{type(exc).__name__}: {exc}")
                    continue
                self.audit.acked(qty, event_id)

    async def churn_lane(self, churn: AgentClient, lane: int) -> None:
        rng = random.Random(1000 + lane)
        schema = self.config.schema
        for n in itertools.count():
            if self.stop.is_set():
                return
            lo = rng.uniform(0, 1000 - CHURN_WIDTH[1])
            expr = f"price >= {lo:.1f} and price < {lo + rng.uniform(*CHURN_WIDTH):.1f}"
            name = f"churn{lane}.{n}"
            try:
                fs = await churn.subscribe(expr, sub_id=name, queue_size=SUB_QUEUE)
            except (OverlayError, TimeoutError) as exc:
                self.churn_failures.append(f"{name}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(1.0)
                continue
            # Counted from now, just after its SubAck: what was published before is not owed.
            self.audit.subscription(name, expr, parse_subscription(expr, schema))
            self.audit.subacked(name)
            self.churn_homes[name] = [sorted(fs.homes)]
            reader = asyncio.create_task(consume(fs, self.audit, name))
            self.tasks.append(reader)
            self.churned += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), rng.uniform(*CHURN_HOLD))
            if self.stop.is_set():
                return  # kept open to the end: owed everything, like the bands
            self.audit.unsubscribed(name)
            self.churn_homes[name].append(sorted(fs.homes))
            await asyncio.sleep(CHURN_GRACE)
            await fs.close()

    # -- the drain and the re-join ------------------------------------------------------------

    async def drain_and_rejoin(self) -> None:
        import aiohttp

        tl = self.timeline
        try:
            tl.drain = time.time()
            self.note(f"drain node {DRAINED} …")
            token = self.token("soak-ops", "admin")
            scheme = "http" if self.ssl is None else "https"
            url = f"{scheme}://127.0.0.1:{self.admin_ports[DRAINED]}/drain"
            timeout = aiohttp.ClientTimeout(total=DRAIN_TIMEOUT)
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(url, headers={"Authorization": f"Bearer {token}"}, ssl=self.ssl or False) as resp,
            ):
                body = await resp.json(content_type=None)
                if resp.status != 200:
                    raise RuntimeError(f"drain refused (HTTP {resp.status}): {body}")
            tl.drained, tl.summary = time.time(), body
            self.note(
                f"node {DRAINED} drained in {tl.drained - tl.drain:.1f}s: {body.get('channels_moved')} channels, "
                f"{body.get('subscriptions_moved')} subscriptions moved, {body.get('clients_closed')} clients closed"
            )
            await asyncio.sleep(self.args.stop_after)
            tl.stopped = await asyncio.to_thread(self.procs.terminate, DRAINED)
            self.note(f"node {DRAINED} stopped (SIGTERM, exit {self.procs.procs[DRAINED].returncode})")
            await asyncio.sleep(self.args.down)
            self.procs.start(DRAINED)
            self.process_started(DRAINED)
            tl.started = time.time()
            await self.procs.ready(DRAINED)
            tl.ready = time.time()
            self.note(f"node {DRAINED} started again, ready in {tl.ready - tl.started:.1f}s")
        except Exception as exc:  # noqa: BLE001 — a failed drain is a finding of the run, reported at the end
            tl.failure = f"{type(exc).__name__}: {exc}"
            self.note(f"drain/re-join failed: {tl.failure}")

    # -- sampling ------------------------------------------------------------------------------

    def sample(self, cursor: dict[str, int], last: float) -> Sample:
        now = time.time()
        audit = self.audit
        deliveries = audit.deliveries[cursor["deliveries"] :]
        latencies = audit.latencies[cursor["latencies"] :]
        cursor["deliveries"] += len(deliveries)
        cursor["latencies"] += len(latencies)
        events = sum(1 for e in audit.events.values() if last < e.acked <= now)
        nodes = {n: proc_sample(self.procs.procs[n].pid) if self.procs.alive(n) else None for n in range(NODES)}
        s = Sample(
            now - self.timeline.start,
            now - last,
            events,
            len(deliveries),
            pct([lat for _, lat in latencies], 99),
            nodes,
            self.notes,
        )
        self.notes = []
        return s

    def print_sample(self, s: Sample) -> None:
        def cells(f: Callable[[NodeSample], str]) -> str:
            return "/".join("—" if x is None else f(x) for x in (s.nodes[n] for n in range(NODES)))

        p99 = "—" if s.p99 is None else f"{s.p99 * 1000:.1f}"
        notes = "; ".join(n.split(":")[0] for n in s.notes)
        print(
            f"{s.t / 60:5.1f} {s.events / s.span:9.1f} {s.deliveries / s.span:9.1f} {p99:>9} "
            f"{cells(lambda x: f'{x.rss / MB:.0f}'):>16} {cells(lambda x: str(x.fds)):>14}  {notes}",
            flush=True,
        )

    # -- the whole run -------------------------------------------------------------------------

    async def run(self) -> None:
        args = self.args
        print(
            f"soak: {NODES} node processes, {args.minutes:g} min, {args.rate:g} events/s plain + "
            f"{args.keyed_rate:g} keyed ({args.keys} keys at a time, ranks 1…{args.ranks}), {BANDS} bands "
            f"(2 homes each), group {GROUP!r} of {INSTANCES}, {args.churn} churn lanes, {LOAD_SUBS} load "
            f"subscriptions; node {DRAINED} drained at {args.drain_at:.0%} and re-joined after {args.down:g}s down"
        )
        tls = (
            "TLS: OFF (--no-tls: plain TCP, peers proving the cluster secret)"
            if self.ssl is None
            else "TLS on every port (development CA; peers by certificate, admin over HTTPS)"
        )
        print(f"security: {tls}; [auth] tokens on every client (Ed25519, roles per client)")
        await self.setup()
        await self.start_traffic()
        print(
            f"{'min':>5} {'events/s':>9} {'deliv/s':>9} {'p99 ms':>9} {'RSS MB n0/n1/n2':>16} {'fds n0/n1/n2':>14}  notes"
        )
        cursor = {"deliveries": 0, "latencies": 0}
        start = self.timeline.start
        drain_at = start + args.drain_at * self.duration
        drain: asyncio.Task[None] | None = None
        last = start
        next_sample = start + args.every
        end = start + self.duration
        while True:
            now = time.time()
            if drain is None and now >= drain_at:
                drain = asyncio.create_task(self.drain_and_rejoin())
            if now >= next_sample or now >= end:
                self.samples.append(s := self.sample(cursor, last))
                self.print_sample(s)
                last, next_sample = now, next_sample + args.every
            if now >= end:
                break
            wake = min(next_sample, end, drain_at if drain is None else end)
            await asyncio.sleep(max(0.05, wake - time.time()))
        self.stop.set()
        if drain is not None:
            await drain
        await asyncio.gather(*self.traffic)
        await self.settle()

    async def settle(self) -> None:
        """Until nothing has arrived for QUIET s (at most SETTLE s)."""
        seen, since, deadline = -1, time.monotonic(), time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            n = len(self.audit.deliveries)
            if n != seen:
                seen, since = n, time.monotonic()
            elif time.monotonic() - since > QUIET:
                break
            await asyncio.sleep(0.25)

    async def node_stats(self) -> dict[int, dict[str, Any]]:
        out = {}
        for n in range(NODES):
            with contextlib.suppress(Exception):
                status = await self.procs.status(n, timeout=5.0)
                out[n] = dict(status.get("stats", {}))  # type: ignore[call-overload]
        return out

    async def close(self) -> None:
        self.stop.set()
        for t in [*self.tasks, *self.traffic]:
            t.cancel()
        for t in [*self.tasks, *self.traffic]:
            with contextlib.suppress(BaseException):
                await t
        for c in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)
        self.procs.stop()
