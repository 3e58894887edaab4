"""The migration half of the node core: both roles of a session (SPEC §8.1–8.2).

The rules are those of ``overlay.balance.migration`` (states, Reforward from
<2>, rollback before <3>); ``Migration`` applies them to the node's tables:
the moving-out side snapshots subscriptions at <2>, switches its tables at
<3> and broadcasts UpdateRoutingTable; the receiver adds channels, then
subscriptions, then applies Reforwards in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

import msgspec

from overlay.actions import Action, ToClient, ToPeer
from overlay.balance.migration import OutgoingMigration, OutState
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.errors import LocalProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.arrivals import Arrivals
from overlay.node.context import NodeContext
from overlay.node.groups import Groups
from overlay.node.loads import ChannelLoads
from overlay.node.planner import Planner
from overlay.node.updates import TableUpdates

__all__ = ["Migration"]

log = logging.getLogger("overlay.node")

MigrationReply = pm.ReplyRequestLoadBalance | pm.ReplyChannelTransfer | pm.ReplySubscriptionMove
Reapply = Callable[[pm.Event | pm.Subscription | pm.UnSubscription, list[Action]], None]
AdminDone = Callable[[tuple[int, int], Any, list[Action]], None]


class Migration:
    """Both sides of this node's migration sessions (SPEC §8.1–8.2).

    Owns the sessions it sends (``outgoing`` by session id; those it receives
    are ``node.arrivals``'), the channels whose messages are reforwarded to a
    receiver
    (``reforwarding``), and the operators waiting on a move.  ``planner`` is
    balancing, set once by the node core (the two need each other);
    ``reapply`` handles an event or (un)subscription as if it had just come
    (``node.router``); ``admin_done`` answers an operator.
    """

    planner: Planner

    def __init__(
        self,
        ctx: NodeContext,
        updates: TableUpdates,
        groups: Groups,
        arrivals: Arrivals,
        loads: ChannelLoads,
        *,
        reapply: Reapply,
        admin_done: AdminDone,
        rebuilding: Callable[[], Collection[ChannelId]] = frozenset,
    ) -> None:
        self._ctx = ctx
        self._rebuilding = rebuilding  # channels waiting for their subscriptions (node.recovery rule 4)
        self._updates = updates
        self._groups = groups
        self._arrivals = arrivals
        self._loads = loads
        self._reapply = reapply
        self._admin_done = admin_done
        self._timeout = ctx.config.cluster.peer_timeout
        self.outgoing: dict[int, OutgoingMigration] = {}
        self.reforwarding: dict[ChannelId, OutgoingMigration] = {}
        self._admin_waits: dict[int, tuple[int, int]] = {}  # session -> (client session, seq)

    # -- what other components ask -------------------------------------------------------------

    def busy(self) -> bool:
        """A session in progress on either side."""
        return bool(self._arrivals.incoming) or any(m.active for m in self.outgoing.values())

    def moving(self, chid: ChannelId) -> bool:
        """``chid`` is leaving this node in a session."""
        return chid in self.reforwarding or any(chid in m.channels and m.active for m in self.outgoing.values())

    def operators_waiting(self) -> list[int]:
        """The sessions an operator's command waits on."""
        return sorted(self._admin_waits)

    def arriving(self) -> set[ChannelId]:
        """Channels of incoming sessions (``node.arrivals``), and channels being
        rebuilt after a death (``node.recovery``): not to be split, merged or moved."""
        rebuilding = self._rebuilding()
        return self._arrivals.arriving() | set(rebuilding) if rebuilding else self._arrivals.arriving()

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
        if mig is None or mig.receiver != src or not mig.active:
            # A late answer to a session already timed out and rolled back —
            # or aborted (the receiver unreachable) and not yet forgotten: the
            # next tick forgets it, and the receiver has its CompleteLoadBalance.
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
                # groups: their dispatch states and lately chosen instances (node.groups rules 7, 9)
                sets.append(pm.ChannelSubscriptions(c, subs, self._groups.states(c), self._groups.choices.of(c)))
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
                    assert ch is not None
                    owners = (mig.receiver,)
                    # its deliveries in flight are the receiver's from now on (node.groups rule 10)
                    out.extend(ToPeer(mig.receiver, m) for m in self._groups.hand_over(ch, mig.session))
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
            pm.ChannelSpec(c, self._ctx.local[c].space, self._loads.past_owners_leaving(c, self._ctx.now))
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
        self._arrivals.lost(node, reason)
        self._groups.peer_down(node, self._ctx.now, out)  # its tracked deliveries (node.groups)

    def stop_waiting_for(self, node: int, out: list[Action]) -> None:
        """Take ``node``'s ReplyUpdateGlobal as given, for every update waiting on it."""
        for mig in list(self.outgoing.values()):
            if mig.state is OutState.UPDATING and node in mig.waiting_updates:
                self.on_update_reply(node, pm.ReplyUpdateGlobal(mig.session, self._ctx.id), self._ctx.now, out)
        self._updates.stop_waiting_for(node, out)

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
        self._arrivals.tick(now)
