"""Tracked delivery: subscriber groups (SPEC §11) and the acks ordered delivery waits for (§10).

The dispatch rule itself is the pure ``overlay.channels.groups.GroupDispatcher``;
this mixin applies it at match time on the channel's owner and carries the
acks back from the subscribers' access nodes.

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
3. **Acks** (access node, ``overlay.node_acks``).  A tracked Notify is
   tagged and waits for the client's answer; a group instance's copy comes
   alone and is *fenced*: no answer within ``ack_timeout`` sends a Revoke,
   and only a decline (or no answer to that either, which disconnects the
   client) fails it — so an event never reaches two instances.  The access
   node then sends ``NotificationAck(sub_ids, lf)`` to the owner —
   ``failed`` when declined, not answered, dropped for a full client queue,
   when the client's session closed, or when the subscription is gone.
4. **Fault surveillance** (owner).  A failed group delivery marks the
   instance faulty for ``fault_period`` and the event goes to the next
   eligible instance of the group that has not tried it.  When none can take
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
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from overlay.actions import Action, CloseClient, ToClient, ToPeer
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.expressions import parse_subscription
from overlay.channels.groups import MAX_WEIGHT, MILLI, GroupDispatcher, GroupState
from overlay.channels.subscriptions import Subscription
from overlay.errors import LocalProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node_acks import AwaitedAcks
from overlay.node.ordering import ACKED, COMPLETE, SEQUENCED

if TYPE_CHECKING:
    from overlay.node_clients import _Session
    from overlay.node_core import NodeCore

__all__ = ["GroupsMixin"]

log = logging.getLogger("overlay.node")

# The group state of a delivery without groups: read-only and shared, so one
# ordered event allocates three dicts fewer (every allocation counts towards
# the next collection) and a write to it raises instead of leaking.
_NO_GROUPS: Final[Any] = MappingProxyType({})

UNDELIVERABLE: Final = "undeliverable"
# How often (seconds) dispatchers of channels no longer here and group ids of
# subscriptions gone are pruned: housekeeping, not correctness.
PRUNE_SECONDS: Final = 5.0


class _Delivery:
    """Owner side: one event's tracked notifications (rules 2, 4, 6)."""

    __slots__ = ("cands", "ch", "deadline", "ev", "gsub", "tried", "waiting")

    def __init__(self, ev: pm.Event, ch: ChannelId, *, groups: bool = True) -> None:
        self.deadline = 0.0
        self.ev = ev
        self.ch = ch
        self.waiting: dict[str, int] = {}  # sub id -> its access node, awaiting an ack
        if groups:
            self.gsub: dict[str, str] = {}  # chosen instance -> its group
            self.cands: dict[str, list[Subscription]] = {}  # group -> matching instances
            self.tried: dict[str, set[str]] = {}  # group -> instances tried
        else:  # a keyed event that matched no group, the common ordered case
            self.gsub = self.cands = self.tried = _NO_GROUPS


