"""The node core: one node's protocol logic with no sockets and no clock.

A decoded message and ``now`` go in; the actions to perform come out
(``ToPeer``, ``ToClient``, ``CloseClient``).  The asyncio shell in
``overlay.net.node`` reads frames, calls the core, and carries out what it
returns; the simulator of SPEC §15 drives the same core with in-memory links.

Rules this module keeps (SPEC §3, §4, §8):

1. Initialisation: the initializer creates ``EC = <WES, ∅>`` and sends
   RoutingTableInit to every peer; it is ready when every peer replied.  Any
   other node is ready once it holds a routing table.  Before that a client's
   publish/subscribe is answered with ``not_ready``.
2. One hop: a client's (un)subscription goes to every channel it belongs to —
   applied here for local channels, sent DISPATCHED with ``ch_id`` to the
   owner of each remote one.  An event goes to its one channel the same way.
   A DISPATCHED message is applied to the named local channel without a
   routing lookup.
3. A DISPATCHED message whose channel is not here is re-routed with the
   current routing table (a bounded number of hops), never dropped silently;
   if this node is moving that channel out and is past time <2>, it is
   reforwarded to the receiver instead (``overlay.balance.migration``).
4. An (un)subscription is acknowledged to its client only when every channel
   it went to has applied it (``SubscriptionApplied``), so an event published
   after the SubAck is matched against it.
5. The owner matches an event once and sends one Notification per
   subscribers' access node; the access node sends each client one Notify
   listing that client's matching subscriptions — at most once per
   subscription per event.
6. Subscription ids are unique per subscribe call
   (``node:session:local_id:n``), so a re-subscribe never revives an old one.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from overlay.actions import Action, CloseClient, ToClient, ToPeer
from overlay.balance.migration import InState, IncomingMigration, OutgoingMigration, OutState
from overlay.balance.split import Cut
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.expressions import parse_event, parse_subscription
from overlay.channels.local_table import LocalTable
from overlay.channels.predicates import Filter
from overlay.channels.routing_table import RouteEntry, RoutingTable
from overlay.channels.space import EventSpace
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.config import ClusterConfig
from overlay.errors import ExpressionError, LocalProtocolError, OverlayError, RemoteProtocolError, SchemaError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node_balancing import BalancingMixin

__all__ = ["NodeCore", "ToPeer", "ToClient", "CloseClient", "Action"]

log = logging.getLogger("overlay.node")

# A message re-routed this many times is dropped (counted and logged): tables
# that disagree for longer than a few hops are a bug, not a transient.
MAX_HOPS: Final = 4


class _Session:
    __slots__ = ("id", "client_id", "subs", "greeted", "n")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.client_id = ""
        self.greeted = False
        self.subs: dict[str, tuple[str, Filter]] = {}  # local id -> (global id, filter)
        self.n = 0


class _Pending:
    """An (un)subscription waiting for its channels to apply it (rule 4)."""

    __slots__ = ("session", "seq", "local_id", "subscribe", "waiting", "applied", "channels")

    def __init__(self, session: int, seq: int, local_id: str, subscribe: bool, chans: Iterable[ChannelId]) -> None:
        self.session = session
        self.seq = seq
        self.local_id = local_id
        self.subscribe = subscribe
        self.waiting = set(chans)
        self.applied: set[ChannelId] = set()
        self.channels = len(self.waiting)


class _TableUpdate:
    """An UpdateRoutingTable broadcast waiting for every ReplyUpdateGlobal."""

    __slots__ = ("waiting", "admin")

    def __init__(self, waiting: set[int], admin: tuple[int, int] | None) -> None:
        self.waiting = waiting
        self.admin = admin


class NodeCore(BalancingMixin):
    """One node's state and protocol logic (module rules 1–6).

    Invariant: a channel is in ``local`` iff the routing table names this node
    as its owner, except inside a migration session between <1> and <3> on
    either side (SPEC §8.1).
    """

    def __init__(self, config: ClusterConfig, node_id: int) -> None:
        self.config = config
        self.id = node_id
        self.me = config.node(node_id)
        self.schema = config.schema
        self.peers: list[int] = [n for n in config.node_ids if n != node_id]
        self.routing = RoutingTable(self.schema)
        self.local = LocalTable(node_id)
        self.has_table = False
        self.ready = False
        self._init_waiting: set[int] = set()
        self.sessions: dict[int, _Session] = {}
        self._sub_owner: dict[str, tuple[int, str]] = {}  # global sub id -> (session, local id)
        self._pending: dict[str, _Pending] = {}
        self._event_seq = 0
        self._session_seq = 0
        self._update_seq = 0
        self._updates: dict[int, _TableUpdate] = {}
        self.outgoing: dict[int, OutgoingMigration] = {}
        self.incoming: dict[tuple[int, int], IncomingMigration] = {}
        self._reforward: dict[ChannelId, OutgoingMigration] = {}
        self._admin_waits: dict[int, tuple[int, int]] = {}  # migration session -> (client session, seq)
        self.stats: Counter[str] = Counter()
        self.timeout = config.cluster.peer_timeout
        self._init_balancing()

    # == lifecycle ===============================================================

    @property
    def is_initializer(self) -> bool:
        return self.id == self.config.cluster.initializer

    def start(self, now: float) -> list[Action]:
        """Rule 1: the initializer builds EC and announces the table."""
        out: list[Action] = []
        if not self.is_initializer:
            return out
        ec = Channel(self.local.new_id(), EventSpace.whole(self.schema), self.schema)
        self.local.add(ec)
        self.routing.set(ec.id, RouteEntry(ec.space, (self.id,)))
        self.has_table = True
        self._init_waiting = set(self.peers)
        init = self._table_init()
        for p in self.peers:
            out.append(ToPeer(p, init))
        if not self._init_waiting:
            self._become_ready()
        log.info("node %d: initializer, created %s, waiting for %d peers", self.id, ec.id, len(self.peers))
        return out

    def _table_init(self) -> pm.RoutingTableInit:
        return pm.RoutingTableInit(tuple(pm.RouteItem(c, e) for c, e in self.routing.items()))

    def _become_ready(self) -> None:
        if not self.ready:
            self.ready = True
            log.info("node %d: ready (%d channels in routing table)", self.id, len(self.routing))

    def hello(self) -> pm.PeerHello:
        return pm.PeerHello(self.id, self.config.cluster.name, self.has_table)

    def peer_hello(self, node: int, msg: pm.PeerHello, now: float) -> list[Action]:
        """A peer (re)connected to us; a peer without a table gets ours."""
        if msg.cluster != self.config.cluster.name:
            raise RemoteProtocolError(
                f"node {node} belongs to cluster {msg.cluster!r}, not {self.config.cluster.name!r}"
            )
        if self.is_initializer and self.has_table and not msg.has_routing_table:
            return [ToPeer(node, self._table_init())]
        return []

    # == peers ===================================================================

    def handle_peer(self, src: int, msg: pm.PeerMessage, now: float) -> list[Action]:
        out: list[Action] = []
        match msg:
            case pm.Event():
                self._on_event(msg, out)
            case pm.Notification():
                self._on_notification(msg, out)
            case pm.Subscription():
                self._on_subscription(msg, out)
            case pm.UnSubscription():
                self._on_unsubscription(msg, out)
            case pm.SubscriptionApplied():
                self._on_applied(msg, out)
            case pm.NotificationAck():
                self.stats["notification_acks"] += 1
            case pm.RoutingTableInit():
                self.routing.replace_all({i.ch_id: i.entry for i in msg.routing_table})
                for chid in self.routing:
                    self.local.observe_id(chid)
                self.has_table = True
                if not self.is_initializer:
                    self._become_ready()
                out.append(ToPeer(src, pm.ReplyRoutingTableInit(self.id)))
            case pm.ReplyRoutingTableInit():
                self._init_waiting.discard(src)
                if not self._init_waiting and self.has_table:
                    self._become_ready()
            case pm.UpdateRoutingTable():
                self.routing.apply(msg.delete_chs, ((i.ch_id, i.entry) for i in msg.update_chs))
                out.append(ToPeer(src, pm.ReplyUpdateGlobal(msg.session, msg.origin)))
            case pm.ReplyUpdateGlobal():
                self._on_update_reply(src, msg, now, out)
            case pm.RequestLoadBalance():
                self._on_request(src, msg, now, out)
            case pm.ChannelTransfer():
                self._on_channel_transfer(src, msg, now, out)
            case pm.SubscriptionMove():
                self._on_subscription_move(src, msg, now, out)
            case pm.Reforward():
                self._on_reforward(src, msg, now, out)
            case pm.CompleteLoadBalance():
                self._on_complete(src, msg, now, out)
            case pm.ReplyRequestLoadBalance() | pm.ReplyChannelTransfer() | pm.ReplySubscriptionMove():
                self._on_migration_reply(src, msg, now, out)
            case pm.LIEM():
                self.stats["liems_in"] += 1
                self._on_liem(src, msg)
            case pm.PeerHello():
                out.extend(self.peer_hello(src, msg, now))
            case pm.PeerError():
                log.warning("node %d: peer %d refused a message: %s %s", self.id, src, msg.code, msg.message)
            case _:
                raise RemoteProtocolError(f"unexpected {type(msg).__name__} from node {src}")
        return out

    # -- events (rules 2, 3, 5) ------------------------------------------------------

    def _on_event(self, msg: pm.Event, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        mig = self._reforward.get(chid)
        if mig is not None and not mig.replicate:  # a replica's events stay here
            self._reforward_msg(mig, chid, pm.ReforwardSign.EVENT_MESSAGE, msg, out)
            return
        ch = self.local.get(chid)
        if ch is None:
            self._reroute_event(msg, out)
            return
        self._match(ch, msg, out)

    def _match(self, ch: Channel, msg: pm.Event, out: list[Action]) -> None:
        matched, _tested = ch.match(msg.event_exp, msg.access_node)
        self.stats["events_matched"] += 1
        if not matched:
            return
        by_node: dict[int, list[str]] = {}
        for sub in matched:
            by_node.setdefault(sub.access_node, []).append(sub.id)
        for node, ids in by_node.items():
            note = pm.Notification(msg.event_id, msg.event_exp, tuple(ids), ch.id, msg.publish_time)
            if node == self.id:
                self._on_notification(note, out)
            else:
                out.append(ToPeer(node, note))
        self.stats["notifications_out"] += len(matched)

    def _reroute_event(self, msg: pm.Event, out: list[Action]) -> None:
        chid = self.routing.lookup_event(msg.event_exp)
        if chid is None or msg.hops >= MAX_HOPS:
            self.stats["events_unroutable"] += 1
            log.error("node %d: event %s has no route (hops %d); dropped", self.id, msg.event_id, msg.hops)
            return
        self.stats["events_rerouted"] += 1
        fwd = msgspec.structs.replace(
            msg, ch_id=chid, dispatch_sign=pm.DispatchSign.EVENT_DISPATCHED, hops=msg.hops + 1
        )
        self._dispatch_event(fwd, out)

    def _dispatch_event(self, msg: pm.Event, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        entry = self.routing[chid]
        owner = entry.owner if not entry.replicated else _pick(entry.owners, msg.event_id)
        if owner == self.id:
            self._on_event(msg, out)
        else:
            out.append(ToPeer(owner, msg))

    def _on_notification(self, msg: pm.Notification, out: list[Action]) -> None:
        by_session: dict[int, list[str]] = {}
        for gid in msg.sub_ids:
            owner = self._sub_owner.get(gid)
            if owner is None:
                self.stats["notifications_orphaned"] += 1
                continue
            by_session.setdefault(owner[0], []).append(owner[1])
        for sid, local_ids in by_session.items():
            out.append(ToClient(sid, cm.Notify(msg.event_id, msg.event_exp, tuple(local_ids), msg.publish_time)))
            self.stats["notifies_out"] += 1

    # -- subscriptions (rules 2, 3, 4) -------------------------------------------------

    def _on_subscription(self, msg: pm.Subscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        mig = self._reforward.get(chid)
        if mig is not None:
            self._reforward_msg(mig, chid, pm.ReforwardSign.SUBSCRIBE, msg, out)
            if not mig.replicate:
                return
        ch = self.local.get(chid)
        if ch is None:
            self._reroute_sub(msg, msg.sub_exp, out, subscribe=True)
            return
        if ch.add(msg.stored()):
            self.stats["subscriptions_applied"] += 1
        self._applied(msg.sub_id, chid, msg.access_node, True, (), out)

    def _on_unsubscription(self, msg: pm.UnSubscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        mig = self._reforward.get(chid)
        if mig is not None:
            self._reforward_msg(mig, chid, pm.ReforwardSign.UNSUBSCRIBE, msg, out)
            if not mig.replicate:
                return
        ch = self.local.get(chid)
        if ch is None:
            self._reroute_sub(msg, msg.unsub_exp, out, subscribe=False)
            return
        if ch.remove(msg.sub_id) is not None:
            self.stats["unsubscriptions_applied"] += 1
        self._applied(msg.sub_id, chid, msg.access_node, False, (), out)

    def _reroute_sub(
        self, msg: pm.Subscription | pm.UnSubscription, f: Filter, out: list[Action], *, subscribe: bool
    ) -> None:
        old = msg.ch_id
        assert old is not None
        if msg.hops >= MAX_HOPS:
            self.stats["subscriptions_unroutable"] += 1
            log.error("node %d: (un)subscription %s bounced %d times; dropped", self.id, msg.sub_id, msg.hops)
            return
        chans = self.routing.lookup_subscription(f)
        self.stats["subscriptions_rerouted"] += 1
        # Tell the access node which channels replace the one it waits on, then send on.
        self._applied(msg.sub_id, old, msg.access_node, subscribe, tuple(chans), out)
        for chid in chans:
            fwd = msgspec.structs.replace(msg, ch_id=chid, hops=msg.hops + 1)
            self._dispatch_sub(fwd, out)

    def _dispatch_sub(self, msg: pm.Subscription | pm.UnSubscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        owners = self.routing[chid].owners
        for owner in owners:  # replicas all hold every subscription (SPEC §8.3)
            if owner == self.id:
                if isinstance(msg, pm.Subscription):
                    self._on_subscription(msg, out)
                else:
                    self._on_unsubscription(msg, out)
            else:
                out.append(ToPeer(owner, msg))

    def _applied(
        self, gid: str, chid: ChannelId, access: int, subscribe: bool, rerouted: tuple[ChannelId, ...], out: list[Action]
    ) -> None:
        note = pm.SubscriptionApplied(gid, chid, subscribe, rerouted)
        if access == self.id:
            self._on_applied(note, out)
        else:
            out.append(ToPeer(access, note))

    def _on_applied(self, msg: pm.SubscriptionApplied, out: list[Action]) -> None:
        p = self._pending.get(msg.sub_id)
        if p is None or p.subscribe != msg.subscribe:
            return
        p.waiting.discard(msg.ch_id)
        if msg.rerouted_to:
            p.waiting.update(c for c in msg.rerouted_to if c not in p.applied)
            p.channels += len(msg.rerouted_to) - 1
        else:
            p.applied.add(msg.ch_id)
        if p.waiting:
            return
        del self._pending[msg.sub_id]
        if p.session not in self.sessions:
            return
        if p.subscribe:
            out.append(ToClient(p.session, cm.SubAck(p.seq, p.local_id, len(p.applied))))
        else:
            out.append(ToClient(p.session, cm.UnsubAck(p.seq, p.local_id)))

    # -- table updates ------------------------------------------------------------------

    def _broadcast_update(
        self, delete: Iterable[ChannelId], update: Iterable[tuple[ChannelId, RouteEntry]], out: list[Action], *, session: int = -1, admin: tuple[int, int] | None = None
    ) -> int:
        self._update_seq += 1
        uid = self._update_seq if session < 0 else session
        msg = pm.UpdateRoutingTable(
            tuple(delete), tuple(pm.RouteItem(c, e) for c, e in update), uid, self.id
        )
        for p in self.peers:
            out.append(ToPeer(p, msg))
        if session < 0:
            self._updates[uid] = _TableUpdate(set(self.peers), admin)
            if not self.peers and admin is not None:
                self._admin_done(admin, {"update": uid}, out)
        return uid

    def _on_update_reply(self, src: int, msg: pm.ReplyUpdateGlobal, now: float, out: list[Action]) -> None:
        mig = self.outgoing.get(msg.session)
        if mig is not None and mig.state is OutState.UPDATING and msg.origin == self.id and msg.session in self.outgoing:
            if mig.on_update_reply(src, now) is OutState.DONE:
                self._finish_outgoing(mig, out)
            return
        upd = self._updates.get(msg.session)
        if upd is None:
            return
        upd.waiting.discard(src)
        if not upd.waiting:
            del self._updates[msg.session]
            if upd.admin is not None:
                self._admin_done(upd.admin, {"update": msg.session}, out)

    # -- migration: moving-out side ---------------------------------------------------------

    def start_migration(
        self, channels: list[ChannelId], receiver: int, now: float, *, forced: bool = False, admin: tuple[int, int] | None = None
    ) -> tuple[OutgoingMigration, list[Action]]:
        for chid in channels:
            if chid not in self.local:
                raise LocalProtocolError(f"channel {chid} is not on node {self.id}")
            if chid in self._reforward or any(chid in m.channels and m.active for m in self.outgoing.values()):
                raise LocalProtocolError(f"channel {chid} is already moving")
        if receiver == self.id or receiver not in self.peers:
            raise LocalProtocolError(f"node {receiver} cannot receive channels from node {self.id}")
        self._update_seq += 1
        mig = OutgoingMigration(self._update_seq, receiver, channels, started=now, timeout=self.timeout, forced=forced)
        self.outgoing[mig.session] = mig
        if admin is not None:
            self._admin_waits[mig.session] = admin
        d = float(self.local.load)
        req = pm.RequestLoadBalance(d, d / self.me.capacity, mig.session, forced)
        log.info("node %d: session %d: moving %s to node %d", self.id, mig.session, [str(c) for c in channels], receiver)
        return mig, [ToPeer(receiver, req)]

    def _on_migration_reply(self, src: int, msg: pm.PeerMessage, now: float, out: list[Action]) -> None:
        mig = self.outgoing.get(msg.session)  # type: ignore[attr-defined]
        if mig is None or mig.receiver != src:
            # A late answer to a session already timed out and rolled back.
            log.info("node %d: ignoring %s from node %d for a session that is over", self.id, type(msg).__name__, src)
            return
        state = mig.on(msg, now)
        if state is OutState.ABORTED:
            self._abort_outgoing(mig, mig.reason, out)
        elif state is OutState.TRANSFERRING:
            if not mig.channels and not self._plan_transfer(mig, now, out):
                mig.abort(mig.reason or "nothing to move")
                self._abort_outgoing(mig, mig.reason, out)
                return
            specs = tuple(pm.ChannelSpec(c, self.local[c].space) for c in mig.channels)
            out.append(ToPeer(mig.receiver, pm.ChannelTransfer(specs, mig.session)))
        elif state is OutState.MOVING:
            # <2>: snapshot the subscriptions, and reforward from now on (migration rule 3).
            sets = []
            for c in mig.channels:
                subs = tuple(self.local[c])
                mig.subscriptions_moved += len(subs)
                sets.append(pm.ChannelSubscriptions(c, subs))
                self._reforward[c] = mig
            move = pm.SubscriptionMove(pm.SubscriptionType.ATOMIC, tuple(sets), mig.session)
            mig.bytes_moved = len(msgspec.msgpack.encode(move))
            out.append(ToPeer(mig.receiver, move))
        elif state is OutState.UPDATING:
            # <3>: the receiver holds everything; switch the tables.
            updates = []
            for c in mig.channels:
                if mig.replicate:  # the channel stays here too: one more owner
                    ch = self.local[c]
                    owners = tuple(dict.fromkeys(self.routing[c].owners + (mig.receiver,)))
                else:
                    ch = self.local.remove(c)
                    assert ch is not None
                    owners = (mig.receiver,)
                entry = RouteEntry(ch.space, owners)
                self.routing.set(c, entry)
                updates.append((c, entry))
            self._broadcast_update((), updates, out, session=mig.session)
            mig.updates_sent(self.peers, now)

    def _finish_outgoing(self, mig: OutgoingMigration, out: list[Action]) -> None:
        for c in mig.channels:
            if self._reforward.get(c) is mig:
                del self._reforward[c]
        out.append(ToPeer(mig.receiver, pm.CompleteLoadBalance(mig.session)))
        self.stats["replications" if mig.replicate else "migrations"] += 1
        self.stats["subscriptions_moved"] += mig.subscriptions_moved
        self.stats["migration_bytes"] += mig.bytes_moved
        bw = self.config.bw(self.id, mig.receiver)
        self.record(
            "replication" if mig.replicate else "migration", mig.times.get("done", mig.started),
            session=mig.session, receiver=mig.receiver, channels=[str(c) for c in mig.channels],
            subscriptions=mig.subscriptions_moved, bytes=mig.bytes_moved, bw=bw,
            mig_cost=mig.subscriptions_moved / bw, forced=mig.forced,
            duration=round(mig.times.get("done", mig.started) - mig.started, 6),
            times={k: round(v - mig.started, 6) for k, v in mig.times.items()},
        )
        if not mig.forced:
            self.monitor.leave_busy(completed=True)
        log.info(
            "node %d: session %d done: %d channels, %d subscriptions to node %d",
            self.id, mig.session, len(mig.channels), mig.subscriptions_moved, mig.receiver,
        )
        admin = self._admin_waits.pop(mig.session, None)
        if admin is not None:
            self._admin_done(
                admin,
                {
                    "session": mig.session,
                    "channels": [str(c) for c in mig.channels],
                    "receiver": mig.receiver,
                    "subscriptions_moved": mig.subscriptions_moved,
                    "bytes": mig.bytes_moved,
                },
                out,
            )

    def _abort_outgoing(self, mig: OutgoingMigration, reason: str, out: list[Action]) -> None:
        if mig.state is not OutState.ABORTED:
            mig.abort(reason)
        out.append(ToPeer(mig.receiver, pm.CompleteLoadBalance(mig.session, aborted=True)))
        self.stats["migrations_aborted"] += 1
        log.warning("node %d: session %d to node %d aborted: %s", self.id, mig.session, mig.receiver, reason)
        self.record("abort", mig.started, session=mig.session, receiver=mig.receiver, reason=reason)
        if not mig.forced:
            if mig.candidate is not None and "<2>" not in mig.times and not mig.channels:
                self._request_next(mig.started, out)  # refused: try the next candidate (SPEC §8.1 step 4)
            else:
                self.monitor.leave_busy(completed=False)
        admin = self._admin_waits.pop(mig.session, None)
        if admin is not None:
            out.append(ToClient(admin[0], cm.Error(admin[1], cm.ErrorCode.ADMIN, f"migration aborted: {reason}")))

    def _reforward_msg(
        self, mig: OutgoingMigration, chid: ChannelId, sign: pm.ReforwardSign, msg: pm.Subscription | pm.UnSubscription | pm.Event, out: list[Action]
    ) -> None:
        self.stats["reforwards"] += 1
        out.append(ToPeer(mig.receiver, pm.Reforward(chid, (pm.ReforwardItem(sign, msg),), mig.session)))

    # -- migration: receiver side -------------------------------------------------------------

    def _on_request(self, src: int, msg: pm.RequestLoadBalance, now: float, out: list[Action]) -> None:
        key = (src, msg.session)
        if key in self.incoming:
            raise RemoteProtocolError(f"node {src} reopened session {msg.session}")
        ok, reason = self._accepts(msg)
        if not ok:
            out.append(ToPeer(src, pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_FAIL, msg.session, reason)))
            return
        self.incoming[key] = IncomingMigration(src, msg.session, started=now, timeout=self.timeout)
        out.append(ToPeer(src, pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_SUCCESS, msg.session)))

    def _incoming(self, src: int, session: int, what: str) -> IncomingMigration:
        mig = self.incoming.get((src, session))
        if mig is None:
            raise RemoteProtocolError(f"{what} from node {src} names unknown session {session}")
        return mig

    def _on_channel_transfer(self, src: int, msg: pm.ChannelTransfer, now: float, out: list[Action]) -> None:
        mig = self._incoming(src, msg.session, "ChannelTransfer")
        clash = [c.ch_id for c in msg.channels if c.ch_id in self.local]
        if clash:
            mig.abort()
            out.append(ToPeer(src, pm.ReplyChannelTransfer(pm.ReplySign.REPLY_FAIL, tuple(clash), msg.session, "channel already here")))
            return
        mig.on(msg, now)
        for spec in msg.channels:
            self.local.add(Channel(spec.ch_id, spec.space, self.schema))
        out.append(ToPeer(src, pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, mig.channels, msg.session)))

    def _on_subscription_move(self, src: int, msg: pm.SubscriptionMove, now: float, out: list[Action]) -> None:
        mig = self._incoming(src, msg.session, "SubscriptionMove")
        mig.on(msg, now)
        for cs in msg.ch_sub_set:
            ch = self.local[cs.ch_id]
            for sub in cs.subscriptions:
                ch.add(sub)
        out.append(ToPeer(src, pm.ReplySubscriptionMove(msg.session)))

    def _on_reforward(self, src: int, msg: pm.Reforward, now: float, out: list[Action]) -> None:
        mig = self.incoming.get((src, msg.session))
        if mig is not None and mig.active:
            mig.on(msg, now)  # rule 4: raises before SubscriptionMove
        self.stats["reforwards_in"] += 1
        for item in msg.messages:
            inner = item.message
            match inner:
                case pm.Event():
                    self._on_event(inner, out)
                case pm.Subscription():
                    self._on_subscription(inner, out)
                case pm.UnSubscription():
                    self._on_unsubscription(inner, out)

    def _on_complete(self, src: int, msg: pm.CompleteLoadBalance, now: float, out: list[Action]) -> None:
        mig = self.incoming.pop((src, msg.session), None)
        if mig is None:
            return
        self.monitor.leave_busy(completed=not msg.aborted)
        if msg.aborted:
            for c in mig.channels:
                if not (self.routing.get(c) and self.id in self.routing[c].owners):
                    self.local.remove(c)
            mig.abort()
            log.warning("node %d: session %d/%d aborted by sender; channels dropped", self.id, src, msg.session)
            return
        mig.on(msg, now)
        log.info("node %d: received %s from node %d", self.id, [str(c) for c in mig.channels], src)

    def tick(self, now: float) -> list[Action]:
        """Time-driven work: slices (SPEC §6) and session timeouts (migration rule 2)."""
        out: list[Action] = []
        self._slice_tick(now, out)
        for mig in list(self.outgoing.values()):
            if mig.expired(now):
                if mig.state in (OutState.REQUESTED, OutState.TRANSFERRING):
                    self._abort_outgoing(mig, f"no answer from node {mig.receiver} within {mig.timeout}s", out)
                else:
                    mig.deadline = now + mig.timeout
                    log.warning("node %d: session %d still waiting in %s", self.id, mig.session, mig.state.value)
            if not mig.active:
                self.outgoing.pop(mig.session, None)
        for key, inc in list(self.incoming.items()):
            if inc.expired(now):
                for c in inc.channels:
                    self.local.remove(c)
                inc.abort()
                self.monitor.leave_busy(completed=False)
                del self.incoming[key]
                log.warning("node %d: incoming session %s timed out; rolled back", self.id, key)
        return out

    # == clients =====================================================================

    def client_opened(self) -> int:
        self._session_seq += 1
        sid = self._session_seq
        self.sessions[sid] = _Session(sid)
        return sid

    def client_closed(self, sid: int) -> list[Action]:
        """Drop the session's subscriptions everywhere (subscriptions are owned by
        the client, which re-subscribes on reconnect)."""
        sess = self.sessions.pop(sid, None)
        out: list[Action] = []
        if sess is None:
            return out
        for local_id, (gid, f) in sess.subs.items():
            self._sub_owner.pop(gid, None)
            self._send_unsubscribe(sid, 0, local_id, gid, f, out)
        return out

    def handle_client(self, sid: int, msg: cm.ClientMessage, now: float) -> list[Action]:
        out: list[Action] = []
        sess = self.sessions.get(sid)
        if sess is None:
            return out
        if not sess.greeted:
            if not isinstance(msg, cm.Hello):
                out.append(ToClient(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, "the first message must be Hello", fatal=True)))
                out.append(CloseClient(sid, "no Hello"))
                return out
            sess.greeted = True
            sess.client_id = msg.client_id
            out.append(ToClient(sid, cm.Welcome(self.id, sid, self.ready, self.config.cluster.name)))
            return out
        match msg:
            case cm.Publish():
                self._client_publish(sess, msg, now, out)
            case cm.Subscribe():
                self._client_subscribe(sess, msg, out)
            case cm.Unsubscribe():
                self._client_unsubscribe(sess, msg, out)
            case cm.Ack():
                self.stats["client_acks"] += 1
            case cm.Admin():
                self._client_admin(sess, msg, now, out)
            case cm.Hello():
                out.append(ToClient(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, "Hello sent twice")))
            case _:
                out.append(ToClient(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, f"{type(msg).__name__} is not a client request", fatal=True)))
                out.append(CloseClient(sid, f"sent {type(msg).__name__}"))
        return out

    def _not_ready(self, sid: int, seq: int, out: list[Action]) -> bool:
        if self.ready:
            return False
        self.stats["rejected_not_ready"] += 1
        out.append(ToClient(sid, cm.Error(seq, cm.ErrorCode.NOT_READY, "the cluster is not ready yet; retry shortly")))
        return True

    def _client_publish(self, sess: _Session, msg: cm.Publish, now: float, out: list[Action]) -> None:
        if self._not_ready(sess.id, msg.seq, out):
            return
        try:
            if isinstance(msg.event, str):
                values = parse_event(msg.event, self.schema)
            else:
                values = self.schema.check_event_values(msg.event)
        except ExpressionError as exc:
            self.stats["rejected_bad_event"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EVENT, exc.reason, exc.position)))
            return
        except SchemaError as exc:
            self.stats["rejected_bad_event"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EVENT, str(exc))))
            return
        chid = self.routing.lookup_event(values)
        if chid is None:
            self.stats["rejected_no_route"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.NO_ROUTE, "no channel holds this event")))
            return
        self._event_seq += 1
        event_id = f"{self.id}-{self._event_seq}"
        self.stats["events_in"] += 1
        ev = pm.Event(event_id, values, self.id, pm.DispatchSign.EVENT_DISPATCHED, chid, msg.publish_time or now)
        self._dispatch_event(ev, out)
        out.append(ToClient(sess.id, cm.PubAck(msg.seq, event_id)))

    def _client_subscribe(self, sess: _Session, msg: cm.Subscribe, out: list[Action]) -> None:
        if self._not_ready(sess.id, msg.seq, out):
            return
        if msg.sub_id in sess.subs:
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.DUPLICATE_SUBSCRIPTION, f"subscription {msg.sub_id!r} already exists")))
            return
        try:
            f = parse_subscription(msg.expression, self.schema)
        except ExpressionError as exc:
            self.stats["rejected_bad_expression"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EXPRESSION, exc.reason, exc.position)))
            return
        sess.n += 1
        gid = f"{self.id}:{sess.id}:{msg.sub_id}:{sess.n}"
        sess.subs[msg.sub_id] = (gid, f)
        self._sub_owner[gid] = (sess.id, msg.sub_id)
        chans = self.routing.lookup_subscription(f)
        self._pending[gid] = _Pending(sess.id, msg.seq, msg.sub_id, True, chans)
        self.stats["subscriptions_in"] += 1
        if not chans:  # a filter no event can match: nothing to store
            self._pending.pop(gid)
            out.append(ToClient(sess.id, cm.SubAck(msg.seq, msg.sub_id, 0)))
            return
        sub = pm.Subscription(gid, f, sess.client_id, self.id, pm.DispatchSign.SUBSCRIBE_DISPATCHED)
        for chid in chans:
            self._dispatch_sub(msgspec.structs.replace(sub, ch_id=chid), out)

    def _client_unsubscribe(self, sess: _Session, msg: cm.Unsubscribe, out: list[Action]) -> None:
        entry = sess.subs.pop(msg.sub_id, None)
        if entry is None:
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.UNKNOWN_SUBSCRIPTION, f"no subscription {msg.sub_id!r}")))
            return
        gid, f = entry
        self._sub_owner.pop(gid, None)
        self._send_unsubscribe(sess.id, msg.seq, msg.sub_id, gid, f, out)

    def _send_unsubscribe(self, sid: int, seq: int, local_id: str, gid: str, f: Filter, out: list[Action]) -> None:
        self._pending.pop(gid, None)  # an unanswered subscribe is superseded
        chans = self.routing.lookup_subscription(f)
        self._pending[gid] = _Pending(sid, seq, local_id, False, chans)
        if not chans:
            self._on_applied(pm.SubscriptionApplied(gid, ChannelId(-1, -1), False), out)
            return
        unsub = pm.UnSubscription(gid, f, local_id, self.id, pm.DispatchSign.UNSUBSCRIBE_DISPATCHED)
        for chid in chans:
            self._dispatch_sub(msgspec.structs.replace(unsub, ch_id=chid), out)

    # -- operator commands -----------------------------------------------------------------

    def _client_admin(self, sess: _Session, msg: cm.Admin, now: float, out: list[Action]) -> None:
        try:
            match msg.command:
                case "status":
                    out.append(ToClient(sess.id, cm.AdminReply(msg.seq, self.status())))
                case "split":
                    self._admin_split(sess.id, msg, now, out)
                case "place":
                    chid = _parse_chid(msg.args.get("channel"))
                    receiver = msg.args.get("node")
                    if not isinstance(receiver, int):
                        raise LocalProtocolError("place needs an integer 'node'")
                    if chid not in self.local:
                        raise LocalProtocolError(self._not_owner(chid))
                    _, acts = self.start_migration([chid], receiver, now, forced=True, admin=(sess.id, msg.seq))
                    out.extend(acts)
                case _:
                    raise LocalProtocolError(f"unknown admin command {msg.command!r} (status, split, place)")
        except (OverlayError, KeyError, ValueError, TypeError) as exc:
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.ADMIN, str(exc))))

    def _not_owner(self, chid: ChannelId) -> str:
        entry = self.routing.get(chid)
        if entry is None:
            return f"channel {chid} does not exist"
        return f"channel {chid} is owned by node {entry.owner}, not node {self.id}"

    def _admin_split(self, sid: int, msg: cm.Admin, now: float, out: list[Action]) -> None:
        chid = _parse_chid(msg.args.get("channel"))
        ch = self.local.get(chid)
        if ch is None:
            raise LocalProtocolError(self._not_owner(chid))
        if chid in self._reforward or any(chid in m.channels and m.active for m in self.outgoing.values()):
            raise LocalProtocolError(f"channel {chid} is moving; split it later")
        attr_name = msg.args.get("attr")
        attr = self.schema.attribute(str(attr_name))
        if "values" in msg.args:
            low, high = ch.space.take_strings(attr.name, [str(v) for v in msg.args["values"]])
        else:
            at = msg.args.get("at")
            if isinstance(at, bool) or not isinstance(at, (int, float)):
                raise LocalProtocolError("split needs a numeric 'at' or a list of 'values'")
            low, high = ch.space.cut(attr, at)
        self._split_local(ch, Cut(attr.name, low, high, 0, 0), now, out, admin=(sid, msg.seq))

    def _admin_done(self, admin: tuple[int, int], result: Any, out: list[Action]) -> None:
        sid, seq = admin
        if sid in self.sessions:
            out.append(ToClient(sid, cm.AdminReply(seq, result)))

    def status(self) -> dict[str, Any]:
        return {
            "node": self.id,
            "ready": self.ready,
            "initializer": self.is_initializer,
            "load": self.local.load,
            "capacity": self.me.capacity,
            "channels": [ch.summary() for ch in self.local],
            "routing": [
                {"id": str(c), "space": e.space.text(self.schema), "owners": list(e.owners)}
                for c, e in sorted(self.routing.items())
            ],
            "sessions": len(self.sessions),
            "stats": dict(self.stats),
        }


def _parse_chid(raw: object) -> ChannelId:
    if isinstance(raw, str) and raw.count(".") == 1:
        node, seq = raw.split(".")
        if node.isdigit() and seq.isdigit():
            return ChannelId(int(node), int(seq))
    raise LocalProtocolError(f"channel ids look like 'node.seq' (e.g. '0.0'), got {raw!r}")


def _pick(owners: tuple[int, ...], key: str) -> int:
    """A replica for an event (SPEC §8.3): random-looking but stable per event."""
    return owners[zlib.crc32(key.encode()) % len(owners)]

