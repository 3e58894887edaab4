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
4. A connection that closed under a write is an ``OSError``
   (``ConnectionResetError``), as its callers expect: uvloop raises
   ``RuntimeError`` ("the handler is closed") when a write meets a transport
   the peer reset before the reading side noticed — one escaping a writer
   ended the node's TaskGroup, and with it the node (a peer killed with
   SIGKILL took a survivor down).  Every write of the shell — these
   writers, the peer links, the hellos, acks and errors — goes through
   ``write_frames``.
5. Over TLS a batch is joined into one write: uvloop's TLS transport makes
   one ``SSL_write`` — one TLS record, a call into OpenSSL, 22 bytes of
   header and tag — per item of ``writelines``, which for frames of ~150
   bytes cost a fifth to a quarter of a node's deliveries/s
   (``bench/throughput.py --secure``: 21–26 % below plain TCP; 1–5 %
   joined).  Plain TCP keeps ``writelines`` (one ``writev``, no copy).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Final, NoReturn

from overlay.net.queues import TwoLevelQueue

__all__ = ["MAX_BATCH", "ConnectionWriter", "write_batches", "write_frames"]

# Frames per writelines(): enough to amortise the system call, small enough
# that one batch does not hold the loop for long.
MAX_BATCH: Final = 512


def write_frames(writer: asyncio.StreamWriter, frames: Iterable[bytes]) -> None:
    """``writer.writelines(frames)`` — over TLS, the frames joined first (rule
    5); a connection closed under it raises ``ConnectionResetError`` (rule 4),
    whatever the event loop."""
    try:
        if writer.get_extra_info("ssl_object") is None:
            writer.writelines(frames)
        else:
            writer.write(b"".join(frames))
    except RuntimeError as exc:
        if not writer.is_closing():
            raise
        raise ConnectionResetError(f"the connection closed under a write ({exc})") from exc


async def write_batches(
    queue: TwoLevelQueue[bytes], writer: asyncio.StreamWriter, idle: asyncio.Event | None = None
) -> NoReturn:
    """Rule 1 until the connection fails (the ``OSError`` propagates) or the
    task is cancelled; ``idle`` is set whenever a batch emptied the queue."""
    while True:
        await queue.wait()
        write_frames(writer, queue.drain(MAX_BATCH))
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
        transport writes its buffer out before it closes; a connection that
        closed already loses nothing more (rule 4)."""
        with contextlib.suppress(ConnectionResetError):
            write_frames(self.writer, self.queue.drain(len(self.queue)))
        self.writer.close()
