"""One writer per connection (``overlay.net.node`` rule 4, STYLE habit 6).

Rules:

1. A connection's frames wait in one bounded ``TwoLevelQueue``; one task per
   connection takes them, high first, at most ``MAX_BATCH`` at a time, and
   writes each batch with ``writelines`` then ``drain``.  Nothing else
   writes to the connection while that task runs.
2. A client connection's writer ends quietly when the connection fails
   (``OSError``): it closes the connection, and the read loop cleans up.
   Raising would end the node's TaskGroup.
3. ``flush`` waits — on an event the writer sets once its queue is empty and
   written, not by polling — until what is queued went out, or the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final, NoReturn

from overlay.net.queues import TwoLevelQueue

__all__ = ["MAX_BATCH", "ConnectionWriter", "write_batches"]

# Frames per writelines(): enough to amortise the system call, small enough
# that one batch does not hold the loop for long.
MAX_BATCH: Final = 512


async def write_batches(
    queue: TwoLevelQueue[bytes], writer: asyncio.StreamWriter, idle: asyncio.Event | None = None
) -> NoReturn:
    """Rule 1 until the connection fails (the ``OSError`` propagates) or the
    task is cancelled; ``idle`` is set whenever a batch emptied the queue."""
    while True:
        await queue.wait()
        writer.writelines(queue.drain(MAX_BATCH))
        await writer.drain()
        if idle is not None and not len(queue):
            idle.set()


class ConnectionWriter:
    """The writing half of one client connection (rules 1–3).

    Invariant: ``queue`` holds only encoded frames for ``writer``, and only
    ``run`` (or ``close``) takes them out.
    """

    def __init__(self, writer: asyncio.StreamWriter, maxsize: int) -> None:
        self.writer = writer
        self.queue: TwoLevelQueue[bytes] = TwoLevelQueue(maxsize)
        self._idle = asyncio.Event()

    async def run(self) -> None:
        try:
            await write_batches(self.queue, self.writer, self._idle)
        except OSError:
            self.writer.close()  # rule 2

    async def flush(self, timeout: float) -> None:
        """Rule 3."""
        if not len(self.queue):
            return
        self._idle.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()

    def close(self) -> None:
        """Close after what is queued (e.g. the fatal Error just sent): the
        transport writes its buffer out before it closes."""
        self.writer.writelines(self.queue.drain(len(self.queue)))
        self.writer.close()
