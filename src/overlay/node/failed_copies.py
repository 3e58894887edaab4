"""A group copy its access node failed, kept until its owner has surely replaced it (SPEC §11, §16).

A group instance's copy of an unkeyed event is confirmed to the publisher's
access node when it reaches the instance's access node (``node.outbox`` rule
2): the event may be PubAck'd before the instance's client takes it.  When the
copy then fails here (declined, unanswered, dropped for a full queue, its
session closed, its subscription gone: ``node.notify`` rule 3), only its owner
can give the event to another instance (``node.groups`` rule 4) — and an owner
whose run ends before it has (paused, cut off, crashed, and rejoined as a new
run) takes the failed answer, or the replacement copy it sent, with it: the
group never gets the event its publisher was promised (fault seed 1990).  So
this access node, which has the event in hand, sends it again.

Rules this module keeps:

1. **Kept.**  The Notification of a group copy that waits for its client
   here, sent by another node, is kept (by event id, for ``event_ttl``, at
   most ``dedup_max``) until the copy is taken — then it is forgotten — or
   fails: then it is kept on, with the owners the failed answer went to.  A
   copy found orphaned (its subscription gone) fails while its Notification
   is handled, which is kept then.  A keyed event's copy is not kept: its
   key's home releases the event again when the owner's run ends
   (``node.keyhome`` rule 9).
2. **Sent again.**  When an owner a failed answer went to is declared dead or
   restarts (``owner_gone``) — or had, when the copy failed — the event is
   dispatched again, as its outbox re-sends one (``node.outbox`` rule 3), to
   its channel's current owner once that is a live node: at once, or when
   the recovery's update or the new run's announcement names it
   (``resend``, with the outbox's re-send, ``node.recovery`` rule 3).  Its
   access node stays the publisher's.  The new owner, told the dead one's
   choices by the instances' access nodes before it matches (``Rebuild``,
   ``node.groups`` rule 9), gives it to the instance that took it, if any,
   or another; the plain subscribers' access nodes drop it (``node.dedup``).
   Counted ``group_copies_resent``.
"""

from __future__ import annotations

from collections.abc import Callable

from overlay.actions import Action
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.dedup import Recent
from overlay.node.notify import Notifier

__all__ = ["FailedCopies"]

DispatchEvent = Callable[[pm.Event, list[Action]], None]


class _Kept:
    """One event's group copy here (rule 1): its Notification, the node that
    sent it and how many of that node's runs had ended then, and the owners
    the failed answer went to."""

    __slots__ = ("ended", "failed", "msg", "src")

    def __init__(self, msg: pm.Notification, src: int, ended: int) -> None:
        self.msg = msg
        self.src = src
        self.ended = ended
        self.failed: set[int] = set()


