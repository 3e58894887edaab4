"""The application's error callback, and the task that calls it (as nats.py's ``error_cb``).

Errors that belong to no call of the application — a ``SlowConsumerError``
when notifications are dropped because it does not keep up, a node's
unsolicited Error, a subscription lost after a reconnect — are kept in an
``ErrorReports`` (``overlay.client.reports``: slow-consumer drops coalesced
per subscription) and handed to the callback, in order, by one reporter
task: the reader never waits on the callback, and a slow callback sees
fewer, larger reports rather than a growing backlog.  Without a callback
each error is logged (WARNING), which is also what happens to an exception
the callback raises (ERROR, with the traceback).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from overlay.client.reports import ErrorReports
from overlay.errors import OverlayError

__all__ = ["ErrorCallback", "ErrorReporter"]

log = logging.getLogger("overlay.client")

# ``error_cb(error)``: a plain function or a coroutine function.
ErrorCallback = Callable[[OverlayError], Awaitable[None] | None]


class ErrorReporter:
    """Hands pending errors to ``callback`` from one task (``run``).

    Invariant: every error added before ``stop()`` is passed to the callback
    (or logged) once, in the order ``ErrorReports`` keeps — unless the
    client's ``close()`` cancels ``run`` first."""

    def __init__(self, callback: ErrorCallback | None, owner: str) -> None:
        self.callback = callback
        self.owner = owner
        self.reports = ErrorReports()
        self.reported = 0  # errors passed on so far
        self._wake = asyncio.Event()
        self._stopped = False

    def add(self, error: OverlayError) -> None:
        self.reports.add(error)
        self._wake.set()

    def slow_consumer(self, subscriber: str, queued: int, limit: int, event_id: str) -> None:
        self.reports.slow_consumer(subscriber, queued, limit, event_id)
        self._wake.set()

    def stop(self) -> None:
        """``run`` returns once it has reported what is pending."""
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for error in self.reports.take():
                await self._report(error)
            if self._stopped:
                return

    async def _report(self, error: OverlayError) -> None:
        self.reported += 1
        if self.callback is None:
            log.warning("%s: %s", self.owner, error)
            return
        try:
            result = self.callback(error)
            if inspect.isawaitable(result):
                await result
        except Exception:  # the application's bug: say so, keep reporting
            log.exception("%s: the error callback raised on %r", self.owner, error)
