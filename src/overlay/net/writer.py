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
5. A client connection's writer keeps its session's ``Account`` of the
   node's queue budget (``overlay.limits.budget`` rules 1–2): a batch's
   bytes leave it once ``drain`` returned, and the time the writer waits in
   ``drain`` — its client not reading — is what the slow-consumer policy
   measures.
6. Closing never waits on the client for ever: ``close`` writes what is
   queued and closes, and aborts a connection whose client has not taken
   what the transport holds within ``linger`` seconds; ``cut`` drops what
   is queued, writes only its last words (the slow consumer's Error) and
   resets the connection after ``linger`` (``reset``), so an unread buffer
   is released, the kernel's included.
7. Closing never raises: a transport already gone (a reset, an abort, a
   TLS transport whose protocol is dropped) answers nothing, and that is
   taken as nothing left to do (``GONE``) — an error escaping a connection's
   last steps would end the node's TaskGroup.
8. Over TLS a batch is joined into one write: uvloop's TLS transport makes
   one ``SSL_write`` — one TLS record, a call into OpenSSL, 22 bytes of
   header and tag — per item of ``writelines``, which for frames of ~150
   bytes cost a fifth to a quarter of a node's deliveries/s
   (``bench/throughput.py --secure``: 21–26 % below plain TCP; 1–5 %
   joined).  Plain TCP keeps ``writelines`` (one ``writev``, no copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Iterable
from typing import Final, NoReturn

from overlay.limits.budget import Account, QueueBudget
from overlay.net.queues import TwoLevelQueue

__all__ = ["LINGER", "MAX_BATCH", "ConnectionWriter", "write_batches", "write_frames"]

# Frames per writelines(): enough to amortise the system call, small enough
# that one batch does not hold the loop for long.
MAX_BATCH: Final = 512
# Rule 6: seconds a closed connection's last bytes may take to be read.
LINGER: Final = 2.0
# SO_LINGER on, 0 s: closing sends a reset and drops the socket's buffers.
RESET_LINGER: Final = struct.pack("ii", 1, 0)
# Rule 7: what a transport that is gone raises when asked anything — an
# OSError, uvloop's RuntimeError ("the handler is closed"), and the standard
# loop's TLS transport an AttributeError (its protocol already dropped).
GONE: Final = (OSError, RuntimeError, AttributeError)


def write_frames(writer: asyncio.StreamWriter, frames: Iterable[bytes]) -> None:
    """``writer.writelines(frames)`` — over TLS, the frames joined first (rule
    8); a connection closed under it raises ``ConnectionResetError`` (rule 4),
    whatever the event loop."""
    try:
        if writer.get_extra_info("ssl_object") is None:
            writer.writelines(frames)
        else:
            writer.write(b"".join(frames))
    except (RuntimeError, AttributeError) as exc:  # AttributeError: a TLS transport closed twice (rule 7)
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
    """The writing half of one client connection (rules 1–3, 5, 6).

    Invariant: ``queue`` holds only encoded frames for ``writer``, and only
    ``run`` (or ``close``/``cut``) takes them out; with a budget,
    ``account`` holds the bytes of what is queued plus the batch being
    written until its drain returned."""

    def __init__(
        self, writer: asyncio.StreamWriter, maxsize: int, *, budget: QueueBudget | None = None, sid: int = 0
    ) -> None:
        self.writer = writer
        self.queue: TwoLevelQueue[bytes] = TwoLevelQueue(maxsize)
        self._idle = asyncio.Event()
        self.budget = budget
        self.account: Account = budget.open(sid) if budget is not None else Account(sid)
        self._abort: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        try:
            if self.budget is None:
                await write_batches(self.queue, self.writer, self._idle)
            else:
                await self._run_accounted(self.budget)
        except OSError:
            self.writer.close()  # rule 2

    async def _run_accounted(self, budget: QueueBudget) -> NoReturn:
        """Rule 1 with rule 5's accounting."""
        queue, writer, account, clock = self.queue, self.writer, self.account, time.monotonic
        while True:
            await queue.wait()
            batch = queue.drain(MAX_BATCH)
            size = sum(map(len, batch))
            write_frames(writer, batch)
            budget.waiting(account, clock())
            try:
                await writer.drain()
            finally:
                budget.moving(account)
            budget.sent(account, size, len(batch))
            if not len(queue):
                self._idle.set()

    async def flush(self, timeout: float) -> None:
        """Rule 3."""
        if not len(self.queue):
            return
        self._idle.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()

    def close(self, linger: float = LINGER) -> None:
        """Close after what is queued (e.g. the fatal Error just sent): the
        transport writes its buffer out before it closes; a connection that
        closed already loses nothing more (rule 4); one whose client does not
        read it within ``linger`` is aborted (rule 6)."""
        with contextlib.suppress(ConnectionResetError):
            write_frames(self.writer, self.queue.drain(len(self.queue)))
        self.shut(linger)

    def cut(self, last: bytes, linger: float = LINGER) -> list[bytes]:
        """Rule 6: drop what is queued, write ``last`` after what the
        connection holds, stop reading it, and reset it after ``linger``
        seconds — the client gets ``last`` if it reads by then; either way
        nothing of it stays in memory, here or in the kernel's socket buffer
        (a plain close would leave what the client never reads there, for
        minutes).  The frames dropped."""
        dropped = self.queue.drain(len(self.queue))
        with contextlib.suppress(ConnectionResetError):
            write_frames(self.writer, [last])
        # A stream's transport reads too (typed as a WriteTransport only here).
        pause = getattr(self.writer.transport, "pause_reading", None)
        with contextlib.suppress(*GONE):  # closing already: the reset below still ends it
            if pause is not None:
                pause()
        if self._abort is None:
            self._abort = asyncio.get_running_loop().call_later(linger, self.reset)
        return dropped

    def reset(self) -> None:
        """End the connection now, discarding what it holds (``SO_LINGER`` 0: a reset)."""
        with contextlib.suppress(*GONE):
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_LINGER)
        with contextlib.suppress(*GONE):
            self.writer.transport.abort()

    def shut(self, linger: float = LINGER) -> None:
        """Close the connection; abort it if its client has not read what the
        transport still holds within ``linger`` (rule 6).  A timer, not a
        task: it outlives nothing but that transport, for ``linger`` at most."""
        self.writer.close()
        if self._abort is None and self._buffered():
            self._abort = asyncio.get_running_loop().call_later(linger, self.reset)

    def _buffered(self) -> int:
        """Bytes the transport still holds; 0 once it is gone (rule 7)."""
        try:
            return self.writer.transport.get_write_buffer_size()
        except GONE:
            return 0
