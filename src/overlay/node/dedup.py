"""The event ids a subscribers' access node delivered lately (SPEC §16: duplicates are removed by event id).

An access node re-sends an event it accepted until the event is confirmed
(``node.outbox``), so an owner may match it twice — the first copy's
confirmation was lost with a dying node, or is only late — and a publisher
whose connection dropped sends its un-acknowledged publish again under the
same id.  The subscribers' access node drops the second copy here.

Rules this module keeps (``node.notify`` applies them):

1. ``seen(event_id, now)`` is True when ``event_id`` was recorded within the
   last ``window`` seconds (the caller drops that copy); otherwise it
   records it and is False.  O(1) per call: a set for the lookup, and two
   parallel deques (ids, times) in the order they came — no tuple allocated
   per event.
2. Ids are forgotten in the order they came: those older than ``window``
   as new ones arrive, and the oldest one first whenever ``limit`` ids are
   held.  An id forgotten by the bound before its window ran out could be
   delivered twice: counted (``dedup_evicted_early``), the bound being sized
   for the window at the node's peak rate.
3. ``SeenEvents`` takes the plain subscriptions' copies of unkeyed events
   (the hot path: one id, no outcome).  A *tracked* copy — every copy of a
   keyed event, a group instance's of any event — goes through
   ``Recent``: per event id the subscriptions this node notified and how
   each delivery ended, so a second copy (a key's new home released it
   again, a re-sent event's group copy came back to the same instance) is
   not delivered again but answered as the first was (``node.notify``).
   And a keyed copy is not delivered to a subscription that got a higher
   rank of its key lately (``RankMarks``): a late copy released again.
4. ``Recent`` keeps a value per id for ``window`` seconds, at most
   ``limit`` ids, forgotten in the order they came, as rule 2 (counted
   ``<name>_evicted_early``); ``node.keyhome`` keeps the event ids a home
   sequenced in one, ``node.groups`` the owner's group choices.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Copy", "RankMarks", "Recent", "SeenEvents", "TrackedCopies"]

V = TypeVar("V")


class SeenEvents:
    """Rules 1 and 2.  Invariant: ``_ids`` holds each id of ``_set`` once,
    oldest first, and ``_at`` the time each one was recorded."""

    __slots__ = ("_at", "_ids", "_last", "_set", "_stats", "limit", "window")

    def __init__(self, window: float, limit: int, stats: Counter[str] | None = None) -> None:
        if window <= 0 or limit < 1:
            raise ValueError(f"a dedup window must be positive and its bound at least 1 (got {window}, {limit})")
        self.window = window
        self.limit = limit
        self._set: set[str] = set()
        self._ids: deque[str] = deque()
        self._at: deque[float] = deque()
        self._stats: Counter[str] = stats if stats is not None else Counter()
        self._last = ""  # the id the last call recorded ("": it recorded none), for unsee

    def __len__(self) -> int:
        return len(self._set)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._set

    def seen(self, event_id: str, now: float) -> bool:
        """Rule 1: True for a copy of an id recorded lately; else record it."""
        held = self._set
        n = len(held)
        held.add(event_id)  # one probe of the table, not a lookup and then an add
        if len(held) == n:
            self._last = ""
            return True
        self._last = event_id
        self._ids.append(event_id)
        at = self._at
        at.append(now)
        if at[0] <= now - self.window or n >= self.limit:
            self._forget(now)
        return False

    def unsee(self, event_id: str, now: float) -> None:
        """Undo the last ``seen`` if it recorded ``event_id``, at ``now``
        (``node.outbox`` rule 6: the handling that called it failed): its
        next copy is delivered.  An id recorded by an earlier copy, which
        was delivered, stays."""
        ids = self._ids
        if self._last != event_id or not ids or ids[-1] != event_id or self._at[-1] != now:
            return
        self._last = ""
        self._set.discard(event_id)
        ids.pop()
        self._at.pop()

    def _forget(self, now: float) -> None:
        """Rule 2: the ids past the window, then the oldest ones past the bound."""
        ids, at, held = self._ids, self._at, self._set
        cutoff = now - self.window
        while at and at[0] <= cutoff:
            at.popleft()
            held.discard(ids.popleft())
        while len(held) > self.limit:
            at.popleft()
            held.discard(ids.popleft())
            self._stats["dedup_evicted_early"] += 1

    def expire(self, now: float) -> None:
        """Forget what is past the window without recording anything (a quiet node's tick)."""
        if self._at and self._at[0] <= now - self.window:
            self._forget(now)


class Recent(Generic[V]):
    """Rule 4.  Invariant: ``_ids`` holds each id of ``_values`` once, oldest
    first, and ``_at`` when each one was first put."""

    __slots__ = ("_at", "_ids", "_name", "_stats", "_values", "limit", "window")

    def __init__(self, window: float, limit: int, stats: Counter[str] | None = None, *, name: str = "recent") -> None:
        if window <= 0 or limit < 1:
            raise ValueError(f"a window must be positive and its bound at least 1 (got {window}, {limit})")
        self.window = window
        self.limit = limit
        self._values: dict[str, V] = {}
        self._ids: deque[str] = deque()
        self._at: deque[float] = deque()
        self._stats: Counter[str] = stats if stats is not None else Counter()
        self._name = name

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def get(self, key: str) -> V | None:
        return self._values.get(key)

    def put(self, key: str, value: V, now: float) -> None:
        """Set ``key``'s value; a new key starts its window now (a known one keeps its place)."""
        values = self._values
        if key not in values:
            self._ids.append(key)
            self._at.append(now)
        values[key] = value
        if self._at[0] <= now - self.window or len(values) > self.limit:
            self.expire(now)

    def expire(self, now: float) -> None:
        """Forget what is past the window, then the oldest past the bound."""
        ids, at, values = self._ids, self._at, self._values
        cutoff = now - self.window
        while at and at[0] <= cutoff:
            at.popleft()
            values.pop(ids.popleft(), None)
        while len(values) > self.limit:
            at.popleft()
            values.pop(ids.popleft(), None)
            self._stats[f"{self._name}_evicted_early"] += 1

    def items(self) -> list[tuple[str, V]]:
        return list(self._values.items())


class Copy:
    """One tracked copy this node delivered (rule 3): how it ended (``None``
    while its client has not answered, then True: taken, False: not), who
    sent it, and the other owners waiting for that outcome."""

    __slots__ = ("acked", "also", "chid", "group", "lf", "owner")

    def __init__(self, owner: int, chid: object, group: str) -> None:
        self.acked: bool | None = None
        self.owner = owner
        self.chid = chid
        self.group = group
        self.lf = 0.0
        self.also: list[int] | None = None


class TrackedCopies:
    """Rule 3: per event id, the tracked copies (by subscription id) this node
    delivered lately, for ``window`` seconds, at most ``limit`` events."""

    __slots__ = ("_recent",)

    def __init__(self, window: float, limit: int, stats: Counter[str] | None = None) -> None:
        self._recent: Recent[dict[str, Copy]] = Recent(window, limit, stats, name="tracked_copies")

    def __len__(self) -> int:
        return len(self._recent)

    def of(self, event_id: str) -> dict[str, Copy] | None:
        return self._recent.get(event_id)

    def delivered(self, event_id: str, gid: str, owner: int, chid: object, group: str, now: float) -> None:
        """A first copy of ``event_id`` for ``gid`` went to its client."""
        copies = self._recent.get(event_id)
        if copies is None:
            copies = {}
            self._recent.put(event_id, copies, now)
        copies[gid] = Copy(owner, chid, group)

    def waited_on(self, event_id: str, gids: tuple[str, ...]) -> bool:
        """Another owner waits for one of these copies' outcome."""
        copies = self._recent.get(event_id)
        return copies is not None and any((c := copies.get(g)) is not None and c.also for g in gids)

    def resolved(self, event_id: str, gid: str, acked: bool, lf: float = 0.0) -> list[int]:
        """``gid``'s client answered; the other owners that wait for it.  A copy
        not taken is forgotten: a later one is delivered (it never reached
        the application)."""
        copies = self._recent.get(event_id)
        c = copies.get(gid) if copies is not None else None
        if c is None or copies is None:
            return []
        also = c.also or []
        if acked:
            c.acked, c.lf, c.also = True, lf, None
        else:
            del copies[gid]
        return also

    def group_choices(
        self, owner: int, chid: object, gone: Callable[[object], bool] = lambda c: False
    ) -> list[tuple[str, str, str, bool]]:
        """``(event id, group, sub id, taken)`` of the group copies ``owner`` sent
        for channel ``chid`` — or for a channel that is ``gone`` (split or merged
        since: its events now belong to whichever channel took its space) — that
        were not given back (``node.groups`` rule 9)."""
        return [
            (eid, c.group, gid, bool(c.acked))
            for eid, copies in self._recent.items()
            for gid, c in copies.items()
            if c.group and c.owner == owner and (c.chid == chid or gone(c.chid))
        ]

    def expire(self, now: float) -> None:
        self._recent.expire(now)


class RankMarks:
    """Rule 5: per (subscription, key), the highest rank this node delivered,
    for ``window`` seconds, at most ``limit`` pairs.  A keyed copy at or below
    it is a late one (its home sent it again after the next ranks went out):
    delivering it would break the key's order, and it is not owed (the
    subscription had it, or did not exist when it was first matched)."""

    __slots__ = ("_recent",)

    def __init__(self, window: float, limit: int, stats: Counter[str] | None = None) -> None:
        self._recent: Recent[int] = Recent(window, limit, stats, name="rank_marks")

    def stale(self, gid: str, key: str, rank: int) -> bool:
        mark = self._recent.get(f"{gid}\x1f{key}")
        return mark is not None and rank <= mark

    def delivered(self, gid: str, key: str, rank: int, now: float) -> None:
        k = f"{gid}\x1f{key}"
        mark = self._recent.get(k)
        if mark is None or rank > mark:
            self._recent.put(k, rank, now)

    def expire(self, now: float) -> None:
        self._recent.expire(now)
