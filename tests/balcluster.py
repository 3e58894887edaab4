"""Balancing on real nodes, in this process: ``Cluster`` (nodes on 127.0.0.1,
ephemeral ports bound before they start, short slices) and ``Ledger``: what
the clients saw, to check exactly-once delivery.  Shared by the
test_balancing* modules; their skewed traffic is ``sim.workload``'s, and
S/dc̄ is judged in virtual time (``sim.convergence``)."""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import Iterable
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

    def busy(self, nodes: Iterable[int] | None = None) -> bool:
        return any(
            any(m.active for m in self.core(i).outgoing.values()) or self.core(i).incoming or self.core(i)._pending
            for i in (nodes or self.ids)
        )

    def settled(self, nodes: Iterable[int] | None = None) -> bool:
        ids = list(nodes or self.ids)
        first = self.core(ids[0]).routing
        quiet = all(
            not len(self.nodes[i].inbox)
            and all(not len(l.queue) for l in self.nodes[i].links.values() if l.peer.id in ids)
            for i in ids
        )
        return quiet and not self.busy(ids) and all(self.core(i).routing == first for i in ids)

    async def quiet(self, led: Ledger, nodes: Iterable[int] | None = None, timeout: float = 30.0) -> None:
        """Wait until ``nodes`` (default all) are ``settled`` with nothing
        queued for a client and the clients' deliveries stopped changing:
        every notification sent is in.  A condition, not a pause: a loaded
        machine only makes it come later."""
        ids = list(nodes or self.ids)
        last = -1

        def done() -> bool:
            nonlocal last
            if not (self.settled(ids) and all(not len(w.queue) for i in ids for w in self.nodes[i].clients.values())):
                last = -1
                return False
            seen, last = last, sum(led.delivered.values())
            return seen == last

        await until(done, timeout, "deliveries to stop", step=0.1)


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
                        bad.append(
                            f"event {qty} {values} delivered {n}x to {ci}/{sid} ({s.expression}) it does not match"
                        )
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
