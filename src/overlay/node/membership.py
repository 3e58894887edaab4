"""Cluster membership of a node: drain a node, let a new node join (SPEC §3, §8, §14).

Rules this module keeps:

1. Drain: ``drain(now, admin)`` puts the node in DRAINING mode — it refuses
   every RequestLoadBalance (forced ones too), schedules nothing and merges
   nothing — and then moves its channels off through the ordinary migration
   path (``start_migration(..., forced=True)``), one channel per session and
   one session at a time, each to the live peer with the lowest load level dc.
   Exactly-once is the migration protocol's (Reforward from <2>).  Every
   choice is journalled as a ``decision`` record with phase ``drain`` and
   every candidate's dc.
2. A replicated channel is not moved: this node leaves its replica set
   through an UpdateRoutingTable broadcast (the other replicas hold the
   same subscriptions, so nothing is lost).
3. Refused with a reason: a drain of a node already draining, of the last
   node of the cluster (no live peer to take the channels), or before the
   node is ready.  A session a receiver refuses or that times out is retried
   with another receiver; after ``MAX_DRAIN_ABORTS`` aborts the drain stops
   and its waiter is told why (the node stays DRAINING: nothing is scheduled
   onto it).
4. The drain ends when the localTable is empty; the waiter (a client Admin
   request or the shell's HTTP handler polling ``drain_state``) gets the
   summary: channels moved, subscriptions moved, replicas left, seconds.
   Then the node's clients are moved away: each session's subscriptions are
   dropped as on a disconnect, and the client gets a fatal Error ``draining``
   and is closed (it re-subscribes through another access node); the drain's
   requester keeps its session for the reply.
5. Join: a PeerHello from a node id this node does not know, carrying the
   caller's address (``host``/``port``/``admin_port``/``capacity``), adds it
   to the config, the peers and the monitor, and yields an ``AddPeer`` action
   before anything sent to it, so the shell opens a link first.  The
   initializer answers a hello without a table with RoutingTableInit (as for
   any peer); the others keep their tables.  The newcomer's monitor starts it
   UNDERLOADED and it takes load through ordinary balancing.
6. Leave: a node whose drain is done says so to every peer with a PeerHello
   marked ``leaving``; a peer drops it from its peers and its monitor (no
   more LIEMs, table updates or balancing sessions for it) and stops waiting
   for its ReplyUpdateGlobal, so the node can stop without stalling a session
   elsewhere.  The peer also drops the subscriptions of the node's clients
   and stops waiting for its receipts (``peer_left``): rule 4 closed every
   one of those clients, and the unsubscriptions it sent last may die with
   the node when it stops at once — one left on a channel held up every
   PubAck of the events it matched, the node never confirming their
   notifications, until the node came back (bench/soak.py).  So that nothing
   lands there later, a node that left refuses a new client's Hello
   (``draining``).  Its links stay (a late message still reaches it, and it
   can still route one; its table may lag, and a stale route is re-routed by
   the owner, node.core rule 3).  A restarted node with the same id says
   hello without ``leaving`` and joins again (rule 5); its receipts are
   waited for again (``peer_joined``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from overlay.actions import Action, AddPeer, CloseClient, ToClient, ToPeer
from overlay.balance.migration import OutgoingMigration, OutState
from overlay.channels.routing_table import RouteEntry
from overlay.config import NodeConfig
from overlay.errors import LocalProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.balancing import Balancing
from overlay.node.boot import Boot
from overlay.node.context import NodeContext
from overlay.node.loads import ChannelLoads
from overlay.node.migration import Migration
from overlay.node.sessions import Sessions
from overlay.node.updates import TableUpdates

__all__ = ["MAX_DRAIN_ABORTS", "DrainState", "Membership"]

log = logging.getLogger("overlay.node")

# Aborted drain sessions (refusals, timeouts) before the drain gives up: a
# few per peer is plenty for transient refusals (a receiver busy draining).
MAX_DRAIN_ABORTS: Final = 12


class DrainState:
    """One drain of this node, from ``drain()`` to its summary."""

    __slots__ = (
        "aborts",
        "admin",
        "channels",
        "clients_closed",
        "done",
        "error",
        "excluded",
        "finished",
        "given",
        "mig",
        "refused",
        "replicas_left",
        "started",
        "subscriptions",
    )

    def __init__(self, started: float, admin: tuple[int, int] | None) -> None:
        self.started = started
        self.admin = admin
        self.mig: OutgoingMigration | None = None
        self.channels: list[str] = []
        self.subscriptions = 0
        self.replicas_left: list[str] = []
        self.aborts = 0
        self.refused: dict[int, int] = {}  # receiver -> aborted sessions to it
        self.clients_closed = 0
        self.given: dict[int, float] = {}  # receiver -> load moved to it by this drain (per T)
        self.excluded: set[int] = set()  # receivers that refused because they drain too
        self.done = False
        self.error = ""
        self.finished = 0.0

    def summary(self, node: int) -> dict[str, Any]:
        return {
            "node": node,
            "drained": self.done and not self.error,
            "channels_moved": len(self.channels),
            "channels": self.channels,
            "subscriptions_moved": self.subscriptions,
            "replicas_left": self.replicas_left,
            "aborted_sessions": self.aborts,
            "clients_closed": self.clients_closed,
            "seconds": round((self.finished or self.started) - self.started, 3),
            **({"error": self.error} if self.error else {}),
        }


class Membership:
    """Rules 1–6 for one node: its drain, its hello, peers joining and leaving.
    ``peer_left``: what the other components do when a peer left (rule 6);
    ``peer_joined``: when a node joins, or comes back after leaving."""

    def __init__(
        self,
        ctx: NodeContext,
        boot: Boot,
        sessions: Sessions,
        migration: Migration,
        balancing: Balancing,
        loads: ChannelLoads,
        updates: TableUpdates,
        *,
        peer_left: Sequence[Callable[[int, list[Action]], object]] = (),
        peer_joined: Sequence[Callable[[int], object]] = (),
    ) -> None:
        self._ctx = ctx
        self._boot = boot
        self._sessions = sessions
        self._migration = migration
        self._balancing = balancing
        self._loads = loads
        self._updates = updates
        self._peer_left_hooks = tuple(peer_left)
        self._peer_joined_hooks = tuple(peer_joined)
        self.draining = False
        self.left = False  # drained, and told the peers (rule 6)
        self.drain_state: DrainState | None = None

    def hello(self) -> pm.PeerHello:
        me = self._ctx.me  # the address lets a node that does not know us add us (node.membership rule 5)
        return pm.PeerHello(
            self._ctx.id,
            self._ctx.config.cluster.name,
            self._boot.has_table,
            me.host,
            me.port,
            me.admin_port,
            me.capacity,
            self.left,
            self._ctx.incarnation,
            self._boot.epoch,
        )

    # -- drain (rules 1–4) --------------------------------------------------------------

    def drain(self, now: float, admin: tuple[int, int] | None = None) -> list[Action]:
        """Start draining; raises ``LocalProtocolError`` with the reason when refused."""
        if self.draining:
            raise LocalProtocolError(f"node {self._ctx.id} is already draining")
        if not self._boot.ready:
            raise LocalProtocolError(f"node {self._ctx.id} is not ready; nothing to drain yet")
        if not self._drain_receivers():
            raise LocalProtocolError(
                f"node {self._ctx.id} is the last node of the cluster: no live peer can take its channels"
            )
        self.draining = True
        self.drain_state = DrainState(now, admin)
        self._ctx.stats["drains"] += 1
        self._ctx.journal.record(
            "decision", now, phase="drain", action="start", channels=[str(c.id) for c in self._ctx.local]
        )
        log.info("node %d: draining %d channels", self._ctx.id, len(self._ctx.local))
        out: list[Action] = []
        self.tick(now, out)
        return out

    def _drain_receivers(self) -> list[tuple[float, int]]:
        """(dc, node) of every live peer, lowest load level first: the dc of its
        last LIEM plus what this drain gave it since (LIEMs come once a slice;
        a drain's sessions take milliseconds)."""
        dc = {p.node: p.dc for p in self._balancing.monitor.live()}
        given = self.drain_state.given if self.drain_state is not None else {}
        return sorted(
            (dc.get(p, 0.0) + given.get(p, 0.0) / self._capacity_of(p), p)
            for p in self._ctx.peers
            if p not in self._ctx.unreachable
        )

    def _capacity_of(self, node: int) -> float:
        return next((n.capacity for n in self._ctx.config.nodes if n.id == node), 1.0)

    def tick(self, now: float, out: list[Action]) -> None:
        """One step of a drain: called on every tick; at most one session at a time."""
        dr = self.drain_state
        if dr is None or dr.done:
            return
        mig = dr.mig
        if mig is not None:
            if mig.active:
                return
            dr.mig = None
            if mig.state is OutState.DONE:
                dr.channels.extend(str(c) for c in mig.channels)
                dr.subscriptions += mig.subscriptions_moved
            else:
                dr.aborts += 1
                dr.refused[mig.receiver] = dr.refused.get(mig.receiver, 0) + 1
                if "draining" in mig.reason:  # that peer is leaving too: never again
                    dr.excluded.add(mig.receiver)
                if dr.aborts >= MAX_DRAIN_ABORTS:
                    self._drain_end(now, f"gave up after {dr.aborts} aborted sessions (last: {mig.reason})", out)
                    return
        # A session begun before the drain (either side) finishes first.
        if self._migration.busy():
            return
        if not len(self._ctx.local):
            self._drain_end(now, "", out)
            return
        ch = min(self._ctx.local, key=lambda c: str(c.id))
        entry = self._ctx.routing[ch.id]
        if entry.replicated:  # rule 2: leave the replica set
            owners = tuple(o for o in entry.owners if o != self._ctx.id)
            new = RouteEntry(entry.space, owners)
            self._ctx.local.remove(ch.id)
            self._ctx.routing.set(ch.id, new)
            self._updates.broadcast((), [(ch.id, new)], out)
            dr.replicas_left.append(str(ch.id))
            self._ctx.journal.record(
                "decision", now, phase="drain", action="leave_replicas", channel=str(ch.id), owners=list(owners)
            )
            return
        cands = [c for c in self._drain_receivers() if c[1] not in dr.excluded]
        if not cands:
            self._drain_end(
                now,
                f"no live peer that is not draining itself is left to take the channels "
                f"(draining: {sorted(dr.excluded)})",
                out,
            )
            return
        # Fewest refusals first, then the lowest load level (a refusing peer is
        # tried again only when every other one refused as often).
        dc, receiver = min(cands, key=lambda c: (dr.refused.get(c[1], 0), c[0], c[1]))
        self._ctx.journal.record(
            "decision",
            now,
            phase="drain",
            action="move",
            channel=str(ch.id),
            receiver=receiver,
            receiver_dc=dc,
            subscriptions=len(ch),
            candidates=[{"node": n, "dc": d, "refused": dr.refused.get(n, 0)} for d, n in cands],
        )
        try:
            dr.mig, acts = self._migration.start([ch.id], receiver, now, forced=True)
            load = self._loads.get(ch.id)
            dr.given[receiver] = dr.given.get(receiver, 0.0) + (float(ch.last.load) if load is None else load)
        except LocalProtocolError as exc:  # cannot happen with the checks above; end rather than spin
            self._drain_end(now, str(exc), out)
            return
        out.extend(acts)

    def _drain_end(self, now: float, error: str, out: list[Action]) -> None:
        dr = self.drain_state
        assert dr is not None
        dr.done, dr.error, dr.finished = True, error, now
        summary = dr.summary(self._ctx.id)
        self._ctx.journal.record(
            "decision",
            now,
            phase="drain",
            action="failed" if error else "done",
            **{k: v for k, v in summary.items() if k not in ("node", "channels")},
        )
        if error:
            log.warning("node %d: drain stopped: %s", self._ctx.id, error)
        else:
            self.left = True  # rule 6: the peers stop counting on us
            hello = self.hello()
            out.extend(ToPeer(p, hello) for p in self._ctx.peers)
            self._close_clients(dr, out)
            log.info(
                "node %d: drained: %d channels, %d subscriptions moved in %.2fs",
                self._ctx.id,
                len(dr.channels),
                dr.subscriptions,
                summary["seconds"],
            )
        if dr.admin is not None:
            sid, seq = dr.admin
            if sid in self._sessions:
                if error:
                    out.append(
                        ToClient(
                            sid, cm.Error(seq, cm.ErrorCode.ADMIN, f"drain of node {self._ctx.id} stopped: {error}")
                        )
                    )
                else:
                    out.append(ToClient(sid, cm.AdminReply(seq, summary)))

    def _close_clients(self, dr: DrainState, out: list[Action]) -> None:
        """Rule 4: once drained, the node's clients go elsewhere: their
        subscriptions are dropped (as on a disconnect, so none is left behind
        when the node stops), and each is told ``draining`` and closed; the
        client re-subscribes through another access node.  The drain's own
        requester keeps its session for the reply."""
        for sid in list(self._sessions):
            if dr.admin is not None and sid == dr.admin[0]:
                continue
            out.extend(self._sessions.close(sid))
            out.append(
                ToClient(
                    sid,
                    cm.Error(
                        -1,
                        cm.ErrorCode.DRAINING,
                        f"node {self._ctx.id} drained and is leaving: reconnect to another node",
                        fatal=True,
                    ),
                )
            )
            out.append(CloseClient(sid, "node drained"))
            dr.clients_closed += 1

    # -- join (rule 5) --------------------------------------------------------------------

    def on_hello(self, node: int, msg: pm.PeerHello) -> list[Action]:
        """A hello from a node not in our config: add it (before any reply to it)."""
        if msg.leaving:
            return self._peer_left(node)
        if node == self._ctx.id or node in self._ctx.peers:
            return []
        if not msg.host or not msg.port:
            log.warning("node %d: hello from unknown node %d without an address; not added", self._ctx.id, node)
            return []
        peer = NodeConfig(node, msg.host, msg.port, msg.admin_port, msg.capacity or 1.0)
        # (A drained node that left and restarts is in the config already: replace it.)
        self._ctx.config = self._ctx.config.with_nodes((*(n for n in self._ctx.config.nodes if n.id != node), peer))
        self._ctx.peers.append(node)
        self._balancing.monitor.add_peer(node)
        self._ctx.stats["peers_joined"] += 1
        self._ctx.journal.record(
            "join",
            self._ctx.now,
            peer=node,
            address=f"{msg.host}:{msg.port}",
            admin_port=msg.admin_port,
            capacity=peer.capacity,
        )
        log.info("node %d: node %d joined from %s:%d", self._ctx.id, node, msg.host, msg.port)
        for joined in self._peer_joined_hooks:
            joined(node)
        return [AddPeer(peer)]

    def _peer_left(self, node: int) -> list[Action]:
        """Rule 6: a drained node leaves the peers; nothing waits for its replies."""
        out: list[Action] = []
        if node not in self._ctx.peers:
            return out
        self._ctx.peers.remove(node)
        self._balancing.monitor.remove_peer(node)
        self._ctx.stats["peers_left"] += 1
        self._ctx.journal.record("leave", self._ctx.now, peer=node)
        log.info("node %d: node %d drained and left", self._ctx.id, node)
        self._migration.stop_waiting_for(node, out)
        for left in self._peer_left_hooks:
            left(node, out)
        return out
