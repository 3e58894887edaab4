"""One event's tracked notifications on its channel's owner (``overlay.node.groups``).

Rules this module keeps:

1. **What a delivery holds.**  The event, the channel it was matched on, the
   notifications not answered yet (subscription id → its access node), and
   per group the instance its copy is with, the matching instances and those
   tried.  A keyed event that matched no group shares one read-only empty
   mapping for the three group tables: the common ordered case allocates
   three dicts fewer.
2. **Travel** (``node.groups`` rule 10).  ``to_wire`` makes the record a
   moving channel's sender hands over; ``from_wire`` rebuilds it on the
   receiver against the channel as it is there: an instance no longer in the
   channel is no candidate (it was not tried), and a copy in flight stays in
   flight whoever it went to.
3. **One copy of a group in flight.**  ``in_flight(group)`` says whether
   a copy of ``group`` waits for its answer; ``merge`` adds another
   delivery's copies of the same event (a hand-over meeting a match of the
   receiver's own), keeping both copies in flight and the union of the
   instances tried, so that neither is replaced while the other may still be
   taken.  ``flying(group, …)`` names the access nodes those copies went to
   (a match again reports them, ``node.groups`` rule 8).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from overlay.channels.channel import Channel, ChannelId
from overlay.channels.subscriptions import Subscription
from overlay.messages import peer as pm

__all__ = ["Delivery", "channel_now", "handover_frames", "notification"]

# Rule 1: the group state of a delivery without groups: read-only and shared,
# so a write to it raises instead of leaking into every other delivery.
_NO_GROUPS: Final[Any] = MappingProxyType({})

# Rule 2: the most a GroupChoice takes encoded (three ids of up to 256 bytes),
# to cut a DeliveryHandover's choices into frames.
_CHOICE_BYTES: Final = 800
_encode = msgspec.msgpack.Encoder().encode


class Delivery:
    """Owner side: one event's tracked notifications (rule 1)."""

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

    def in_flight(self, group: str) -> bool:
        """Rule 3: a copy of ``group`` waits for its answer."""
        return group in self.gsub.values()

    def flying(self, group: str, senders: Container[str], nodes: list[int]) -> bool:
        """Rule 3: adds to ``nodes`` the access nodes ``group``'s copies are in
        flight to; True when one is a live sender's (an instance in ``senders``,
        ``node.groups`` rule 10), whose access node is not known here."""
        held = False
        for sid, g in self.gsub.items():
            if g == group:
                if sid in senders:
                    held = True
                elif (node := self.waiting.get(sid)) is not None:
                    nodes.append(node)
        return held

    def to_wire(self) -> pm.TrackedDelivery:
        """Rule 2: the record a moving channel's sender hands over."""
        gsub = self.gsub
        return pm.TrackedDelivery(
            self.ev,
            tuple(pm.CopyInFlight(sid, node, gsub.get(sid, "")) for sid, node in self.waiting.items()),
            tuple(
                pm.GroupTries(g, tuple(self.tried.get(g, ())), tuple(s.id for s in cands))
                for g, cands in self.cands.items()
            ),
        )

    @classmethod
    def from_wire(cls, rec: pm.TrackedDelivery, ch: Channel) -> Delivery:
        """Rule 2: ``rec`` on the receiver, whose channel ``ch`` it now belongs to."""
        groups = bool(rec.groups) or any(c.group for c in rec.waiting)
        d = cls(rec.event, ch.id, groups=groups)
        for c in rec.waiting:
            d.waiting[c.sub_id] = c.access_node
            if c.group:
                d.gsub[c.sub_id] = c.group
        for gt in rec.groups:
            d.tried[gt.group] = set(gt.tried)
            d.cands[gt.group] = [s for s in map(ch.get, gt.candidates) if s is not None]
        for sid, g in d.gsub.items():  # a copy in flight was tried, whatever the record says
            d.tried.setdefault(g, set()).add(sid)
            d.cands.setdefault(g, [])
        return d

    def merge(self, other: Delivery) -> None:
        """Rule 3: ``other``'s copies of the same event join these."""
        if self.gsub is _NO_GROUPS and (other.gsub or other.cands or other.tried):
            self.gsub, self.cands, self.tried = {}, {}, {}
        for sid, node in other.waiting.items():
            self.waiting.setdefault(sid, node)
        for sid, g in other.gsub.items():
            self.gsub.setdefault(sid, g)
        for g, tried in other.tried.items():
            self.tried.setdefault(g, set()).update(tried)
        for g, cands in other.cands.items():
            known = {s.id for s in self.cands.setdefault(g, [])}
            self.cands[g].extend(s for s in cands if s.id not in known)

    def by_node(self) -> dict[int, list[str]]:
        """The subscriptions waited for, grouped by their access node."""
        by_node: dict[int, list[str]] = {}
        for sid, node in self.waiting.items():
            by_node.setdefault(node, []).append(sid)
        return by_node


def handover_frames(
    session: int,
    chid: ChannelId,
    records: list[pm.TrackedDelivery],
    choices: tuple[pm.GroupChoice, ...],
    budget: int,
) -> list[pm.DeliveryHandover]:
    """Rule 2: channel ``chid``'s hand-over in frames of about ``budget`` bytes
    at most: the records first, then the choices; at least one frame, so the
    receiver learns the sender tracks nothing any more."""
    size = 0
    msgs: list[pm.DeliveryHandover] = []
    batch: list[pm.TrackedDelivery] = []
    for rec in records:
        n = len(_encode(rec))
        if batch and size + n > budget:
            msgs.append(pm.DeliveryHandover(session, chid, tuple(batch)))
            batch, size = [], 0
        batch.append(rec)
        size += n
    step = max(1, budget // _CHOICE_BYTES)
    for i in range(0, len(choices), step):
        msgs.append(pm.DeliveryHandover(session, chid, tuple(batch), choices[i : i + step]))
        batch = []
    if batch or not msgs:
        msgs.append(pm.DeliveryHandover(session, chid, tuple(batch)))
    return msgs


def channel_now(
    d: Delivery, local: Callable[[ChannelId], Channel | None], replaced: Mapping[ChannelId, tuple[ChannelId, ...]]
) -> Channel | None:
    """The channel here that ``d``'s event lies in now: the one it was matched
    on, or one that replaced it here (a split's child); None when neither is
    here (it moved on)."""
    todo, seen = [d.ch], set()
    while todo:
        chid = todo.pop()
        if chid in seen:
            continue
        seen.add(chid)
        ch = local(chid)
        if ch is not None:
            if chid == d.ch or ch.space.contains(d.ev.event_exp):
                return ch
            continue
        todo.extend(replaced.get(chid, ()))
    return None


def notification(msg: pm.Event, sub_ids: tuple[str, ...], chid: ChannelId, origin: int) -> pm.Notification:
    """The Notification of ``msg`` for ``sub_ids`` of one access node."""
    return pm.Notification(
        msg.event_id,
        msg.event_exp,
        sub_ids,
        chid,
        msg.publish_time,
        msg.key,
        msg.rank,
        msg.home,
        origin,
        payload=msg.payload,
    )