class GroupsMixin:
    """Mixed into ``NodeCore``."""

    def _init_groups(self: NodeCore) -> None:
        g = self.config.groups
        self._dispatchers: dict[tuple[ChannelId, str], GroupDispatcher] = {}
        self._low_filter = parse_subscription(g.low_priority, self.schema) if g.low_priority else None
        self._deliveries: dict[str, _Delivery] = {}  # owner: event id -> tracked delivery
        # Deadlines in the order they come (now + a fixed wait), each with its key in
        # a parallel deque: no (deadline, key) tuple to allocate per event, and
        # every allocation counts towards the cyclic GC's next collection.
        self._delivery_at: deque[float] = deque()  # owner: deadlines ...
        self._delivery_ids: deque[str] = deque()  # ... of these event ids
        self._group_of: dict[str, str] = {}  # access: global sub id -> group
        # Access node: tracked Notifies by tag, waiting for their client's answer (overlay.node_acks).
        self.acks = AwaitedAcks(g.ack_timeout)
        # Owner: how long it waits for the access node (rule 4): longer than the
        # access node's own wait for an ack and then for the answer to a Revoke.
        self._owner_wait = 3 * g.ack_timeout
        self._next_prune = 0.0

    # -- subscribe (access node) -----------------------------------------------------------

    def _check_group(self: NodeCore, sess: _Session, msg: cm.Subscribe, out: list[Action]) -> bool:
        """Bad input: a weight outside (0, MAX_WEIGHT] (NaN, inf, 1e308 …) is refused."""
        if not (isinstance(msg.weight, (int, float)) and 0 < msg.weight <= MAX_WEIGHT):
            self.stats["rejected_bad_group"] += 1
            out.append(
                ToClient(
                    sess.id,
                    cm.Error(
                        msg.seq,
                        cm.ErrorCode.BAD_GROUP,
                        f"weight must be a number in (0, {MAX_WEIGHT:g}], got {msg.weight!r}",
                    ),
                )
            )
            return False
        if msg.group and not msg.group.strip():
            self.stats["rejected_bad_group"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_GROUP, "a group name must not be blank")))
            return False
        return True

    # -- owner: match time (rules 1, 2, 5) ---------------------------------------------------

    def _dispatcher(self: NodeCore, chid: ChannelId, group: str) -> GroupDispatcher:
        d = self._dispatchers.get((chid, group))
        if d is None:
            cfg = self.config.groups
            parent = next(
                (p for p, heirs in self._replaced.items() if chid in heirs and (p, group) in self._dispatchers), None
            )
            if parent is not None:  # a split child: continue from the parent's state (rule 7)
                d = GroupDispatcher.restore(
                    self._dispatchers[(parent, group)].state(),
                    fault_period=cfg.fault_period,
                    throttle_lf=cfg.throttle_lf,
                )
            else:
                d = GroupDispatcher(group, fault_period=cfg.fault_period, throttle_lf=cfg.throttle_lf)
            self._dispatchers[(chid, group)] = d
        return d

    def _deliver_tracked(
        self: NodeCore, ch: Channel, msg: pm.Event, matched: Sequence[Subscription], out: list[Action]
    ) -> bool:
        """Rules 1, 2, 5, 6. False: nothing to track, the caller notifies as usual."""
        keyed = bool(msg.key)
        if keyed:
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
        now = self.now
        d = _Delivery(msg, ch.id)
        low: bool | None = None
        for g, subs in groups.items():
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
                self.stats["group_throttled"] += 1
                continue
            chosen = disp.pick([s.id for s in subs], now)
            if chosen is None:
                self._undeliverable(msg, g, out)
                continue
            d.cands[g] = subs
            d.tried[g] = {chosen}
            d.gsub[chosen] = g
            targets.append(next(s for s in subs if s.id == chosen))
            self.stats["group_dispatched"] += 1
        for s in targets:
            if keyed or s.id in d.gsub:
                d.waiting[s.id] = s.access_node
        self._send_notifications(msg, ch.id, targets, out)
        if d.waiting:
            self._deliveries[msg.event_id] = d
            d.deadline = now + self._owner_wait
            self._delivery_at.append(d.deadline)
            self._delivery_ids.append(msg.event_id)
        else:
            self._delivery_done(d, out)
        return True

    def _deliver_keyed(
        self: NodeCore, ch: Channel, msg: pm.Event, matched: Sequence[Subscription], out: list[Action]
    ) -> None:
        """Rules 1, 6 for a keyed event that matched no group: every match is tracked."""
        d = _Delivery(msg, ch.id, groups=False)
        if len(matched) == 1 and matched[0].access_node != self.id:  # the common case, inline
            s = matched[0]
            node = d.waiting[s.id] = s.access_node
            out.append(
                ToPeer(
                    node,
                    pm.Notification(
                        msg.event_id, msg.event_exp, (s.id,), ch.id, msg.publish_time, msg.key, msg.rank, msg.home
                    ),
                )
            )
            self.stats["notifications_out"] += 1
        else:
            waiting = d.waiting
            for s in matched:
                waiting[s.id] = s.access_node
            if not waiting:
                self._delivery_done(d, out)
                return
            self._send_notifications(msg, ch.id, matched, out)
        self._deliveries[msg.event_id] = d
        d.deadline = deadline = self.now + self._owner_wait
        self._delivery_at.append(deadline)
        self._delivery_ids.append(msg.event_id)

    def _send_notifications(
        self: NodeCore, msg: pm.Event, chid: ChannelId, targets: Sequence[Subscription], out: list[Action]
    ) -> None:
        if len(targets) == 1:  # the common case, without the grouping
            s = targets[0]
            if s.access_node == self.id:
                self._access_notify(
                    msg.event_id, msg.event_exp, (s.id,), msg.publish_time, self.id, msg.key, msg.rank, out
                )
            else:
                out.append(
                    ToPeer(
                        s.access_node,
                        pm.Notification(
                            msg.event_id, msg.event_exp, (s.id,), chid, msg.publish_time, msg.key, msg.rank, msg.home
                        ),
                    )
                )
            self.stats["notifications_out"] += 1
            return
        by_node: dict[int, list[str]] = {}
        for s in targets:
            by_node.setdefault(s.access_node, []).append(s.id)
        for node, ids in by_node.items():
            if node == self.id:
                self._access_notify(msg.event_id, msg.event_exp, ids, msg.publish_time, self.id, msg.key, msg.rank, out)
            else:
                out.append(
                    ToPeer(
                        node,
                        pm.Notification(
                            msg.event_id, msg.event_exp, tuple(ids), chid, msg.publish_time, msg.key, msg.rank, msg.home
                        ),
                    )
                )
        self.stats["notifications_out"] += len(targets)

    def _undeliverable(self: NodeCore, ev: pm.Event, group: str, out: list[Action]) -> None:
        """Rule 4: no instance of ``group`` can take ``ev``: tell the publisher."""
        self.stats["group_undeliverable"] += 1
        note = pm.NotificationAck(ev.event_id, (), failed=True, code=UNDELIVERABLE, detail=group)
        if ev.access_node == self.id:
            self._on_returned(note, out)
        else:
            out.append(ToPeer(ev.access_node, note))

    # -- access node: notify and acks (rule 3) -------------------------------------------------

    def _access_notify(
        self: NodeCore,
        event_id: str,
        event: dict[str, Any],
        sub_ids: Sequence[str],
        publish_time: float,
        owner: int,
        key: str,
        rank: int,
        out: list[Action],
    ) -> None:
        """Rule 3 (``overlay.node_acks`` rule 1): each group instance's copy in
        a tagged Notify of its own; the plain subscriptions of one session in
        one Notify, tagged when the event is keyed (tracked for its order)."""
        if key and len(sub_ids) == 1 and sub_ids[0] not in self._group_of:
            self._access_notify_one(event_id, event, sub_ids, publish_time, owner, key, rank, out)
            return
        group_of = self._group_of
        if not key and not any(g in group_of for g in sub_ids):
            self._notify_clients(event_id, event, sub_ids, publish_time, out)
            return
        now = self.now
        latency = now - publish_time
        self.latency_hist.observe(latency if latency > 0 else 0.0)
        owners = self._sub_owner
        if self.capture is not None:
            self.capture.deliver(event_id, sub_ids, owners)
        plain: dict[int, tuple[list[str], list[str]]] = {}
        orphans: list[str] = []
        notifies = 0
        for gid in sub_ids:
            o = owners.get(gid)
            if o is None:
                self.stats["notifications_orphaned"] += 1
                if key or gid in group_of:
                    orphans.append(gid)
                continue
            if gid in group_of:  # fenced on its own (node_acks rule 2)
                tag = self.acks.add(o[0], event_id, owner, (gid,), group=True, now=now)
                out.append(ToClient(o[0], cm.Notify(event_id, event, (o[1],), publish_time, key, rank, tag)))
                notifies += 1
                continue
            local, gids = plain.setdefault(o[0], ([], []))
            local.append(o[1])
            gids.append(gid)
        for sid, (local, gids) in plain.items():
            tag = self.acks.add(sid, event_id, owner, tuple(gids), group=False, now=now) if key else 0
            out.append(ToClient(sid, cm.Notify(event_id, event, tuple(local), publish_time, key, rank, tag)))
        self.stats["notifies_out"] += notifies + len(plain)
        if orphans:
            self._ack_to_owner(owner, pm.NotificationAck(event_id, tuple(orphans), failed=True), out)

    def _access_notify_one(
        self: NodeCore,
        event_id: str,
        event: dict[str, Any],
        sub_ids: Sequence[str],
        publish_time: float,
        owner: int,
        key: str,
        rank: int,
        out: list[Action],
    ) -> None:
        """``_access_notify`` for the common keyed case: one plain subscription."""
        now = self.now
        latency = now - publish_time
        self.latency_hist.observe(latency if latency > 0 else 0.0)
        gid = sub_ids[0]
        gids = sub_ids if type(sub_ids) is tuple else (gid,)
        if self.capture is not None:
            self.capture.deliver(event_id, gids, self._sub_owner)
        o = self._sub_owner.get(gid)
        if o is None:
            self.stats["notifications_orphaned"] += 1
            self._ack_to_owner(owner, pm.NotificationAck(event_id, gids, failed=True), out)
            return
        sid, local_id = o
        tag = self.acks.add(sid, event_id, owner, gids, group=False, now=now)
        out.append(ToClient(sid, cm.Notify(event_id, event, (local_id,), publish_time, key, rank, tag)))
        self.stats["notifies_out"] += 1

    def _ack_to_owner(self: NodeCore, owner: int, ack: pm.NotificationAck, out: list[Action]) -> None:
        if owner == self.id:
            self._on_delivery_ack(ack, out)
        else:
            out.append(ToPeer(owner, ack))

    def _tracks_ack(self: NodeCore, sid: int, msg: cm.Ack) -> bool:
        """From the shell's read loop: True when this Ack must go through
        ``handle_client`` (it changes state and may emit messages).  A plain
        subscriber's ack for a remote owner is only batched (rule 8 of
        ``node.ordering``): it is taken here, without the inbox."""
        if not msg.tag:
            return False
        a = self.acks.get(msg.tag, sid)
        if a is None:
            return False  # stale: answered already, or failed meanwhile
        if a.owner == self.id or a.group or msg.declined:
            return True
        self.acks.remove(msg.tag)
        self.ordering.note_acks(a.owner, a.event_id, a.gids)
        return False

    def _client_acked(self: NodeCore, sid: int, msg: cm.Ack, out: list[Action]) -> None:
        """The client's answer to a tracked Notify (node_acks rules 1, 2)."""
        a = self.acks.pop(msg.tag, sid) if msg.tag else None
        if a is None:
            if msg.tag:
                self.stats["client_acks_stale"] += 1
            return
        if msg.declined:  # not handed over: fail it, so a group sends it to another instance
            self.stats["deliveries_declined"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)
            return
        if a.revoking:
            self.stats["revokes_answered_with_ack"] += 1
        if a.owner != self.id and not a.group:
            self.ordering.note_acks(a.owner, a.event_id, a.gids)  # no LF to carry: batched (node.ordering rule 8)
            return
        lf = msg.lf if isinstance(msg.lf, (int, float)) and math.isfinite(msg.lf) else 0.0
        self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, lf=min(1.0, max(0.0, lf))), out)

    def notify_dropped(self: NodeCore, sid: int, tag: int) -> list[Action]:
        """The shell dropped a tracked Notify (the session's queue was full):
        that delivery failed now, not after a timeout (a group instance's
        event goes to another instance at once)."""
        out: list[Action] = []
        a = self.acks.pop(tag, sid)
        if a is not None:
            self.stats["deliveries_dropped_slow"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)
        return out

    def _fail_session_acks(self: NodeCore, sid: int, out: list[Action]) -> None:
        """A closed session acks nothing more: its tracked deliveries failed."""
        if not len(self.acks):
            return
        for tag, a in self.acks.of_session(sid):
            self.acks.remove(tag)
            self.stats["delivery_failed_closed"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)

    def _on_returned(self: NodeCore, msg: pm.NotificationAck, out: list[Action]) -> None:
        """Rule 4 at the publisher's access node."""
        self.stats["returned_to_sender"] += 1
        pub = self.ordering.recent_publish(msg.event_id)
        if pub is None or pub[0] not in self.sessions:
            self.stats["returned_publisher_gone"] += 1
            log.warning(
                "node %d: event %s undeliverable to group %r; its publisher is gone", self.id, msg.event_id, msg.detail
            )
            return
        out.append(
            ToClient(
                pub[0],
                cm.Error(
                    pub[1],
                    cm.ErrorCode.UNDELIVERABLE,
                    f"event {msg.event_id}: no instance of group {msg.detail!r} could take it",
                ),
            )
        )

    # -- owner: acks, faults, completion (rules 4, 6) -----------------------------------------------

    def _on_notification_ack(self: NodeCore, src: int, msg: pm.NotificationAck, out: list[Action]) -> None:
        """Dispatch on the leg ``msg.code`` names (see ``pm.NotificationAck``)."""
        code = msg.code
        if not msg.event_id and code in (COMPLETE, SEQUENCED, ACKED):
            self.ordering.on_batched(msg, out)
        elif code == "":
            self._on_delivery_ack(msg, out)
        elif code == COMPLETE:
            self.ordering.on_complete_ack(msg.event_id, out)
        elif code == UNDELIVERABLE:
            self._on_returned(msg, out)
        elif code == SEQUENCED or msg.failed:
            self.ordering.on_verdict(msg, out)
        else:
            self.stats["notification_acks_unknown"] += 1

    def _deliveries_acked(self: NodeCore, pairs: Sequence[str], out: list[Action]) -> None:
        """A batched ``acked`` note: ``(event id, sub id)`` pairs of plain subscribers
        that got their event (node.ordering rule 8)."""
        deliveries = self._deliveries
        it = iter(pairs)
        for event_id, gid in zip(it, it):  # a stray odd id is ignored
            d = deliveries.get(event_id)
            if d is None:
                self.stats["delivery_acks_stale"] += 1
                continue
            if d.gsub and gid in d.gsub:  # a group instance after all: its LF and faults (rule 4)
                self._on_delivery_ack(pm.NotificationAck(event_id, (gid,)), out)
                continue
            waiting = d.waiting
            waiting.pop(gid, None)
            if not waiting:
                self._delivery_done(d, out)

    def _on_delivery_ack(self: NodeCore, msg: pm.NotificationAck, out: list[Action]) -> None:
        d = self._deliveries.get(msg.event_id)
        if d is None:
            self.stats["delivery_acks_stale"] += 1
            return
        now = self.now
        retry: list[Subscription] = []
        for gid in msg.sub_ids:
            node = d.waiting.pop(gid, None)
            if node is None:
                continue
            g = d.gsub.pop(gid, None) if d.gsub else None
            if g is None:
                if msg.failed:
                    self.stats["ordered_delivery_failed"] += 1
                continue
            disp = self._dispatchers.get((d.ch, g))
            if not msg.failed:
                if disp is not None:
                    disp.update_lf(gid, msg.lf)
                continue
            self.stats["group_delivery_failed"] += 1
            if disp is not None:
                disp.mark_faulty(gid, now)
            left = [s for s in d.cands[g] if s.id not in d.tried[g]]
            if disp is not None:
                chosen = disp.pick([s.id for s in left], now) if left else None
            else:  # the channel moved on: any instance not tried yet
                chosen = left[0].id if left else None
            if chosen is None:
                self._undeliverable(d.ev, g, out)
                continue
            self.stats["group_redispatched"] += 1
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

    def _delivery_done(self: NodeCore, d: _Delivery, out: list[Action]) -> None:
        ev = d.ev
        self._deliveries.pop(ev.event_id, None)
        if not ev.key:
            return
        home = ev.home
        if home == self.id or home < 0:
            self.ordering.on_complete_ack(ev.event_id, out)
        else:
            self.ordering.note(home, COMPLETE, ev.event_id)  # sent by end_batch (node.ordering rule 8)

    def _peer_down_deliveries(self: NodeCore, node: int, now: float, out: list[Action]) -> None:
        """A subscribers' access node went down: what it owed us failed (rule 4)."""
        for eid, d in list(self._deliveries.items()):
            lost = tuple(g for g, n in d.waiting.items() if n == node)
            if lost:
                self._on_delivery_ack(pm.NotificationAck(eid, lost, failed=True), out)

    # -- time (rules 3, 4) ----------------------------------------------------------------------

    def _groups_tick(self: NodeCore, now: float, out: list[Action]) -> None:
        for tag, a in list(self.acks.expired(now)):  # node_acks rules 2, 3
            if self.acks.get(tag, a.sid) is not a:
                continue  # failed meanwhile with its session (an unresponsive client below)
            if a.group and not a.revoking:
                self.stats["deliveries_revoked"] += 1
                self.acks.revoking(tag, now)
                out.append(ToClient(a.sid, cm.Revoke(tag, a.event_id)))
                continue
            self.acks.remove(tag)
            self.stats["delivery_ack_timeouts"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)
            if a.revoking and a.sid in self.sessions:  # it answered neither the Notify nor the Revoke
                self._unresponsive(a.sid, out)
        at, ids = self._delivery_at, self._delivery_ids
        while at and at[0] <= now:
            deadline, eid = at.popleft(), ids.popleft()
            d = self._deliveries.get(eid)
            if d is not None and d.waiting and d.deadline == deadline:
                self.stats["delivery_owner_timeouts"] += 1
                self._on_delivery_ack(pm.NotificationAck(eid, tuple(d.waiting), failed=True), out)
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_SECONDS
            for k in [k for k in self._dispatchers if k[0] not in self.local]:
                del self._dispatchers[k]
            for gid in [g for g in self._group_of if g not in self._sub_owner]:
                del self._group_of[gid]
            for (chid, _), disp in self._dispatchers.items():
                ch = self.local.get(chid)
                if ch is not None:
                    for i in [i for i in disp.instances if i not in ch]:
                        disp.remove(i)

    def _unresponsive(self: NodeCore, sid: int, out: list[Action]) -> None:
        """node_acks rule 2: a client that answers neither an ack nor a revoke
        is disconnected; its client library drops the group copies it held."""
        self.stats["clients_unresponsive"] += 1
        wait = self.acks.wait
        log.warning(
            "node %d: client session %d answered neither a group notification nor its revoke in %.1fs; "
            "disconnecting it",
            self.id,
            sid,
            2 * wait,
        )
        out.append(
            ToClient(
                sid,
                cm.Error(
                    -1,
                    cm.ErrorCode.UNRESPONSIVE,
                    (
                        f"no answer to a group notification within {2 * wait:g}s: disconnected; its events went to other instances"
                    ),
                    fatal=True,
                ),
            )
        )
        out.extend(self.client_closed(sid))
        out.append(CloseClient(sid, "unresponsive"))

    # -- migration (rule 7) ----------------------------------------------------------------------

    def _group_states(self: NodeCore, chid: ChannelId) -> tuple[GroupState, ...]:
        return tuple(d.state() for (c, _), d in self._dispatchers.items() if c == chid)

    def _restore_groups(self: NodeCore, cs: pm.ChannelSubscriptions) -> None:
        cfg = self.config.groups
        for st in cs.groups:
            self._dispatchers[(cs.ch_id, st.name)] = GroupDispatcher.restore(
                st, fault_period=cfg.fault_period, throttle_lf=cfg.throttle_lf
            )
        if cs.groups:
            self.stats["group_states_restored"] += len(cs.groups)

    def group_status(self: NodeCore) -> list[dict[str, Any]]:
        """Per (channel, group): instances with their weights, LF, sent counts."""
        return [
            {
                "channel": str(c),
                "group": g,
                "dispatched": d.dispatched,
                "counters": dict(d.counters),
                "instances": {
                    i: {"ws": s.ws / 1000, "lf": s.lf / 1000, "sent": s.sent, "faulty_until": s.faulty_until}
                    for i, s in d.instances.items()
                },
            }
            for (c, g), d in self._dispatchers.items()
        ]
