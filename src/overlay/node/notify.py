"""The subscribers' access node: Notifies to its clients, and the acks of tracked ones (SPEC §4, §10, §11).

A Notification (or a local match) names global subscription ids; the access
node maps them to its client sessions and sends each session one Notify
(``node.core`` rule 5).  A tracked delivery — every notification of a keyed
event, a group instance's copy of any event — is tagged and waits for the
client's answer (the rules of ``overlay.node.acks``), and the outcome goes
back to the channel's owner (``overlay.node.groups``) as a
``NotificationAck``.

Rules this module keeps (numbered as in ``overlay.node.groups``):

1. The owner and the access node agree on what is tracked: a keyed event's
   notifications, and those of subscriptions in a group (this node knows
   its clients' group subscriptions).
3. Each group instance's copy goes in a tagged Notify of its own; the plain
   subscriptions of one session in one Notify, tagged when the event is
   keyed.  A declined, dropped (queue full), unanswered or orphaned copy is
   a failed delivery; a plain subscriber's ack of a remote owner is only
   batched (``node.ordering`` rule 8).  An orphaned copy (its subscription
   gone from here) is answered failed to the owner that sent it even when it
   looks plain: the group id of a subscription gone is pruned, and a group
   copy dropped unanswered stays in flight at its owner, which may hand it
   over and die (fault seeds 459, 929: the PubAck'd event was lost).  The
   owner counts the answer to a copy it does not track as stale.
4. An event no instance could take comes back here, to its publisher's
   access node, as an ``undeliverable`` Error to the publisher — after its
   PubAck when the event is still kept (``node.outbox`` rule 2).
5. A plain subscription's copy of an unkeyed event whose id this node
   delivered lately is dropped (``node.dedup``), counted
   ``duplicates_dropped``, before anything else sees it (the capture
   records one delivery): a re-sent event matched twice, or a publish sent
   again under its id, reaches each client once.  The Notification is
   still confirmed to the publisher's access node (``node.core``).  A
   tracked copy (a keyed event's, a group instance's) that this node
   delivered lately to the same subscription is not delivered again either
   (``TrackedCopies``): its sender is answered as the first copy's was —
   at once if its client answered, with it if it has not yet; a copy its
   client did not take is delivered again.  So a key's new home releasing
   an event again, or a re-sent event's sticky group copy (``node.groups``
   rule 9), reaches each client once and still completes.  A keyed copy of
   a rank at or below one its subscription got lately (``RankMarks``) is
   late — its home released it again after the next ranks went out — and is
   answered the same way, so a key's order holds at every subscription.
6. Conjuncts of one subscription (``node.sessions`` rule 7) that an event
   matched come in one Notification (the event's one channel holds them
   all): their client hears the subscription's local id once, and the
   capture records the subscription's own id once.  A tracked copy's answer
   still goes back for every conjunct the owner named.
7. An untagged Notify for several sessions (an unkeyed event's plain
   subscriptions) is one ``Notifies`` action, each session with its own
   local ids: the shell encodes the event and its payload once for all of
   them (``overlay.messages.codec`` rule 4), and no per-session action or
   Notify is made here.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any, Final

from overlay.actions import Action, CloseClient, Notifies, ToClient, ToPeer
from overlay.channels.groups import MAX_WEIGHT
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.acks import Awaited, AwaitedAcks
from overlay.node.context import NodeContext
from overlay.node.dedup import RankMarks, SeenEvents, TrackedCopies
from overlay.node.observer import CoreObserver
from overlay.node.ordering import Ordering

__all__ = ["PRUNE_SECONDS", "UNDELIVERABLE", "Notifier"]

log = logging.getLogger("overlay.node")

UNDELIVERABLE: Final = pm.AckCode.UNDELIVERABLE
# How often (seconds) group ids of subscriptions gone are pruned: housekeeping.
PRUNE_SECONDS: Final = 5.0
# Per event, read from C statics when compiled (a global's lookup and its
# attribute's were dict lookups each time: issue 19).
_Notify: Final = cm.Notify
_ToClient: Final = ToClient

OwnerAck = Callable[[pm.NotificationAck, list[Action]], None]
CloseSession = Callable[[int], list[Action]]
DeferError = Callable[[str, str, str], bool]


def _not_in(container: Container[object], item: object) -> bool:
    return item not in container


class Notifier:
    """The access node's notifications and the acks it waits for.

    ``owners`` maps a global subscription id to its ``(session, local id)``
    and ``sessions`` tells which sessions are open (both ``node.sessions``);
    ``owner_ack`` hands a NotificationAck to this node's own owner side
    (``node.groups``); ``close_session`` ends a client's session; ``seen``
    holds the event ids delivered lately (rule 5); ``defer_error`` holds an
    error for a publisher until its PubAck (``Outbox.defer_error``).
    """

    def __init__(
        self,
        ctx: NodeContext,
        ordering: Ordering,
        *,
        owners: Mapping[str, tuple[int, str]],
        base_of: Mapping[str, str] | None = None,
        sessions: Container[int],
        owner_ack: OwnerAck,
        close_session: CloseSession,
        seen: SeenEvents,
        defer_error: DeferError,
    ) -> None:
        self._ctx = ctx
        self._ordering = ordering
        self._owners = owners
        self._base_of: Mapping[str, str] = base_of if base_of is not None else {}
        self._sessions = sessions
        self._owner_ack = owner_ack
        self._close_session = close_session
        self.seen = seen
        self._defer_error = defer_error
        self._group_of: dict[str, str] = {}  # global sub id -> group, for this node's clients
        # Tracked Notifies by tag, waiting for their client's answer (overlay.node.acks).
        self.acks = AwaitedAcks(ctx.config.groups.ack_timeout)
        cl = ctx.config.cluster
        self.copies = TrackedCopies(cl.dedup_window, cl.dedup_max, ctx.stats)  # rule 5
        self.marks = RankMarks(min(cl.event_ttl, ctx.config.sequencer.key_ttl), cl.dedup_max, ctx.stats)
        self._next_prune = 0.0
        self.observer: CoreObserver | None = None  # node.observer rule 1

    @property
    def has_groups(self) -> bool:
        """Whether any client of this node subscribed in a group."""
        return bool(self._group_of)

    def note_group(self, gid: str, group: str) -> None:
        self._group_of[gid] = group

    def tick(self, now: float, out: list[Action]) -> None:
        """Rules 2 and 3 of ``node.acks``: revoke, then fail, what went unanswered."""
        for tag, a in list(self.acks.expired(now)):
            if self.acks.get(tag, a.sid) is not a:
                continue  # failed meanwhile with its session (an unresponsive client below)
            if a.group and not a.revoking:
                self._ctx.stats["deliveries_revoked"] += 1
                self.acks.revoking(tag, now)
                out.append(ToClient(a.sid, cm.Revoke(tag, a.event_id)))
                continue
            self.acks.remove(tag)
            self._ctx.stats["delivery_ack_timeouts"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)
            self._resolved(a, False, 0.0, out)
            if a.revoking and a.sid in self._sessions:  # it answered neither the Notify nor the Revoke
                self._unresponsive(a.sid, out)

    def prune(self, now: float) -> None:
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_SECONDS
            self.copies.expire(now)
            self.marks.expire(now)
            for gid in [g for g in self._group_of if g not in self._owners]:
                del self._group_of[gid]

    def notify_clients(
        self,
        event_id: str,
        event: dict[str, Any],
        sub_ids: Sequence[str],
        publish_time: float,
        out: list[Action],
        payload: bytes = b"",
        owner: int = -1,
    ) -> None:
        """One Notify per client session, listing its matching subscriptions
        (``node.core`` rule 5), several sessions' in one action (rule 7); a
        copy delivered lately is dropped (rule 5).  ``payload`` goes
        unchanged in every Notify (the same bytes object).  A copy for a
        subscription gone from here is answered failed to ``owner``, the
        channel's owner that sent it, when there is one (rule 3)."""
        obs = self.observer
        if obs is not None:
            obs.notified(event_id, sub_ids)
        ctx = self._ctx
        now = ctx.now
        if self.seen.seen(event_id, now):
            ctx.stats["duplicates_dropped"] += 1
            return
        owners = self._owners
        latency = now - publish_time
        ctx.latency_hist.observe(latency if latency > 0 else 0.0)
        if ctx.capture is not None:
            ctx.capture.deliver(event_id, self._bases(sub_ids), owners, len(payload))
        if len(sub_ids) == 1:  # the common case, without the grouping
            o = owners.get(sub_ids[0])
            if o is None:
                ctx.stats["notifications_orphaned"] += 1
                if owner >= 0:
                    self._orphaned(owner, event_id, sub_ids, out)
                return
            # Positional: msgspec parses keywords per call (untagged: key "", rank 0, tag 0).
            out.append(_ToClient(o[0], _Notify(event_id, event, (o[1],), publish_time, "", 0, 0, payload)))
            ctx.stats["notifies_out"] += 1
            return
        by_session: dict[int, tuple[str, ...]] = {}
        orphans: list[str] | None = None
        for gid in sub_ids:
            o = owners.get(gid)
            if o is None:
                self._ctx.stats["notifications_orphaned"] += 1
                if orphans is None:
                    orphans = [gid]
                else:
                    orphans.append(gid)
                continue
            sid, local_id = o
            ids = by_session.get(sid)
            if ids is None:
                by_session[sid] = (local_id,)
            elif local_id not in ids:  # rule 6: conjuncts of one subscription
                by_session[sid] = (*ids, local_id)
        if orphans is not None and owner >= 0:
            self._orphaned(owner, event_id, orphans, out)
        if not by_session:
            return
        # Rule 7: one action for every session, which the shell encodes once.
        sessions = list(by_session)
        local_ids = list(by_session.values())
        out.append(
            Notifies(cm.Notify(event_id, event, local_ids[0], publish_time, payload=payload), sessions, local_ids)
        )
        self._ctx.stats["notifies_out"] += len(sessions)

    def _orphaned(self, owner: int, event_id: str, gids: Sequence[str], out: list[Action]) -> None:
        """Rule 3: copies for subscriptions gone from here failed, answered
        even when they look plain (a group id of a subscription gone is pruned)."""
        self._ack_to_owner(owner, pm.NotificationAck(event_id, tuple(gids), failed=True), out)

    def _bases(self, sub_ids: Sequence[str]) -> Sequence[str]:
        """Rule 6: the subscriptions' own ids, each once (the same ids when no
        subscription here has several conjuncts: the common case, no copy)."""
        base_of = self._base_of
        if not base_of:
            return sub_ids
        return tuple(dict.fromkeys(base_of.get(g, g) for g in sub_ids))

    def check_group(self, sid: int, msg: cm.Subscribe, out: list[Action]) -> bool:
        """Bad input: a weight outside (0, MAX_WEIGHT] (NaN, inf, 1e308 …) is refused."""
        if not 0 < msg.weight <= MAX_WEIGHT:  # NaN compares false: refused
            self._ctx.stats["rejected_bad_group"] += 1
            out.append(
                ToClient(
                    sid,
                    cm.Error(
                        msg.seq,
                        cm.ErrorCode.BAD_GROUP,
                        f"weight must be a number in (0, {MAX_WEIGHT:g}], got {msg.weight!r}",
                    ),
                )
            )
            return False
        if msg.group and not msg.group.strip():
            self._ctx.stats["rejected_bad_group"] += 1
            out.append(ToClient(sid, cm.Error(msg.seq, cm.ErrorCode.BAD_GROUP, "a group name must not be blank")))
            return False
        return True

    def notify(
        self,
        event_id: str,
        event: dict[str, Any],
        sub_ids: Sequence[str],
        publish_time: float,
        owner: int,
        key: str,
        rank: int,
        out: list[Action],
        chid: object = None,
        payload: bytes = b"",
    ) -> None:
        """Rule 3 (``overlay.node.acks`` rule 1): each group instance's copy in
        a tagged Notify of its own; the plain subscriptions of one session in
        one Notify, tagged when the event is keyed (tracked for its order).
        Rule 5: a tracked copy delivered here before is answered, not delivered."""
        group_of = self._group_of
        if not key and not any(g in group_of for g in sub_ids):
            self.notify_clients(event_id, event, sub_ids, publish_time, out, payload, owner)
            return
        obs = self.observer  # node.observer rule 3 (the plain copies' report is notify_clients')
        if obs is not None:
            obs.notified(event_id, sub_ids)
        if self.copies.of(event_id) is not None:
            sub_ids = self._again(event_id, sub_ids, owner, bool(key), out)
            if not sub_ids:
                return
        if key:
            sub_ids = self._in_order(event_id, sub_ids, owner, key, rank, out)
            if not sub_ids:
                return
        if key and len(sub_ids) == 1 and sub_ids[0] not in group_of:
            self._notify_one(event_id, event, sub_ids, publish_time, owner, key, rank, out, chid, payload)
            return
        now = self._ctx.now
        if not key and not all(g in group_of for g in sub_ids) and self.seen.seen(event_id, now):
            self._ctx.stats["duplicates_dropped"] += 1  # rule 5: the plain copies; each group's is its own
            sub_ids = [g for g in sub_ids if g in group_of]
        latency = now - publish_time
        self._ctx.latency_hist.observe(latency if latency > 0 else 0.0)
        owners = self._owners
        if self._ctx.capture is not None:
            self._ctx.capture.deliver(event_id, self._bases(sub_ids), owners, len(payload))
        plain: dict[int, tuple[list[str], list[str]]] = {}
        orphans: list[str] = []
        notifies = 0
        for gid in sub_ids:
            o = owners.get(gid)
            if o is None:
                self._ctx.stats["notifications_orphaned"] += 1
                if key or gid in group_of:
                    orphans.append(gid)
                continue
            if gid in group_of:  # fenced on its own (node.acks rule 2)
                tag = self.acks.add(o[0], event_id, owner, (gid,), group=True, now=now)
                self.copies.delivered(event_id, gid, owner, chid, group_of[gid], now)
                if key:
                    self.marks.delivered(gid, key, rank, now)
                out.append(ToClient(o[0], cm.Notify(event_id, event, (o[1],), publish_time, key, rank, tag, payload)))
                notifies += 1
                continue
            local, gids = plain.setdefault(o[0], ([], []))
            if o[1] not in local:  # rule 6: conjuncts of one subscription
                local.append(o[1])
            gids.append(gid)
        for sid, (local, gids) in plain.items():
            tag = 0
            if key:
                tag = self.acks.add(sid, event_id, owner, tuple(gids), group=False, now=now)
                for gid in gids:
                    self.copies.delivered(event_id, gid, owner, chid, "", now)
                    self.marks.delivered(gid, key, rank, now)
            out.append(ToClient(sid, cm.Notify(event_id, event, tuple(local), publish_time, key, rank, tag, payload)))
        self._ctx.stats["notifies_out"] += notifies + len(plain)
        if orphans:
            self._ack_to_owner(owner, pm.NotificationAck(event_id, tuple(orphans), failed=True), out)

    def _notify_one(
        self,
        event_id: str,
        event: dict[str, Any],
        sub_ids: Sequence[str],
        publish_time: float,
        owner: int,
        key: str,
        rank: int,
        out: list[Action],
        chid: object = None,
        payload: bytes = b"",
    ) -> None:
        """``notify`` for the common keyed case: one plain subscription."""
        now = self._ctx.now
        latency = now - publish_time
        self._ctx.latency_hist.observe(latency if latency > 0 else 0.0)
        gid = sub_ids[0]
        gids = sub_ids if type(sub_ids) is tuple else (gid,)
        if self._ctx.capture is not None:
            self._ctx.capture.deliver(event_id, self._bases(gids), self._owners, len(payload))
        o = self._owners.get(gid)
        if o is None:
            self._ctx.stats["notifications_orphaned"] += 1
            self._ack_to_owner(owner, pm.NotificationAck(event_id, gids, failed=True), out)
            return
        sid, local_id = o
        tag = self.acks.add(sid, event_id, owner, gids, group=False, now=now)
        self.copies.delivered(event_id, gid, owner, chid, "", now)
        self.marks.delivered(gid, key, rank, now)
        out.append(ToClient(sid, cm.Notify(event_id, event, (local_id,), publish_time, key, rank, tag, payload)))
        self._ctx.stats["notifies_out"] += 1

    # -- rule 5: tracked copies that come again ----------------------------------------------------

    def _again(self, event_id: str, sub_ids: Sequence[str], owner: int, keyed: bool, out: list[Action]) -> list[str]:
        """The subscriptions of ``sub_ids`` to deliver: a tracked copy delivered
        here before is answered to ``owner`` as the first was, not delivered."""
        copies = self.copies.of(event_id)
        assert copies is not None
        fresh: list[str] = []
        for gid in sub_ids:
            c = copies.get(gid)
            if c is None or not (keyed or gid in self._group_of):
                fresh.append(gid)
                continue
            self._ctx.stats["tracked_duplicates_dropped"] += 1
            if c.acked is None:  # its client has not answered: the owner hears with the first
                if c.also is None:
                    c.also = [owner]
                else:
                    c.also.append(owner)
            else:
                self._answer(owner, event_id, gid, True, c.lf, out)
        return fresh

    def _in_order(
        self, event_id: str, sub_ids: Sequence[str], owner: int, key: str, rank: int, out: list[Action]
    ) -> list[str]:
        """Rule 5: a keyed copy at or below a rank a subscription got lately is
        late (released again after the next ranks went out): answered, not delivered."""
        marks = self.marks
        fresh: list[str] = []
        for gid in sub_ids:
            if marks.stale(gid, key, rank):
                self._ctx.stats["ordered_late_dropped"] += 1
                self._answer(owner, event_id, gid, True, 0.0, out)
            else:
                fresh.append(gid)
        return fresh

    def _resolved(self, a: Awaited, acked: bool, lf: float, out: list[Action]) -> None:
        """Rule 5: the other owners waiting for this delivery hear its outcome too."""
        for gid in a.gids:
            for owner in self.copies.resolved(a.event_id, gid, acked, lf):
                if owner != a.owner:
                    self._answer(owner, a.event_id, gid, acked, lf, out)

    def _answer(self, owner: int, event_id: str, gid: str, acked: bool, lf: float, out: list[Action]) -> None:
        if acked and owner != self._ctx.id and gid not in self._group_of:
            self._ordering.note_acks(owner, event_id, (gid,))  # as a plain ack goes (node.ordering rule 8)
        else:
            self._ack_to_owner(owner, pm.NotificationAck(event_id, (gid,), lf=lf, failed=not acked), out)

    def group_choices(self, owner: int, chid: object) -> tuple[pm.GroupChoice, ...]:
        """What ``owner`` gave this node's group instances of channel ``chid`` lately,
        or of a channel the routing table no longer names (node.groups rule 9):
        the dead owner may have split it just before it died (fault seed 561)."""
        # A partial, not a lambda over ``routing``: mypyc 2.4.1 cannot compile a
        # closure in a method of a plain class (overlay.build rule 5).
        choices = self.copies.group_choices(owner, chid, functools.partial(_not_in, self._ctx.routing))
        return tuple(pm.GroupChoice(e, g, s, t) for e, g, s, t in choices)

    def _ack_to_owner(self, owner: int, ack: pm.NotificationAck, out: list[Action]) -> None:
        if owner == self._ctx.id:
            self._owner_ack(ack, out)
        else:
            out.append(ToPeer(owner, ack))

    def tracks_ack(self, sid: int, msg: cm.Ack) -> bool:
        """From the shell's read loop: True when this Ack must go through
        ``handle_client`` (it changes state and may emit messages).  A plain
        subscriber's ack for a remote owner is only batched (rule 8 of
        ``node.ordering``): it is taken here, without the inbox."""
        if not msg.tag:
            return False
        a = self.acks.get(msg.tag, sid)
        if a is None:
            return False  # stale: answered already, or failed meanwhile
        if a.owner == self._ctx.id or a.group or msg.declined or self.copies.waited_on(a.event_id, a.gids):
            return True
        self.acks.remove(msg.tag)
        self._ordering.note_acks(a.owner, a.event_id, a.gids)
        for gid in a.gids:
            self.copies.resolved(a.event_id, gid, True)
        return False

    def client_acked(self, sid: int, msg: cm.Ack, out: list[Action]) -> None:
        """The client's answer to a tracked Notify (node.acks rules 1, 2)."""
        a = self.acks.pop(msg.tag, sid) if msg.tag else None
        if a is None:
            if msg.tag:
                self._ctx.stats["client_acks_stale"] += 1
            return
        if msg.declined:  # not handed over: fail it, so a group sends it to another instance
            self._ctx.stats["deliveries_declined"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)
            self._resolved(a, False, 0.0, out)
            return
        if a.revoking:
            self._ctx.stats["revokes_answered_with_ack"] += 1
        lf = min(1.0, max(0.0, msg.lf)) if math.isfinite(msg.lf) else 0.0
        if a.owner != self._ctx.id and not a.group:
            self._ordering.note_acks(a.owner, a.event_id, a.gids)  # no LF to carry: batched (node.ordering rule 8)
        else:
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, lf=lf), out)
        self._resolved(a, True, lf, out)

    def notify_dropped(self, sid: int, tag: int) -> list[Action]:
        """The shell dropped a tracked Notify (the session's queue was full):
        that delivery failed now, not after a timeout (a group instance's
        event goes to another instance at once)."""
        out: list[Action] = []
        a = self.acks.pop(tag, sid)
        if a is not None:
            self._ctx.stats["deliveries_dropped_slow"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)
            self._resolved(a, False, 0.0, out)
        return out

    def fail_session_acks(self, sid: int, out: list[Action]) -> None:
        """A closed session acks nothing more: its tracked deliveries failed."""
        if not len(self.acks):
            return
        for tag, a in self.acks.of_session(sid):
            self.acks.remove(tag)
            self._ctx.stats["delivery_failed_closed"] += 1
            self._ack_to_owner(a.owner, pm.NotificationAck(a.event_id, a.gids, failed=True), out)
            self._resolved(a, False, 0.0, out)

    def on_returned(self, msg: pm.NotificationAck, out: list[Action]) -> None:
        """Rule 4 at the publisher's access node."""
        self._ctx.stats["returned_to_sender"] += 1
        text = f"event {msg.event_id}: no instance of group {msg.detail!r} could take it"
        if self._defer_error(msg.event_id, cm.ErrorCode.UNDELIVERABLE, text):
            return  # the event is kept: the publisher hears it after its PubAck
        pub = self._ordering.recent_publish(msg.event_id)
        if pub is None or pub[0] not in self._sessions:
            self._ctx.stats["returned_publisher_gone"] += 1
            log.warning(
                "node %d: event %s undeliverable to group %r; its publisher is gone",
                self._ctx.id,
                msg.event_id,
                msg.detail,
            )
            return
        out.append(
            ToClient(
                pub[0],
                cm.Error(pub[1], cm.ErrorCode.UNDELIVERABLE, text),
            )
        )

    def _unresponsive(self, sid: int, out: list[Action]) -> None:
        """node.acks rule 2: a client that answers neither an ack nor a revoke
        is disconnected; its client library drops the group copies it held."""
        self._ctx.stats["clients_unresponsive"] += 1
        wait = self.acks.wait
        log.warning(
            "node %d: client session %d answered neither a group notification nor its revoke in %.1fs; "
            "disconnecting it",
            self._ctx.id,
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
        out.extend(self._close_session(sid))
        out.append(CloseClient(sid, "unresponsive"))
