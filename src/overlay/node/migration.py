"""The migration half of the node core: both roles of a session (SPEC §8.1–8.2).

The rules are those of ``overlay.balance.migration`` (states, Reforward from
<2>, rollback before <3>); ``Migration`` applies them to the node's tables:
the moving-out side snapshots subscriptions at <2>, switches its tables at
<3> and broadcasts UpdateRoutingTable; the receiver adds channels, then
subscriptions, then applies Reforwards in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from overlay.actions import Action, ToClient, ToPeer
from overlay.balance.migration import IncomingMigration, InState, OutgoingMigration, OutState
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.groups import Groups
from overlay.node.indexing import Indexing
from overlay.node.updates import TableUpdates

__all__ = ["Migration", "Planner"]

log = logging.getLogger("overlay.node")

MigrationReply = pm.ReplyRequestLoadBalance | pm.ReplyChannelTransfer | pm.ReplySubscriptionMove
Reapply = Callable[[pm.Event | pm.Subscription | pm.UnSubscription, list[Action]], None]
AdminDone = Callable[[tuple[int, int], Any, list[Action]], None]
StaleSub = Callable[[str, int], bool]


class Planner(Protocol):
    """What a session needs from balancing (``overlay.node.balancing``):
    whether to accept one, which channels to send, what a channel's past
    owners are, and the monitor's busy state."""

    def accepts(self, msg: pm.RequestLoadBalance) -> tuple[bool, str]: ...

    def plan(self, mig: OutgoingMigration, now: float, out: list[Action]) -> bool | None: ...

    def request_next(self, now: float, out: list[Action]) -> None: ...

    def session_ended(self, mig: OutgoingMigration) -> None: ...

    def leave_busy(self, *, completed: bool) -> None: ...

    def splitting(self) -> ChannelId | None: ...

    def past_owners_leaving(self, chid: ChannelId, now: float) -> tuple[pm.PastOwner, ...]: ...

    def arrived_from(self, chid: ChannelId, past: Sequence[pm.PastOwner]) -> None: ...


