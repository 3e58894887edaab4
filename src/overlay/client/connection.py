"""The client library: publish, subscribe and operate, over one access-node connection.

Rules this module keeps (SPEC §4, §12; STYLE habits 6–8):

1. One connection at a time to one access node, chosen from the known list;
   one writer task coalesces frames; one reader task routes answers to the
   waiting request (by ``seq``) and notifications to their subscription.
2. Requests are retried, not failed, while the cluster is not ready and
   when a node answers Choke(delay): the client waits the delay (nothing is
   dropped) and sends again.
3. Subscriptions belong to the client.  After a lost connection the client
   reconnects (to the same or the next node, with backoff) and re-subscribes
   every open subscription before any new request goes out.
4. A ``Subscription`` is an async iterator with a bounded queue.  A Notify
   goes to every subscription it lists (``overlay.client.deliveries``), and
   once all of them took it one ``Ack`` goes back, carrying the highest of
   their load factors (SPEC §11, ``overlay.client.load_factor``)
   computed here from real use: the queue's fill against its capacity, and
   the processing time of each notification — from the moment it was handed
   to the application until the application asks for the next one, or calls
   ``Subscription.done()`` if it finishes earlier (time spent waiting on an
   empty queue is not processing).  When the queue is full
   further notifications are dropped and counted (``dropped``) — the reader
   never blocks on one slow consumer — and declined to the node (a group's
   event then goes to another instance).  A group instance's copy is handed
   over only while the node has not revoked it (``deliveries`` rules 2, 3).
   ``drain()`` lets queued notifications be consumed then unsubscribes;
   ``close()`` unsubscribes and drops them.
5. ``publish`` waits for its PubAck.  ``publish_windowed`` does not: it keeps
   at most ``window`` publishes unacknowledged (waiting for room past that,
   so a fast publisher is paced by the node) and ``flush()`` waits for all of
   them.  Every pipelined publish is kept until its PubAck: one answered
   Choke or not_ready is sent again after the delay (and after a Choke no new
   one goes out before the delay has passed), one lost with the
   connection is sent again after the reconnect (at least once, as for
   ``publish``, which retries too), and one the node rejects is
   counted in ``publish_errors`` and raised by the next ``flush()``.  Frames
   leave in call order; a publish re-sent after a Choke or a reconnect may
   reach the node after later ones.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from overlay.channels.schema import Value
from overlay.client.deliveries import Deliveries, Notification
from overlay.client.load_factor import LoadFactor, LoadFactorConfig
from overlay.errors import ConnectionLost, LocalProtocolError, NotReady, RemoteProtocolError, RequestError
from overlay.messages import client as cm
from overlay.messages.codec import DEFAULT_MAX_FRAME_SIZE, client_reader, encode_frame

__all__ = ["Client", "Notification", "Publisher", "Subscriber", "Subscription"]

log = logging.getLogger("overlay.client")

CLIENT_MAGIC: Final = b"OVC1"
DEFAULT_QUEUE: Final = 10_000
REQUEST_TIMEOUT: Final = 10.0
NOT_READY_RETRY: Final = 0.05
RECONNECT_MIN: Final = 0.05
RECONNECT_MAX: Final = 2.0
# Unacknowledged publish_windowed() calls before the caller waits: enough to
# keep a loopback link busy for a couple of round trips at 100k msgs/s, far
# below the node's choke threshold (8,000 by default) so a lone publisher is
# paced by PubAcks rather than by Chokes.
PUBLISH_WINDOW: Final = 1_000
# The protocol's bound on a sequence key (messages.client.Publish): checked
# here, as a frame over it would be a protocol error that closes the session.
MAX_KEY: Final = 256
# The id ``ping()`` unsubscribes: no subscription has it (a NUL is no one's
# choice of name), so the node answers unknown_subscription and changes nothing.
PING_SUB_ID: Final = "\x00ping"


# The longest wait a caller may ask for: a day (a NaN, an infinity or 1e308
# would wait forever, or not at all).
MAX_TIMEOUT: Final = 86_400.0


def check_timeout(timeout: float) -> float:
    """A timeout is a positive, finite number of seconds, at most ``MAX_TIMEOUT``."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise LocalProtocolError(f"a timeout is a number of seconds in (0, {MAX_TIMEOUT:g}], got {timeout!r}")
    return float(timeout)


