"""Routing events and (un)subscriptions to their channels, and matching (SPEC §4, §8.3).

Rules (``node.core``'s, numbered as there):

2. One hop: a client's (un)subscription goes to every channel it belongs to —
   applied here for local channels, sent DISPATCHED with ``ch_id`` to the
   owner of each remote one.  An event goes to its one channel the same way.
   A DISPATCHED message is applied to the named local channel without a
   routing lookup.
3. A DISPATCHED message whose channel is not here is re-routed with the
   current routing table (at most ``MAX_HOPS`` hops), never dropped silently;
   if this node is moving that channel out and is past time <2>, it is
   reforwarded to the receiver instead (``node.migration``).  A channel still
   arriving here counts as not here; an (un)subscription for a moved channel
   goes on to that channel only, one for a split or merged channel to the
   channels that replaced it.  A replicated channel's (un)subscriptions enter
   at its first owner and are relayed along its owners, the last one
   answering the access node.
5. The owner matches an event once and sends one Notification per
   subscribers' access node (tracked ones go through ``node.groups``).  An
   unkeyed event's Notifications carry its access node as ``origin``, and
   the match is reported to that node naming the nodes notified other than
   this one (``node.outbox`` rule 2): when there are any, each of them
   reports it as it confirms (``Notification.confirm``) — one receipt per
   event and access node, not the owner's as well; when there are none
   (nothing matched, or only this node's clients), the owner reports it
   (``Receipts.matched``).
8. An error matching an event for one subscription is that subscription's
   (counted, logged), and every other match is served.
9. An owner remembers the ids unsubscribed here lately (``MAX_REMOVED``): a
   late copy of such a subscription — one its access node sent again
   (``node.sessions`` rule 6) — is answered but never stored again.
"""

from __future__ import annotations

import logging
import sys
import zlib
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from overlay.actions import Action, ToPeer
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.predicates import Filter
from overlay.channels.subscriptions import Subscription
from overlay.messages import peer as pm
from overlay.node.arrivals import Arrivals
from overlay.node.context import NodeContext
from overlay.node.groups import Groups
from overlay.node.migration import Migration
from overlay.node.notify import Notifier
from overlay.node.observer import CoreObserver
from overlay.node.ordering import Ordering
from overlay.node.outbox import Receipts
from overlay.node.peers import PeerRuns
from overlay.node.recovery import Recovery
from overlay.node.sessions import Sessions
from overlay.node.updates import TableUpdates

__all__ = ["MAX_HOPS", "Router"]

log = logging.getLogger("overlay.node")

# A message re-routed this many times is dropped (counted and logged): tables
# that disagree for longer than a few hops are a bug, not a transient.
MAX_HOPS: Final = 4
# Unsubscribed ids an owner remembers (rule 9): far more than can be in flight.
MAX_REMOVED: Final = 100_000
# Per event, read from C statics when compiled (a global's lookup and its
# attributes' were dict lookups each time: issue 19).
_EVENT_NEW: Final = pm.DispatchSign.EVENT_NEW
_Notification: Final = pm.Notification
_ToPeer: Final = ToPeer


