"""A subscription of the routing agent, held on one or more access nodes at once
(``overlay.client.routing``, AgentClient rule 5).

Rules:

1. Every copy of a notification arriving through any home goes through
   ``_sink``: the first copy of an event id is queued for the application,
   a later one is acknowledged at once (``duplicates``) — as long as the id
   is among the last ``dedup`` ones queued (an LRU).
2. A copy that does not fit in the queue is dropped, declined to the node
   it came through, counted in ``dropped`` and reported to the agent's error
   callback as a ``SlowConsumerError``.  It is not remembered: another
   home's copy may still take its place.
3. Taking a notification claims it from the client it came through (a
   group copy the node took back is skipped, ``revoked``); the load factor
   on each Ack comes from this object's queue and processing times.
4. ``drain()``/``close()`` unsubscribe on every home, keeping or dropping
   what is queued.  When no access node takes the subscription any more
   (rule 6 of the agent) the iteration raises ``error`` once the queue is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Protocol

from overlay.client.connection import Client, Notification
from overlay.client.load_factor import LoadFactor, LoadFactorConfig
from overlay.client.subscription import Subscription, SubscriptionOwner
from overlay.errors import ConnectionLost, OverlayError, RequestError

__all__ = ["FailoverOwner", "FailoverSubscription"]

# The timeout of the unsubscribes of drain() and close(), on each home.
UNSUBSCRIBE_TIMEOUT: Final = 2.0


class FailoverOwner(Protocol):
    """What a failover subscription needs of its routing agent (``overlay.client.routing.AgentClient``)."""

    @property
    def clients(self) -> Sequence[Client]: ...

    def _slow_consumer(self, sub_id: str, queued: int, limit: int, event_id: str) -> None: ...

    def _ended(self, sub_id: str) -> None: ...


class FailoverSubscription:
    """One subscription held on one or more access nodes (rules 1–4).

    Invariant: an event id is queued for the application at most once while
    it is in the LRU ``_seen``; every copy received is acknowledged to the
    node it came through.  ``async for``/``async with``, ``drain()`` and
    ``close()`` as for ``Subscription``.
    """

    def __init__(
        self,
        owner: FailoverOwner,
        sub_id: str,
        expression: str,
        *,
        group: str,
        weight: float,
        queue_size: int,
        redundancy: int,
        dedup: int,
        load: LoadFactorConfig | None,
    ) -> None:
        self.owner = owner
        self.sub_id = sub_id
        self.expression = expression
        self.group = group
        self.weight = weight
        self.redundancy = 1 if group else redundancy
        self.maxsize = queue_size
        self.queue: asyncio.Queue[tuple[Notification, SubscriptionOwner] | None] = asyncio.Queue(queue_size)
        self.homes: dict[int, Subscription] = {}  # node index -> its per-connection subscription
        self.load = LoadFactor(load)
        self.closed = False
        self.received = 0  # distinct events queued
        self.duplicates = 0  # copies recognised and acked without delivery
        self.dropped = 0  # copies refused, the queue being full
        self.revoked = 0  # group copies the node gave another instance, never handed over
        self.failovers = 0  # homes lost
        # Set when no access node would take the subscription again (rule 4).
        self.error: OverlayError | None = None
        self.last_refusal = ""
        # A node refused it with no_quorum (AgentClient rule 6: the caller's subscribe waits then).
        self.quorum_refused = False
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._dedup = dedup
        self._handed_at: float | None = None
        # The agent places it under this lock (AgentClient rule 6): never two placements at once.
        self.placing = asyncio.Lock()

    def _sink(self, part: Subscription, note: Notification) -> None:
        """Rules 1, 2 (called by the reader of the client the copy came through)."""
        if self.closed:
            part.client._dropped(note)
            return
        seen = self._seen
        if note.event_id in seen:
            self.duplicates += 1
            seen.move_to_end(note.event_id)
            part.client._took(note, self.load_factor())
            return
        try:
            self.queue.put_nowait((note, part.client))
        except asyncio.QueueFull:
            self.dropped += 1
            part.client._dropped(note)
            self.owner._slow_consumer(self.sub_id, self.queue.qsize(), self.maxsize, note.event_id)
            return
        self.received += 1
        seen[note.event_id] = None
        if len(seen) > self._dedup:
            seen.popitem(last=False)

    def _end(self, error: OverlayError | None = None) -> None:
        """No more notifications; wake a consumer waiting on an empty queue."""
        self.closed = True
        self.error = self.error or error
        if not self.queue.full():
            self.queue.put_nowait(None)

    def __aiter__(self) -> FailoverSubscription:
        return self

    async def __anext__(self) -> Notification:
        self.done()
        while True:
            item = None if self.closed and self.queue.empty() else await self.queue.get()
            if item is None:
                if self.error is not None:
                    raise self.error
                raise StopAsyncIteration
            note, client = item
            if client._claim(note, self.load_factor()):  # a group copy may have been revoked
                self._handed_at = time.monotonic()
                return note
            self.revoked += 1

    async def next(self, timeout: float | None = None) -> Notification:
        return await asyncio.wait_for(self.__anext__(), timeout)

    def done(self) -> None:
        """The application finished the last notification (see ``Subscription.done``)."""
        if self._handed_at is not None:
            now = time.monotonic()
            self.load.processed(now - self._handed_at, now)
            self._handed_at = None

    def load_factor(self) -> float:
        budget = max((c.deliveries.window for c in self.owner.clients), default=0.0)
        return self.load.update(self.queue.qsize(), self.maxsize, time.monotonic(), budget)

    async def _unsubscribe_all(self) -> None:
        self.owner._ended(self.sub_id)
        homes, self.homes = self.homes, {}
        for i, part in homes.items():
            with contextlib.suppress(ConnectionLost, RequestError, TimeoutError, OSError):
                await self.owner.clients[i].unsubscribe(part.sub_id, timeout=UNSUBSCRIBE_TIMEOUT)

    async def drain(self) -> None:
        """Unsubscribe everywhere, then let queued notifications be consumed."""
        if not self.closed:
            self.closed = True
            await self._unsubscribe_all()
            self._end()

    async def close(self) -> None:
        """Unsubscribe everywhere and drop what is queued."""
        if not self.closed:
            self.closed = True
            while not self.queue.empty():
                item = self.queue.get_nowait()
                if item is not None:
                    item[1]._dropped(item[0])
            await self._unsubscribe_all()
            self._end()

    async def __aenter__(self) -> FailoverSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
