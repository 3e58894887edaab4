"""A subscription as the application sees it: an async iterator over a bounded queue.

Rules (Client rule 4; STYLE habits 7, 8):

1. A notification for this subscription is queued, or — the queue being
   full — dropped: counted in ``dropped``, declined to the node (a group's
   event then goes to another instance) and reported to the client's error
   callback as a ``SlowConsumerError``.  The reader never waits on the
   application.
2. Taking a notification (``async for``, ``next``) claims it from the
   deliveries component: a group copy the node took back is skipped
   (``revoked``).  The time from handing one over to asking for the next
   (or ``done()``) is its processing time, which with the queue's fill makes
   the load factor carried on the Ack (``overlay.client.load_factor``).
3. ``drain()`` unsubscribes and lets what is queued be consumed; ``close()``
   unsubscribes and drops it.  Either ends the iteration; so does the
   client's close, and the node not taking the subscription back after a
   reconnect — then the iteration raises ``error`` once the queue is empty.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from overlay.client.deliveries import Deliveries, Notification
from overlay.client.load_factor import LoadFactor, LoadFactorConfig
from overlay.errors import OverlayError

__all__ = ["Sink", "Subscription", "SubscriptionOwner"]


class SubscriptionOwner(Protocol):
    """What a subscription needs of its client (``overlay.client.connection.Client``)."""

    @property
    def deliveries(self) -> Deliveries: ...

    def _claim(self, note: Notification, lf: float) -> bool: ...

    def _took(self, note: Notification, lf: float) -> None: ...

    def _dropped(self, note: Notification) -> None: ...

    def _slow_consumer(self, sub_id: str, queued: int, limit: int, event_id: str) -> None: ...

    async def unsubscribe(self, sub_id: str, *, timeout: float = ...) -> None: ...


# Where an owner that routes a subscription's notifications itself
# (``overlay.client.routing``) takes them, instead of the queue.
Sink = Callable[["Subscription", Notification], None]


class Subscription:
    """Rules 1–3.  Use as ``async for note in sub`` or ``async with sub``.

    Invariant: ``received`` counts the notifications queued, ``dropped`` those
    refused because the queue was full; once ``closed`` nothing more is queued."""

    def __init__(
        self,
        client: SubscriptionOwner,
        sub_id: str,
        expression: str,
        maxsize: int,
        *,
        group: str = "",
        weight: float = 1.0,
        load: LoadFactorConfig | None = None,
    ) -> None:
        self.client = client
        self.sub_id = sub_id
        self.expression = expression
        self.group = group
        self.weight = weight
        self.maxsize = maxsize
        self.queue: asyncio.Queue[Notification | None] = asyncio.Queue(maxsize)
        self.dropped = 0
        self.received = 0
        self.revoked = 0  # group copies given back to the node, never handed over
        self.closed = False
        self.error: OverlayError | None = None  # why it ended, when it did not end by a call of ours
        self.load = LoadFactor(load)
        self._handed_at: float | None = None  # monotonic time the last note went to the application
        self.sink: Sink | None = None

    def _deliver(self, note: Notification) -> None:
        """Rule 1 (called by the client's reader)."""
        if self.sink is not None:
            self.sink(self, note)
            return
        try:
            self.queue.put_nowait(note)
            self.received += 1
        except asyncio.QueueFull:
            self.dropped += 1
            self.client._dropped(note)
            self.client._slow_consumer(self.sub_id, self.queue.qsize(), self.maxsize, note.event_id)

    def _end(self, error: OverlayError | None = None) -> None:
        """Rule 3: no more notifications; wake a consumer waiting on an empty queue."""
        self.closed = True
        self.error = self.error or error
        if not self.queue.full():
            self.queue.put_nowait(None)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Notification:
        self.done()
        while True:
            note = None if self.closed and self.queue.empty() else await self.queue.get()
            if note is None:
                if self.error is not None:
                    raise self.error
                raise StopAsyncIteration
            if self.client._claim(note, self.load_factor()):
                self._handed_at = time.monotonic()
                return note
            self.revoked += 1  # the node gave it to another group instance

    def done(self) -> None:
        """The application finished the last notification handed to it (rule 2).

        Optional: asking for the next notification implies it.  Calling it
        when nothing is being processed does nothing.
        """
        if self._handed_at is not None:
            now = time.monotonic()
            self.load.processed(now - self._handed_at, now)
            self._handed_at = None

    def load_factor(self) -> float:
        """The current LF (SPEC §11) from the queue's fill and recent processing
        times, against the node's ack window (``load_factor`` module docstring)."""
        return self.load.update(self.queue.qsize(), self.maxsize, time.monotonic(), self.client.deliveries.window)

    async def next(self, timeout: float | None = None) -> Notification:
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def drain(self) -> None:
        """Unsubscribe, then let queued notifications be consumed before iteration ends."""
        if not self.closed:
            self.closed = True
            await self.client.unsubscribe(self.sub_id)
            self._end()

    async def close(self) -> None:
        """Unsubscribe and drop what is queued."""
        if not self.closed:
            self.closed = True
            while not self.queue.empty():
                note = self.queue.get_nowait()
                if note is not None:
                    self.client._dropped(note)
            await self.client.unsubscribe(self.sub_id)
            self._end()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
