"""A node's outbound link to one peer (``overlay.net.node`` rules 2, 9 and 10).

Rules:

1. One ``PeerLink`` per peer, sending on its own outbound connection (FIFO,
   high before normal), reconnecting with exponential backoff between
   ``BACKOFF_MIN`` and ``BACKOFF_MAX``.  It never reads what the peer sends on
   it, but EOF: the peer closed it.
2. The link opens with a hello each way: ours on connect, the peer's answer
   before anything queued goes out (``net.node`` rule 9).  The answer's
   incarnation goes to ``answered``, which discards what was queued for the
   peer's previous run when it restarted.  ``connect`` comes first: the
   TCP connection, TLS, and proof that the peer is the node dialled
   (``net.admission`` rule 5).  Connect and hello not done within the peer
   timeout, a hello answered by another node or cluster, or a link refused
   — by either side — is a failed connect.  A refusal this node makes goes
   to ``refused`` (counted); the first of an outage is logged at WARNING.
3. While the link is down, ``send`` keeps the queue's bound: past it a frame
   is dropped (``Sent.DROPPED``), the outage's drops are logged once.  While
   it is up, a full queue is backpressure: the frame waits past the bound
   (``Sent.OVERFLOW``).  The node counts both.
4. The link reports each change of its state to ``changed(peer, up)`` —
   also every failed connect, as down — and ``overdue`` tells the node's
   ticker, once per outage, that the peer has been away past the timeout.
5. The link knows its node only through those callbacks and the numbers it
   is built with: no reference to the ``Node``.
6. Nothing is lost with a connection while both runs live: every frame
   written stays in ``unacked`` until the peer's ``LinkAck`` (written back
   on the same connection, every ``ACK_EVERY`` frames or ``ACK_SECONDS``)
   counts it.  On reconnect the peer's answering hello says how many frames
   of this run it has (``received``); the ones after are sent again first,
   in order, so the peer sees each frame once.  When the peer restarted,
   what was meant for its previous run goes (``discard``).  Past
   ``queue_size`` unacknowledged frames the oldest are given up, counted
   (``frames_unconfirmed_dropped``) — the peer is not reading.
7. While the link is up, the hot path's normal-queue messages
   (``messages.peer.BATCHED``: events, notifications, their acks and
   receipts, (un)subscriptions and their answers) are not a frame each: ``send``
   collects them, and ``flush`` — a loop turn later, when the dispatcher
   gives the loop back (``net.dispatch`` rule 1), or at ``BATCH_ITEMS``
   messages — encodes them as one ``Batch`` frame (one message alone: its
   own frame), split in two until each part fits the frame cap.  Order is
   kept: a normal message that is not batched flushes the batch before it
   is queued, and a Batch's messages are handed to the peer's node in
   order (``net.node`` rule 3).  High messages are never batched nor held.
   While the link is down every message is a frame of its own, so the
   bound of rule 3 counts messages there as before; while it is up the
   queue and ``unacked`` count frames of at most ``BATCH_ITEMS`` messages
   and ``max_frame`` bytes each.  A message too large for a frame (the core
   checks payloads, so a bug) is logged and counted (``oversize``), and
   the rest of its batch goes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

from overlay.config import NodeConfig
from overlay.errors import LocalProtocolError, PeerRefused, RemoteProtocolError
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, encode, encode_frame, peer_reader
from overlay.net.inbox import READ_CHUNK
from overlay.net.queues import TwoLevelQueue
from overlay.net.writer import MAX_BATCH, write_frames
from overlay.security import Refusal

__all__ = [
    "ACK_EVERY",
    "ACK_SECONDS",
    "BACKOFF_MAX",
    "BACKOFF_MIN",
    "BATCH_ITEMS",
    "PEER_MAGIC",
    "PeerClosed",
    "PeerLink",
    "Sent",
]

log = logging.getLogger("overlay.net")

PEER_MAGIC: Final = b"OVP1"
BACKOFF_MIN: Final = 0.05
BACKOFF_MAX: Final = 2.0
# Rule 6: the receiving end acknowledges after this many frames, or this
# many seconds after the first unacknowledged one (whichever comes first).
ACK_EVERY: Final = 256
ACK_SECONDS: Final = 0.05
# Rule 7: messages per Batch frame at most.  Enough that a dispatcher slice's
# events to one peer share a frame (each frame costs both ends an encode, a
# decode, a queue entry and a piece of a write, which for a ~250-byte event
# was most of its cost on the link), few enough that one frame is a small
# share of the receiver's inbox and of what a reconnect sends again.
BATCH_ITEMS: Final = 128
_BATCHED: Final = pm.BATCHED
assert not _BATCHED & pm.HIGH  # send() batches before it asks which queue (messages.peer rule 3)


class Sent(enum.Enum):
    """What ``PeerLink.send`` did with a frame (rule 3)."""

    QUEUED = "queued"
    OVERFLOW = "overflow"  # queued past the bound: the link is up, the peer slow
    DROPPED = "dropped"  # the link is down and its queue full


class PeerClosed(ConnectionResetError):
    """The peer closed our link in order (EOF): it stopped or restarts."""


Connect = Callable[[NodeConfig], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class PeerLink:
    """The outbound link to ``peer`` (rules 1–5).

    Invariant: ``connected`` is set exactly while a connection whose hello
    was answered is pumping; ``down_since`` is None exactly then.
    """

    def __init__(
        self,
        node_id: int,
        peer: NodeConfig,
        *,
        queue_size: int,
        max_frame: int,
        hello_timeout: float,
        hello: Callable[[], pm.PeerHello],
        answered: Callable[[int, int], None],
        changed: Callable[[int, bool], None],
        connect: Connect,
        refused: Callable[[PeerRefused], None],
    ) -> None:
        self.node_id = node_id
        self.peer = peer
        self.max_frame = max_frame
        self.hello_timeout = hello_timeout
        self._hello = hello
        self._answered = answered
        self._changed = changed
        self._connect = connect
        self._refused = refused
        self._refusal = ""  # the last refusal logged (rule 2: once per outage and reason)
        self.queue: TwoLevelQueue[bytes] = TwoLevelQueue(queue_size)
        self.connected = asyncio.Event()
        self.connects = 0
        self.down_since: float | None = time.time()  # None while connected
        self.reported_down = False
        self.dropped = 0  # frames dropped during the current outage (rule 3)
        # Rule 6: frames written and not yet acknowledged, and how many of
        # this peer run's frames it acknowledged.
        self.unacked: deque[bytes] = deque()
        self.acked = 0
        self.resent = 0  # frames sent again after a reconnect
        self.given_up = 0  # unacknowledged frames dropped past the bound
        self._pending: list[pm.PeerMessage] = []  # frames read behind the peer's hello
        self._frames = peer_reader(self.max_frame)
        self._transport: asyncio.BaseTransport | None = None
        self._batch: list[pm.PeerMessage] = []  # rule 7: sent, not yet a frame
        self._flush_due = False  # a flush is scheduled for the next loop turn
        self.batches = 0  # Batch frames queued (rule 7)
        self.oversize = 0  # messages too large for a frame, dropped (rule 7)

    @property
    def name(self) -> str:
        return f"link-{self.node_id}->{self.peer.id}"

    @property
    def backlog(self) -> int:
        """Frames queued and messages waiting for their batch's frame (rule 7)."""
        return len(self.queue) + len(self._batch)

    def send(self, msg: pm.PeerMessage) -> Sent:
        """Rules 3 and 7."""
        if type(msg) in _BATCHED and self.connected.is_set():  # normal-queue types (asserted at import)
            batch = self._batch
            batch.append(msg)
            if len(batch) >= BATCH_ITEMS:
                self.flush()
            elif not self._flush_due:
                self._flush_due = True
                asyncio.get_running_loop().call_soon(self.flush)
            return Sent.OVERFLOW if self.queue.full(False) else Sent.QUEUED
        high = pm.is_high(msg)
        if self._batch and not high:
            self.flush()  # rule 7: what was batched before it goes before it
        frame = encode_frame(msg, self.max_frame)
        if self.queue.put_nowait(frame, high):
            return Sent.QUEUED
        if not self.connected.is_set():
            if not self.dropped:
                log.warning(
                    "node %d: link to node %d is down and its queue is full (%d): dropping frames for it",
                    self.node_id,
                    self.peer.id,
                    self.queue.maxsize,
                )
            self.dropped += 1
            return Sent.DROPPED
        self.queue.put_force(frame, high)
        return Sent.OVERFLOW

    def flush(self) -> None:
        """Rule 7: the messages batched so far, queued as Batch frames."""
        self._flush_due = False
        batch = self._batch
        if not batch:
            return
        self._batch = []
        queue = self.queue
        for frame in self._frames_of(batch):
            # Room was judged per message in send(): a full queue is the
            # backpressure it reported (OVERFLOW), and a link gone down since
            # overshoots its bound by this one batch at most.
            if not queue.put_nowait(frame, False):
                queue.put_force(frame, False)

    def _frames_of(self, msgs: list[pm.PeerMessage]) -> list[bytes]:
        """Rule 7: ``msgs`` in as few frames under the cap as halving finds."""
        if len(msgs) == 1:
            try:
                return [encode_frame(msgs[0], self.max_frame)]
            except LocalProtocolError as exc:
                self.oversize += 1
                log.error("node %d: a message for node %d dropped: %s", self.node_id, self.peer.id, exc)
                return []
        body = encode(pm.Batch(tuple(msgs)))  # type: ignore[arg-type]  # only BATCHED types reach here
        if len(body) <= self.max_frame:
            self.batches += 1
            return [HEADER.pack(len(body)) + body]
        half = len(msgs) // 2
        return self._frames_of(msgs[:half]) + self._frames_of(msgs[half:])

    def discard(self) -> int:
        """Drop what is queued, batched or unacknowledged (it was meant for
        the peer's previous run); how many frames (a batch's messages each)."""
        self.dropped = 0
        n = len(self.unacked) + len(self._batch)
        self._batch.clear()
        self.unacked.clear()
        self.acked = 0
        return self.queue.clear() + n

    def abort(self) -> None:
        """Drop the connection at once, unwritten bytes and all, as a broken
        network does (tests of rule 6); the link reconnects."""
        if self._transport is not None and self.connected.is_set():
            self._transport.abort()  # type: ignore[attr-defined]

    def _ack(self, received: int) -> None:
        """Rule 6: the peer has ``received`` frames of this run."""
        n = received - self.acked
        if n <= 0:
            return
        unacked = self.unacked
        for _ in range(min(n, len(unacked))):
            unacked.popleft()
        self.acked = received

    def _resume(self, received: int) -> None:
        """Rule 6 on reconnect: what the peer did not get goes first."""
        self._ack(received)
        if self.unacked:
            frames = list(self.unacked)
            self.unacked.clear()
            self.resent += len(frames)
            self.queue.requeue_front(frames)
            log.info(
                "node %d: link to node %d: %d frames the broken connection may have lost are sent again",
                self.node_id,
                self.peer.id,
                len(frames),
            )

    def overdue(self, now: float, limit: float) -> bool:
        """Rule 4: True once per outage, when a peer that was connected once has been away past ``limit``."""
        if self.down_since is None or self.reported_down or not self.connects or now - self.down_since <= limit:
            return False
        self.reported_down = True
        return True

    def back(self) -> bool:
        """The link is up again: whether the peer had been reported away (rule 4)."""
        was, self.reported_down = self.reported_down, False
        return was

    async def _handshake(self, reader: asyncio.StreamReader) -> None:
        """Rule 2: the peer's answering hello, before anything queued goes out."""
        frames = self._frames = peer_reader(self.max_frame)  # the connection's one reader: _watch_close goes on with it
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionResetError("peer closed the link during the hello")
            msgs = frames.feed(data)
            if msgs:
                hello = msgs[0]
                if isinstance(hello, pm.PeerError):
                    raise PeerRefused(
                        hello.code, f"node {self.peer.id} refused the link: {hello.message}", by_peer=True
                    )
                if not isinstance(hello, pm.PeerHello) or hello.node_id != self.peer.id:
                    raise RemoteProtocolError(f"node {self.peer.id} answered the hello with {hello!r}")
                if hello.cluster != self._hello().cluster:
                    raise PeerRefused(
                        Refusal.WRONG_CLUSTER, f"node {self.peer.id} belongs to cluster {hello.cluster!r}, not ours"
                    )
                self._answered(self.peer.id, hello.incarnation)  # may discard (a new run)
                self._resume(hello.received)
                self._pending = msgs[1:]  # acks behind the hello in the same read
                return

    async def run(self) -> None:
        """Rule 1, until cancelled (by the node's TaskGroup)."""
        backoff = BACKOFF_MIN
        peer = self.peer
        while True:
            writer: asyncio.StreamWriter | None = None
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel
                # that meets the hello failing, and the link never stopped.
                async with asyncio.timeout(self.hello_timeout):
                    reader, writer = await self._connect(peer)
                    write_frames(writer, [encode_frame(self._hello())])
                    await self._handshake(reader)
            except PeerRefused as exc:
                self._refusal_seen(exc)
            except ssl.SSLCertVerificationError as exc:
                detail = f"node {peer.id} at {peer.host}:{peer.port}: {exc.verify_message or exc}"
                self._refusal_seen(PeerRefused(Refusal.BAD_CERTIFICATE, detail))
            except (TimeoutError, OSError, RemoteProtocolError) as exc:
                log.log(
                    logging.INFO if writer is not None else logging.DEBUG,  # a refused TCP connect is routine
                    "node %d: peer %d did not answer the link's hello (%s); retry in %.2fs",
                    self.node_id,
                    peer.id,
                    str(exc) or type(exc).__name__,
                    backoff,
                )
            else:
                backoff = BACKOFF_MIN
                self._refusal = ""
                await self._serve(reader, writer)
                continue
            if writer is not None:
                writer.close()
            self._changed(peer.id, False)  # key homes (node.ordering)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _refusal_seen(self, exc: PeerRefused) -> None:
        """Rule 2: counted when this node refused; logged once per outage and reason."""
        if not exc.by_peer:
            self._refused(exc)
        text = str(exc)
        level = logging.WARNING if text != self._refusal else logging.DEBUG
        self._refusal = text
        log.log(level, "node %d: link to node %d refused: %s", self.node_id, self.peer.id, text)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection whose hello was answered, until it fails."""
        peer = self.peer
        self._transport = writer.transport
        self._up()
        try:
            self._changed(peer.id, True)
            log.info("node %d: link to peer %d up", self.node_id, peer.id)
            await self._pump(reader, writer)
        except PeerClosed:  # an orderly close (the peer stopped): not a fault
            log.info("node %d: peer %d closed its link", self.node_id, peer.id)
        except OSError as exc:
            log.warning("node %d: link to peer %d lost: %s", self.node_id, peer.id, exc)
        finally:
            self.connected.clear()
            self.down_since = time.time()
            writer.close()
            self._changed(peer.id, False)

    def _up(self) -> None:
        self.connects += 1
        self.down_since = None
        if self.dropped:
            log.warning(
                "node %d: %d frames for peer %d were dropped while its link was down (queue bound %d)",
                self.node_id,
                self.dropped,
                self.peer.id,
                self.queue.maxsize,
            )
            self.dropped = 0
        self.connected.set()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Write what is queued until the link fails, and raise what ended it.
        Its two halves are tasks of this call: whichever ends first ends the
        other, and both are awaited, so nothing outlives the link — also when
        the node stops it.  (Not a TaskGroup: Python 3.11's can turn a cancel
        that meets a child's error into that error alone, and the link would
        go on reconnecting through the node's stop.)"""
        name = self.name
        halves = (
            asyncio.create_task(self._watch_close(reader), name=f"{name}-watch"),
            asyncio.create_task(self._write(writer), name=f"{name}-write"),
        )
        try:
            done, _ = await asyncio.wait(halves, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for half in halves:
                half.cancel()
            await asyncio.wait(halves)
        errors = [exc for half in done if not half.cancelled() and (exc := half.exception()) is not None]
        # Both halves may end in one turn (over TLS the writer's drain then
        # fails with "Connection lost" as the reader sees EOF): an orderly
        # close is what happened.
        for exc in errors:
            if isinstance(exc, PeerClosed):
                raise exc
        if errors:
            raise errors[0]
        raise ConnectionResetError("link ended")  # neither half returns otherwise

    async def _write(self, writer: asyncio.StreamWriter) -> None:
        """Write what is queued, high first, in batches; keep it until acknowledged (rule 6)."""
        queue, unacked, bound = self.queue, self.unacked, self.queue.maxsize
        while True:
            await queue.wait()
            batch = queue.drain(MAX_BATCH)
            unacked.extend(batch)
            if len(unacked) > bound:
                over = len(unacked) - bound
                for _ in range(over):
                    unacked.popleft()
                self.acked += over
                self.given_up += over
            write_frames(writer, batch)  # a reset connection: OSError (net.writer rule 4)
            await writer.drain()

    async def _watch_close(self, reader: asyncio.StreamReader) -> None:
        # The peer writes only acknowledgements on our outbound link; EOF
        # means it went away.
        frames = self._frames
        for msg in self._pending:
            if type(msg) is pm.LinkAck:
                self._ack(msg.received)
        self._pending = []
        while data := await reader.read(READ_CHUNK):
            for msg in frames.feed(data):
                if type(msg) is pm.LinkAck:
                    self._ack(msg.received)
        raise PeerClosed("peer closed the link")
