"""Bounded two-level (high/normal) queues for the asyncio layer (SPEC §1.1).

Rules:
1. ``get``/``drain`` always take from the high level before the normal one;
   within a level, order is FIFO.
2. Each level is bounded.  ``put`` waits for room (backpressure);
   ``put_nowait`` returns False when full and changes nothing, so the caller
   decides — and counts — what happens instead.  Nothing is dropped here.
3. Cheap on the hot path: a put sets the wake-up event only when the queue
   was empty (``_awake`` mirrors it: every set and clear goes through this
   class), and ``drain`` takes a whole level in one copy when it fits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["TwoLevelQueue"]

T = TypeVar("T")


class TwoLevelQueue(Generic[T]):
    """Invariant: ``len(high) <= maxsize`` and ``len(normal) <= maxsize``."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.high: deque[T] = deque()
        self.normal: deque[T] = deque()
        self._nonempty = asyncio.Event()
        self._awake = False  # rule 3: whether _nonempty is set
        # One event per level: a put waits for room on its own level only, so a
        # full normal level never holds back a high put (and vice versa).
        self._room = {True: asyncio.Event(), False: asyncio.Event()}
        self._room[True].set()
        self._room[False].set()

    def __len__(self) -> int:
        return len(self.high) + len(self.normal)

    def full(self, high: bool) -> bool:
        return len(self.high if high else self.normal) >= self.maxsize

    def put_nowait(self, item: T, high: bool) -> bool:
        q = self.high if high else self.normal
        if len(q) >= self.maxsize:
            self._room[high].clear()
            return False
        q.append(item)
        if not self._awake:  # rule 3
            self._awake = True
            self._nonempty.set()
        return True

    def put_force(self, item: T, high: bool) -> None:
        """Enqueue past the bound: only for the few control frames whose loss
        would wedge a protocol (the caller bounds how many it sends)."""
        (self.high if high else self.normal).append(item)
        if not self._awake:  # rule 3
            self._awake = True
            self._nonempty.set()

    async def put(self, item: T, high: bool) -> None:
        while not self.put_nowait(item, high):
            await self._room[high].wait()

    def _taken(self) -> None:
        if not self.high and not self.normal:
            self._awake = False
            self._nonempty.clear()
        if len(self.high) < self.maxsize:
            self._room[True].set()
        if len(self.normal) < self.maxsize:
            self._room[False].set()

    async def get(self) -> tuple[T, bool]:
        """The next item and whether it was high priority (rule 1)."""
        while not self.high and not self.normal:
            await self._nonempty.wait()
        if self.high:
            item, high = self.high.popleft(), True
        else:
            item, high = self.normal.popleft(), False
        self._taken()
        return item, high

    async def wait(self) -> None:
        while not self.high and not self.normal:
            await self._nonempty.wait()

    def requeue_front(self, items: list[T]) -> None:
        """Put ``items`` back ahead of everything, in their order (frames a
        broken connection may have lost, sent again first: net.peer_link)."""
        if items:
            self.high.extendleft(reversed(items))
            self._awake = True
            self._nonempty.set()

    def clear(self) -> int:
        """Drop everything queued (frames for a peer's run that is over); how many."""
        n = len(self)
        self.high.clear()
        self.normal.clear()
        self._taken()
        return n

    def drain(self, limit: int) -> list[T]:
        """Up to ``limit`` items, high first (rule 1), without waiting."""
        hq, nq = self.high, self.normal
        out: list[T]
        if not hq and len(nq) <= limit:  # rule 3: the common case, in one copy
            out = list(nq)
            nq.clear()
            self._taken()
            return out
        out = []
        while hq and len(out) < limit:
            out.append(hq.popleft())
        while nq and len(out) < limit:
            out.append(nq.popleft())
        self._taken()
        return out
