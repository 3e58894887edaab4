"""Balancing on real nodes, in this process: ``Cluster`` (nodes on 127.0.0.1,
ephemeral ports bound before they start, short slices), S/dc̄ from the nodes'
journals, skewed traffic, and ``Ledger``: what the clients saw, to check
exactly-once delivery.  Shared by the test_balancing* modules."""

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
from loopback import listening_socket
from loopback import wait_until as until

from overlay.channels.predicates import Filter
from overlay.client import Client
from overlay.config import NodeConfig, load_config
from overlay.messages import client as cm
from overlay.net.node import Node

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


# -- what the clients saw -------------------------------------------------------------------


@dataclass
class Sub:
    client: int
    sub_id: str
    expression: str
    filter: Filter
    started: float
    acked: float = float("inf")
    unsub_started: float = float("inf")
    unsub_acked: float = float("inf")


@dataclass
class Ledger:
    """What the clients saw, on one clock (``time.time()``, the nodes' clock too)."""

    subs: dict[tuple[int, str], Sub] = field(default_factory=dict)
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

    def expected(self, s: Sub, qty: int, start: float) -> bool:
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
