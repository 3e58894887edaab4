"""The migration half of the node core: both roles of a session (SPEC §8.1–8.2).

The rules are those of ``overlay.balance.migration`` (states, Reforward from
<2>, rollback before <3>); this mixin applies them to the node's tables:
the moving-out side snapshots subscriptions at <2>, switches its tables at
<3> and broadcasts UpdateRoutingTable; the receiver adds channels, then
subscriptions, then applies Reforwards in order.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from overlay.actions import Action, ToClient, ToPeer
from overlay.balance.migration import IncomingMigration, InState, OutgoingMigration, OutState
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm

if TYPE_CHECKING:
    from overlay.node_core import NodeCore

__all__ = ["MigrationMixin"]

log = logging.getLogger("overlay.node")


class MigrationMixin:
    """Mixed into ``NodeCore``."""

    _in_reforward = False  # True while applying a Reforward's messages (see _unfilled)

    # -- migration: moving-out side ---------------------------------------------------------

    def start_migration(
        self: NodeCore,
        channels: list[ChannelId],
        receiver: int,
        now: float,
        *,
        forced: bool = False,
        admin: tuple[int, int] | None = None,
    ) -> tuple[OutgoingMigration, list[Action]]:
        for chid in channels:
            if chid not in self.local:
                raise LocalProtocolError(f"channel {chid} is not on node {self.id}")
            if chid in self._reforward or any(chid in m.channels and m.active for m in self.outgoing.values()):
                raise LocalProtocolError(f"channel {chid} is already moving")
            if chid in self._arriving():
                raise LocalProtocolError(f"channel {chid} is still arriving; move it later")
            if chid == self._splitting():
                raise LocalProtocolError(f"channel {chid} is being split; move it later")
            if self.routing[chid].replicated:  # its other replicas would keep a channel no table names
                raise LocalProtocolError(
                    f"channel {chid} is replicated on nodes {list(self.routing[chid].owners)}; it cannot move"
                )
        if receiver == self.id or receiver not in self.peers:
            raise LocalProtocolError(f"node {receiver} cannot receive channels from node {self.id}")
        mig = OutgoingMigration(
            self.updates.next_session(), receiver, channels, started=now, timeout=self.timeout, forced=forced
        )
        self.outgoing[mig.session] = mig
        if admin is not None:
            self._admin_waits[mig.session] = admin
        d = float(self.local.load)
        req = pm.RequestLoadBalance(d, d / self.me.capacity, mig.session, forced)
        log.info(
            "node %d: session %d: moving %s to node %d", self.id, mig.session, [str(c) for c in channels], receiver
        )
        return mig, [ToPeer(receiver, req)]

    def _on_migration_reply(self: NodeCore, src: int, msg: pm.PeerMessage, now: float, out: list[Action]) -> None:
        mig = self.outgoing.get(msg.session)  # type: ignore[attr-defined]
        if mig is None or mig.receiver != src:
            # A late answer to a session already timed out and rolled back.
            log.info("node %d: ignoring %s from node %d for a session that is over", self.id, type(msg).__name__, src)
            return
        state = mig.on(msg, now)
        if state is OutState.ABORTED:
            self._abort_outgoing(mig, mig.reason, out)
        elif state is OutState.TRANSFERRING:
            planned = self._plan_transfer(mig, now, out) if not mig.channels else True
            if planned is None:  # a split first, in the background: _split_ready goes on
                return
            if not planned:
                mig.abort(mig.reason or "nothing to move")
                self._abort_outgoing(mig, mig.reason, out)
                return
            self._send_transfer(mig, out)
        elif state is OutState.MOVING:
            # <2>: snapshot the subscriptions, and reforward from now on (migration rule 3).
            sets = []
            for c in mig.channels:
                subs = tuple(self.local[c])
                mig.subscriptions_moved += len(subs)
                sets.append(pm.ChannelSubscriptions(c, subs, self.groups.states(c)))  # groups: node.groups
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
            self.updates.broadcast((), updates, out, session=mig.session)
            mig.updates_sent([p for p in self.peers if p not in self.unreachable], now)  # rule 5
            if mig.state is OutState.DONE:  # no live peer to wait for
                self._finish_outgoing(mig, out)

    def _send_transfer(self: NodeCore, mig: OutgoingMigration, out: list[Action]) -> None:
        specs = tuple(
            pm.ChannelSpec(c, self.local[c].space, self.past_owners_leaving(c, self.now)) for c in mig.channels
        )
        out.append(ToPeer(mig.receiver, pm.ChannelTransfer(specs, mig.session)))

    def _finish_outgoing(self: NodeCore, mig: OutgoingMigration, out: list[Action]) -> None:
        for c in mig.channels:
            if self._reforward.get(c) is mig:
                del self._reforward[c]
        out.append(ToPeer(mig.receiver, pm.CompleteLoadBalance(mig.session)))
        self.stats["replications" if mig.replicate else "migrations"] += 1
        self.stats["subscriptions_moved"] += mig.subscriptions_moved
        self.stats["migration_bytes"] += mig.bytes_moved
        bw = self.config.bw(self.id, mig.receiver)
        self.record(
            "replication" if mig.replicate else "migration",
            mig.times.get("done", mig.started),
            session=mig.session,
            receiver=mig.receiver,
            channels=[str(c) for c in mig.channels],
            subscriptions=mig.subscriptions_moved,
            bytes=mig.bytes_moved,
            bw=bw,
            mig_cost=mig.subscriptions_moved / bw,
            forced=mig.forced,
            sets=mig.five_sets(),
            duration=round(mig.times.get("done", mig.started) - mig.started, 6),
            times={k: round(v - mig.started, 6) for k, v in mig.times.items()},
        )
        if not mig.forced:
            self.monitor.leave_busy(completed=True)
        log.info(
            "node %d: session %d done: %d channels, %d subscriptions to node %d",
            self.id,
            mig.session,
            len(mig.channels),
            mig.subscriptions_moved,
            mig.receiver,
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

    def _abort_outgoing(
        self: NodeCore, mig: OutgoingMigration, reason: str, out: list[Action], *, failure: bool = False
    ) -> None:
        """End a session before <3>.  ``failure``: the receiver failed (no
        answer, unreachable, restarted) — a WARNING; a refusal or nothing
        worth moving is ordinary balancing, logged at INFO in plain words."""
        if mig.state is not OutState.ABORTED:
            mig.abort(reason)
        if self._split is not None and self._split[1] is mig:
            self._cancel_split()
        out.append(ToPeer(mig.receiver, pm.CompleteLoadBalance(mig.session, aborted=True, reason=reason)))
        self.stats["migrations_aborted"] += 1
        if failure or "<2>" in mig.times:
            log.warning(
                "node %d: session %d to node %d rolled back, its channels stay here: %s",
                self.id,
                mig.session,
                mig.receiver,
                reason,
            )
        else:
            log.info(
                "node %d: balancing session %d with node %d moved nothing: %s",
                self.id,
                mig.session,
                mig.receiver,
                reason,
            )
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
        self: NodeCore,
        mig: OutgoingMigration,
        chid: ChannelId,
        sign: pm.ReforwardSign,
        msg: pm.Subscription | pm.UnSubscription | pm.Event,
        out: list[Action],
    ) -> None:
        self.stats["reforwards"] += 1
        if mig.state is OutState.MOVING:
            mig.log.append((chid, msg))
        out.append(ToPeer(mig.receiver, pm.Reforward(chid, (pm.ReforwardItem(sign, msg),), mig.session)))

    def _rollback_moving(self: NodeCore, mig: OutgoingMigration, reason: str, out: list[Action]) -> None:
        """Migration rule 5 past <2>: the receiver is gone; take the channels back."""
        for c in mig.channels:
            if self._reforward.get(c) is mig:
                del self._reforward[c]
        log_items, mig.log = mig.log, []
        mig.abort(reason)
        self._abort_outgoing(mig, reason, out, failure=True)
        for _chid, msg in log_items:  # the channels are still ours: apply in order
            if isinstance(msg, pm.Event):
                self._on_event(msg, out)
            elif isinstance(msg, pm.Subscription):
                self._on_subscription(msg, out)
            else:
                self._on_unsubscription(msg, out)
        self.stats["rollbacks_after_2"] += 1
        self.stats["reforwards_reapplied"] += len(log_items)

    def peer_unreachable(self: NodeCore, node: int, now: float) -> list[Action]:
        """The shell lost its link to ``node`` for longer than the peer timeout."""
        self.unreachable.add(node)
        self.now = now
        out: list[Action] = []
        self._peer_gone(node, f"no answer from node {node}: unreachable for {self.timeout}s", out)
        return out

    def _peer_gone(self: NodeCore, node: int, reason: str, out: list[Action]) -> None:
        """Rule 5, and node_core rule 7: a session with a peer that is gone
        (unreachable past the timeout, or restarted) ends on this side, and
        nothing waits for its replies any more, so balancing goes on among
        the live nodes.  Before <3> the session rolls back (past <2> with
        what was reforwarded re-applied here); from <3> the tables have moved
        and the session completes without that peer's ReplyUpdateGlobal."""
        for mig in list(self.outgoing.values()):
            if mig.receiver == node and mig.active:
                if mig.state in (OutState.REQUESTED, OutState.TRANSFERRING):
                    self._abort_outgoing(mig, reason, out, failure=True)
                elif mig.state is OutState.MOVING:
                    self._rollback_moving(mig, reason, out)
        self._stop_waiting_for(node, out)
        for key, inc in list(self.incoming.items()):
            if inc.origin == node:
                self._incoming_lost(key, inc, reason)
        self.groups.peer_down(node, self.now, out)  # its tracked deliveries (node.groups)

    def _stop_waiting_for(self: NodeCore, node: int, out: list[Action]) -> None:
        """Take ``node``'s ReplyUpdateGlobal as given, for every update waiting on it."""
        for mig in list(self.outgoing.values()):
            if mig.state is OutState.UPDATING and node in mig.waiting_updates:
                self._on_update_reply(node, pm.ReplyUpdateGlobal(mig.session, self.id), self.now, out)
        self.updates.stop_waiting_for(node, out)

    def _incoming_lost(self: NodeCore, key: tuple[int, int], inc: IncomingMigration, reason: str) -> None:
        """The sender of an incoming session is gone: channels the routing
        table gives this node are kept (the sender got past <3>), the others
        are dropped (it never got there: the table still names it)."""
        kept = []
        for c in inc.channels:
            entry = self.routing.get(c)
            if entry is not None and self.id in entry.owners:
                kept.append(c)
            else:
                self.local.remove(c)
        inc.abort()
        del self.incoming[key]
        self.monitor.leave_busy(completed=bool(kept))
        log.warning(
            "node %d: incoming session %d/%d ended (%s): kept %s",
            self.id,
            key[0],
            key[1],
            reason,
            [str(c) for c in kept] or "nothing",
        )

    def peer_reachable(self: NodeCore, node: int) -> None:
        self.unreachable.discard(node)

    # -- migration: receiver side -------------------------------------------------------------

    def _on_request(self: NodeCore, src: int, msg: pm.RequestLoadBalance, now: float, out: list[Action]) -> None:
        key = (src, msg.session)
        if key in self.incoming:
            raise RemoteProtocolError(f"node {src} reopened session {msg.session}")
        ok, reason = self._accepts(msg)
        if not ok:
            out.append(ToPeer(src, pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_FAIL, msg.session, reason)))
            return
        self.incoming[key] = IncomingMigration(src, msg.session, started=now, timeout=self.timeout)
        out.append(ToPeer(src, pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_SUCCESS, msg.session)))

    def _arriving(self: NodeCore) -> set[ChannelId]:
        """Channels an incoming session put in the localTable that are not ours
        until its CompleteLoadBalance: no split, merge or move may touch them
        (the sender's SubscriptionMove and Reforwards still name them)."""
        return {c for m in self.incoming.values() for c in m.channels}

    def _unfilled(self: NodeCore, chid: ChannelId, *, event: bool = False) -> bool:
        """An arriving channel is not this node's until its subscriptions are
        here and the routing table names this node: what reaches it straight (an
        old route, e.g. from when it lived here before) goes to the owner the
        table names, which keeps it or reforwards it here in order.  Reforwards
        themselves are the owner's hand-over and apply here.  An event only
        needs the subscriptions: once they are here it is matched here, once,
        as a reforwarded one would be."""
        for m in self.incoming.values():
            if chid in m.channels:
                if m.state is InState.CHANNELS_ADDED:
                    return True
                if event:
                    return False
                entry = self.routing.get(chid)
                return not self._in_reforward and entry is not None and self.id not in entry.owners
        return False

    def _incoming(self: NodeCore, src: int, session: int, what: str) -> IncomingMigration:
        mig = self.incoming.get((src, session))
        if mig is None:
            raise RemoteProtocolError(f"{what} from node {src} names unknown session {session}")
        return mig

    def _on_channel_transfer(self: NodeCore, src: int, msg: pm.ChannelTransfer, now: float, out: list[Action]) -> None:
        if (src, msg.session) not in self.incoming:  # we stopped waiting for it: the sender rolls back
            ids = tuple(c.ch_id for c in msg.channels)
            out.append(
                ToPeer(src, pm.ReplyChannelTransfer(pm.ReplySign.REPLY_FAIL, ids, msg.session, "session timed out"))
            )
            return
        mig = self._incoming(src, msg.session, "ChannelTransfer")
        clash = [c.ch_id for c in msg.channels if c.ch_id in self.local]
        if clash:
            mig.abort()
            out.append(
                ToPeer(
                    src,
                    pm.ReplyChannelTransfer(pm.ReplySign.REPLY_FAIL, tuple(clash), msg.session, "channel already here"),
                )
            )
            return
        mig.on(msg, now)
        for spec in msg.channels:
            self.local.add(Channel(spec.ch_id, spec.space, self.schema))
            if spec.past_owners:
                self._past_owners[spec.ch_id] = spec.past_owners  # node_balancing rule 7
        out.append(ToPeer(src, pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, mig.channels, msg.session)))

    def _on_subscription_move(
        self: NodeCore, src: int, msg: pm.SubscriptionMove, now: float, out: list[Action]
    ) -> None:
        mig = self._incoming(src, msg.session, "SubscriptionMove")
        mig.on(msg, now)
        for cs in msg.ch_sub_set:
            # Stored at once, indexed in the background (Channel rule 5): indexing
            # thousands here would hold up every event behind this message.
            # Those of a dead client (node_core rule 7) are not taken.
            subs = [s for s in cs.subscriptions if not self._stale_sub(s.id, s.access_node)]
            if len(subs) < len(cs.subscriptions):
                self.stats["subscriptions_of_dead_clients_removed"] += len(cs.subscriptions) - len(subs)
            self.local[cs.ch_id].add_deferred(subs)
            self.index_wanted = True
            self.groups.restore(cs)  # the group dispatch state (node.groups)
        out.append(ToPeer(src, pm.ReplySubscriptionMove(msg.session)))

    def _on_reforward(self: NodeCore, src: int, msg: pm.Reforward, now: float, out: list[Action]) -> None:
        mig = self.incoming.get((src, msg.session))
        if mig is not None and mig.active:
            mig.on(msg, now)  # rule 4: raises before SubscriptionMove
        self.stats["reforwards_in"] += 1
        self._in_reforward = True  # no detour through _unfilled: the owner hands these over
        try:
            for item in msg.messages:
                inner = item.message
                match inner:
                    case pm.Event():
                        self._on_event(inner, out)
                    case pm.Subscription():
                        self._on_subscription(inner, out)
                    case pm.UnSubscription():
                        self._on_unsubscription(inner, out)
        finally:
            self._in_reforward = False

    def _on_complete(self: NodeCore, src: int, msg: pm.CompleteLoadBalance, now: float, out: list[Action]) -> None:
        mig = self.incoming.pop((src, msg.session), None)
        if mig is None:
            return
        self.monitor.leave_busy(completed=not msg.aborted)
        if msg.aborted:
            for c in mig.channels:
                if not (self.routing.get(c) and self.id in self.routing[c].owners):
                    self.local.remove(c)
            mig.abort()
            # Nothing is lost: the channels it had offered stay with node src.
            log.info(
                "node %d: node %d called off balancing session %d (%s); its channels stay with it",
                self.id,
                src,
                msg.session,
                msg.reason or "no reason given",
            )
            return
        mig.on(msg, now)
        log.info("node %d: received %s from node %d", self.id, [str(c) for c in mig.channels], src)
