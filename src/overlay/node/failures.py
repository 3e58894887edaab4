"""A node's side of failures (SPEC §16): heartbeats out, deaths in, rejoin.

``node.liveness`` decides who is alive and ``node.recovery`` what becomes of
a dead node's channels; this module is what the node core does with them:

1. On every tick: heartbeats to every peer when due, the deaths this node
   declares, the recovery's own timers, and the ``Rejoin`` request.
2. A heartbeat from a peer teaches deaths (each goes to the recovery), and
   carries the digest of the peer's routing table (``node.table_sync``).
3. Nothing a run declared dead says counts (it may still be talking: it was
   paused or cut off) until a new run of it says hello; the heartbeats it
   gets tell it to rejoin.
4. A run this node learns it is itself declared dead in asks its shell,
   once, for a new empty run (``Rejoin``; ``node.liveness`` rule 5).
5. A new run's hello revives a dead node (``node.liveness`` rule 7): it is
   a member again, and its receipts are waited for again.
6. A death ends everything that waited for the dead run, component by
   component (``gone``: its migration sessions, its keys' homes, its
   clients' subscriptions, the receipts it owed), and its last LIEM leaves
   dc̄.
7. A peer's hello with a new incarnation: it restarted (``node.core`` rule
   7); what its previous run left here goes (``restarted``: sessions with
   it, its dead clients' subscriptions, rebuilds waiting for it).
8. Every hello, after the rules above, goes to ``new_run`` (``node.ordering``
   rule 7): a node back from the dead is home of keys again, and a home that
   restarted lost the keyed events sent to its previous run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from overlay.actions import Action, Rejoin, ToPeer
from overlay.balance.monitor import Monitor
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.liveness import Liveness
from overlay.node.peers import PeerRuns
from overlay.node.recovery import Recovery
from overlay.node.table_sync import TableSync

__all__ = ["Failures"]

log = logging.getLogger("overlay.node")

NodeBack = Callable[[int], None]
Gone = Callable[[int, list[Action]], object]
NewRun = Callable[[int, int, list[Action]], object]


class Failures:
    """Rules 1–5; ``peers`` is the context's list of peers, ``node_back``
    what other components do when a dead node comes back (the outbox)."""

    def __init__(
        self,
        ctx: NodeContext,
        liveness: Liveness,
        recovery: Recovery,
        *,
        tables: TableSync,
        peers: Sequence[int],
        monitor: Monitor,
        gone: Sequence[Gone],
        node_back: NodeBack,
        peer_runs: PeerRuns,
        restarted: Sequence[Gone],
        new_run: NewRun = lambda node, incarnation, out: None,
    ) -> None:
        self._ctx = ctx
        self.liveness = liveness
        self.recovery = recovery
        self._tables = tables
        self._peers = peers
        self._monitor = monitor
        self._gone = gone
        self._node_back = node_back
        self._peer_runs = peer_runs
        self._restarted = restarted
        self._new_run = new_run
        self._rejoin_asked = False

    def peer_dead(self, node: int, out: list[Action]) -> None:
        """Rule 6: nothing waits for a dead run any more."""
        for gone in self._gone:
            gone(node, out)
        self._monitor.loads.pop(node, None)  # its last LIEM no longer counts in dc̄

    def loads(self) -> dict[int, tuple[float, float]]:
        """(dc, capacity) of this node and every peer with a recent LIEM (``node.recovery`` rule 2)."""
        mon = self._monitor
        loads = {p.node: (p.dc, p.capacity or 1.0) for p in mon.live()}
        loads[self._ctx.id] = (mon.dc, mon.capacity or 1.0)
        return loads

    def tick(self, now: float, out: list[Action]) -> None:
        """Rule 1."""
        live = self.liveness
        live.start(now)
        for node in live.check(now):
            self.recovery.node_dead(node, now, out)
        if live.due(now):
            digest, clock = self._tables.summary()  # node.table_sync rule 1
            beat = live.heartbeat(now, table_digest=digest, table_clock=clock)
            out.extend(ToPeer(p, live.to(p, beat)) for p in self._peers)
        self.recovery.tick(now, out)
        self._check_rejoin(out)

    def on_heartbeat(self, src: int, msg: pm.Heartbeat, now: float, out: list[Action]) -> None:
        """Rule 2."""
        for node in self.liveness.on_heartbeat(src, msg, now):
            self.recovery.node_dead(node, now, out)
        self._tables.on_heartbeat(src, msg, now, out)  # node.table_sync rule 2
        self._check_rejoin(out)

    def heard(self, src: int, msg: pm.PeerMessage, now: float) -> bool:
        """Rule 3: False when ``msg`` comes from a run declared dead (dropped, counted)."""
        if src in self.liveness.dead and type(msg) is not pm.PeerHello:
            self._ctx.stats["dropped_from_dead_peer"] += 1
            return False
        self.liveness.heard(src, now)
        return True

    def hello(self, node: int, incarnation: int, now: float, out: list[Action]) -> None:
        """Rules 5 and 7."""
        if self._peer_runs.hello(node, incarnation):
            log.warning("node %d: node %d restarted; dropping what its previous run left here", self._ctx.id, node)
            self._ctx.stats["peers_restarted"] += 1
            for gone in self._restarted:
                gone(node, out)
        if self.liveness.revived(node, incarnation, now):
            self.recovery.node_back(node)
            self._node_back(node)
        self.liveness.heard(node, now)
        self._new_run(node, incarnation, out)  # rule 8

    def _check_rejoin(self, out: list[Action]) -> None:
        """Rule 4."""
        live = self.liveness
        if live.rejoin and not self._rejoin_asked:
            self._rejoin_asked = True
            self._ctx.stats["declared_dead_rejoins"] += 1
            out.append(Rejoin(live.rejoin_reason))
