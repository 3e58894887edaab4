"""Which instance of a group each event went to lately, and who still tracks the copy.

The bookkeeping of ``overlay.node.groups`` rules 9 and 10, owned here so the
dispatch itself stays in one module of its own size.

Rules this module keeps (numbered as in ``overlay.node.groups``):

9. **Choices.**  Per event (at most ``dedup_max``, for ``event_ttl``): the
   channel it was matched on and, per group, the instance it went to and
   whether that instance's client took it.  A taken choice is never
   overwritten by one not taken of the same instance; a replacement instance
   overwrites.  ``of(chid)`` gives the choices of a channel and of the
   channels it replaced here (split or merged from), as a SubscriptionMove
   or a DeliveryHandover carries them.
10. **Senders.**  A receiver learns, with a moved channel's choices not taken,
   that the live sender still tracks those copies (``learn_senders``) until
   the sender's DeliveryHandover says it tracks none any more
   (``sender_done``), or the sender goes down after the choice was learned.
   ``sender_tracks`` says whether a failed copy is the sender's to replace.
   A copy the receiver leaves to the sender at match time (its instance gone
   here) is waited for (``wait_for_sender``) until the sender hands it over
   or keeps the channel (``release``) or goes down (``peer_down``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from overlay.channels.channel import ChannelId
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.dedup import Recent

__all__ = ["GroupChoices"]

# event id -> (its channel, {group: (instance, taken)})
Choice = tuple[ChannelId, dict[str, tuple[str, bool]]]


class GroupChoices:
    """Rules 9 and 10.  ``replaced`` names the channels that replaced deleted
    ones here (``node.groups`` rule 7)."""

    def __init__(self, ctx: NodeContext, replaced: Mapping[ChannelId, tuple[ChannelId, ...]]) -> None:
        self._ctx = ctx
        self._replaced = replaced
        cl = ctx.config.cluster
        self._chosen: Recent[Choice] = Recent(cl.event_ttl, cl.dedup_max, ctx.stats, name="group_choices")
        # "event id\x1fgroup" -> (the live sender that still tracks the copy, when learned).
        self._senders: Recent[tuple[int, float]] = Recent(cl.event_ttl, cl.dedup_max, ctx.stats, name="group_senders")
        self._down_at: dict[int, float] = {}  # node -> when it last went down
        # Copies this node's deliveries wait for from a live sender (rule 10):
        # event id -> {group: (instance, sender)}.
        self._waits: dict[str, dict[str, tuple[str, int]]] = {}

    def get(self, event_id: str) -> Choice | None:
        return self._chosen.get(event_id)

    def expire(self, now: float) -> None:
        self._chosen.expire(now)

    def remember(self, event_id: str, group: str, instance: str, chid: ChannelId, *, taken: bool = False) -> None:
        """``event_id`` of channel ``chid`` went to ``instance`` of ``group`` (``taken``: its client took it)."""
        entry = self._chosen.get(event_id)
        if entry is None:
            self._chosen.put(event_id, (chid, {group: (instance, taken)}), self._ctx.now)
            return
        choices = entry[1]
        if taken or choices.get(group, ("", False))[0] != instance:
            choices[group] = (instance, taken)

    def took(self, event_id: str, group: str, instance: str) -> bool:
        """Whether ``instance`` of ``group`` is known to have taken ``event_id``."""
        entry = self._chosen.get(event_id)
        return entry is not None and entry[1].get(group) == (instance, True)

    def learn(self, choices: Sequence[pm.GroupChoice], chid: ChannelId) -> None:
        """What another owner gave (a dead one, told by the instances' access
        nodes; one that moved the channel here)."""
        for c in choices:
            self.remember(c.event_id, c.group, c.sub_id, chid, taken=c.taken)
        self._ctx.stats["group_choices_learned"] += len(choices)

    def of(self, chid: ChannelId) -> tuple[pm.GroupChoice, ...]:
        """The choices made lately for events of channel ``chid``, or of the
        channels it was split or merged from here."""
        chans = self.lineage(chid)
        return tuple(
            pm.GroupChoice(eid, g, inst, taken)
            for eid, (ch, choices) in self._chosen.items()
            if ch in chans
            for g, (inst, taken) in choices.items()
        )

    def lineage(self, chid: ChannelId) -> set[ChannelId]:
        """``chid`` and the channels it replaced here, and theirs."""
        chans, todo = {chid}, [chid]
        while todo:
            c = todo.pop()
            for p in [p for p, heirs in self._replaced.items() if c in heirs and p not in chans]:
                chans.add(p)
                todo.append(p)
        return chans

    def learn_senders(self, choices: Sequence[pm.GroupChoice], sender: int) -> None:
        """Rule 10: ``sender``, alive, moved these choices here with its channel;
        it still tracks the copies not taken yet."""
        now = self._ctx.now
        for c in choices:
            if not c.taken:
                self._senders.put(f"{c.event_id}\x1f{c.group}", (sender, now), now)

    def sender_done(self, event_id: str, group: str) -> None:
        """Rule 10: the sender handed its copy of ``event_id`` for ``group`` over, or had none."""
        now = self._ctx.now
        self._senders.put(f"{event_id}\x1f{group}", (self._ctx.id, now), now)

    def peer_down(self, node: int, now: float) -> None:
        self._down_at[node] = now
        for eid, waits in list(self._waits.items()):  # its copies are this node's to replace now
            for g in [g for g, (_, sender) in waits.items() if sender == node]:
                del waits[g]
            if not waits:
                del self._waits[eid]

    def wait_for_sender(self, event_id: str, group: str, instance: str, sender: int) -> None:
        """Rule 10: this node's delivery of ``event_id`` waits for ``sender``'s copy to ``instance``."""
        self._waits.setdefault(event_id, {})[group] = (instance, sender)

    def waited_for(self, event_id: str) -> set[str]:
        """Rule 10: the instances of ``event_id`` whose copies a live sender still tracks."""
        waits = self._waits.get(event_id)
        if not waits:
            return set()
        return {i for g, (i, _) in waits.items() if self.tracker(event_id, g, i) is not None}

    def release(self, src: int, handed: Callable[[str], bool]) -> list[tuple[str, str, str]]:
        """Rule 10: ``src`` handed a channel over or kept it: the waits for its
        copies of the events ``handed`` names, or that it tracks no more, end.
        Returns them as (event id, group, instance)."""
        ended = []
        for eid, waits in list(self._waits.items()):
            for g, (inst, sender) in list(waits.items()):
                if sender == src and (handed(eid) or self.tracker(eid, g, inst) is None):
                    del waits[g]
                    ended.append((eid, g, inst))
            if not waits:
                del self._waits[eid]
        return ended

    def forget_waits(self, event_id: str) -> None:
        if self._waits:
            self._waits.pop(event_id, None)

    def sender_tracks(self, event_id: str, group: str, instance: str) -> bool:
        """Rule 10: a failed copy to ``instance`` is the live sender's to replace."""
        return self.tracker(event_id, group, instance) is not None

    def tracker(self, event_id: str, group: str, instance: str) -> int | None:
        """Rule 10: the live sender that still tracks the copy of ``event_id``
        to ``instance`` of ``group``, or None when that copy is this node's to decide."""
        if not len(self._senders):
            return None
        entry = self._senders.get(f"{event_id}\x1f{group}")
        if entry is None:
            return None
        sender, learned = entry
        if sender == self._ctx.id or self._down_at.get(sender, -1.0) >= learned:
            return None
        chosen = self._chosen.get(event_id)
        return sender if chosen is not None and chosen[1].get(group, ("", False))[0] == instance else None
