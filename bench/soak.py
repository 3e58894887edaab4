"""Soak: a 3-node cluster of real processes under steady mixed traffic for
minutes, one node drained and re-joined midway, every pair audited at the end.

Run as ``flock /tmp/bench.lock .venv/bin/python bench/soak.py [--minutes M]
[--warmup W] [--rate R] [--keyed-rate K] [--logs DIR]`` (the lock: never two
benchmarks at once on the machine).  Default: 10 minutes.

What it does:

1. **Cluster.**  Three ``overlay node`` processes (``overlay.testing.NodeProcesses``)
   of a generated config: balancing on, slices of ``--slice`` s, the failure
   settings' defaults; TLS on every port with development certificates
   (``overlay.testing.dev_tls``: peers authenticated by their certificates,
   clients verifying the nodes, the admin endpoint over HTTPS); and
   ``[auth]``: every client presents a token signed with the run's own
   Ed25519 key (``overlay.auth``), with only the roles it needs — publishers
   ``publish``, subscribers ``subscribe``, the operator ``admin`` for the
   drain.  ``--no-tls``: plain TCP, peers proving a secret (the run says so).
2. **Traffic**, all of it through ``AgentClient``s (each connected to every
   node, as a real client of a 3-node cluster is):

   * *load*: 400 price ranges with a ``venue`` no event has, on one access
     node each — the matcher tests them (SPEC §5's load, so balancing has
     something to balance) but nothing is notified;
   * *plain*: ``--rate`` events/s from 16 publishing tasks, each waiting for
     its PubAck, 70 % of the prices in [0, 200] (``skewed_price``);
   * *ordered*: ``--keyed-rate`` events/s over ``--keys`` lanes, each
     publishing one key's ranks 1…``--ranks`` in order (``Publish.key`` and
     ``rank``), then the next key (a key is an order id: a short life);
   * *bands*: 8 price bands tiling [0, 1000], each held on two access nodes
     (``AgentClient`` failover): every event is delivered to one band;
   * *group*: 3 instances of group ``workers`` on ``sym = "A"`` (half the
     events), one client each;
   * *churn*: ``--churn`` lanes, each subscribing a random price range,
     keeping it 3–10 s, unsubscribing, and again.

3. **Drain and re-join.**  At ``--drain-at`` of the run, node 2 is drained
   (``POST /drain`` with an admin token: its channels move to the others,
   its clients are told to go), stopped cleanly (SIGTERM) ``--stop-after``
   s after the drain answered (an operator's pause: its clients try to come
   back meanwhile), left down ``--down`` s, and started again: it joins the
   running cluster empty and takes load back through balancing.
4. **Every minute** (``--every``): events/s (PubAck'ed in the interval),
   deliveries/s (handed to the application), p99 publish→delivery of those
   deliveries, RSS and open file descriptors of every node process (from
   ``/proc``), and what happened (drain, stop, start).
5. **At the end**, once nothing more arrives: the audit of every (event,
   receiver) pair (``overlay.testing.Audit``) — bands and churned
   subscriptions exactly once for acknowledged pairs (a churned one is owed
   what was PubAck'ed before it asked to unsubscribe), the group: each event
   to exactly one instance, and every key's ranks in order at every receiver.

Targets: no loss; no duplicate; keys in order; per node process, RSS and
descriptors flat within 10 % after warm-up (``--warmup`` minutes from the
process's start: the first sample after it is the baseline, every later one
within ±10 % of it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
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
    Verdict,
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
FLAT: Final = 0.10  # RSS and descriptors within ±10 % of the baseline after warm-up
QUIET: Final = 5.0  # s without a delivery after publishing: nothing more is coming
SETTLE: Final = 60.0
DRAIN_TIMEOUT: Final = 120.0
TOKEN_MARGIN: Final = 3600.0  # tokens outlive the run: no session ends on its token here
BENCH_NICE: Final = -10
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


# -- the report -------------------------------------------------------------------------------


def show(measure: str, value: int) -> str:
    return f"{value / MB:.1f} MB" if measure == "rss" else str(value)


def flatness(soak: Soak, warmup: float) -> dict[str, list[str]]:
    """Per node process, per measure: the baseline (first sample ``warmup`` s
    after the process started) and the worst later deviation; failures named."""
    rows: dict[str, list[str]] = {"rss": [], "fds": [], "failed": []}
    for n, runs in sorted(soak.starts.items()):
        for k, (started, pid) in enumerate(runs):
            mine = [(s.t + soak.timeline.start, s.nodes[n]) for s in soak.samples if s.nodes[n] is not None]
            after = [x for t, x in mine if x is not None and x.pid == pid and t >= started + warmup]
            what = f"node {n}" + (f" (run {k + 1})" if len(runs) > 1 else "")
            if len(after) < 2:
                rows["rss"].append(f"{what}: fewer than 2 samples after warm-up")
                rows["fds"].append(f"{what}: fewer than 2 samples after warm-up")
                continue
            for measure in ("rss", "fds"):
                values_ = [getattr(x, measure) for x in after]
                base = values_[0]
                worst = max(values_, key=lambda v: abs(v - base))
                dev = (worst - base) / base if base else math.inf
                ok = abs(dev) <= FLAT
                rows[measure].append(
                    f"{what}: {show(measure, base)} → worst {show(measure, worst)} ({dev:+.1%}), "
                    f"last {show(measure, values_[-1])} "
                    f"over {len(values_)} samples {'ok' if ok else 'NOT FLAT'}"
                )
                if not ok:
                    rows["failed"].append(f"{what} {measure}")
    return rows


def breakdown(soak: Soak, verdict: Verdict) -> list[str]:
    """The lost and duplicated pairs by receiver kind, keyed or not, and by
    whether their event was published during the drain/re-join window."""
    tl = soak.timeline
    lo = tl.drain or math.inf
    hi = (tl.ready or tl.started or tl.stopped or tl.drained or lo) + 5.0
    out = []
    for kind, pairs in (("lost", verdict.lost_pairs), ("duplicated", verdict.duplicated_pairs)):
        counts: dict[str, int] = {}
        for receiver, qty in pairs:
            ev = soak.audit.events[qty]
            who = "group" if receiver == GROUP else "band" if receiver.startswith("band") else "churn"
            window = "in the drain/re-join window" if lo <= ev.started <= hi else "outside it"
            resent = "re-sent by the publisher's agent" if soak.attempts[qty] > 1 else "sent once"
            label = f"{who}, {'keyed' if ev.key else 'plain'} event {resent}, {window}"
            counts[label] = counts.get(label, 0) + 1
        out += [f"{kind}: {n} — {label}" for label, n in sorted(counts.items())]
    return out


def report(soak: Soak, verdict: Verdict, stats: dict[int, dict[str, Any]]) -> bool:
    args = soak.args
    audit = soak.audit
    tl = soak.timeline
    events = audit.events.values()
    acked = sum(1 for e in events if e.acked < math.inf)
    keyed = sum(1 for e in events if e.key)
    keyed_acked = sum(1 for e in events if e.key and e.acked < math.inf)
    owed = audit.owed()
    by_kind: dict[str, int] = {}
    for receiver, _ in owed:
        kind = "group" if receiver == GROUP else "bands" if receiver.startswith("band") else "churn"
        by_kind[kind] = by_kind.get(kind, 0) + 1
    lat = [x for _, x in audit.latencies]
    print()
    print("audit:")
    print(
        f"  events published {len(audit.events):,} ({keyed:,} keyed), PubAck'ed {acked:,} ({keyed_acked:,} keyed), "
        f"failed {len(audit.failed):,}"
    )
    print(
        f"  acknowledged pairs {verdict.expected:,} (bands {by_kind.get('bands', 0):,}, group "
        f"{by_kind.get('group', 0):,}, churn {by_kind.get('churn', 0):,}), delivered {verdict.delivered:,}; "
        f"{len(audit.deliveries):,} deliveries in all"
    )
    print(f"  churned subscriptions {soak.churned} ({len(soak.churn_failures)} subscribes failed)")
    resent = sum(1 for n in soak.attempts.values() if n > 1)
    print(f"  events the publishers' agents sent more than once (a PubAck late: AgentClient rule 3): {resent:,}")
    errors = ", ".join(f"{code} ×{n}" for code, n in soak.client_errors.most_common()) or "none"
    print(f"  errors the clients were told (error_cb): {errors}")
    print(
        "  p50/p99/max publish→delivery over the run: "
        + "/".join(
            "—" if x is None else f"{x * 1000:.1f}" for x in (pct(lat, 50), pct(lat, 99), max(lat, default=None))
        )
        + " ms"
    )
    for line in str(verdict).splitlines():
        print(f"  {line[:600]}")
    for line in breakdown(soak, verdict):
        print(f"  {line}")
    for why in sorted(set(audit.failed.values()))[:5]:
        print(f"  a publish failed: {why[:200]}")
    for why in soak.churn_failures[:5]:
        print(f"  a churn subscribe failed: {why[:200]}")
    for why in soak.lane_errors:
        print(f"  {why}")
    if tl.drain:
        d = tl.summary
        print(
            f"drain of node {DRAINED}: "
            + (
                f"FAILED ({tl.failure})"
                if tl.failure
                else f"{(tl.drained or 0) - tl.drain:.1f}s, {d.get('channels_moved')} channels and "
                f"{d.get('subscriptions_moved')} subscriptions moved; down {args.down:g}s; ready again "
                f"{(tl.ready or 0) - (tl.started or 0):.1f}s after its start"
            )
        )
    interesting = (
        "slow_consumer",
        "choke",
        "unroutable",
        "undeliverable",
        "resen",
        "seq_",
        "group_",
        "rejected",
        "dropped",
    )
    for n, st in sorted(stats.items()):
        picked = {k: v for k, v in sorted(st.items()) if v and any(w in k for w in interesting)}
        print(f"node {n} counters: " + (", ".join(f"{k}={v}" for k, v in picked.items()) or "—"))
    for n in range(NODES):
        log = soak.procs.log(n)
        tracebacks, errors = log.count("Traceback"), sum(1 for x in log.splitlines() if " ERROR " in x)
        if tracebacks or errors:
            print(f"node {n} logged {tracebacks} tracebacks and {errors} ERROR lines (see --logs)")
    warm = args.warmup * 60.0
    flat = flatness(soak, warm)
    print()
    print(f"RSS and descriptors after warm-up ({args.warmup:g} min from each process's start), baseline → worst:")
    for line in flat["rss"]:
        print(f"  RSS {line}")
    for line in flat["fds"]:
        print(f"  fds {line}")
    print()
    loss = not verdict.lost
    dup = not verdict.duplicated
    order = not verdict.disordered
    other = not (verdict.wrong or verdict.unknown or verdict.ended) and not tl.failure and not soak.lane_errors
    rss_ok = not any(f.endswith("rss") for f in flat["failed"]) and bool(flat["rss"])
    fds_ok = not any(f.endswith("fds") for f in flat["failed"]) and bool(flat["fds"])
    rows = [
        ("no loss (acknowledged pairs)", loss, f"{len(verdict.lost)} lost"),
        ("no duplicate", dup, f"{len(verdict.duplicated)} duplicated"),
        ("per-key order", order, f"{len(verdict.disordered)} out of order"),
        ("nothing else wrong", other, "wrong/unknown/ended, the drain, the lanes"),
        (
            f"RSS flat within {FLAT:.0%} after warm-up",
            rss_ok,
            ", ".join(f for f in flat["failed"] if f.endswith("rss")),
        ),
        (
            f"descriptors flat within {FLAT:.0%} after warm-up",
            fds_ok,
            ", ".join(f for f in flat["failed"] if f.endswith("fds")),
        ),
    ]
    print("targets:")
    for name, ok, detail in rows:
        print(f"  {name:<42} {'met' if ok else 'NOT MET'}   {detail}")
    return all(ok for _, ok, _ in rows)


async def main_async(args: argparse.Namespace, workdir: Path) -> bool:
    soak = Soak(args, workdir)
    try:
        await soak.run()
        stats = await soak.node_stats()
        verdict = soak.audit.verdict()
        if args.dump:
            tl = soak.timeline
            extra = {
                "timeline": vars(tl),
                "attempts": {q: n for q, n in soak.attempts.items() if n > 1},
                "churn_homes": soak.churn_homes,
            }
            args.dump.write_text(json.dumps(soak.audit.dump() | extra))
        return report(soak, verdict, stats)
    finally:
        await soak.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the traffic (default 10)")
    ap.add_argument(
        "--warmup", type=float, default=2.0, help="minutes from a process's start before flatness counts (default 2)"
    )
    ap.add_argument("--every", type=float, default=60.0, help="seconds between two samples (default 60)")
    ap.add_argument("--rate", type=float, default=200.0, help="plain events/s (default 200)")
    ap.add_argument("--keyed-rate", type=float, default=40.0, help="keyed events/s over all keys (default 40)")
    ap.add_argument("--keys", type=int, default=8, help="keys published at a time (default 8)")
    ap.add_argument("--ranks", type=int, default=20, help="events per key (default 20)")
    ap.add_argument("--churn", type=int, default=4, help="subscription churn lanes (default 4)")
    ap.add_argument("--max-events", type=int, default=0, help="at most this many plain events (default: rate × length)")
    ap.add_argument(
        "--drain-at", type=float, default=0.4, help="when node 2 is drained, as a fraction of the run (default 0.4)"
    )
    ap.add_argument(
        "--stop-after", type=float, default=2.0, help="seconds from the drain's answer to the node's stop (default 2)"
    )
    ap.add_argument("--down", type=float, default=10.0, help="seconds the drained node stays stopped (default 10)")
    ap.add_argument("--slice", type=float, default=1.0, help="T in seconds (default 1)")
    ap.add_argument("--no-tls", action="store_true", help="plain TCP instead of TLS (tokens still on)")
    ap.add_argument("--logs", type=Path, help="copy the nodes' logs into this directory")
    ap.add_argument("--capture", type=Path, help="every node captures its traffic into this directory (SPEC §13)")
    ap.add_argument("--dump", type=Path, help="write everything the audit saw to this JSON file (a post-mortem)")
    args = ap.parse_args()
    for name in ("minutes", "every", "rate", "keyed_rate", "slice"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.keys < 1 or args.ranks < 1 or min(args.churn, args.down, args.stop_after) < 0 or not 0 < args.drain_at < 1:
        ap.error("--keys and --ranks ≥ 1, --churn, --down and --stop-after ≥ 0, 0 < --drain-at < 1")
    with contextlib.suppress(OSError):
        os.nice(BENCH_NICE)
    # The clients' reconnections (node 2 refusing them while it is drained, then
    # down) would break the table: what the nodes told them is counted instead (error_cb).
    logging.getLogger("overlay.client").setLevel(logging.ERROR)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        t0 = time.monotonic()
        try:
            ok = runner(main_async(args, Path(tmp)))
        finally:
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.logs / log.name)
        print(f"\n(run in {time.monotonic() - t0:.0f} s)")
        print("targets met" if ok else "TARGET MISSED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