class Router:
    """Rules 2, 3, 5, 8: where each event and (un)subscription goes, and the
    match on the owner.  It hands a match to ``groups`` (tracked) or straight
    to the subscribers' access nodes, this one's being ``notifier``."""

    def __init__(
        self,
        ctx: NodeContext,
        *,
        migration: Migration,
        arrivals: Arrivals,
        ordering: Ordering,
        groups: Groups,
        notifier: Notifier,
        updates: TableUpdates,
        sessions: Sessions,
        peers: PeerRuns,
        recovery: Recovery,
        receipts: Receipts,
    ) -> None:
        self._ctx = ctx
        self._migration = migration
        self._arrivals = arrivals
        self._ordering = ordering
        self._groups = groups
        self._notifier = notifier
        self._updates = updates
        self._sessions = sessions
        self._peers = peers
        self._recovery = recovery
        # Rule 9: ids unsubscribed here lately (ids never repeat, node.core rule 6).
        self._removed: dict[str, None] = {}
        self._receipts = receipts
        self.observer: CoreObserver | None = None  # node.observer rule 1

    def reapply(self, msg: pm.Event | pm.Subscription | pm.UnSubscription, out: list[Action]) -> None:
        """A message handled as if it had just come (a Reforward's, a rollback's)."""
        match msg:
            case pm.Event():
                self.on_event(msg, out)
            case pm.Subscription():
                self.on_subscription(msg, out)
            case pm.UnSubscription():
                self.on_unsubscription(msg, out)

    def on_event(self, msg: pm.Event, out: list[Action]) -> None:
        if msg.dispatch_sign is _EVENT_NEW:  # a keyed event for its home (node.ordering)
            self._ordering.sequence(msg, out)
            return
        chid = msg.ch_id
        assert chid is not None
        mig = self._migration.reforwarding.get(chid)
        if mig is not None and not mig.replicate:  # a replica's events stay here
            self._migration.reforward(mig, chid, pm.ReforwardSign.EVENT_MESSAGE, msg, out)
            return
        ch = self._ctx.local.get(chid)
        if ch is None or (self._arrivals.incoming and self._arrivals.unfilled(chid, event=True)):
            self._reroute_event(msg, out)
            return
        recovery = self._recovery
        if recovery.rebuilding and recovery.holds(chid, msg):
            return  # a recovered channel waits for its subscriptions (node.recovery rule 4)
        self.match(ch, msg, out)

    def match(self, ch: Channel, msg: pm.Event, out: list[Action]) -> None:
        obs = self.observer
        if obs is not None:
            obs.matched(msg.event_id)
        try:
            matched, _tested = ch.match(msg.event_exp, msg.access_node)
        except Exception:  # noqa: BLE001 - a bug or a poisoned subscription: serve the others (SPEC §16)
            (matched, _tested), failed = ch.match_isolating(msg.event_exp, msg.access_node)
            self.subscriptions_failed(ch, msg, failed, "matching")
        self._ctx.tested_hist.observe(_tested)
        if self._ctx.capture is not None:
            self._ctx.capture.event(
                msg.event_id,
                msg.access_node,
                ch.id,
                _tested,
                matched,
                self._ctx.journal.slice_no(),
                msg.key or None,
                msg.rank or None,
            )
        self._ctx.stats["events_matched"] += 1
        if len(matched) == 1 and not msg.key and not matched[0].group:
            self.deliver_one(ch, msg, matched[0], out)  # the common case
        else:
            self.deliver(ch, msg, matched, out)

    def deliver_one(self, ch: Channel, msg: pm.Event, sub: Subscription, out: list[Action]) -> None:
        """``deliver`` for an unkeyed event that matched one plain subscription,
        the common case: the same actions, without its dict and tuples
        (tests/test_router_fast.py holds the two to the same)."""
        node = sub.access_node
        if node == self._ctx.id:
            self._notifier.notify_clients(msg.event_id, msg.event_exp, (sub.id,), msg.publish_time, out, msg.payload)
            self._ctx.stats["notifications_out"] += 1
            self._receipts.matched(msg, (), out)  # rule 5: only this node's client, so the owner reports
            return
        note = _Notification(
            msg.event_id,
            msg.event_exp,
            (sub.id,),
            ch.id,
            msg.publish_time,
            "",
            0,
            -1,
            msg.access_node,
            (node,),
            msg.payload,
        )
        out.append(_ToPeer(node, note))  # rule 5: that node reports the match as it confirms
        self._ctx.stats["notifications_out"] += 1

    def deliver(self, ch: Channel, msg: pm.Event, matched: Sequence[Subscription], out: list[Action]) -> None:
        """Rule 5 for the subscriptions ``msg`` matched on ``ch``: tracked
        (ordered, groups) through ``groups``, else one Notification per
        subscribers' access node, this one's straight to its clients, and
        the report of the match."""
        stats = self._ctx.stats
        # The matches per subscribers' access node, and whether a group's is
        # among them, in one pass (no generator: per event).
        by_node: dict[int, list[str]] = {}
        grouped = False
        for sub in matched:
            if sub.group:
                grouped = True
            ids = by_node.get(sub.access_node)
            if ids is None:
                by_node[sub.access_node] = [sub.id]
            else:
                ids.append(sub.id)
        if (msg.key or grouped) and self._groups.deliver_tracked(ch, msg, matched, out):  # ordered / groups
            return
        if not matched:  # an unkeyed event (a keyed one is tracked): nothing to wait for
            self._receipts.matched(msg, (), out)
            return
        me = self._ctx.id
        origin = msg.access_node
        if len(by_node) == 1:  # the common case, without a generator
            nodes: tuple[int, ...] = () if me in by_node else (next(iter(by_node)),)
        else:
            nodes = tuple([n for n in by_node if n != me])
        # Rule 5: with notifications for other nodes, they report the match.
        for node, ids in by_node.items():
            if node == me:
                # This node is the subscribers' access node: straight to their
                # clients, exactly as a Notification to ourselves would go.
                self._notifier.notify_clients(msg.event_id, msg.event_exp, ids, msg.publish_time, out, msg.payload)
            else:
                out.append(
                    ToPeer(
                        node,
                        pm.Notification(
                            msg.event_id,
                            msg.event_exp,
                            tuple(ids),
                            ch.id,
                            msg.publish_time,
                            "",
                            0,
                            -1,
                            origin,
                            nodes,
                            msg.payload,
                        ),
                    )
                )
        stats["notifications_out"] += len(matched)
        if not nodes:  # only this node's own clients: the report is the owner's
            self._receipts.matched(msg, nodes, out)

    def subscriptions_failed(self, ch: Channel, msg: pm.Event, subs: Sequence[Any], what: str) -> None:
        """Rule 5's exception: these subscriptions could not be served this
        event; counted per subscription, logged with the traceback, and the
        event goes on to every other match."""
        self._ctx.stats["subscription_errors"] += max(1, len(subs))
        log.error(
            "node %d: %s event %s on channel %s failed for %s; the other subscriptions are served",
            self._ctx.id,
            what,
            msg.event_id,
            ch.id,
            [getattr(s, "id", s) for s in subs] or "an unknown subscription",
            exc_info=sys.exc_info()[1],  # the traceback when called from a handler
        )

    def _reroute_event(self, msg: pm.Event, out: list[Action]) -> None:
        chid = self._ctx.routing.lookup_event(msg.event_exp)
        if chid is None or msg.hops >= MAX_HOPS:
            self._ctx.stats["events_unroutable"] += 1
            log.error("node %d: event %s has no route (hops %d); dropped", self._ctx.id, msg.event_id, msg.hops)
            return
        self._ctx.stats["events_rerouted"] += 1
        fwd = msgspec.structs.replace(
            msg, ch_id=chid, dispatch_sign=pm.DispatchSign.EVENT_DISPATCHED, hops=msg.hops + 1
        )
        self.dispatch_event(fwd, out)

    def dispatch_event(self, msg: pm.Event, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        owners = self._ctx.routing[chid].owners
        # One owner, or a replica per event (SPEC §8.3); without RouteEntry's properties (per event).
        owner = owners[0] if len(owners) == 1 else _pick(owners, msg.event_id)
        if owner == self._ctx.id:
            self.on_event(msg, out)
        else:
            out.append(_ToPeer(owner, msg))

    def on_subscription(self, msg: pm.Subscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        if self._peers.stale_sub(msg.sub_id, msg.access_node):  # rule 7: a late copy from a dead client
            self._ctx.stats["subscriptions_of_dead_clients_removed"] += 1
            return
        mig = self._migration.reforwarding.get(chid)
        if mig is not None:
            self._migration.reforward(mig, chid, pm.ReforwardSign.SUBSCRIBE, msg, out)
            if not mig.replicate:
                return
        ch = self._ctx.local.get(chid)
        if ch is None or (self._arrivals.incoming and self._arrivals.unfilled(chid)):
            self._reroute_sub(msg, msg.sub_exp, out, subscribe=True)
            return
        if self._to_first_replica(chid, msg, out):
            return
        if msg.sub_id in self._removed:  # a late copy of a subscription ended here: never back (rule 9)
            self._ctx.stats["subscriptions_resurrection_refused"] += 1
        elif ch.add(msg.stored()):
            self._ctx.stats["subscriptions_applied"] += 1
        if mig is None and not self._relay(chid, msg, out):  # a new replica answers a Reforward itself
            self._applied(msg.sub_id, chid, msg.access_node, True, (), out, msg.attempt)

    def on_unsubscription(self, msg: pm.UnSubscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        mig = self._migration.reforwarding.get(chid)
        if mig is not None:
            self._migration.reforward(mig, chid, pm.ReforwardSign.UNSUBSCRIBE, msg, out)
            if not mig.replicate:
                return
        ch = self._ctx.local.get(chid)
        if ch is None or (self._arrivals.incoming and self._arrivals.unfilled(chid)):
            self._reroute_sub(msg, msg.unsub_exp, out, subscribe=False)
            return
        if self._to_first_replica(chid, msg, out):
            return
        if ch.remove(msg.sub_id) is not None:
            self._ctx.stats["unsubscriptions_applied"] += 1
        removed = self._removed
        removed[msg.sub_id] = None
        if len(removed) > MAX_REMOVED:
            del removed[next(iter(removed))]
        if mig is None and not self._relay(chid, msg, out):  # a new replica answers a Reforward itself
            self._applied(msg.sub_id, chid, msg.access_node, False, (), out, msg.attempt)

    def _relay(self, chid: ChannelId, msg: pm.Subscription | pm.UnSubscription, out: list[Action]) -> bool:
        """A replicated channel's (un)subscriptions reach its first owner and go
        along its owners in order, as Reforwards (each link FIFO); the last one
        answers the access node, so a SubAck means every replica holds it
        (SPEC §8.3), and one that reached the first owner by an old table still
        reaches all."""
        entry = self._ctx.routing.get(chid)
        if entry is None or not entry.replicated or self._ctx.id not in entry.owners:
            return False
        i = entry.owners.index(self._ctx.id)
        if i + 1 == len(entry.owners):
            return False
        sign = pm.ReforwardSign.SUBSCRIBE if isinstance(msg, pm.Subscription) else pm.ReforwardSign.UNSUBSCRIBE
        out.append(ToPeer(entry.owners[i + 1], pm.Reforward(chid, (pm.ReforwardItem(sign, msg),))))
        return True

    def _to_first_replica(self, chid: ChannelId, msg: pm.Subscription | pm.UnSubscription, out: list[Action]) -> bool:
        """A later replica got an (un)subscription straight, not along the chain
        (an old route from when it owned the channel alone): to the first owner."""
        if self._arrivals.in_reforward:
            return False
        entry = self._ctx.routing.get(chid)
        if entry is None or not entry.replicated or entry.owner == self._ctx.id or self._ctx.id not in entry.owners:
            return False
        out.append(ToPeer(entry.owner, msg))
        return True

    def _reroute_sub(
        self, msg: pm.Subscription | pm.UnSubscription, f: Filter, out: list[Action], *, subscribe: bool
    ) -> None:
        old = msg.ch_id
        assert old is not None
        if msg.hops >= MAX_HOPS:
            self._ctx.stats["subscriptions_unroutable"] += 1
            log.error("node %d: (un)subscription %s bounced %d times; dropped", self._ctx.id, msg.sub_id, msg.hops)
            return
        entry = self._ctx.routing.get(old)
        if entry is not None and self._ctx.id not in entry.owners:
            chans = [old]  # it moved: only its new owner(s), not every channel of the filter again
        else:
            chans = self._ctx.routing.lookup_subscription(f)
            heirs = self._updates.heirs(old)  # split or merged: only what replaced it
            if heirs:
                chans = [c for c in chans if c in heirs]
        self._ctx.stats["subscriptions_rerouted"] += 1
        # Tell the access node which channels replace the one it waits on, then send on.
        self._applied(msg.sub_id, old, msg.access_node, subscribe, tuple(chans), out, msg.attempt)
        for chid in chans:
            fwd = msgspec.structs.replace(msg, ch_id=chid, hops=msg.hops + 1)
            self.dispatch_sub(fwd, out)

    def dispatch_sub(self, msg: pm.Subscription | pm.UnSubscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        owner = self._ctx.routing[chid].owner  # replicas: the first, which relays it to the others
        if owner == self._ctx.id:
            if isinstance(msg, pm.Subscription):
                self.on_subscription(msg, out)
            else:
                self.on_unsubscription(msg, out)
        else:
            out.append(ToPeer(owner, msg))

    def _applied(
        self,
        gid: str,
        chid: ChannelId,
        access: int,
        subscribe: bool,
        rerouted: tuple[ChannelId, ...],
        out: list[Action],
        attempt: int = 0,
    ) -> None:
        note = pm.SubscriptionApplied(gid, chid, subscribe, rerouted, attempt)
        if access == self._ctx.id:
            self._sessions.on_applied(note, out)
        else:
            out.append(ToPeer(access, note))


def _pick(owners: tuple[int, ...], key: str) -> int:
    """A replica for an event (SPEC §8.3): random-looking but stable per event."""
    return owners[zlib.crc32(key.encode()) % len(owners)]
