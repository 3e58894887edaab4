"""Tracked delivery: subscriber groups (SPEC §11) and the acks ordered delivery waits for (§10).

The dispatch rule itself is the pure ``overlay.channels.groups.GroupDispatcher``;
``Groups`` applies it at match time on the channel's owner and takes the acks
the subscribers' access nodes send back (their side is ``overlay.node.notify``).

Rules this module keeps:

1. **Which deliveries are tracked.** Every notification of a keyed event
   (ordered delivery needs "every matched subscriber acknowledged"), and the
   notification of a group instance for any event.  A plain notification of
   an unkeyed event is not tracked: that hot path is unchanged.  The owner and
   the access node apply the same rule (the access node knows its group
   subscriptions), so they agree on what is acked.
2. **Groups at match time** (owner).  Non-group matches are notified as
   before.  Per ``(channel, group)`` a ``GroupDispatcher`` picks exactly one
   instance (a subscription id, with its static weight) among that group's
   matching subscriptions, by ``Wd = Ws·(1 − LF)`` and the integer Bresenham
   rule.  An instance's ``LF`` is the one its client put on its last Ack.
3. **Acks** (access node: ``overlay.node.notify``, ``overlay.node.acks``).  A tracked Notify is
   tagged and waits for the client's answer; a group instance's copy comes
   alone and is *fenced*: no answer within ``ack_timeout`` sends a Revoke,
   and only a decline (or no answer to that either, which disconnects the
   client) fails it — so an event never reaches two instances.  The access
   node then sends ``NotificationAck(sub_ids, lf)`` to the owner —
   ``failed`` when declined, not answered, dropped for a full client queue,
   when the client's session closed, or when the subscription is gone.
4. **Fault surveillance** (owner).  A failed group delivery marks the
   instance faulty for ``fault_period`` and the event goes to the next
   eligible instance of the group that has not tried it, still in the event's
   channel now (fault seed 739 re-offered one to 13 gone).  When none can take
   it, the publisher's access node is told (``NotificationAck`` code
   ``undeliverable``) and answers the publisher with an ``undeliverable``
   Error naming the event — counted (``group_undeliverable``), never silent.
   An owner that hears nothing (the access node died) fails the delivery
   after ``3·ack_timeout`` (longer than the access node's fence takes).
5. **Throttling.** When every live instance of a group has ``LF`` above
   ``throttle_lf`` and the event matches the configured ``low_priority``
   filter, the group's copy is dropped, counted (``group_throttled``).
6. **Completion.** When a keyed event's tracked deliveries are all answered
   (acked or failed: a failed plain subscriber does not block its key
   forever, it is counted ``ordered_delivery_failed``), the owner tells the
   key's home (``overlay.node.ordering`` rule 4).
7. **Migration and splits.** A channel's dispatch states travel in its
   ``ChannelSubscriptions.groups`` (SubscriptionMove) and are restored on the
   receiver, so shares continue where they left off; split children start
   from their parent's state.
8. **Receipts.** An unkeyed event's match here is reported once to its
   publisher's access node (``events_matched``, ``node.outbox`` rule 2),
   naming the other access nodes its first notifications went to; its
   Notifications carry that node as ``origin``, so a re-dispatched group
   copy is confirmed too (a receipt the outbox no longer waits for is
   counted stale there).  A match again that sends a group nothing, its
   copy in flight here, names that copy's access node as well, and one
   whose copy a live sender holds (rule 10) is not reported: a report
   naming fewer nodes completes the event before the copy arrives (fault
   seed 3467: the PubAck'd copy died with its owner's run).
9. **An event matched again** (re-sent by its access node, released again
   by a key's new home) reaches the instance of each group it reached
   before: the owner remembers its *sticky* choices for ``event_ttl`` (at
   most ``dedup_max`` events), a new owner learns a dead one's from the
   instances' access nodes (``Rebuild.groups``) before it matches anything,
   a receiver a moving channel's (``ChannelSubscriptions.choices``).  That
   instance's access node answers without delivering it twice (``node.notify``
   rule 5).  If the instance left the group since, the group gets nothing
   when it had taken the event (also when its access node, which forgot it,
   fails the copy: fault seed 1751), else another instance; a failed copy's
   replacement is what is remembered.  A keyed event still tracked here is
   not notified again: the delivery learns its latest home (for the
   completion).  A group rebuilt on a new owner restarts its dispatch
   counters; exactly one instance per event does not depend on them.
10. **A moved channel's copies in flight go with it.**  Until <3> the node
   a live channel leaves tracks the copies it sent (its ``Delivery``) and
   picks another instance when one fails; a receiver that learned such a
   choice not taken yet (``ChannelSubscriptions.choices``) and matches the
   event again sends it to the same instance, and when that copy fails it
   picks no other while the sender lives: the sender does (fault seed 808:
   both did, and the group got the event twice).  At <3> the sender hands
   every delivery of the channel it still tracks to the receiver
   (``DeliveryHandover``, with the choices as they stand now) and forgets
   them; the receiver sends each copy in flight again, so the access node
   answers it too (``node.notify`` rule 5: not delivered twice), and
   decides from then on, alone.  An event matched again while one of its
   group's copies is in flight here goes to no second instance; a failed
   copy whose group has another in flight is not replaced.  Nor does a
   receiver pick when the sender's choice has left the channel before the
   hand-over (seed 427: both picked): its delivery waits for that copy as
   if in flight to the sender, until the hand-over, the sender calling the
   move off (the copy stays its own) or its death (then the receiver picks:
   skipping the group lost the event when the sender died next, seed 770).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from overlay.actions import Action, ToPeer
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.expressions import parse_subscription
from overlay.channels.groups import MILLI, GroupDispatcher, GroupState
from overlay.channels.subscriptions import Subscription
from overlay.errors import LocalProtocolError
from overlay.messages import peer as pm
from overlay.node.choices import GroupChoices
from overlay.node.context import NodeContext
from overlay.node.deliveries import Delivery, channel_now, handover_frames, notification
from overlay.node.notify import PRUNE_SECONDS, UNDELIVERABLE, Notifier
from overlay.node.ordering import COMPLETE, Ordering

__all__ = ["Groups"]

log = logging.getLogger("overlay.node")

SubscriptionsFailed = Callable[[Channel, pm.Event, Sequence[Any], str], None]
EventsMatched = Callable[[pm.Event, tuple[int, ...], list[Action]], None]


class Groups:
    """The owner's tracked deliveries: group dispatch (rules 2, 4, 5, 7) and
    the completion of keyed events (rule 6).

    ``notifier`` is this node's access-node side (a match for a local
    subscriber goes to it directly); ``ordering`` takes the completions;
    ``replaced`` names the channels that replaced deleted ones (a split child
    continues its parent's dispatch state); ``subscriptions_failed`` counts
    and logs an instance that cannot be served (``node.events``);
    ``events_matched`` reports an unkeyed event's match (rule 8).
    """

    def __init__(
        self,
        ctx: NodeContext,
        notifier: Notifier,
        ordering: Ordering,
        *,
        replaced: Mapping[ChannelId, tuple[ChannelId, ...]],
        subscriptions_failed: SubscriptionsFailed,
        events_matched: EventsMatched,
    ) -> None:
        self._ctx = ctx
        self._events_matched = events_matched
        self._notifier = notifier
        self._ordering = ordering
        self._replaced = replaced
        self._subscriptions_failed = subscriptions_failed
        g = ctx.config.groups
        self._dispatchers: dict[tuple[ChannelId, str], GroupDispatcher] = {}
        self._low_filter = parse_subscription(g.low_priority, ctx.schema) if g.low_priority else None
        self._deliveries: dict[str, Delivery] = {}  # event id -> tracked delivery
        # Deadlines in the order they come (now + a fixed wait), each with its key in
        # a parallel deque: no (deadline, key) tuple to allocate per event, and
        # every allocation counts towards the cyclic GC's next collection.
        self._delivery_at: deque[float] = deque()  # deadlines ...
        self._delivery_ids: deque[str] = deque()  # ... of these event ids
        # How long the owner waits for the access node (rule 4): longer than the
        # access node's own wait for an ack and then for the answer to a Revoke.
        self._owner_wait = 3 * g.ack_timeout
        self._next_prune = 0.0
        self.choices = GroupChoices(ctx, replaced)  # rules 9 and 10

    def dispatcher(self, chid: ChannelId, group: str) -> GroupDispatcher | None:
        """The dispatch state of ``group`` on channel ``chid``, if any (status, tests)."""
        return self._dispatchers.get((chid, group))

    def tracks(self, event_id: str) -> bool:
        """Whether ``event_id``'s delivery waits for answers here (status, tests)."""
        return event_id in self._deliveries

    def pending(self) -> int:
        """Deliveries waiting for answers here (status, the simulator's drain)."""
        return len(self._deliveries)

    def tick(self, now: float, out: list[Action]) -> None:
        """Rule 4: deliveries nobody answered fail; housekeeping."""
        at, ids = self._delivery_at, self._delivery_ids
        rearm: list[Delivery] = []
        while at and at[0] <= now:
            deadline, eid = at.popleft(), ids.popleft()
            d = self._deliveries.get(eid)
            if d is not None and d.waiting and d.deadline == deadline:
                with_sender = self.choices.waited_for(eid)  # rule 10: not failed while the sender lives
                failed = tuple(s for s in d.waiting if s not in with_sender)
                if with_sender:
                    rearm.append(d)
                if failed:
                    self._ctx.stats["delivery_owner_timeouts"] += 1
                    self.on_delivery_ack(pm.NotificationAck(eid, failed, failed=True), out)
        for d in rearm:
            if self._deliveries.get(d.ev.event_id) is d:
                self._track(d)

    def prune(self, now: float) -> None:
        """Dispatchers of channels no longer here, instances no longer members."""
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_SECONDS
            self.choices.expire(now)
            local = self._ctx.local
            for k in [k for k in self._dispatchers if k[0] not in local]:
                del self._dispatchers[k]
            for (chid, _), disp in self._dispatchers.items():
                ch = local.get(chid)
                if ch is not None:
                    for i in [i for i in disp.instances if i not in ch]:
                        disp.remove(i)

    def _dispatcher(self, chid: ChannelId, group: str) -> GroupDispatcher:
        d = self._dispatchers.get((chid, group))
        if d is None:
            cfg = self._ctx.config.groups
            parent = next(
                (p for p, heirs in self._replaced.items() if chid in heirs and (p, group) in self._dispatchers), None
            )
            if parent is not None:  # a split child: continue from the parent's state (rule 7)
                state = self._dispatchers[(parent, group)].state()
                d = GroupDispatcher.restore(state, fault_period=cfg.fault_period, throttle_lf=cfg.throttle_lf)
            else:
                d = GroupDispatcher(group, fault_period=cfg.fault_period, throttle_lf=cfg.throttle_lf)
            self._dispatchers[(chid, group)] = d
        return d

    def deliver_tracked(self, ch: Channel, msg: pm.Event, matched: Sequence[Subscription], out: list[Action]) -> bool:
        """Rules 1, 2, 5, 6, 9. False: nothing to track, the caller notifies as usual."""
        keyed = bool(msg.key)
        if keyed:
            d = self._deliveries.get(msg.event_id)
            if d is not None:  # rule 9: released again by a new home while tracked here
                self._ctx.stats["ordered_matched_again"] += 1
                if d.ev.home != msg.home:
                    d.ev = msg
                return True
            for s in matched:
                if s.group:
                    break
            else:  # an ordered event without groups, the common case
                self._deliver_keyed(ch, msg, matched, out)
                return True
        groups: dict[str, list[Subscription]] = {}
        targets: list[Subscription] = []
        for s in matched:
            if s.group:
                groups.setdefault(s.group, []).append(s)
            else:
                targets.append(s)
        if not keyed and not groups:
            return False
        now = self._ctx.now
        d = Delivery(msg, ch.id)
        low: bool | None = None
        entry = self.choices.get(msg.event_id) if groups else None
        sticky = entry[1] if entry is not None else None
        # Rule 10: a copy of a group still in flight here (a delivery handed over
        # with the channel, or this node's own) is that group's, whatever left since.
        tracked = self._deliveries.get(msg.event_id) if groups else None
        flying: list[int] = []  # rule 8: access nodes of this event's group copies in flight here
        held = False  # rule 8: a live sender holds a group's copy: this match's report is not whole
        for g, subs in groups.items():
            if tracked is not None and tracked.in_flight(g):
                self._ctx.stats["group_copy_in_flight"] += 1
                if not keyed:
                    held |= tracked.flying(g, self.choices.waited_for(msg.event_id), flying)
                continue
            disp = self._dispatcher(ch.id, g)
            bad = []
            for s in subs:
                st = disp.instances.get(s.id)
                try:
                    if st is None or st.ws != max(1, round(s.weight * MILLI)):
                        disp.add(s.id, s.weight)
                except (ArithmeticError, ValueError, LocalProtocolError):  # an instance that cannot be weighed
                    bad.append(s)
            if bad:  # it is left out, counted; its group and every other match are served
                self._subscriptions_failed(ch, msg, bad, "dispatching to a group")
                subs = [s for s in subs if s not in bad]
                if not subs:
                    continue
            if low is None:
                low = self._low_filter is not None and self._low_filter.matches(msg.event_exp)
            if low and disp.throttled(now):
                disp.counters["throttled"] += 1
                self._ctx.stats["group_throttled"] += 1
                continue
            before, taken = sticky.get(g, ("", False)) if sticky is not None else ("", False)
            if before and any(s.id == before for s in subs):  # rule 9: where it went before
                chosen: str | None = before
                self._ctx.stats["group_sticky"] += 1
            elif taken:  # rule 9: the instance that took it left since: the group had it
                self._ctx.stats["group_sticky_gone"] += 1
                continue
            elif before and (sender := self.choices.tracker(msg.event_id, g, before)) is not None:
                # Rule 10: the live sender's copy went to an instance gone here: the
                # sender replaces it; this copy waits for its hand-over or its death.
                self._ctx.stats["group_copy_with_sender"] += 1
                self.choices.wait_for_sender(msg.event_id, g, before, sender)
                held = True
                d.cands[g] = subs
                d.tried[g] = {before}
                d.gsub[before] = g
                d.waiting[before] = sender
                continue
            else:
                chosen = disp.pick([s.id for s in subs], now)
            if chosen is None:
                self._undeliverable(msg, g, out)
                continue
            self.choices.remember(msg.event_id, g, chosen, ch.id)
            d.cands[g] = subs
            d.tried[g] = {chosen}
            d.gsub[chosen] = g
            targets.append(next(s for s in subs if s.id == chosen))
            self._ctx.stats["group_dispatched"] += 1
        for s in targets:
            if keyed or s.id in d.gsub:
                d.waiting[s.id] = s.access_node
        waits = bool(d.waiting)
        if tracked is not None and waits:  # rule 10: one delivery per event here
            tracked.merge(d)
            d = tracked
        if waits:  # first: this node's access node may answer a copy it had at once (node.notify rule 5)
            self._track(d)
        self._send_notifications(msg, ch.id, targets, out)
        if not keyed and not held:  # rule 8
            me = self._ctx.id
            nodes = [s.access_node for s in targets]
            nodes.extend(flying)
            self._events_matched(msg, tuple(dict.fromkeys(n for n in nodes if n != me)), out)
        if not waits and tracked is None:
            self._delivery_done(d, out)
        return True

    def _track(self, d: Delivery) -> None:
        """``d`` waits for its answers, at most ``_owner_wait`` (rule 4)."""
        eid = d.ev.event_id
        self._deliveries[eid] = d
        d.deadline = deadline = self._ctx.now + self._owner_wait
        self._delivery_at.append(deadline)
        self._delivery_ids.append(eid)

    def _deliver_keyed(self, ch: Channel, msg: pm.Event, matched: Sequence[Subscription], out: list[Action]) -> None:
        """Rules 1, 6 for a keyed event that matched no group: every match is tracked."""
        d = Delivery(msg, ch.id, groups=False)
        if len(matched) == 1 and matched[0].access_node != self._ctx.id:  # the common case, inline
            s = matched[0]
            node = d.waiting[s.id] = s.access_node
            out.append(ToPeer(node, notification(msg, (s.id,), ch.id, -1)))
            self._ctx.stats["notifications_out"] += 1
        else:
            waiting = d.waiting
            for s in matched:
                waiting[s.id] = s.access_node
            if not waiting:
                self._delivery_done(d, out)
                return
            self._track(d)  # first: a local access node may answer at once (node.notify rule 5)
            self._send_notifications(msg, ch.id, matched, out)
            return
        self._track(d)

    def _send_notifications(
        self, msg: pm.Event, chid: ChannelId, targets: Sequence[Subscription], out: list[Action]
    ) -> None:
        origin = -1 if msg.key else msg.access_node  # rule 8: a keyed event is its home's to track
        if len(targets) == 1:  # the common case, without the grouping
            s = targets[0]
            self._send_to(s.access_node, (s.id,), msg, chid, origin, out)
        else:
            by_node: dict[int, list[str]] = {}
            for s in targets:
                by_node.setdefault(s.access_node, []).append(s.id)
            for node, ids in by_node.items():
                self._send_to(node, tuple(ids), msg, chid, origin, out)
        self._ctx.stats["notifications_out"] += len(targets)

    def _send_to(
        self, node: int, ids: tuple[str, ...], msg: pm.Event, chid: ChannelId, origin: int, out: list[Action]
    ) -> None:
        """``msg``'s notification for ``ids``, subscriptions of access node ``node``."""
        if node == self._ctx.id:
            self._notifier.notify(
                msg.event_id,
                msg.event_exp,
                ids,
                msg.publish_time,
                self._ctx.id,
                msg.key,
                msg.rank,
                out,
                chid,
                msg.payload,
            )
        else:
            out.append(ToPeer(node, notification(msg, ids, chid, origin)))

    def _undeliverable(self, ev: pm.Event, group: str, out: list[Action]) -> None:
        """Rule 4: no instance of ``group`` can take ``ev``: tell the publisher."""
        self._ctx.stats["group_undeliverable"] += 1
        note = pm.NotificationAck(ev.event_id, (), failed=True, code=UNDELIVERABLE, detail=group)
        if ev.access_node == self._ctx.id:
            self._notifier.on_returned(note, out)
        else:
            out.append(ToPeer(ev.access_node, note))

    def deliveries_acked(self, pairs: Sequence[str], out: list[Action]) -> None:
        """A batched ``acked`` note: ``(event id, sub id)`` pairs of plain subscribers
        that got their event (node.ordering rule 8)."""
        deliveries = self._deliveries
        it = iter(pairs)
        for event_id, gid in zip(it, it):  # a stray odd id is ignored
            d = deliveries.get(event_id)
            if d is None:
                self._ctx.stats["delivery_acks_stale"] += 1
                continue
            if d.gsub and gid in d.gsub:  # a group instance after all: its LF and faults (rule 4)
                self.on_delivery_ack(pm.NotificationAck(event_id, (gid,)), out)
                continue
            waiting = d.waiting
            waiting.pop(gid, None)
            if not waiting:
                self._delivery_done(d, out)

    def on_delivery_ack(self, msg: pm.NotificationAck, out: list[Action]) -> None:
        d = self._deliveries.get(msg.event_id)
        if d is None:
            self._ctx.stats["delivery_acks_stale"] += 1
            return
        now = self._ctx.now
        retry: list[Subscription] = []
        now_in = channel_now(d, self._ctx.local.get, self._replaced) if msg.failed else None  # rule 4
        for gid in msg.sub_ids:
            node = d.waiting.pop(gid, None)
            if node is None:
                continue
            g = d.gsub.pop(gid, None) if d.gsub else None
            if g is None:
                if msg.failed:
                    self._ctx.stats["ordered_delivery_failed"] += 1
                continue
            disp = self._dispatchers.get((d.ch, g))
            if not msg.failed:
                if disp is not None:
                    disp.update_lf(gid, msg.lf)
                self.choices.remember(msg.event_id, g, gid, d.ch, taken=True)
                continue
            self._ctx.stats["group_delivery_failed"] += 1
            if self.choices.took(msg.event_id, g, gid):  # rule 9: it took the event before
                self._ctx.stats["group_sticky_gone"] += 1
                continue
            if disp is not None:
                disp.mark_faulty(gid, now)
            if d.in_flight(g):  # rule 10: another copy of the group may still be taken
                self._ctx.stats["group_retry_superseded"] += 1
                continue
            if self.choices.sender_tracks(msg.event_id, g, gid):  # rule 10: the channel's sender picks another
                self._ctx.stats["group_retry_left_to_sender"] += 1
                continue
            left = [s for s in d.cands[g] if s.id not in d.tried[g] and (now_in is None or s.id in now_in)]
            if disp is not None:
                chosen = disp.pick([s.id for s in left], now) if left else None
            else:  # the channel moved on: any instance not tried yet
                chosen = left[0].id if left else None
            if chosen is None:
                self._undeliverable(d.ev, g, out)
                continue
            self._ctx.stats["group_redispatched"] += 1
            self.choices.remember(msg.event_id, g, chosen, d.ch)
            d.tried[g].add(chosen)
            d.gsub[chosen] = g
            s = next(s for s in left if s.id == chosen)
            d.waiting[chosen] = s.access_node
            retry.append(s)
        if retry:
            self._send_notifications(d.ev, d.ch, retry, out)
            d.deadline = now + self._owner_wait
            self._delivery_at.append(d.deadline)
            self._delivery_ids.append(msg.event_id)
        if not d.waiting:
            self._delivery_done(d, out)

    def _delivery_done(self, d: Delivery, out: list[Action]) -> None:
        ev = d.ev
        self._deliveries.pop(ev.event_id, None)
        self.choices.forget_waits(ev.event_id)
        if not ev.key:
            return
        home = ev.home
        if home == self._ctx.id or home < 0:
            self._ordering.on_complete_ack(ev.event_id, out)
        else:
            self._ordering.note(home, COMPLETE, ev.event_id)  # sent by end_batch (node.ordering rule 8)

    def _release(self, src: int, chid: ChannelId) -> list[Delivery]:
        """Rule 10: ``src`` handed channel ``chid`` over or kept it: stop waiting for its copies."""
        deliveries = self._deliveries
        released = []
        for eid, g, inst in self.choices.release(src, lambda e: e in deliveries and deliveries[e].ch == chid):
            d = deliveries.get(eid)
            if d is not None and d.waiting.get(inst) == src and d.gsub.get(inst) == g:
                del d.waiting[inst]
                del d.gsub[inst]
                released.append(d)
        return released

    def sender_kept(self, src: int, chid: ChannelId, out: list[Action]) -> None:
        """Rule 10: ``src`` called off moving channel ``chid`` here: its copies stay its own."""
        for d in self._release(src, chid):
            if not d.waiting and self._deliveries.get(d.ev.event_id) is d:
                self._delivery_done(d, out)

    def peer_down(self, node: int, now: float, out: list[Action]) -> None:
        """A subscribers' access node went down: what it owed us failed (rule 4).
        Rule 10: so did the copies a sender that went down still tracked."""
        self.choices.peer_down(node, now)
        for eid, d in list(self._deliveries.items()):
            lost = tuple(g for g, n in d.waiting.items() if n == node)
            if lost:
                self.on_delivery_ack(pm.NotificationAck(eid, lost, failed=True), out)

    def hand_over(self, ch: Channel, session: int) -> list[pm.DeliveryHandover]:
        """Rule 10, the sender at <3>: channel ``ch``'s deliveries still
        tracked here, for its receiver, forgotten here.  Those matched on a
        channel it was split from go only if their event lies in ``ch``: the
        split's other child keeps its own (fault seed 1077: both sides gave one
        to an instance)."""
        chid, space = ch.id, ch.space
        chans = self.choices.lineage(chid)
        gone = [
            d for d in self._deliveries.values() if d.ch == chid or (d.ch in chans and space.contains(d.ev.event_exp))
        ]
        for d in gone:
            del self._deliveries[d.ev.event_id]
        if gone:
            self._ctx.stats["deliveries_handed_over"] += len(gone)
        # In frames of at most half the cap (an event's payload may take that much alone).
        budget = self._ctx.config.cluster.max_frame_size // 2
        return handover_frames(session, chid, [d.to_wire() for d in gone], self.choices.of(chid), budget)

    def adopt(self, src: int, msg: pm.DeliveryHandover, out: list[Action]) -> None:
        """Rule 10, the receiver: ``src`` no longer tracks channel ``ch_id``'s
        deliveries; they are this node's, each copy in flight sent again so its
        access node answers here too."""
        ch = self._ctx.local.get(msg.ch_id)
        if ch is None:  # moved on, or recovered elsewhere, since: its new owner decides
            if msg.deliveries:
                self._ctx.stats["handed_over_deliveries_dropped"] += len(msg.deliveries)
                log.warning(
                    "node %d: %d deliveries handed over by node %d for channel %s, which is not here; dropped",
                    self._ctx.id,
                    len(msg.deliveries),
                    src,
                    msg.ch_id,
                )
            return
        self.choices.learn(msg.choices, ch.id)
        for c in msg.choices:  # the sender tracks none of them any more
            self.choices.sender_done(c.event_id, c.group)
        for rec in msg.deliveries:
            for copy in rec.waiting:
                if copy.group:
                    self.choices.sender_done(rec.event.event_id, copy.group)
        released = self._release(src, ch.id)  # first: a copy handed over may be the one waited for
        for rec in msg.deliveries:
            got = Delivery.from_wire(rec, ch)
            eid = got.ev.event_id
            for sid, g in got.gsub.items():
                self.choices.remember(eid, g, sid, ch.id)
            d = self._deliveries.get(eid)
            if d is None:
                d = got
            else:
                d.merge(got)
            if not d.waiting:
                self._delivery_done(d, out)
                continue
            self._track(d)
            origin = -1 if d.ev.key else d.ev.access_node  # as _send_notifications
            for node, ids in got.by_node().items():
                self._send_to(node, tuple(ids), d.ev, ch.id, origin, out)
        for d in released:  # rule 10: the sender decided these copies; what else they wait for
            if not d.waiting and self._deliveries.get(d.ev.event_id) is d:
                self._delivery_done(d, out)
        self._ctx.stats["deliveries_adopted"] += len(msg.deliveries)

    def states(self, chid: ChannelId) -> tuple[GroupState, ...]:
        return tuple(d.state() for (c, _), d in self._dispatchers.items() if c == chid)

    def restore(self, cs: pm.ChannelSubscriptions) -> None:
        cfg = self._ctx.config.groups
        for st in cs.groups:
            d = GroupDispatcher.restore(st, fault_period=cfg.fault_period, throttle_lf=cfg.throttle_lf)
            self._dispatchers[(cs.ch_id, st.name)] = d
        if cs.groups:
            self._ctx.stats["group_states_restored"] += len(cs.groups)
        self.choices.learn(cs.choices, cs.ch_id)