class FailedCopies:
    """Rules 1 and 2 at the subscribers' access node: ``notifier`` tells each
    answer it sends another owner, and its tracked copies say which wait for
    their clients (``node.dedup`` rule 3); ``dispatch`` routes an event to its
    channel's owner."""

    def __init__(self, ctx: NodeContext, notifier: Notifier, *, dispatch: DispatchEvent) -> None:
        self._ctx = ctx
        self._copies = notifier.copies
        notifier.answered = self.answered
        self.dispatch = dispatch
        cl = ctx.config.cluster
        # Rule 1: the Notifications of copies waiting for their clients (None once taken) ...
        self._waiting: Recent[_Kept | None] = Recent(cl.event_ttl, cl.dedup_max, ctx.stats, name="group_copies")
        # ... those of copies failed here, and those of them whose owner is gone (rule 2).
        self._failed: Recent[_Kept] = Recent(cl.event_ttl, cl.dedup_max, ctx.stats, name="group_copies_failed")
        self._gone: dict[str, _Kept] = {}
        self._ends: dict[int, int] = {}  # node -> how many of its runs ended
        # Failed answers to copies whose Notification is being handled (rule 1:
        # an orphan fails within it): event id -> owners.
        self.pending: dict[str, set[int]] = {}

    def keeps(self, event_id: str) -> bool:
        """Whether ``event_id``'s Notification is kept here (status, tests)."""
        return self._waiting.get(event_id) is not None or self._failed.get(event_id) is not None

    def arrived(self, src: int, msg: pm.Notification, out: list[Action]) -> None:
        """Rule 1: ``msg``, an unkeyed event's Notification from ``src``, was
        handled: kept if a group copy of it waits for its client here, or one
        failed meanwhile."""
        eid = msg.event_id
        owners = self.pending.pop(eid, None) if self.pending else None
        self.pending.clear()  # failures of other events, no Notification in hand: nothing to keep
        if owners is None and not self._waits(eid):
            return
        ended = self._ends.get(src, 0)
        k = self._waiting.get(eid) or self._failed.get(eid)
        if k is None:
            k = _Kept(msg, src, ended)
        else:  # the copy came again (re-sent, or by the channel's next owner): its latest sender
            k.msg, k.src, k.ended = msg, src, ended
        self._waiting.put(eid, k, self._ctx.now)
        for owner in owners or ():
            self._fail(k, owner, out)

    def answered(self, owner: int, ack: pm.NotificationAck, out: list[Action]) -> None:
        """A copy's answer went to ``owner`` (another node): a taken one is
        forgotten, a failed one kept on (rule 1), sent again if ``owner`` is
        gone (rule 2)."""
        eid = ack.event_id
        k = self._waiting.get(eid)
        if not ack.failed:
            if k is not None and not self._waits(eid, ack.sub_ids):
                self._waiting.put(eid, None, self._ctx.now)  # its client took it: the group has it
            return
        k = k or self._failed.get(eid)
        if k is None:  # an orphan of the Notification being handled (or no longer kept)
            self.pending.setdefault(eid, set()).add(owner)
        else:
            self._fail(k, owner, out)

    def _waits(self, event_id: str, answered: tuple[str, ...] = ()) -> bool:
        """Whether a group copy of ``event_id`` waits for its client here
        (but those of ``answered``, whose answer is on its way)."""
        copies = self._copies.of(event_id)
        return copies is not None and any(
            c.acked is None and c.group and gid not in answered for gid, c in copies.items()
        )

    def _fail(self, k: _Kept, owner: int, out: list[Action]) -> None:
        k.failed.add(owner)
        eid = k.msg.event_id
        self._failed.put(eid, k, self._ctx.now)
        # The run that sent the copy ended since (a restart: its new run knows
        # nothing of it), or the owner is dead: the answer is lost with it.
        if owner in self._ctx.unreachable or (owner == k.src and self._ends.get(owner, 0) != k.ended):
            self._gone[eid] = k
            self.resend(out)

    def owner_gone(self, node: int, out: list[Action]) -> None:
        """Rule 2: ``node`` was declared dead or restarted: the copies failed
        back to it go again once their channels have live owners."""
        self._ends[node] = self._ends.get(node, 0) + 1
        for eid, k in self._failed.items():
            if node in k.failed:
                self._gone[eid] = k

    def resend(self, out: list[Action]) -> None:
        """Rule 2: every failed copy whose owner is gone, to its channel's
        current owner if that one lives; the others wait for the next call."""
        ctx = self._ctx
        routing, unreachable = ctx.routing, ctx.unreachable
        for eid, k in list(self._gone.items()):
            if self._failed.get(eid) is not k:  # past its time
                del self._gone[eid]
                continue
            msg = k.msg
            chid = routing.lookup_event(msg.event_exp)
            entry = routing.get(chid) if chid is not None else None
            if entry is None or any(o in unreachable for o in entry.owners):
                continue  # no live owner named yet: the recovery's update will
            del self._gone[eid]
            k.failed.clear()
            ctx.stats["group_copies_resent"] += 1
            ev = pm.Event(
                eid,
                msg.event_exp,
                msg.origin,
                pm.DispatchSign.EVENT_DISPATCHED,
                chid,
                msg.publish_time,
                payload=msg.payload,
            )
            self.dispatch(ev, out)
