"""An in-memory network of ``NodeCore``s, for core-pair tests (``CoreLink``).

No event loop, no sockets, no clock: ``CoreLink`` plays the asyncio shell of
``overlay.net.node`` for several cores at once.

Delivery model (SPEC §1.1):

* every ordered pair of nodes is one link with a high and a normal queue;
  within a link, high-priority messages (``overlay.messages.peer.is_high``)
  go before normal ones, and each level is FIFO;
* across links the next delivery is the link whose next message was sent
  earliest, so a run is a deterministic function of the inputs;
* every peer message is encoded and decoded by the real codec on the way, and
  must come out equal to what went in;
* a link can be paused (by hand, or when a message matching a ``hold``
  predicate is sent on it): nothing on it is delivered until ``release``.
  That is how a test opens the window between two steps of a migration;
* a ``RemoteProtocolError`` raised by a core is recorded in ``errors`` and
  answered with ``PeerError``, as the node's dispatcher does;
* each delivery, and each client message, is one batch: the core's
  ``end_batch`` (its batched notes and receipts) follows it, as the node's
  dispatcher calls it after each batch it hands the core;
* a split a migration session waits on (``node.balancing`` rule 3), which the
  shell works out in background steps, is finished right after the delivery
  that started it (the simulator interleaves its steps instead); indexing is
  left to the test (``index_pending``).

Everything that happened is logged: ``trace`` (peer deliveries in order),
``to_clients`` and ``closed`` (what the cores told their clients).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from overlay.actions import Action, CloseClient, Notifies, Rejoin, ToClient, ToPeer
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node import NodeCore
from overlay.testing.memory_link import MemoryLink

__all__ = ["CoreLink", "Delivery", "HoldPredicate"]

Delivery = tuple[int, int, pm.PeerMessage]
HoldPredicate = Callable[[int, int, pm.PeerMessage], bool]

# A run that delivers more than this is looping, not settling.
MAX_STEPS = 200_000


class CoreLink:
    """Cores of one cluster joined by deterministic FIFO links (module docstring)."""

    def __init__(self, config: ClusterConfig, *, now: float = 0.0) -> None:
        self.config = config
        self.now = now
        self.cores: dict[int, NodeCore] = {i: NodeCore(config, i) for i in config.node_ids}
        self.links: dict[tuple[int, int], MemoryLink] = {
            (a, b): MemoryLink() for a in self.cores for b in self.cores if a != b
        }
        self._seq = itertools.count()
        self._hold: HoldPredicate | None = None
        self.trace: list[Delivery] = []
        self.to_clients: list[tuple[int, int, cm.ClientMessage]] = []
        self.closed: list[tuple[int, int, str]] = []
        self.errors: list[tuple[int, int, RemoteProtocolError]] = []
        self.rejoins: list[tuple[int, str]] = []  # (node, reason): cores that asked for a new run

    # -- driving the cores ------------------------------------------------------------

    def start(self) -> None:
        """Start every core (the initializer announces its table) and settle."""
        for i, core in self.cores.items():
            self.execute(i, core.start(self.now))
        self.run()

    def execute(self, node: int, acts: Iterable[Action]) -> None:
        """Carry out what ``node``'s core returned."""
        for act in acts:
            if type(act) is ToPeer:
                self.send(node, act.node, act.msg)
            elif type(act) is ToClient:
                self.to_clients.append((node, act.session, act.msg))
            elif type(act) is Notifies:
                self.to_clients.extend((node, one.session, one.msg) for one in act.each())
            elif type(act) is CloseClient:
                self.closed.append((node, act.session, act.reason))
            elif type(act) is Rejoin:
                self.rejoins.append((node, act.reason))
            else:  # pragma: no cover - a new action type needs handling here
                raise AssertionError(f"unknown action {act!r}")

    def send(self, src: int, dst: int, msg: pm.PeerMessage) -> None:
        """Queue ``msg`` on link src→dst (as if ``src`` sent it)."""
        assert src != dst, f"node {src} sent {type(msg).__name__} to itself"
        link = self.links[(src, dst)]
        link.push(next(self._seq), msg)
        if self._hold is not None and self._hold(src, dst, msg):
            link.paused = True

    def tick(self, node: int, now: float) -> None:
        self.now = now
        self.execute(node, self.cores[node].tick(now))

    # -- delivery ---------------------------------------------------------------------------

    def pending(self, src: int | None = None, dst: int | None = None) -> list[Delivery]:
        """Undelivered messages (of one link or all), in per-link delivery order."""
        out: list[Delivery] = []
        for (a, b), link in self.links.items():
            if (src is None or a == src) and (dst is None or b == dst):
                out.extend((a, b, m) for m in link.queued())
        return out

    def step(self) -> Delivery | None:
        """Deliver the one next message; None when nothing is deliverable."""
        best: tuple[float, tuple[int, int]] | None = None
        for key, link in self.links.items():
            if link.paused:
                continue
            head = link.head()
            if head is not None and (best is None or head[0] < best[0]):
                best = (head[0], key)
        if best is None:
            return None
        src, dst = best[1]
        link = self.links[(src, dst)]
        msg = link.pop()
        _, decoded = link.carry(msg)
        assert decoded == [msg], f"{type(msg).__name__} did not survive the codec: {decoded!r} != {msg!r}"
        msg = decoded[0]
        self.trace.append((src, dst, msg))
        try:
            acts = self.cores[dst].handle_peer(src, msg, self.now)
        except RemoteProtocolError as exc:
            self.errors.append((dst, src, exc))
            self.send(dst, src, pm.PeerError("protocol_error", str(exc)))
            return (src, dst, msg)
        self.execute(dst, acts)
        self.execute(dst, self.cores[dst].end_batch())
        self.finish_split(dst)
        return (src, dst, msg)

    def finish_split(self, node: int) -> None:
        """Work out the split ``node``'s session waits on, if any, to the end."""
        core = self.cores[node]
        while core.balancing.splitting() is not None:
            _more, acts = core.background_step(0, self.now)
            self.execute(node, acts)

    def run(self, max_steps: int = MAX_STEPS) -> int:
        """Deliver until nothing deliverable is left; returns how many were delivered."""
        for n in range(max_steps):
            if self.step() is None:
                return n
        raise AssertionError(f"no quiescence after {max_steps} deliveries: a routing loop?")

    # -- holding links -----------------------------------------------------------------------

    def hold(self, pred: HoldPredicate) -> None:
        """Pause a link as soon as a message matching ``pred`` is sent on it."""
        self._hold = pred

    def hold_types(self, *types: type, src: int | None = None, dst: int | None = None) -> None:
        self.hold(lambda a, b, m: isinstance(m, types) and (src is None or a == src) and (dst is None or b == dst))

    def pause(self, src: int, dst: int) -> None:
        self.links[(src, dst)].paused = True

    def release(self) -> None:
        """Forget the hold predicate and resume every link."""
        self._hold = None
        for link in self.links.values():
            link.paused = False

    def paused(self) -> list[tuple[int, int]]:
        return [k for k, link in self.links.items() if link.paused]

    # -- clients ---------------------------------------------------------------------------

    def open_client(self, node: int, client_id: str) -> int:
        """A greeted client session on ``node``; returns its session id."""
        sid = self.cores[node].client_opened()
        self.client_send(node, sid, cm.Hello(client_id))
        return sid

    def client_send(self, node: int, sid: int, msg: cm.ClientMessage) -> None:
        """The client of session ``sid`` on ``node`` sends ``msg`` (no delivery yet)."""
        core = self.cores[node]
        self.execute(node, core.handle_client(sid, msg, self.now))
        self.execute(node, core.end_batch())

    def request(self, node: int, sid: int, msg: cm.ClientMessage) -> list[cm.ClientMessage]:
        """Send, settle, and return what the session received meanwhile."""
        mark = len(self.to_clients)
        self.client_send(node, sid, msg)
        self.run()
        return self.received(node, sid, since=mark)

    def close_client(self, node: int, sid: int) -> None:
        self.execute(node, self.cores[node].client_closed(sid))

    def received(self, node: int, sid: int, *, since: int = 0, kind: type | None = None) -> list[Any]:
        return [
            m for n, s, m in self.to_clients[since:] if n == node and s == sid and (kind is None or isinstance(m, kind))
        ]

    # -- views ---------------------------------------------------------------------------------

    def types(self, since: int = 0, *, only: Iterable[type] | None = None) -> list[tuple[int, int, str]]:
        """``trace`` as (src, dst, type name), optionally only some types;
        heartbeats (sent on every tick) only when ``only`` names them."""
        keep = tuple(only) if only is not None else None
        return [
            (a, b, type(m).__name__)
            for a, b, m in self.trace[since:]
            if (isinstance(m, keep) if keep is not None else type(m) is not pm.Heartbeat)
        ]

    def routing_tables_equal(self) -> bool:
        tables = [c.routing for c in self.cores.values()]
        return all(t == tables[0] for t in tables[1:])

    def owner_of(self, chid: Any) -> list[int]:
        """The nodes whose localTable holds ``chid``."""
        return [i for i, c in self.cores.items() if chid in c.local]
