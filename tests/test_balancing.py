"""Balancing on real nodes: exactly-once across migrations, convergence, rollback.

Integration tests (STYLE habit 10): every test starts real ``Node``s on
127.0.0.1 in this process, on ephemeral ports bound before the nodes start,
and drives them with real ``Client``s.  Slices are short (T = 0.3–0.4 s) and
the scheduling probability is 1, so natural splits and migrations happen
within a few seconds (SPEC §6, §8).

What each test checks:

* ``test_exactly_once_across_migrations`` — SPEC §8.2's invariant under
  sustained publishing, subscription churn, forced moves (admin split/place)
  and natural ones: every (event, matching subscription) that was SubAck'ed
  before the publish started and not unsubscribed before its PubAck is
  delivered exactly once; nothing is ever delivered twice, nor to a filter it
  does not match, nor after the UnsubAck; once quiet, every live subscription
  is stored in exactly the channels it belongs to and unsubscribed ones
  nowhere.
* ``test_converges_from_the_initializer`` — S/dc̄ (SPEC §5) falls below
  ``SPREAD_TARGET`` within a bounded number of slices and stays there, with
  few migrations afterwards (no oscillation).
* ``test_heterogeneous_capacities_converge`` — the same with capacities
  1, 2, 1, 4, 2: load *levels* converge while loads differ.
* ``test_failure_mid_session_rolls_back`` — a receiver that stops answering
  after ChannelTransfer (before answering it, and after answering it): the
  sender times out, rolls back to its tables of <1>, keeps serving the
  channel, and subscribers on the surviving nodes lose nothing.

S/dc̄ is computed from the nodes' journal ``slice`` entries: at the end of
each slice of the initializer, every node's latest slice entry.
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Self

import msgspec
import pytest

from overlay.channels import parse_subscription
from overlay.channels.channel import ChannelId
from overlay.channels.predicates import Filter
from overlay.client import Client
from overlay.config import NodeConfig, load_config
from overlay.errors import RequestError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.net.node import Node
from loopback import listening_socket, wait_until as until

CONFIGS: Final = Path(__file__).resolve().parent.parent / "cluster_configs"
SPREAD_TARGET: Final = 0.10
# A slice whose cluster-wide load is this far off the steady offered load saw
# the test process stall (or catch up); S/dc̄ is not judged on it.
STALL: Final = 0.25
# Nodes close their slices at the same instants of the clock, each on its
# next tick (overlay.net.node ticks every 50 ms), give or take loop lag.
TICK: Final = 0.1
GOLDEN: Final = 0.6180339887498949
# Generous: a notification queue must never overflow in these tests.
QUEUE: Final = 1_000_000


# -- a cluster in this process --------------------------------------------------------


class Cluster:
    """Real nodes on loopback, each on a socket bound before it starts."""

    def __init__(self, config: str, capacities: Iterable[float] | None = None, **settings: Any) -> None:
        cfg = load_config(CONFIGS / config)
        cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, **settings))
        caps = list(capacities) if capacities is not None else [n.capacity for n in cfg.nodes]
        self.socks: list[socket.socket] = []
        nodes = []
        for n, cap in zip(cfg.nodes, caps):
            s = listening_socket()
            self.socks.append(s)
            nodes.append(NodeConfig(n.id, "127.0.0.1", s.getsockname()[1], 0, cap))
        self.config = cfg.with_nodes(tuple(nodes))
        self.schema = self.config.schema
        self.nodes = {n.id: Node(self.config, n.id, sock=s) for n, s in zip(self.config.nodes, self.socks)}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.clients: list[Client] = []
        self.t0 = 0.0

    @property
    def ids(self) -> list[int]:
        return list(self.nodes)

    def addr(self, node: int) -> tuple[str, int]:
        n = self.config.node(node)
        return (n.host, n.port)

    async def __aenter__(self) -> Self:
        for i, n in self.nodes.items():
            self.tasks[i] = asyncio.create_task(n.run(), name=f"node-{i}")
        await until(lambda: all(n.core.ready for n in self.nodes.values()), 10, "cluster ready")
        self.t0 = time.time()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self.clients:
            await c.close()
        for i in self.ids:
            self.stop_node(i)
        await asyncio.wait_for(asyncio.gather(*self.tasks.values(), return_exceptions=True), 15)

    def stop_node(self, node: int) -> None:
        self.nodes[node].stop()

    async def client(self, node: int, name: str) -> Client:
        c = await Client([self.addr(node)], client_id=name, reconnect=False).connect()
        self.clients.append(c)
        return c

    def core(self, node: int) -> Any:
        return self.nodes[node].core

    def journal(self, kind: str, nodes: Iterable[int] | None = None) -> list[dict[str, Any]]:
        out = [e for i in (nodes or self.ids) for e in self.core(i).journal if e["kind"] == kind]
        return sorted(out, key=lambda e: e["time"])

    def stat(self, key: str) -> int:
        return sum(self.core(i).stats.get(key, 0) for i in self.ids)

    def busy(self) -> bool:
        return any(
            any(m.active for m in self.core(i).outgoing.values()) or self.core(i).incoming or self.core(i)._pending
            for i in self.ids
        )

    def settled(self, nodes: Iterable[int] | None = None) -> bool:
        ids = list(nodes or self.ids)
        first = self.core(ids[0]).routing
        quiet = all(
            not len(self.nodes[i].inbox) and all(not len(l.queue) for l in self.nodes[i].links.values() if l.peer.id in ids)
            for i in ids
        )
        return quiet and not self.busy() and all(self.core(i).routing == first for i in ids)

    def spread_series(self, nodes: Iterable[int] | None = None) -> list[tuple[float, float, list[float]]]:
        """``(time since start, S/dc̄, dc per node)`` at the end of each slice of
        the initializer, with what every node reported last by then.  Slices
        close on a common grid, to a tick (``TICK``); a node whose T is
        stretched (anti-jitter) reports less often, so its last report may be
        up to one of its slices old."""
        ids = list(nodes or self.ids)
        ref = self.config.cluster.initializer
        per = {i: self.journal("slice", [i]) for i in ids}
        out = []
        for e in per[ref]:
            dcs = []
            for i in ids:
                prior = [x for x in per[i] if x["time"] <= e["time"] + TICK]
                if not prior or e["time"] - prior[-1]["time"] > prior[-1]["slice_seconds"] + TICK:
                    break
                dcs.append(prior[-1]["dc"])
            else:
                out.append((e["time"] - self.t0, ratio(dcs), dcs))
        return out


def ratio(dcs: list[float]) -> float:
    """``S / dc̄`` (SPEC §5); 0 when nothing is loaded."""
    n = len(dcs)
    mean = sum(dcs) / n
    if mean <= 0:
        return 0.0
    return (sum((d - mean) ** 2 for d in dcs) / n) ** 0.5 / mean




# -- traffic -------------------------------------------------------------------------------


def skewed_price(k: int, offset: float = 0.0, hot: tuple[float, float] = (0.0, 200.0)) -> float:
    """70 % of events in the hot range, 30 % over the whole domain; a
    golden-ratio sequence, so the load per slice is smooth, not noisy."""
    u = (offset + k * GOLDEN) % 1.0
    lo, hi = hot
    if u < 0.7:
        return round(lo + (hi - lo) * u / 0.7, 3)
    return round(1000.0 * (u - 0.7) / 0.3, 3)


def range_subscriptions(n: int, seed: int, venue: str | None = None) -> list[str]:
    """Price ranges; with ``venue``, a pattern no event matches: the matcher
    still tests them (they are load, SPEC §5) but nothing is notified, which
    keeps these in-process runs cheap enough to measure steady slices."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lo = rng.uniform(0, 900)
        expr = f"price >= {lo:.1f} and price < {min(1000.0, lo + rng.uniform(30, 300)):.1f}"
        out.append(expr if venue is None else f'{expr} and venue prefix "{venue}"')
    return out


