"""The receiving side of migration sessions (SPEC §8.1–8.2).

The receiver accepts a session or refuses it (balancing decides), adds the
channels it is sent, then their subscriptions (indexed in the background),
then applies Reforwards in the order they come; the channels are its own at
CompleteLoadBalance.  Until then an arriving channel is *not here* for
anything that reaches it straight (``unfilled``), and no split, merge or move
may touch it (``arriving``).  A session whose sender is gone or silent past
the timeout ends: channels the routing table already gives this node stay,
the others go.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from overlay.actions import Action, ToPeer
from overlay.balance.migration import IncomingMigration, InState
from overlay.channels.channel import Channel, ChannelId
from overlay.errors import RemoteProtocolError
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.groups import Groups
from overlay.node.indexing import Indexing
from overlay.node.loads import ChannelLoads
from overlay.node.planner import Planner

__all__ = ["Arrivals"]

log = logging.getLogger("overlay.node")

Reapply = Callable[[pm.Event | pm.Subscription | pm.UnSubscription, list[Action]], None]
StaleSub = Callable[[str, int], bool]


class Arrivals:
    """This node's incoming sessions, by (sender, session).  ``planner`` is
    balancing (set once by the node core); ``reapply`` handles a reforwarded
    message as if it had just come (``node.router``); ``stale_sub`` tells a
    dead client's subscription (``node.peers``)."""

    planner: Planner

    def __init__(
        self,
        ctx: NodeContext,
        groups: Groups,
        indexing: Indexing,
        loads: ChannelLoads,
        *,
        reapply: Reapply,
        stale_sub: StaleSub,
    ) -> None:
        self._ctx = ctx
        self._groups = groups
        self._indexing = indexing
        self._loads = loads
        self._reapply = reapply
        self._stale_sub = stale_sub
        self._timeout = ctx.config.cluster.peer_timeout
        self.incoming: dict[tuple[int, int], IncomingMigration] = {}
        self.in_reforward = False  # True while applying a Reforward's messages (see unfilled)

    def _lost(self, key: tuple[int, int], inc: IncomingMigration, reason: str) -> None:
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

    def _session(self, src: int, session: int, what: str) -> IncomingMigration:
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
        mig = self._session(src, msg.session, "ChannelTransfer")
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
                self._loads.arrived_from(spec.ch_id, spec.past_owners)  # node.loads rule 7
        out.append(ToPeer(src, pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, mig.channels, msg.session)))

    def on_subscription_move(self, src: int, msg: pm.SubscriptionMove, now: float, out: list[Action]) -> None:
        mig = self._session(src, msg.session, "SubscriptionMove")
        mig.on(msg, now)
        for cs in msg.ch_sub_set:
            # Stored at once, indexed in the background (Channel rule 5): indexing
            # thousands here would hold up every event behind this message.
            # Those of a dead client (node.core rule 7) are not taken.
            ch = self._ctx.local.get(cs.ch_id)
            if ch is None:
                # Gone since its ChannelTransfer: a recovery gave it to another
                # node (node.recovery), which rebuilds its subscriptions from
                # their access nodes — these copies are not needed (fault seed 668).
                self._ctx.stats["subscription_moves_for_gone_channels"] += 1
                log.warning(
                    "node %d: %d subscriptions moved from node %d for channel %s, which is no longer here; dropped",
                    self._ctx.id,
                    len(cs.subscriptions),
                    src,
                    cs.ch_id,
                )
                continue
            subs = [s for s in cs.subscriptions if not self._stale_sub(s.id, s.access_node)]
            if len(subs) < len(cs.subscriptions):
                self._ctx.stats["subscriptions_of_dead_clients_removed"] += len(cs.subscriptions) - len(subs)
            ch.add_deferred(subs)
            self._indexing.want()
            self._groups.restore(cs)  # the group dispatch state (node.groups)
            self._groups.choices.learn_senders(cs.choices, src)  # node.groups rule 10
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
                    self._groups.sender_kept(src, c, out)  # node.groups rule 10
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

    def lost(self, node: int, reason: str) -> None:
        """``node`` is gone (unreachable, restarted): its sessions here end."""
        for key, inc in list(self.incoming.items()):
            if inc.origin == node:
                self._lost(key, inc, reason)

    def tick(self, now: float) -> None:
        """Sessions whose sender went silent past the timeout roll back (rule 2)."""
        for key, inc in list(self.incoming.items()):
            if inc.expired(now):
                for c in inc.channels:
                    self._ctx.local.remove(c)
                inc.abort()
                self.planner.leave_busy(completed=False)
                del self.incoming[key]
                log.warning("node %d: incoming session %s timed out; rolled back", self._ctx.id, key)