def check_order(key: str, rank: int) -> None:
    """Refuse what the node's decoder would treat as a protocol error."""
    if len(key) > MAX_KEY:
        raise LocalProtocolError(f"a sequence key has at most {MAX_KEY} characters, got {len(key)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= cm.MAX_RANK:
        raise LocalProtocolError(
            f"a rank is an integer in [1, {cm.MAX_RANK}] (0: let the key's home assign one), got {rank!r}"
        )


class Subscription:
    """Rule 4. Use as ``async for note in sub`` or ``async with``."""

    def __init__(
        self,
        client: Client,
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
        self.load = LoadFactor(load)
        self._handed_at: float | None = None  # monotonic time the last note went to the application
        # Set by an owner that routes this subscription's notifications itself
        # (``overlay.client.routing``): called instead of queueing.
        self.sink: Any = None

    def _deliver(self, note: Notification) -> None:
        if self.sink is not None:
            self.sink(self, note)
            return
        try:
            self.queue.put_nowait(note)
            self.received += 1
        except asyncio.QueueFull:
            self.dropped += 1
            self.client._dropped(note)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Notification:
        self.done()
        while True:
            if self.closed and self.queue.empty():
                raise StopAsyncIteration
            note = await self.queue.get()
            if note is None:
                raise StopAsyncIteration
            if self.client._claim(note, self.load_factor()):
                self._handed_at = time.monotonic()
                return note
            self.revoked += 1  # the node gave it to another group instance

    def done(self) -> None:
        """The application finished the last notification handed to it (rule 4).

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
            if not self.queue.full():  # wake a consumer blocked on an empty queue
                self.queue.put_nowait(None)

    async def close(self) -> None:
        """Unsubscribe and drop what is queued."""
        if not self.closed:
            self.closed = True
            while not self.queue.empty():
                note = self.queue.get_nowait()
                if note is not None:
                    self.client._dropped(note)
            await self.client.unsubscribe(self.sub_id)
            self.queue.put_nowait(None)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Client:
    """A connection to the cluster through one access node at a time (rules 1–3)."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        client_id: str | None = None,
        reconnect: bool = True,
        max_frame: int = DEFAULT_MAX_FRAME_SIZE,
        token: str = "",
    ) -> None:
        """``token``: the cluster's admin token, for ``admin`` commands that
        change the cluster (split, place, drain) when the cluster has one."""
        if not addresses:
            raise ValueError("a client needs at least one access node address")
        self.token = token
        self.addresses = list(addresses)
        self.client_id = client_id or f"client-{os.getpid()}-{id(self):x}"
        self.reconnect = reconnect
        self.max_frame = max_frame
        self.node_id: int | None = None
        self.cluster = ""  # the cluster name the node gave in its Welcome
        self.ready = False
        self.subscriptions: dict[str, Subscription] = {}
        self.chokes = 0
        self._seq = itertools.count(1)
        self._sub_seq = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[cm.ClientMessage]] = {}
        self._out: deque[bytes] = deque()
        self._out_ready = asyncio.Event()
        self._connected = asyncio.Event()
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._writer: asyncio.StreamWriter | None = None
        self._addr_index = 0
        self._lost = asyncio.Event()
        # Rule 5: pipelined publishes by seq, until their PubAck.
        self._inflight: dict[int, cm.Publish] = {}
        self._window_room = asyncio.Event()
        self._window_room.set()
        self._all_acked = asyncio.Event()
        self._all_acked.set()
        self._publish_error: RequestError | None = None
        self._choked_until = 0.0  # loop time before which no new pipelined publish goes out
        self._conn_count = 0  # connections opened so far
        self.publish_errors = 0
        # Rule 4: each Notify until every subscription it lists took it.
        self.deliveries = Deliveries()
        # Called with this client each time its connection is lost (before any
        # reconnect): the routing agent moves subscriptions away from it.
        self.on_lost: list[Any] = []

    @property
    def connected(self) -> bool:
        return self._connected.is_set() and not self._closing

    # -- connection ----------------------------------------------------------------

    async def connect(self, timeout: float = 10.0) -> Client:
        await asyncio.wait_for(self._open(), timeout)
        self._tasks.append(asyncio.get_running_loop().create_task(self._supervise()))
        return self

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _open(self) -> None:
        delay = RECONNECT_MIN
        while True:
            host, port = self.addresses[self._addr_index % len(self.addresses)]
            try:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(self.client_id, 1, self.token), self.max_frame))
                magic = await reader.readexactly(4)
                if magic != CLIENT_MAGIC:
                    raise RemoteProtocolError(f"node at {host}:{port} answered with {magic!r}")
                frames = client_reader(self.max_frame)
                welcome = None
                while welcome is None:
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionResetError("closed during hello")
                    msgs = frames.feed(data)
                    if msgs:
                        welcome = msgs[0]
                        pending = msgs[1:]
                if isinstance(welcome, cm.Error):
                    raise RequestError(welcome.code, welcome.message)
                if not isinstance(welcome, cm.Welcome):
                    raise RemoteProtocolError(f"expected Welcome, got {type(welcome).__name__}")
                self.node_id = welcome.node_id
                self.cluster = welcome.cluster
                self.ready = welcome.ready
                self.deliveries.window = welcome.ack_timeout
                self._writer = writer
                loop = asyncio.get_running_loop()
                self._conn_tasks = [
                    loop.create_task(self._read(reader, frames, pending)),
                    loop.create_task(self._write(writer)),
                ]
                self._lost.clear()
                self._conn_count += 1
                self._connected.set()
                log.debug("%s: connected to node %d at %s:%d", self.client_id, welcome.node_id, host, port)
                return
            except (OSError, asyncio.IncompleteReadError, RemoteProtocolError) as exc:
                log.debug("%s: cannot use %s:%d: %s", self.client_id, host, port, exc)
                self._addr_index += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)

    async def _supervise(self) -> None:
        """Rule 3: reconnect and re-subscribe after a lost connection."""
        while not self._closing:
            await self._lost.wait()
            if self._closing:
                return
            self._connected.clear()
            self.deliveries.connection_lost(self._conn_count)  # its group copies are void (deliveries rule 3)
            for cb in list(self.on_lost):
                cb(self)
            for t in self._conn_tasks:
                t.cancel()
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionLost("connection to the access node lost"))
            self._waiting.clear()
            if not self.reconnect:
                return
            self._addr_index += 1
            await self._open()
            for sub in list(self.subscriptions.values()):
                if not sub.closed:
                    await self._request_retrying(
                        lambda seq, s=sub: cm.Subscribe(seq, s.sub_id, s.expression, s.group, s.weight)
                    )
            for msg in list(self._inflight.values()):  # rule 5: nothing pipelined is lost
                self._send(msg)

    async def close(self) -> None:
        self._closing = True
        self._lost.set()
        for t in getattr(self, "_conn_tasks", []):
            t.cancel()
        for t in self._tasks:
            t.cancel()
        if self._writer is not None:
            self._writer.close()
        for sub in self.subscriptions.values():
            sub.closed = True
            if not sub.queue.full():
                sub.queue.put_nowait(None)

    async def _read(self, reader: asyncio.StreamReader, frames: Any, pending: list[cm.ClientMessage]) -> None:
        try:
            for msg in pending:
                self._on_message(msg)
            while data := await reader.read(256 * 1024):
                for msg in frames.feed(data):
                    self._on_message(msg)
        except (OSError, RemoteProtocolError) as exc:
            log.debug("%s: read failed: %s", self.client_id, exc)
        finally:
            self._lost.set()

    async def _write(self, writer: asyncio.StreamWriter) -> None:
        out = self._out
        try:
            while True:
                while not out:
                    self._out_ready.clear()
                    await self._out_ready.wait()
                batch = [out.popleft() for _ in range(min(len(out), 512))]
                writer.writelines(batch)
                await writer.drain()
        except OSError:
            self._lost.set()

    def _send(self, msg: cm.ClientMessage) -> None:
        self._out.append(encode_frame(msg, self.max_frame))
        self._out_ready.set()

    def _on_message(self, msg: cm.ClientMessage) -> None:
        match msg:
            case cm.Notify():
                note = Notification(
                    msg.event_id, msg.event, msg.sub_ids, msg.publish_time, time.time(), msg.key, msg.rank, msg.tag
                )
                takers = [
                    s for s in map(self.subscriptions.get, dict.fromkeys(msg.sub_ids)) if s is not None and not s.closed
                ]
                group = bool(msg.tag) and any(s.group for s in takers)
                self._answer(
                    self.deliveries.arrived(note, len(takers), group=group, conn=self._conn_count, now=time.monotonic())
                )
                for sub in takers:  # every listed subscription gets it (rule 4)
                    sub._deliver(note)
            case cm.Revoke():
                self._answer(self.deliveries.revoke(msg.tag, msg.event_id))
            case cm.PubAck(seq=seq) if seq in self._inflight:
                self._window_acked(seq)
            case cm.Error(seq=seq) if seq in self._waiting:
                self._waiting.pop(seq).set_result(msg)
            case cm.Error(seq=seq) if seq in self._inflight:
                if msg.code == cm.ErrorCode.NOT_READY:
                    self._resend_later(seq, NOT_READY_RETRY)
                else:
                    self.publish_errors += 1
                    if self._publish_error is None:
                        self._publish_error = RequestError(msg.code, msg.message, msg.position)
                    self._window_acked(seq)
            case cm.Choke(seq=seq) if seq in self._inflight:
                self.chokes += 1
                # Back off as a whole, not only this frame: sending more before
                # the delay would only be choked in turn.
                loop = asyncio.get_running_loop()
                self._choked_until = max(self._choked_until, loop.time() + msg.delay)
                self._resend_later(seq, msg.delay)
            case cm.Error():
                log.warning("%s: node says %s: %s", self.client_id, msg.code, msg.message)
            case (
                cm.PubAck(seq=seq)
                | cm.SubAck(seq=seq)
                | cm.UnsubAck(seq=seq)
                | cm.Choke(seq=seq)
                | cm.AdminReply(seq=seq)
            ):
                fut = self._waiting.pop(seq, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            case _:
                log.debug("%s: ignoring %s", self.client_id, type(msg).__name__)

    def _window_acked(self, seq: int) -> None:
        del self._inflight[seq]
        self._window_room.set()
        if not self._inflight:
            self._all_acked.set()

    def _resend_later(self, seq: int, delay: float) -> None:
        conn = self._conn_count

        def resend() -> None:
            msg = self._inflight.get(seq)
            # On a new connection the reconnect has re-sent it already (rule 5).
            if msg is not None and conn == self._conn_count and self._connected.is_set() and not self._closing:
                self._send(msg)

        asyncio.get_running_loop().call_later(delay, resend)

    def _answer(self, ack: cm.Ack | None) -> None:
        if ack is not None and self._connected.is_set():
            self._send(ack)

    def _claim(self, note: Notification, lf: float) -> bool:
        """A subscription hands ``note`` to the application now, if it may (rule 4)."""
        ok, ack = self.deliveries.claim(note, lf, time.monotonic())
        self._answer(ack)
        return ok

    def _took(self, note: Notification, lf: float) -> None:
        """Taken, not handed over: the copy a failover subscription saw already."""
        self._answer(self.deliveries.took(note, lf))

    def _dropped(self, note: Notification) -> None:
        """Not taken: a full queue, or a subscription that closed."""
        self._answer(self.deliveries.dropped(note))

    # -- requests (rule 2) -----------------------------------------------------------------

    async def _request(self, make: Any, timeout: float) -> cm.ClientMessage:
        check_timeout(timeout)
        if self._closing:
            raise ConnectionLost("the client is closed")
        # The timeout covers the wait for a connection too: a request made
        # while the node is gone must not wait for it forever.
        async with asyncio.timeout(timeout):
            await self._connected.wait()
            seq = next(self._seq)
            fut: asyncio.Future[cm.ClientMessage] = asyncio.get_running_loop().create_future()
            self._waiting[seq] = fut
            self._send(make(seq))
            try:
                return await fut
            finally:
                self._waiting.pop(seq, None)

    async def _request_retrying(self, make: Any, timeout: float = REQUEST_TIMEOUT) -> cm.ClientMessage:
        check_timeout(timeout)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request timed out")
            try:
                reply = await self._request(make, left)
            except ConnectionLost:
                if not self.reconnect or self._closing:
                    raise
                continue
            if isinstance(reply, cm.Choke):
                self.chokes += 1
                await asyncio.sleep(reply.delay)
                continue
            if isinstance(reply, cm.Error):
                if reply.code == cm.ErrorCode.NOT_READY:
                    if time.monotonic() + NOT_READY_RETRY >= deadline:
                        raise NotReady(reply.message)
                    await asyncio.sleep(NOT_READY_RETRY)
                    continue
                raise RequestError(reply.code, reply.message, reply.position)
            return reply

    async def publish(
        self, event: str | dict[str, Value], *, key: str = "", rank: int = 0, timeout: float = REQUEST_TIMEOUT
    ) -> str:
        """Publish an event (an eventExp text or an ``{attr: value}`` map); returns its id.

        ``key`` (and optionally ``rank``) ask for ordered delivery (SPEC §10).
        """
        check_order(key, rank)
        now = time.time()
        reply = await self._request_retrying(lambda seq: cm.Publish(seq, event, now, key, rank), timeout)
        assert isinstance(reply, cm.PubAck)
        return reply.event_id

    async def publish_once(
        self, event: str | dict[str, Value], *, key: str = "", rank: int = 0, timeout: float = REQUEST_TIMEOUT
    ) -> cm.PubAck | cm.Choke:
        """One attempt, for a caller that handles Choke itself (the routing agent).

        Returns the PubAck or the Choke; raises ``RequestError`` (``NotReady``
        for not_ready) for a rejection, ``ConnectionLost`` if the connection
        goes, ``TimeoutError`` after ``timeout``.
        """
        check_order(key, rank)
        if not self._connected.is_set():
            raise ConnectionLost("not connected to the access node")
        now = time.time()
        reply = await self._request(lambda seq: cm.Publish(seq, event, now, key, rank), timeout)
        if isinstance(reply, cm.Error):
            if reply.code == cm.ErrorCode.NOT_READY:
                raise NotReady(reply.message)
            raise RequestError(reply.code, reply.message, reply.position)
        assert isinstance(reply, (cm.PubAck, cm.Choke))
        return reply

    async def publish_windowed(self, event: str | dict[str, Value], *, window: int = PUBLISH_WINDOW) -> None:
        """Publish without waiting for this event's PubAck (rule 5).

        Returns once the frame is queued; waits only while ``window`` earlier
        pipelined publishes are unacknowledged or the connection is down.  A
        rejection surfaces in ``publish_errors`` and from ``flush()``.
        """
        if window < 1:
            raise ValueError("window must be at least 1")
        if self._choked_until:
            wait = self._choked_until - asyncio.get_running_loop().time()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                self._choked_until = 0.0
        while len(self._inflight) >= window or not self._connected.is_set():
            if self._closing:
                raise ConnectionLost("client is closed")
            if not self._connected.is_set():
                await self._connected.wait()
            else:
                self._window_room.clear()
                await self._window_room.wait()
        seq = next(self._seq)
        msg = cm.Publish(seq, event, time.time())
        self._inflight[seq] = msg
        self._all_acked.clear()
        self._send(msg)

    async def flush(self, *, timeout: float = REQUEST_TIMEOUT) -> None:
        """Wait until every ``publish_windowed`` event is acknowledged.

        Raises the first rejection since the last flush (``RequestError``), or
        ``TimeoutError`` if some are still unacknowledged after ``timeout``.
        """
        await asyncio.wait_for(self._all_acked.wait(), check_timeout(timeout))
        err, self._publish_error = self._publish_error, None
        if err is not None:
            raise err

    @property
    def unacknowledged(self) -> int:
        """Pipelined publishes still waiting for their PubAck."""
        return len(self._inflight)

    async def subscribe(
        self,
        expression: str,
        *,
        sub_id: str | None = None,
        queue_size: int = DEFAULT_QUEUE,
        group: str = "",
        weight: float = 1.0,
        load: LoadFactorConfig | None = None,
        sink: Any = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Subscription:
        """Subscribe; returns once every channel holding it has applied it.

        ``group``/``weight`` join a subscriber group (SPEC §11); ``load`` tunes
        the load factor reported on acks; ``sink`` (for ``overlay.client.routing``)
        receives the notifications instead of the subscription's queue.
        """
        sid = sub_id or f"s{next(self._sub_seq)}"
        if sid in self.subscriptions and not self.subscriptions[sid].closed:
            raise RequestError(cm.ErrorCode.DUPLICATE_SUBSCRIPTION, f"subscription {sid!r} is already open")
        sub = Subscription(self, sid, expression, queue_size, group=group, weight=weight, load=load)
        sub.sink = sink
        self.subscriptions[sid] = sub
        try:
            await self._request_retrying(lambda seq: cm.Subscribe(seq, sid, expression, group, weight), timeout)
        except BaseException:
            self.subscriptions.pop(sid, None)
            raise
        return sub

    async def unsubscribe(self, sub_id: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            raise RequestError(cm.ErrorCode.UNKNOWN_SUBSCRIPTION, f"no subscription {sub_id!r}")
        sub.closed = True
        await self._request_retrying(lambda seq: cm.Unsubscribe(seq, sub_id), timeout)

    async def request_unsubscribe(self, sub_id: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        """Unsubscribe ``sub_id`` on the node whether or not this client holds it:
        a subscribe that timed out here may have been applied there."""
        await self._request_retrying(lambda seq: cm.Unsubscribe(seq, sub_id), timeout)

    @property
    def connections(self) -> int:
        """Connections opened so far: a new one is a new session on the node."""
        return self._conn_count

    async def ping(self, timeout: float = REQUEST_TIMEOUT) -> None:
        """One round trip through the node's inbox and dispatcher, as cheap as a
        publish and changing nothing (the routing agent's probe, SPEC §12)."""
        reply = await self._request(lambda seq: cm.Unsubscribe(seq, PING_SUB_ID), timeout)
        if not (isinstance(reply, cm.Error) and reply.code == cm.ErrorCode.UNKNOWN_SUBSCRIPTION):
            log.debug("%s: ping answered with %r", self.client_id, reply)

    async def admin(self, command: str, *, timeout: float = REQUEST_TIMEOUT, **args: Any) -> Any:
        reply = await self._request_retrying(lambda seq: cm.Admin(seq, command, args), timeout)
        assert isinstance(reply, cm.AdminReply)
        return reply.result


# The two roles; one class serves both, as one connection can do both.
Publisher = Client
Subscriber = Client
