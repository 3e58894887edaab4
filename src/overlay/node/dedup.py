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
3. Only the deliveries the caller names go through here: plain
   subscriptions' copies of unkeyed events.  A group instance's copy is
   tracked by its owner (``node.groups``) and a keyed event by its sequencer
   (``node.ordering``): their re-deliveries are theirs to judge.
"""

from __future__ import annotations

from collections import Counter, deque

__all__ = ["SeenEvents"]


class SeenEvents:
    """Rules 1 and 2.  Invariant: ``_ids`` holds each id of ``_set`` once,
    oldest first, and ``_at`` the time each one was recorded."""

    __slots__ = ("_at", "_ids", "_set", "_stats", "limit", "window")

    def __init__(self, window: float, limit: int, stats: Counter[str] | None = None) -> None:
        if window <= 0 or limit < 1:
            raise ValueError(f"a dedup window must be positive and its bound at least 1 (got {window}, {limit})")
        self.window = window
        self.limit = limit
        self._set: set[str] = set()
        self._ids: deque[str] = deque()
        self._at: deque[float] = deque()
        self._stats: Counter[str] = stats if stats is not None else Counter()

    def __len__(self) -> int:
        return len(self._set)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._set

    def seen(self, event_id: str, now: float) -> bool:
        """Rule 1: True for a copy of an id recorded lately; else record it."""
        if event_id in self._set:
            return True
        self._set.add(event_id)
        self._ids.append(event_id)
        at = self._at
        at.append(now)
        if at[0] <= now - self.window or len(self._set) > self.limit:
            self._forget(now)
        return False

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