class Migration:
    """Both sides of this node's migration sessions (SPEC §8.1–8.2).

    Owns the sessions (``outgoing`` by session id, ``incoming`` by (sender,
    session)), the channels whose messages are reforwarded to a receiver
    (``reforwarding``), and the operators waiting on a move.  ``planner`` is
    balancing, set once by the node core (the two need each other);
    ``reapply`` handles an event or (un)subscription as if it had just come
    (``node.router``); ``stale_sub`` tells a dead client's subscription
    (``node.sessions``); ``admin_done`` answers an operator.
    """

    planner: Planner

    def __init__(
        self,
        ctx: NodeContext,
        updates: TableUpdates,
        groups: Groups,
        indexing: Indexing,
        *,
        reapply: Reapply,
        stale_sub: StaleSub,
        admin_done: AdminDone,
    ) -> None:
        self._ctx = ctx
        self._updates = updates
        self._groups = groups
        self._indexing = indexing
        self._reapply = reapply
        self._stale_sub = stale_sub
        self._admin_done = admin_done
        self._timeout = ctx.config.cluster.peer_timeout
        self.outgoing: dict[int, OutgoingMigration] = {}
        self.incoming: dict[tuple[int, int], IncomingMigration] = {}
        self.reforwarding: dict[ChannelId, OutgoingMigration] = {}
        self.in_reforward = False  # True while applying a Reforward's messages (see unfilled)
        self._admin_waits: dict[int, tuple[int, int]] = {}  # session -> (client session, seq)

    # -- what other components ask -------------------------------------------------------------

    def busy(self) -> bool:
        """A session in progress on either side."""
        return bool(self.incoming) or any(m.active for m in self.outgoing.values())

    def moving(self, chid: ChannelId) -> bool:
        """``chid`` is leaving this node in a session."""
        return chid in self.reforwarding or any(chid in m.channels and m.active for m in self.outgoing.values())

    def operators_waiting(self) -> list[int]:
        """The sessions an operator's command waits on."""
        return sorted(self._admin_waits)

    def leaving(self) -> set[ChannelId]:
        """Channels on their way out (their receiver indexes them)."""
        return set(self.reforwarding) | {c for m in self.outgoing.values() if m.active for c in m.channels}

    def request(self, receiver: int, candidate: Any, msg_d: float, msg_dc: float, now: float) -> ToPeer:
        """A balancing session to ``receiver`` (SPEC §8.1 step 1): its request."""
        mig = OutgoingMigration(self._updates.next_session(), receiver, (), started=now, timeout=self._timeout)
        mig.candidate = candidate
        self.outgoing[mig.session] = mig
        return ToPeer(receiver, pm.RequestLoadBalance(msg_d, msg_dc, mig.session))

    def on_update_reply(self, src: int, msg: pm.ReplyUpdateGlobal, now: float, out: list[Action]) -> bool:
        """A reply to a session's table update at <3>: True when it was one."""
        mig = self.outgoing.get(msg.session)
        if mig is None or mig.state is not OutState.UPDATING or msg.origin != self._ctx.id:
            return False
        if mig.on_update_reply(src, now) is OutState.DONE:
            self._finish(mig, out)
        return True

    # -- migration: moving-out side ---------------------------------------------------------

    def start(
        self,
        channels: list[ChannelId],
        receiver: int,
        now: float,
        *,
        forced: bool = False,
        admin: tuple[int, int] | None = None,
    ) -> tuple[OutgoingMigration, list[Action]]:
        for chid in channels:
            if chid not in self._ctx.local:
                raise LocalProtocolError(f"channel {chid} is not on node {self._ctx.id}")
            if chid in self.reforwarding or any(chid in m.channels and m.active for m in self.outgoing.values()):
                raise LocalProtocolError(f"channel {chid} is already moving")
            if chid in self.arriving():
                raise LocalProtocolError(f"channel {chid} is still arriving; move it later")
            if chid == self.planner.splitting():
                raise LocalProtocolError(f"channel {chid} is being split; move it later")
            if self._ctx.routing[chid].replicated:  # its other replicas would keep a channel no table names
                raise LocalProtocolError(
                    f"channel {chid} is replicated on nodes {list(self._ctx.routing[chid].owners)}; it cannot move"
                )
        if receiver == self._ctx.id or receiver not in self._ctx.peers:
            raise LocalProtocolError(f"node {receiver} cannot receive channels from node {self._ctx.id}")
        mig = OutgoingMigration(
            self._updates.next_session(), receiver, channels, started=now, timeout=self._timeout, forced=forced
        )
        self.outgoing[mig.session] = mig
        if admin is not None:
            self._admin_waits[mig.session] = admin
        d = float(self._ctx.local.load)
        req = pm.RequestLoadBalance(d, d / self._ctx.me.capacity, mig.session, forced)
        log.info(
            "node %d: session %d: moving %s to node %d", self._ctx.id, mig.session, [str(c) for c in channels], receiver
        )
        return mig, [ToPeer(receiver, req)]

    def on_reply(self, src: int, msg: MigrationReply, now: float, out: list[Action]) -> None:
        mig = self.outgoing.get(msg.session)
        if mig is None or mig.receiver != src:
            # A late answer to a session already timed out and rolled back.
            log.info(
                "node %d: ignoring %s from node %d for a session that is over", self._ctx.id, type(msg).__name__, src
            )
            return
        state = mig.on(msg, now)
        if state is OutState.ABORTED:
            self.abort(mig, mig.reason, out)
        elif state is OutState.TRANSFERRING:
            planned = self.planner.plan(mig, now, out) if not mig.channels else True
            if planned is None:  # a split first, in the background: _split_ready goes on
                return
            if not planned:
                mig.abort(mig.reason or "nothing to move")
                self.abort(mig, mig.reason, out)
                return
            self.send_transfer(mig, out)
        elif state is OutState.MOVING:
            # <2>: snapshot the subscriptions, and reforward from now on (migration rule 3).
            sets = []
            for c in mig.channels:
                subs = tuple(self._ctx.local[c])
                mig.subscriptions_moved += len(subs)
                sets.append(pm.ChannelSubscriptions(c, subs, self._groups.states(c)))  # groups: node.groups
                self.reforwarding[c] = mig
            move = pm.SubscriptionMove(pm.SubscriptionType.ATOMIC, tuple(sets), mig.session)
            mig.bytes_moved = len(msgspec.msgpack.encode(move))
            out.append(ToPeer(mig.receiver, move))
        elif state is OutState.UPDATING:
            # <3>: the receiver holds everything; switch the tables.
            updates = []
            for c in mig.channels:
                ch: Channel | None
                if mig.replicate:  # the channel stays here too: one more owner
                    ch = self._ctx.local[c]
                    owners = tuple(dict.fromkeys((*self._ctx.routing[c].owners, mig.receiver)))
                else:
                    ch = self._ctx.local.remove(c)
                    owners = (mig.receiver,)
                assert ch is not None
                entry = RouteEntry(ch.space, owners)
                self._ctx.routing.set(c, entry)
                updates.append((c, entry))
            self._updates.broadcast((), updates, out, session=mig.session)
            mig.updates_sent([p for p in self._ctx.peers if p not in self._ctx.unreachable], now)  # rule 5
            if mig.state is OutState.DONE:  # no live peer to wait for
                self._finish(mig, out)

    def send_transfer(self, mig: OutgoingMigration, out: list[Action]) -> None:
        specs = tuple(
            pm.ChannelSpec(c, self._ctx.local[c].space, self.planner.past_owners_leaving(c, self._ctx.now))
            for c in mig.channels
        )
        out.append(ToPeer(mig.receiver, pm.ChannelTransfer(specs, mig.session)))

    def _finish(self, mig: OutgoingMigration, out: list[Action]) -> None:
        for c in mig.channels:
            if self.reforwarding.get(c) is mig:
                del self.reforwarding[c]
        out.append(ToPeer(mig.receiver, pm.CompleteLoadBalance(mig.session)))
        self._ctx.stats["replications" if mig.replicate else "migrations"] += 1
        self._ctx.stats["subscriptions_moved"] += mig.subscriptions_moved
        self._ctx.stats["migration_bytes"] += mig.bytes_moved
        bw = self._ctx.config.bw(self._ctx.id, mig.receiver)
        self._ctx.journal.record(
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
            self.planner.leave_busy(completed=True)
        log.info(
            "node %d: session %d done: %d channels, %d subscriptions to node %d",
            self._ctx.id,
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

    def abort(self, mig: OutgoingMigration, reason: str, out: list[Action], *, failure: bool = False) -> None:
        """End a session before <3>.  ``failure``: the receiver failed (no
        answer, unreachable, restarted) — a WARNING; a refusal or nothing
        worth moving is ordinary balancing, logged at INFO in plain words."""
        if mig.state is not OutState.ABORTED:
            mig.abort(reason)
        self.planner.session_ended(mig)
        out.append(ToPeer(mig.receiver, pm.CompleteLoadBalance(mig.session, aborted=True, reason=reason)))
        self._ctx.stats["migrations_aborted"] += 1
        if failure or "<2>" in mig.times:
            log.warning(
                "node %d: session %d to node %d rolled back, its channels stay here: %s",
                self._ctx.id,
                mig.session,
                mig.receiver,
                reason,
            )
        else:
            log.info(
                "node %d: balancing session %d with node %d moved nothing: %s",
                self._ctx.id,
                mig.session,
                mig.receiver,
                reason,
            )
        self._ctx.journal.record("abort", mig.started, session=mig.session, receiver=mig.receiver, reason=reason)
        if not mig.forced:
            if mig.candidate is not None and "<2>" not in mig.times and not mig.channels:
                self.planner.request_next(mig.started, out)  # refused: try the next candidate (SPEC §8.1 step 4)
            else:
                self.planner.leave_busy(completed=False)
        admin = self._admin_waits.pop(mig.session, None)
        if admin is not None:
            out.append(ToClient(admin[0], cm.Error(admin[1], cm.ErrorCode.ADMIN, f"migration aborted: {reason}")))

    def reforward(
        self,
        mig: OutgoingMigration,
        chid: ChannelId,
        sign: pm.ReforwardSign,
        msg: pm.Subscription | pm.UnSubscription | pm.Event,
        out: list[Action],
    ) -> None:
        self._ctx.stats["reforwards"] += 1
        if mig.state is OutState.MOVING:
            mig.log.append((chid, msg))
        out.append(ToPeer(mig.receiver, pm.Reforward(chid, (pm.ReforwardItem(sign, msg),), mig.session)))

    def _rollback(self, mig: OutgoingMigration, reason: str, out: list[Action]) -> None:
        """Migration rule 5 past <2>: the receiver is gone; take the channels back."""
        for c in mig.channels:
            if self.reforwarding.get(c) is mig:
                del self.reforwarding[c]
        log_items, mig.log = mig.log, []
        mig.abort(reason)
        self.abort(mig, reason, out, failure=True)
        for _chid, msg in log_items:  # the channels are still ours: apply in order
            self._reapply(msg, out)
        self._ctx.stats["rollbacks_after_2"] += 1
        self._ctx.stats["reforwards_reapplied"] += len(log_items)

    def peer_gone(self, node: int, reason: str, out: list[Action]) -> None:
        """Rule 5, and node.core rule 7: a session with a peer that is gone
        (unreachable past the timeout, or restarted) ends on this side, and
        nothing waits for its replies any more, so balancing goes on among
        the live nodes.  Before <3> the session rolls back (past <2> with
        what was reforwarded re-applied here); from <3> the tables have moved
        and the session completes without that peer's ReplyUpdateGlobal."""
        for mig in list(self.outgoing.values()):
            if mig.receiver == node and mig.active:
                if mig.state in (OutState.REQUESTED, OutState.TRANSFERRING):
                    self.abort(mig, reason, out, failure=True)
                elif mig.state is OutState.MOVING:
                    self._rollback(mig, reason, out)
        self.stop_waiting_for(node, out)
        for key, inc in list(self.incoming.items()):
            if inc.origin == node:
                self._incoming_lost(key, inc, reason)
        self._groups.peer_down(node, self._ctx.now, out)  # its tracked deliveries (node.groups)

    def stop_waiting_for(self, node: int, out: list[Action]) -> None:
        """Take ``node``'s ReplyUpdateGlobal as given, for every update waiting on it."""
        for mig in list(self.outgoing.values()):
            if mig.state is OutState.UPDATING and node in mig.waiting_updates:
                self.on_update_reply(node, pm.ReplyUpdateGlobal(mig.session, self._ctx.id), self._ctx.now, out)
        self._updates.stop_waiting_for(node, out)

    def _incoming_lost(self, key: tuple[int, int], inc: IncomingMigration, reason: str) -> None:
        """The sender of an incoming session is gone: channels the routing
        table gives this node are kept (the sender got past <3>), the others
        are dropped (it never got there: the table still names it)."""
        kept = []
        for c in inc.channels:
            entry = self._ctx.routing.get(c)
            if entry is not None and self._ctx.id in entry.owners:
                kept.append(c)
            else:
                self._ctx.local.remove(c)
        inc.abort()
        del self.incoming[key]
        self.planner.leave_busy(completed=bool(kept))
        log.warning(
            "node %d: incoming session %d/%d ended (%s): kept %s",
            self._ctx.id,
            key[0],
            key[1],
            reason,
            [str(c) for c in kept] or "nothing",
        )

    # -- migration: receiver side -------------------------------------------------------------

    def on_request(self, src: int, msg: pm.RequestLoadBalance, now: float, out: list[Action]) -> None:
        key = (src, msg.session)
        if key in self.incoming:
            raise RemoteProtocolError(f"node {src} reopened session {msg.session}")
        ok, reason = self.planner.accepts(msg)
        if not ok:
            out.append(ToPeer(src, pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_FAIL, msg.session, reason)))
            return
        self.incoming[key] = IncomingMigration(src, msg.session, started=now, timeout=self._timeout)
        out.append(ToPeer(src, pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_SUCCESS, msg.session)))

    def arriving(self) -> set[ChannelId]:
        """Channels an incoming session put in the localTable that are not ours
        until its CompleteLoadBalance: no split, merge or move may touch them
        (the sender's SubscriptionMove and Reforwards still name them)."""
        return {c for m in self.incoming.values() for c in m.channels}

    def unfilled(self, chid: ChannelId, *, event: bool = False) -> bool:
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
                entry = self._ctx.routing.get(chid)
                return not self.in_reforward and entry is not None and self._ctx.id not in entry.owners
        return False

    def _incoming(self, src: int, session: int, what: str) -> IncomingMigration:
        mig = self.incoming.get((src, session))
        if mig is None:
            raise RemoteProtocolError(f"{what} from node {src} names unknown session {session}")
        return mig

    def on_channel_transfer(self, src: int, msg: pm.ChannelTransfer, now: float, out: list[Action]) -> None:
        if (src, msg.session) not in self.incoming:  # we stopped waiting for it: the sender rolls back
            ids = tuple(c.ch_id for c in msg.channels)
            out.append(
                ToPeer(src, pm.ReplyChannelTransfer(pm.ReplySign.REPLY_FAIL, ids, msg.session, "session timed out"))
            )
            return
        mig = self._incoming(src, msg.session, "ChannelTransfer")
        clash = [c.ch_id for c in msg.channels if c.ch_id in self._ctx.local]
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
            self._ctx.local.add(Channel(spec.ch_id, spec.space, self._ctx.schema))
            if spec.past_owners:
                self.planner.arrived_from(spec.ch_id, spec.past_owners)  # node.balancing rule 7
        out.append(ToPeer(src, pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, mig.channels, msg.session)))

    def on_subscription_move(self, src: int, msg: pm.SubscriptionMove, now: float, out: list[Action]) -> None:
        mig = self._incoming(src, msg.session, "SubscriptionMove")
        mig.on(msg, now)
        for cs in msg.ch_sub_set:
            # Stored at once, indexed in the background (Channel rule 5): indexing
            # thousands here would hold up every event behind this message.
            # Those of a dead client (node.core rule 7) are not taken.
            subs = [s for s in cs.subscriptions if not self._stale_sub(s.id, s.access_node)]
            if len(subs) < len(cs.subscriptions):
                self._ctx.stats["subscriptions_of_dead_clients_removed"] += len(cs.subscriptions) - len(subs)
            self._ctx.local[cs.ch_id].add_deferred(subs)
            self._indexing.want()
            self._groups.restore(cs)  # the group dispatch state (node.groups)
        out.append(ToPeer(src, pm.ReplySubscriptionMove(msg.session)))

    def on_reforward(self, src: int, msg: pm.Reforward, now: float, out: list[Action]) -> None:
        mig = self.incoming.get((src, msg.session))
        if mig is not None and mig.active:
            mig.on(msg, now)  # rule 4: raises before SubscriptionMove
        self._ctx.stats["reforwards_in"] += 1
        self.in_reforward = True  # no detour through unfilled: the owner hands these over
        try:
            for item in msg.messages:
                self._reapply(item.message, out)
        finally:
            self.in_reforward = False

    def on_complete(self, src: int, msg: pm.CompleteLoadBalance, now: float, out: list[Action]) -> None:
        mig = self.incoming.pop((src, msg.session), None)
        if mig is None:
            return
        self.planner.leave_busy(completed=not msg.aborted)
        if msg.aborted:
            for c in mig.channels:
                if not (self._ctx.routing.get(c) and self._ctx.id in self._ctx.routing[c].owners):
                    self._ctx.local.remove(c)
            mig.abort()
            # Nothing is lost: the channels it had offered stay with node src.
            log.info(
                "node %d: node %d called off balancing session %d (%s); its channels stay with it",
                self._ctx.id,
                src,
                msg.session,
                msg.reason or "no reason given",
            )
            return
        mig.on(msg, now)
        log.info("node %d: received %s from node %d", self._ctx.id, [str(c) for c in mig.channels], src)

    # -- time (migration rule 2) ---------------------------------------------------------------

    def tick(self, now: float, out: list[Action]) -> None:
        """Session timeouts (rule 2), both sides; a peer that became unreachable
        is not waited for past <3> (rule 5)."""
        for mig in list(self.outgoing.values()):
            if mig.expired(now):
                if mig.state in (OutState.REQUESTED, OutState.TRANSFERRING):
                    self.abort(mig, f"no answer from node {mig.receiver} within {mig.timeout}s", out, failure=True)
                elif mig.state is OutState.MOVING and mig.receiver in self._ctx.unreachable:
                    self._rollback(mig, f"no answer from node {mig.receiver}: unreachable", out)
                elif mig.state is OutState.UPDATING and mig.waiting_updates & self._ctx.unreachable:
                    for node in sorted(mig.waiting_updates & self._ctx.unreachable):  # migration rule 5
                        self.stop_waiting_for(node, out)
                else:
                    mig.deadline = now + mig.timeout
                    log.warning("node %d: session %d still waiting in %s", self._ctx.id, mig.session, mig.state.value)
            if not mig.active:
                self.outgoing.pop(mig.session, None)
        for key, inc in list(self.incoming.items()):
            if inc.expired(now):
                for c in inc.channels:
                    self._ctx.local.remove(c)
                inc.abort()
                self.planner.leave_busy(completed=False)
                del self.incoming[key]
                log.warning("node %d: incoming session %s timed out; rolled back", self._ctx.id, key)
