"""Tracked notifications at the subscribers' access node, waiting for their acks (SPEC §10, §11).

Rules (``overlay.node.notify`` applies them):

1. A tracked Notify (every notification of a keyed event; a group
   instance's notification of any event) carries a *tag*, unique on this
   node, and the client answers it once: ``Ack(tag)`` when every listed
   subscription took it, ``Ack(tag, declined)`` when it did not hand it to
   the application (queue full, subscription closed, revoked).  A group
   instance's copy travels alone in its Notify, so its answer is about it
   alone.
2. **Fencing a group delivery.**  An instance that has not answered within
   ``ack_timeout`` is asked to give the copy back (``Revoke(tag)``) instead
   of being failed at once: the first of its two possible answers decides —
   an Ack (it handed the copy over before the Revoke reached it) is a
   delivery, a decline frees the event for another instance.  Only then
   does the owner re-dispatch, so an event never reaches two instances.  A
   client that answers neither within another ``ack_timeout`` is
   disconnected: its client library drops the group copies it held when the
   connection goes, and the delivery fails over.  (The client also never
   hands over a group copy older than ``ack_timeout``: it declines it.)
3. A plain subscriber's copy of a keyed event is never revoked (it is not
   re-dispatched): no answer within ``ack_timeout`` fails it, which only
   lets the key move on (``ordered_delivery_failed``).
4. Deadlines come in the order they are set (now + a fixed wait), so they
   sit in two parallel deques — no tuple allocated per event — and an entry
   whose deadline moved (a Revoke) is found by its stored deadline.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

__all__ = ["Awaited", "AwaitedAcks"]


class Awaited:
    """One tracked Notify (rule 1)."""

    __slots__ = ("deadline", "event_id", "gids", "group", "owner", "revoking", "sid")

    def __init__(
        self, sid: int, event_id: str, owner: int, gids: tuple[str, ...], group: bool, deadline: float
    ) -> None:
        self.sid = sid
        self.event_id = event_id
        self.owner = owner  # the node that matched the event and waits for the outcome
        self.gids = gids  # the global ids of the subscriptions it notified
        self.group = group  # a group instance's copy: fenced (rule 2)
        self.deadline = deadline
        self.revoking = False


class AwaitedAcks:
    """The tracked Notifies of one access node, by tag (rules 1, 4)."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self._by_tag: dict[int, Awaited] = {}
        self._at: deque[float] = deque()
        self._tags: deque[int] = deque()
        self._next = 0

    def __len__(self) -> int:
        return len(self._by_tag)

    def add(self, sid: int, event_id: str, owner: int, gids: tuple[str, ...], *, group: bool, now: float) -> int:
        self._next += 1
        tag = self._next
        deadline = now + self.wait
        self._by_tag[tag] = Awaited(sid, event_id, owner, gids, group, deadline)
        self._at.append(deadline)
        self._tags.append(tag)
        return tag

    def get(self, tag: int, sid: int) -> Awaited | None:
        """The entry of ``tag`` if session ``sid`` owns it (a tag is answered by its session only)."""
        a = self._by_tag.get(tag)
        return a if a is not None and a.sid == sid else None

    def pop(self, tag: int, sid: int) -> Awaited | None:
        a = self.get(tag, sid)
        if a is not None:
            del self._by_tag[tag]
        return a

    def revoking(self, tag: int, now: float) -> None:
        """Rule 2: the Revoke went out; the client has another ``wait`` to answer."""
        a = self._by_tag[tag]
        a.revoking = True
        a.deadline = now + self.wait
        self._at.append(a.deadline)
        self._tags.append(tag)

    def expired(self, now: float) -> Iterator[tuple[int, Awaited]]:
        """Entries whose deadline passed, oldest first; each stays until popped
        or moved on (``revoking``) by the caller."""
        at, tags = self._at, self._tags
        while at and at[0] <= now:
            deadline, tag = at.popleft(), tags.popleft()
            a = self._by_tag.get(tag)
            if a is not None and a.deadline == deadline:
                yield tag, a

    def sessions(self) -> set[int]:
        return {a.sid for a in self._by_tag.values()}

    def of_session(self, sid: int) -> list[tuple[int, Awaited]]:
        return [(t, a) for t, a in self._by_tag.items() if a.sid == sid]

    def remove(self, tag: int) -> None:
        self._by_tag.pop(tag, None)