async def publish_at_rate(client: Client, rate: float, seconds: float, make: Callable[[int], dict[str, Any]]) -> int:
    """Publish ``make(k)`` at a fixed rate (pipelined), then wait for every PubAck."""
    start = time.time()
    k = 0
    while (elapsed := time.time() - start) < seconds:
        due = int(elapsed * rate)
        while k < due:
            await client.publish_windowed(make(k))
            k += 1
        await asyncio.sleep(0.005)
    await client.flush(timeout=30)
    return k


# -- test 1: exactly once ------------------------------------------------------------------


@dataclass
class _Sub:
    client: int
    sub_id: str
    expression: str
    filter: Filter
    started: float
    acked: float = float("inf")
    unsub_started: float = float("inf")
    unsub_acked: float = float("inf")


@dataclass
class _Ledger:
    """What the clients saw, on one clock (``time.time()``, the nodes' clock too)."""

    subs: dict[tuple[int, str], _Sub] = field(default_factory=dict)
    events: dict[int, tuple[dict[str, Any], float, float]] = field(default_factory=dict)  # qty -> (values, start, ack)
    delivered: collections.Counter[tuple[int, str, int]] = field(default_factory=collections.Counter)
    access: dict[int, int] = field(default_factory=dict)  # subscriber client -> its access node
    # (access node, event) -> when a client of that node first received the event.
    first_seen: dict[tuple[int, int], float] = field(default_factory=dict)

    def hook(self, index: int, client: Client, node: int) -> None:
        """Count every Notify at the wire, per listed subscription."""
        inner = client._on_message
        self.access[index] = node

        def on_message(msg: cm.ClientMessage) -> None:
            if type(msg) is cm.Notify:
                qty = msg.event["qty"]
                self.first_seen.setdefault((node, qty), time.time())  # type: ignore[arg-type]
                for sid in msg.sub_ids:
                    self.delivered[(index, sid, qty)] += 1  # type: ignore[index]
            inner(msg)

        client._on_message = on_message  # type: ignore[method-assign]

    def expected(self, s: _Sub, qty: int, start: float) -> bool:
        """Must ``s`` get event ``qty`` exactly once?

        Subscribe side: SubAck'ed before the publish started (the SubAck
        means every channel holding ``s`` applied it).  Unsubscribe side: the
        access node stops forwarding a subscription's notifications when it
        handles the Unsubscribe, and a PubAck only says the event was routed,
        not matched — so "PubAck before the unsubscribe" is not a sound
        boundary.  Sound: a client of the same access node received the event
        before the unsubscribe started.  The owner sends that node one
        Notification per event listing every match there, so ``s`` was in it.
        """
        if not s.acked < start:
            return False
        if s.unsub_started == float("inf"):
            return True
        seen = self.first_seen.get((self.access[s.client], qty))
        return seen is not None and seen < s.unsub_started

    def violations(self) -> tuple[list[str], int, int]:
        """Breaches of the §8.2 invariant; the pairs checked exactly; and the
        pairs that the PubAck boundary would have required but were not delivered."""
        bad: list[str] = []
        exact = 0
        undelivered_in_window = 0
        events = sorted(self.events.items())
        seen_pairs = set()
        for (ci, sid), s in self.subs.items():
            for qty, (values, start, ack) in events:
                n = self.delivered.get((ci, sid, qty), 0)
                if n:
                    seen_pairs.add((ci, sid, qty))
                if not s.filter.matches(values):
                    if n:
                        bad.append(f"event {qty} {values} delivered {n}x to {ci}/{sid} ({s.expression}) it does not match")
                    continue
                if self.expected(s, qty, start):
                    exact += 1
                    if n != 1:
                        bad.append(f"event {qty} {values} delivered {n}x to {ci}/{sid} ({s.expression}), expected once")
                elif n > 1:
                    bad.append(f"event {qty} delivered {n}x to {ci}/{sid} (in-flight window)")
                elif n and start > s.unsub_acked:
                    bad.append(f"event {qty} published after the UnsubAck of {ci}/{sid} was delivered to it")
                elif not n and s.acked < start and ack < s.unsub_started:
                    undelivered_in_window += 1
        stray = set(self.delivered) - seen_pairs
        bad += [f"delivery {k} names no known subscription or event" for k in sorted(stray)[:5]]
        return bad, exact, undelivered_in_window


