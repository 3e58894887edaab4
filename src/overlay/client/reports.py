"""Errors waiting to be handed to the application's error callback (sans-IO).

Some errors belong to no call of the application: a notification dropped
because a subscription's queue was full, the access node dropping
notifications for the connection, a node's unsolicited Error, a subscription
the node did not take back after a reconnect.  They are kept here until the
client's reporter task hands them to the callback (``overlay.client.callbacks``).

Rules:

1. One ``SlowConsumerError`` per subscription is pending at a time: drops
   while it is pending add to its ``dropped`` count (a burst of drops is one
   report, not one per notification, and a slow callback is not flooded).
   ``queued``/``limit``/``event_id`` describe the first drop of the report.
2. Other errors are kept in arrival order, at most ``MAX_PENDING_ERRORS``:
   past that the oldest is discarded and counted in ``discarded``.
3. ``take`` returns every pending error in arrival order and empties the list.

Invariant: ``_slow`` holds exactly the subscriptions with a pending report in
``_pending``.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from overlay.errors import OverlayError, SlowConsumerError

__all__ = ["MAX_PENDING_ERRORS", "ErrorReports"]

# Errors other than drops that wait for the callback: far more than a
# callback that keeps up ever sees pending; a bound so one that hangs cannot
# make the client grow without limit.
MAX_PENDING_ERRORS: Final = 1_000


class _Drops:
    """A pending slow-consumer report of one subscription (rule 1)."""

    __slots__ = ("dropped", "event_id", "limit", "queued", "subscriber")

    def __init__(self, subscriber: str, queued: int, limit: int, event_id: str) -> None:
        self.subscriber = subscriber
        self.queued = queued
        self.limit = limit
        self.event_id = event_id
        self.dropped = 0

    def error(self) -> SlowConsumerError:
        return SlowConsumerError(self.subscriber, self.queued, self.limit, dropped=self.dropped, event_id=self.event_id)


class ErrorReports:
    """Rules 1–3."""

    def __init__(self) -> None:
        self._pending: deque[_Drops | OverlayError] = deque()
        self._slow: dict[str, _Drops] = {}
        self._others = 0  # entries of _pending that are not _Drops
        self.discarded = 0  # rule 2
        self.dropped = 0  # notifications dropped in all, reported or not

    def __len__(self) -> int:
        return len(self._pending)

    def slow_consumer(self, subscriber: str, queued: int, limit: int, event_id: str) -> None:
        """Rule 1: ``subscriber`` dropped one notification (``event_id``), its queue holding ``queued`` of ``limit``."""
        self.dropped += 1
        drops = self._slow.get(subscriber)
        if drops is None:
            drops = self._slow[subscriber] = _Drops(subscriber, queued, limit, event_id)
            self._pending.append(drops)
        drops.dropped += 1

    def add(self, error: OverlayError) -> None:
        """Rule 2."""
        if self._others >= MAX_PENDING_ERRORS:
            for i, item in enumerate(self._pending):
                if not isinstance(item, _Drops):
                    del self._pending[i]
                    self._others -= 1
                    self.discarded += 1
                    break
        self._pending.append(error)
        self._others += 1

    def take(self) -> list[OverlayError]:
        """Rule 3."""
        out = [item.error() if isinstance(item, _Drops) else item for item in self._pending]
        self._pending.clear()
        self._slow.clear()
        self._others = 0
        return out