def _sub_expression(rng: random.Random) -> str:
    lo = rng.uniform(0, 950)
    hi = min(1000.0, lo + rng.uniform(10, 250))
    sym = rng.choice("ABCD")
    match rng.randrange(5):
        case 0:
            return f"price >= {lo:.1f} and price < {hi:.1f}"
        case 1:
            return f'price >= {lo:.1f} and price <= {hi:.1f} and sym = "{sym}"'
        case 2:
            return f'sym = "{sym}" and qty < {rng.randrange(20_000)}'
        case 3:
            return f"price > {lo:.1f} and price < {hi:.1f} and qty >= {rng.randrange(20_000)}"
        case _:
            return f'sym in {{"{sym}", "{rng.choice("ABCD")}"}} and price < {hi:.1f}'


async def test_exactly_once_across_migrations() -> None:
    EVENTS = 20_000
    RATE = 2_500  # events/s over all publishers: the run lasts 8 s, ~20 slices
    WORKERS = 12  # concurrent publish() calls per publisher
    rng = random.Random(20240611)
    async with Cluster("local.toml", slice_seconds=0.4, probability=1.0, peer_timeout=5.0) as cl:
        ids = cl.ids
        led = _Ledger()
        subscribers: list[Client] = []
        for k in range(2 * len(ids)):  # two subscriber clients per node
            c = await cl.client(ids[k % len(ids)], f"sub-{k}")
            led.hook(k, c, ids[k % len(ids)])
            subscribers.append(c)
        publishers = [await cl.client(i, f"pub-{i}") for i in ids]
        admin = await cl.client(cl.config.cluster.initializer, "admin")
        sub_seq = iter(range(1_000_000))

        async def subscribe(ci: int) -> None:
            expr = _sub_expression(rng)
            sid = f"s{next(sub_seq)}"
            s = _Sub(ci, sid, expr, parse_subscription(expr, cl.schema), time.time())
            led.subs[(ci, sid)] = s
            await subscribers[ci].subscribe(expr, sub_id=sid, queue_size=QUEUE)
            s.acked = time.time()

        async def unsubscribe(ci: int, sid: str) -> None:
            s = led.subs[(ci, sid)]
            s.unsub_started = time.time()
            await subscribers[ci].unsubscribe(sid)
            s.unsub_acked = time.time()

        await asyncio.gather(*(subscribe(k % len(subscribers)) for k in range(40)))

        next_event = iter(range(EVENTS))
        published = 0

        def make_event(k: int) -> dict[str, Any]:
            hot = (0.0, 200.0) if k < EVENTS // 2 else (600.0, 800.0)  # the hot spot moves halfway
            return {"price": skewed_price(k, hot=hot), "sym": "ABCD"[k * 7 % 4] if k % 3 else "A", "qty": k}

        begin = time.time()

        async def publisher(c: Client) -> None:
            nonlocal published
            for k in next_event:
                ev = make_event(k)
                if (wait := begin + k / RATE - time.time()) > 0:
                    await asyncio.sleep(wait)
                start = time.time()
                await c.publish(ev)
                led.events[k] = (ev, start, time.time())
                published += 1

        async def churn() -> None:
            """Subscribe and unsubscribe all along, so some land mid-migration."""
            while published < EVENTS - 500:
                ci = rng.randrange(len(subscribers))
                live = [s.sub_id for s in led.subs.values() if s.client == ci and s.unsub_started == float("inf") and s.acked < float("inf")]
                if live and rng.random() < 0.45:
                    await unsubscribe(ci, rng.choice(live))
                else:
                    await subscribe(ci)
                await asyncio.sleep(rng.uniform(0.005, 0.03))

        forced = {"split": 0, "place": 0, "refused": 0}

        async def force() -> None:
            """Admin splits and placements at chosen points of the run."""
            marks = [EVENTS * f // 10 for f in (1, 2, 3, 5, 6, 8)]
            for mark in marks:
                await until(lambda m=mark: published >= m, 30, f"{mark} events published")
                node = max(ids, key=lambda i: cl.core(i).local.load or len(cl.core(i).local))
                chans = [ch for ch in cl.core(node).local if ch.last.events > 2]
                if not chans:
                    continue
                ch = max(chans, key=lambda c: c.last.load)
                prices = sorted(r.point[ch.last.priority.index("price")] for r in ch.last.records())
                at = prices[len(prices) // 2]
                c = await cl.client(node, f"admin-{mark}")
                try:
                    await c.admin("split", channel=str(ch.id), attr="price", at=at)
                    forced["split"] += 1
                    target = min((i for i in ids if i != node), key=lambda i: cl.core(i).local.load)
                    mine = sorted(cl.core(node).local, key=lambda x: -x.last.load)
                    if mine:
                        await c.admin("place", channel=str(mine[-1].id), node=target)
                        forced["place"] += 1
                except RequestError as exc:  # the channel moved or is moving: the balancer got there first
                    forced["refused"] += 1
                    assert exc.code == cm.ErrorCode.ADMIN, exc

        await asyncio.gather(*(publisher(p) for p in publishers for _ in range(WORKERS)), churn(), force())
        assert published == EVENTS

        # Quiet: every delivery in, no session open, tables settled.
        last = -1
        while last != sum(led.delivered.values()):
            last = sum(led.delivered.values())
            await asyncio.sleep(0.5)
        await until(cl.settled, 15, "tables to settle")

        migrations = cl.journal("migration")
        natural = [m for m in migrations if not m["forced"]]
        assert forced["split"] >= 3 and forced["place"] >= 2, forced
        assert len(natural) >= 2, f"expected natural migrations, journal has {len(migrations)} ({forced})"
        assert cl.stat("reforwards") > 0, "no Reforward happened: no event crossed a migration"
        assert cl.stat("slow_consumer_drops") == 0

        bad, exact, window = led.violations()
        assert not bad, f"{len(bad)} violations, e.g.:\n" + "\n".join(bad[:20])
        assert exact > EVENTS, exact  # the expected set is not trivially small
        print(
            f"exactly-once pairs {exact}; unsubscribed after PubAck but before delivery: {window}; "
            f"migrations {len(natural)} natural + {len(migrations) - len(natural)} forced; forced {forced}; "
            f"splits {cl.stat('splits')}, merges {cl.stat('merges')}, reforwards {cl.stat('reforwards')}, "
            f"subscriptions {len(led.subs)}, unsubscribed {sum(s.unsub_started < float('inf') for s in led.subs.values())}"
        )

        # No subscription lost or resurrected: each live one in exactly its channels.
        _check_subscription_placement(cl, led, subscribers)
        await _check_status(cl, admin)


def _check_subscription_placement(cl: Cluster, led: _Ledger, subscribers: list[Client]) -> None:
    routing = cl.core(cl.ids[0]).routing
    stored: dict[tuple[str, str], set[ChannelId]] = collections.defaultdict(set)
    for i in cl.ids:
        core = cl.core(i)
        for ch in core.local:
            entry = routing.get(ch.id)
            assert entry is not None and i in entry.owners, (
                f"node {i} holds {ch.id} ({len(ch)} subscriptions), routed to {entry and entry.owners}"
            )
            for sub in ch:
                stored[(sub.subscriber, sub.id.split(":")[2])].add(ch.id)
    for chid, entry in routing.items():
        for owner in entry.owners:
            assert chid in cl.core(owner).local, f"{chid} is routed to node {owner}, which does not hold it"
    for (ci, sid), s in led.subs.items():
        key = (subscribers[ci].client_id, sid)
        if s.unsub_started < float("inf"):
            assert not stored.get(key), f"unsubscribed {key} resurrected in {stored[key]}"
        else:
            want = set(routing.lookup_subscription(s.filter))
            assert stored.get(key, set()) == want, f"{key} ({s.expression}) stored in {stored.get(key)}, belongs to {want}"


async def _check_status(cl: Cluster, admin: Client) -> None:
    """The operator's view agrees: one routing table, channels where it says.
    (Idle channels merge once traffic stops, so a view taken while an update
    is on its way is taken again.)"""
    clients = [await cl.client(i, f"status-{i}") for i in cl.ids]
    for _ in range(10):
        await until(cl.settled, 15, "tables to settle")
        views = await asyncio.gather(*(c.admin("status") for c in clients))
        tables = [v["routing"] for v in views]
        if all(t == tables[0] for t in tables):
            break
    assert all(t == tables[0] for t in tables), "routing tables differ once quiet"
    owners = {r["id"]: set(r["owners"]) for r in tables[0]}
    held: dict[str, set[int]] = collections.defaultdict(set)
    for v in views:
        for ch in v["channels"]:
            held[ch["id"]].add(v["node"])
    assert held == owners, f"channels held {dict(held)} differ from the routing table {owners}"


# -- tests 2 and 3: convergence ------------------------------------------------------------


@dataclass
class _Run:
    series: list[tuple[float, float, list[float]]]  # (time, S/dc̄, dc per node) per slice
    migrations: list[dict[str, Any]]  # natural ones, times relative to the start
    settled_at: int  # index of the first slice with the offered load steady
    converged_at: int | None  # index from which S/dc̄ stays below SPREAD_TARGET
    loads: list[float]  # d per node in the last slice


async def _converge(config: str, *, rate: float, seconds: float, slice_seconds: float, capacities: list[float] | None = None) -> _Run:
    """All channels start on the initializer; skewed traffic at a fixed rate
    from a publisher on every node, range subscriptions on every node."""
    async with Cluster(config, capacities, slice_seconds=slice_seconds, probability=1.0) as cl:
        ids = cl.ids
        subs = [await cl.client(i, f"sub-{i}") for i in ids]
        exprs = range_subscriptions(20, seed=7) + range_subscriptions(240, seed=8, venue="zz")
        await asyncio.gather(*(subs[k % len(subs)].subscribe(e, queue_size=QUEUE) for k, e in enumerate(exprs)))
        pubs = [await cl.client(i, f"pub-{i}") for i in ids]
        start = time.time() - cl.t0

        def maker(i: int) -> Callable[[int], dict[str, Any]]:
            # Each publisher walks its own stretch of the golden-ratio sequence.
            return lambda k: {"price": skewed_price(k, offset=i / len(ids)), "sym": "A", "qty": k % 100_000, "venue": "x"}

        await asyncio.gather(*(publish_at_rate(p, rate / len(pubs), seconds, maker(i)) for i, p in enumerate(pubs)))
        stop = time.time() - cl.t0
        await asyncio.sleep(0.05)
        # Whole slices of steady traffic only: from the first with traffic on
        # every publisher to the last that ended before publishing stopped.
        series = [s for s in cl.spread_series() if start + slice_seconds < s[0] <= stop]
        caps = [cl.config.node(i).capacity for i in ids]
        totals = [sum(d * c for d, c in zip(s[2], caps)) for s in series]
        steady = sorted(totals)[len(totals) // 2]
        settled_at = next(k for k, t in enumerate(totals) if t >= (1 - STALL) * steady)
        # A slice whose total load is off the offered one by more than STALL
        # is this process stalling (every node and client share one loop on
        # a shared machine), not balancing: it is shown, not judged.
        judged = [k for k, t in enumerate(totals) if abs(t - steady) <= STALL * steady]
        converged_at = None
        for k in reversed(judged):
            if series[k][1] >= SPREAD_TARGET:
                break
            converged_at = k
        migrations = [
            m | {"time": m["time"] - cl.t0} for m in cl.journal("migration") + cl.journal("replication") if not m["forced"]
        ]
        last = {i: cl.journal("slice", [i])[-1]["d"] for i in ids}
        for k, (t, r, dcs) in enumerate(series):
            print(f"{t:6.2f}s  S/dc̄ {r:5.3f}  dc {[round(x) for x in dcs]}" + ("" if k in judged else "  (stall: not judged)"))
        print(f"settled at slice {settled_at}, converged at {converged_at}; migrations at {[round(m['time'], 2) for m in migrations]}")
        return _Run(series, migrations, settled_at, converged_at, [last[i] for i in ids])


async def test_converges_from_the_initializer() -> None:
    run = await _converge("local.toml", rate=1_000, seconds=10.0, slice_seconds=0.4)
    ratios = [round(s[1], 3) for s in run.series]
    assert run.converged_at is not None, f"S/dc̄ never stayed below {SPREAD_TARGET}: {ratios}"
    assert run.converged_at - run.settled_at <= 12, f"converged {run.converged_at - run.settled_at} slices after the load settled: {ratios}"
    assert len(run.series) - run.converged_at >= 8, f"converged too late to see it stay: {ratios}"
    assert run.migrations, "no migration happened"
    _assert_no_oscillation(run, nodes=3)


async def test_heterogeneous_capacities_converge() -> None:
    caps = [1.0, 2.0, 1.0, 4.0, 2.0]  # hetero5's
    run = await _converge("hetero5.toml", rate=1_000, seconds=14.0, slice_seconds=0.4, capacities=caps)
    ratios = [round(s[1], 3) for s in run.series]
    assert run.converged_at is not None, f"S/dc̄ never stayed below {SPREAD_TARGET}: {ratios}"
    assert run.converged_at - run.settled_at <= 20, f"converged {run.converged_at - run.settled_at} slices after the load settled: {ratios}"
    assert len(run.series) - run.converged_at >= 5, f"converged too late to see it stay: {ratios}"
    # Levels converge while the loads themselves differ, roughly with capacity.
    assert max(run.loads) >= 2.5 * min(run.loads), run.loads
    _assert_no_oscillation(run, nodes=5)


def _assert_no_oscillation(run: _Run, nodes: int) -> None:
    """After convergence S/dc̄ stays below the target (asserted by the caller);
    the few moves that still fine-tune it must not ping-pong: no channel goes
    back to a node it left (a hand-on, A→B→C, is fine-tuning), and there are no
    more of them than nodes."""
    after = sorted((m for m in run.migrations if m["time"] > run.series[run.converged_at][0]), key=lambda m: m["time"])
    left: dict[str, set[int]] = {}
    for m in after:
        for c in m["channels"]:
            assert m["receiver"] not in left.get(c, ()), f"oscillation: {c} moved back to node {m['receiver']}: {after}"
            left.setdefault(c, set()).add(m["node"])
    assert len(after) <= nodes, f"oscillation: {len(after)} migrations after convergence"


# -- test 4: a failure in mid-session ------------------------------------------------------


async def _place_must_abort(admin: Client, channel: str, node: int, timeout: float) -> None:
    try:
        await admin.admin("place", channel=channel, node=node, timeout=timeout)
    except RequestError as exc:
        assert "aborted" in str(exc), exc
        return
    raise AssertionError("the move went through")


def _tables(core: Any) -> tuple[Any, ...]:
    """What rollback must restore: the routing table, and each local channel
    with its space and subscriptions."""
    routing = sorted((str(c), e.space.text(core.schema), e.owners) for c, e in core.routing.items())
    local = sorted((str(ch.id), ch.space.text(core.schema), tuple(sorted(s.id for s in ch))) for ch in core.local)
    return tuple(routing), tuple(local)


@pytest.mark.parametrize(
    "failure",
    [
        "silent_after_transfer",
        "dies_after_reply",
    ],
)
async def test_failure_mid_session_rolls_back(failure: str) -> None:
    """A forced move of one channel to node 2; node 2 stops answering once the
    ChannelTransfer reaches it (``silent_after_transfer``: it never answers;
    ``dies_after_reply``: it answers, so the sender is past <2> and
    reforwarding, then the node stops).  Publishing from nodes 0 and 1 goes on
    throughout; their subscribers must lose nothing."""
    TIMEOUT = 1.0
    async with Cluster("local.toml", balancing=False, peer_timeout=TIMEOUT, slice_seconds=0.5) as cl:
        sender, receiver = 0, 2
        admin = await cl.client(sender, "admin")
        await admin.admin("split", channel="0.0", attr="price", at=500.0)
        moving = next(ch for ch in cl.core(sender).local if ch.space.contains({"price": 750.0, "sym": "A"}))
        led = _Ledger()
        subscribers = []
        for k, node in enumerate([0, 1, 0, 1]):
            c = await cl.client(node, f"sub-{k}")
            led.hook(k, c, node)
            subscribers.append(c)
        exprs = ["price >= 600", "price < 400", 'sym = "B"', "price > 100 and price < 900"]
        for k, expr in enumerate(exprs * 2):
            ci = k % len(subscribers)
            sid = f"s{k}"
            s = _Sub(ci, sid, expr, parse_subscription(expr, cl.schema), time.time())
            led.subs[(ci, sid)] = s
            await subscribers[ci].subscribe(expr, sub_id=sid, queue_size=QUEUE)
            s.acked = time.time()

        # The receiver stops answering once ChannelTransfer reaches it.
        core2 = cl.core(receiver)
        inner = core2.handle_peer
        seen: list[str] = []

        def handle_peer(src: int, msg: pm.PeerMessage, now: float) -> list[Any]:
            if seen:
                return []  # gone quiet: nothing it receives is answered
            if isinstance(msg, pm.ChannelTransfer):
                seen.append(type(msg).__name__)
                if failure == "silent_after_transfer":
                    return []
                out = inner(src, msg, now)  # answers SUCCESS, then the node stops
                asyncio.get_running_loop().call_soon(cl.stop_node, receiver)
                return out
            return inner(src, msg, now)

        core2.handle_peer = handle_peer

        publishers = [await cl.client(i, f"pub-{i}") for i in (0, 1)]
        stop = asyncio.Event()
        counter = iter(range(1_000_000))

        async def publish(c: Client) -> None:
            while not stop.is_set():
                k = next(counter)
                ev = {"price": round((k * GOLDEN % 1.0) * 1000, 3), "sym": "AB"[k % 2], "qty": k}
                start = time.time()
                await c.publish(ev)
                led.events[k] = (ev, start, time.time())
                await asyncio.sleep(0.002)

        tasks = [asyncio.create_task(publish(c)) for c in publishers for _ in range(2)]
        await asyncio.sleep(0.5)
        at1 = _tables(cl.core(sender))  # <1>: nothing changes the tables from here but the session
        t = time.time()
        try:
            await _place_must_abort(admin, str(moving.id), receiver, 5 * TIMEOUT)
        except BaseException:
            stop.set()
            await asyncio.gather(*tasks)
            raise
        waited = time.time() - t
        assert seen == ["ChannelTransfer"]
        assert TIMEOUT * 0.9 <= waited <= TIMEOUT * 4, waited

        # Rolled back: the sender's tables are those of <1>, no session left.
        core = cl.core(sender)
        assert _tables(core) == at1
        assert not any(m.active for m in core.outgoing.values()) and not core._reforward
        assert core.monitor.state is not core.monitor.state.BUSY
        aborts = cl.journal("abort", [sender])
        assert aborts and "no answer" in aborts[-1]["reason"], aborts
        # Node 1 never heard of a change either.
        assert _tables(cl.core(1))[0] == at1[0]

        # The channel is still served: publishing goes on, then everything is checked.
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        last = -1
        while last != sum(led.delivered.values()):
            last = sum(led.delivered.values())
            await asyncio.sleep(0.3)
        served = [q for q, (ev, start, _) in led.events.items() if start > t + waited and ev["price"] > 500]
        assert served, "no event for the moving channel after the rollback"
        bad, exact, _ = led.violations()
        assert not bad, f"{len(bad)} violations, e.g.:\n" + "\n".join(bad[:20])
        assert exact > len(led.events), exact
        print(f"{failure}: abort after {waited:.2f}s; {len(led.events)} events, {exact} exact deliveries checked")
