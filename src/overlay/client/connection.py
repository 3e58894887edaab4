"""The client library's asyncio driver: publish, subscribe and operate over one
access-node connection at a time.

The protocol's rules — request correlation, the publish window, Choke and
``not_ready`` re-sends, the re-subscribe list, delivery bookkeeping — are
``overlay.client.protocol``'s, a sans-IO state machine.  This module reads,
writes, waits and keeps time; the rules it keeps itself (SPEC §4, §12;
STYLE habits 6–8):

1. One connection at a time, to the access nodes of the list in turn (with
   backoff between attempts).  Per connection, one reader task feeds what
   it reads to the protocol and one writer task writes what the protocol
   has to send, in batches (``writelines`` then ``drain``); nothing else
   touches the socket (``overlay.client.transport``).
2. Every task is owned (``overlay.client.tasks``): the connection
   supervisor, the timer (``tick`` when the protocol's ``next_timer`` comes)
   and the error reporter; a connection's reader and writer belong to the
   supervisor.  ``close()`` cancels them all and waits until each has ended.
3. After a lost connection the client reconnects — to the next node of its
   list, with backoff — and the protocol re-subscribes and sends again what
   must be (its rule 3) before anything new goes out.  With
   ``reconnect=False`` the client closes instead: pending calls and open
   subscriptions end with ``ConnectionLost``.
4. Requests are retried, not failed, while the cluster is not ready and
   when a node answers Choke(delay); ``publish`` waits for its PubAck.  An
   unkeyed publish names its event (protocol rule 8) and keeps the id when
   it is sent again after a lost connection: it is delivered once.
   ``publish_windowed`` does not: it keeps at most ``window`` publishes
   unacknowledged and ``flush()`` waits for all of them and raises the first
   refusal (protocol rule 2, ``overlay.client.window``).
5. Notifications go to ``Subscription`` queues (``overlay.client.subscription``);
   one that does not fit is dropped, declined, counted and reported to the
   error callback (``error_cb``) as a ``SlowConsumerError`` — so are the
   node's own drops for this connection and its other unsolicited errors
   (``overlay.client.callbacks``).  Nothing waits on a slow consumer.
6. Tokens (``overlay.auth``): ``token`` is a string, or a function that
   returns the current one, called before every connection — a client
   whose token expires (the node closes the session, ``token_expired``)
   reconnects with a fresh one.  Without ``client_id`` the client takes the
   token's subject (nodes accept a token only for the client id it names).
   A node's refusal of the token (``unauthorized``) is final on the first
   connection (``connect`` raises it); on a reconnect it ends the client
   too, unless a token function may give a new token next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from ssl import SSLContext
from typing import Any, Final

from overlay.auth.tokens import unverified_subject
from overlay.channels.schema import Value
from overlay.client.callbacks import ErrorCallback, ErrorReporter
from overlay.client.deliveries import Deliveries, Notification
from overlay.client.events import Connected, Delivered, Event, Failed, NodeError, Replied, SubscriptionLost
from overlay.client.limits import (
    DEFAULT_QUEUE,
    PUBLISH_WINDOW,
    REQUEST_TIMEOUT,
    check_order,
    check_payload,
    check_timeout,
)
from overlay.client.load_factor import LoadFactorConfig
from overlay.client.protocol import ClientProtocol, ConnState
from overlay.client.requests import RequestMessage
from overlay.client.subscription import Sink, Subscription
from overlay.client.tasks import OwnedTasks
from overlay.client.transport import Conn, TokenSource, Transport
from overlay.errors import ConnectionLost, LocalProtocolError, NotReady, RequestError
from overlay.messages import client as cm
from overlay.messages.codec import DEFAULT_MAX_FRAME_SIZE, encode_frame

__all__ = ["Client", "Notification", "Publisher", "Subscriber", "Subscription", "check_order", "check_timeout"]

log = logging.getLogger("overlay.client")

# The id ``ping()`` unsubscribes: no subscription has it (a NUL is no one's
# choice of name), so the node answers unknown_subscription and changes nothing.
PING_SUB_ID: Final = "\x00ping"


class Client:
    """A connection to the cluster through one access node at a time (rules 1–5).

    ``error_cb(error)`` (a function or a coroutine function) receives the
    errors no call raises: ``SlowConsumerError`` when notifications are
    dropped, the node's unsolicited errors, a subscription lost after a
    reconnect; without it they are logged.  ``token``: a signed token
    (``overlay token create``), or a function returning the current one
    (rule 6), when the cluster has ``[auth]``; otherwise the cluster's legacy
    admin token, for ``admin`` commands that change the cluster (split,
    place, drain) when it has one.  ``ssl``: connect with TLS, verifying
    the node against the context's CA (``overlay.security.client_context``,
    or ``client_ssl(config)``); ``None`` is plain TCP, for a cluster with
    ``[tls] insecure = true``."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        client_id: str | None = None,
        reconnect: bool = True,
        max_frame: int = DEFAULT_MAX_FRAME_SIZE,
        token: TokenSource = "",
        error_cb: ErrorCallback | None = None,
        ssl: SSLContext | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("a client needs at least one access node address")
        self._token_source = token if callable(token) else None  # rule 6
        self.token = token() if callable(token) else token
        self.ssl = ssl
        self.addresses = list(addresses)
        # Unique per instance, unless the token names the client (rule 6).
        self.client_id = client_id or unverified_subject(self.token) or f"client-{uuid.uuid4().hex[:16]}"
        self.reconnect = reconnect
        self.max_frame = max_frame
        self.protocol = ClientProtocol(self.client_id, token=self.token, max_frame=max_frame)
        self.subscriptions: dict[str, Subscription] = {}
        # Called with this client each time its connection is lost (before any
        # reconnect): the routing agent moves subscriptions away from it.
        self.on_lost: list[Callable[[Client], None]] = []
        self._errors = ErrorReporter(error_cb, self.client_id)
        self._tasks = OwnedTasks(self.client_id)
        self._waiters: dict[int, asyncio.Future[cm.ClientMessage]] = {}
        self._transport = Transport(
            self.protocol,
            self.addresses,
            self.client_id,
            on_message=lambda msg: self._on_message(msg),  # looked up per call: a test may wrap it
            on_events=self._handle,
            token_source=self._token_source,
            tls=ssl,
        )
        self._changed = asyncio.Event()  # the connection's state changed, or the window moved
        self._timer_wake = asyncio.Event()  # a timer earlier than the one awaited
        self._timer_at: float | None = None
        self._window_seen = 0
        self._state_seen = ConnState.IDLE
        self._started = False
        self._closing = False
        self._sub_seq = itertools.count(1)

    # -- what the protocol knows -------------------------------------------------------

    @property
    def node_id(self) -> int | None:
        return self.protocol.node_id

    @property
    def cluster(self) -> str:
        """The cluster name the node gave in its Welcome."""
        return self.protocol.cluster

    @property
    def ready(self) -> bool:
        return self.protocol.ready

    @property
    def connected(self) -> bool:
        return self.protocol.state is ConnState.OPEN and not self._closing

    @property
    def connections(self) -> int:
        """Connections opened so far: a new one is a new session on the node."""
        return self.protocol.conn

    @property
    def chokes(self) -> int:
        return self.protocol.chokes

    @property
    def publish_errors(self) -> int:
        """Pipelined publishes the node refused."""
        return self.protocol.window.errors

    @property
    def unacknowledged(self) -> int:
        """Pipelined publishes still waiting for their PubAck."""
        return len(self.protocol.window)

    @property
    def deliveries(self) -> Deliveries:
        return self.protocol.deliveries

    # -- connection (rules 1–3) --------------------------------------------------------

    async def connect(self, timeout: float = 10.0) -> Client:
        if self._closing:
            raise ConnectionLost("the client is closed")
        if self._started:
            raise LocalProtocolError(f"{self.client_id} is connected already")
        conn = await asyncio.wait_for(self._transport.open(refusal_is_final=True), timeout)
        self._started = True
        self._tasks.spawn(self._supervise(conn), "connection")
        self._tasks.spawn(self._timers(), "timers")
        self._tasks.spawn(self._errors.run(), "error reporter")
        return self

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _supervise(self, conn: Conn) -> None:
        """Rule 3: serve a connection; when it is lost, reconnect (or close)."""
        while True:
            await self._transport.serve(conn)
            self._handle(self.protocol.connection_lost())
            for callback in list(self.on_lost):
                callback(self)
            if not self.reconnect:
                self._shut("connection to the access node lost")
                return
            self._transport.next_address()
            try:
                conn = await self._transport.open(refusal_is_final=False)
            except RequestError as exc:  # rule 6: the token is refused, and no new one will come
                self._errors.add(exc)
                self._shut(f"the access node refused the session: {exc}")
                return

    async def _timers(self) -> None:
        """Rule 2: the protocol's deadlines and pauses, on time."""
        protocol = self.protocol
        while True:
            at = self._timer_at = protocol.next_timer()
            self._timer_wake.clear()
            if at is None:
                await self._timer_wake.wait()
            elif (left := at - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._timer_wake.wait()
            self._timer_at = None
            self._handle(protocol.tick(time.monotonic()))

    def _on_message(self, msg: cm.ClientMessage) -> None:
        """One message from the node (the reader's only call into the protocol)."""
        self._handle(self.protocol.receive(msg, time.monotonic(), time.time()))

    def _handle(self, events: list[Event]) -> None:
        """Act on the protocol's events, then wake whoever its new state concerns."""
        for event in events:
            match event:
                case Delivered(note=note, sub_ids=sub_ids):
                    for sid in sub_ids:  # every listed subscription gets it
                        sub = self.subscriptions.get(sid)
                        if sub is None:
                            self.protocol.dropped(note)
                        else:
                            sub._deliver(note)
                case Replied(request=rid, reply=reply):
                    fut = self._waiters.pop(rid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(reply)
                case Failed(request=rid, error=error):
                    fut = self._waiters.pop(rid, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(error)
                case NodeError(error=error):
                    self._errors.add(error)
                case SubscriptionLost(sub_id=sid, error=error):
                    sub = self.subscriptions.pop(sid, None)
                    if sub is not None:
                        sub._end(error)
                    self._errors.add(error)
                case Connected(node_id=node_id, conn=conn):
                    log.debug("%s: session %d with node %d open", self.client_id, conn, node_id)
        self._after()

    def _after(self) -> None:
        protocol = self.protocol
        if protocol.has_output:
            for msg in protocol.messages_to_send():
                self._send(msg)
        size = len(protocol.window)
        if size < self._window_seen or protocol.state is not self._state_seen:
            self._changed.set()
        self._window_seen = size
        self._state_seen = protocol.state
        at = protocol.next_timer()
        if at is not None and (self._timer_at is None or at < self._timer_at):
            self._timer_wake.set()

    def _send(self, msg: cm.ClientMessage) -> None:
        """One message to the node, queued for the writer (every message passes here)."""
        self._transport.send(encode_frame(msg, self.max_frame))

    def _shut(self, reason: str) -> None:
        """Close the protocol for good: pending calls fail, subscriptions end."""
        self._handle(self.protocol.close(reason))
        for sub in list(self.subscriptions.values()):
            sub._end(None if self._closing else ConnectionLost(reason))
        self._errors.stop()

    async def close(self) -> None:
        """Close the connection; every subscription's iteration ends.  Waits
        until every task of the client has ended."""
        if not self._closing:
            self._closing = True
            self._shut("the client is closed")
        await self._tasks.close()

    # -- the calls from subscriptions (protocol rule 5) -------------------------------

    def _claim(self, note: Notification, lf: float) -> bool:
        ok = self.protocol.claim(note, lf, time.monotonic())
        self._after()
        return ok

    def _took(self, note: Notification, lf: float) -> None:
        self.protocol.took(note, lf)
        self._after()

    def _dropped(self, note: Notification) -> None:
        self.protocol.dropped(note)
        self._after()

    def _slow_consumer(self, sub_id: str, queued: int, limit: int, event_id: str) -> None:
        self._errors.slow_consumer(sub_id, queued, limit, event_id)

    def _forget(self, sub_id: str) -> None:
        """``sub_id`` is no longer this connection's to re-subscribe (the routing agent's call)."""
        self.subscriptions.pop(sub_id, None)
        self.protocol.forget(sub_id)

    # -- requests (rule 4) -------------------------------------------------------------

    async def _request(self, make: Callable[[int], RequestMessage], timeout: float) -> cm.ClientMessage:
        """One attempt: the node's first answer, whatever it is (a Choke, an Error…)."""
        return await self._ask(make(0), timeout, retry=False)

    async def _ask(self, message: RequestMessage, timeout: float, *, retry: bool) -> cm.ClientMessage:
        check_timeout(timeout)
        self._check_open()
        return await self._wait(self.protocol.request(message, now=time.monotonic(), timeout=timeout, retry=retry))

    def _check_open(self) -> None:
        if self._closing:
            raise ConnectionLost("the client is closed")
        if not self.protocol.conn:
            raise LocalProtocolError(f"{self.client_id} is not connected: call connect() first")

    async def _wait(self, rid: int) -> cm.ClientMessage:
        fut: asyncio.Future[cm.ClientMessage] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        self._after()
        try:
            return await fut
        finally:
            if self._waiters.pop(rid, None) is not None:  # the caller gave up (cancelled)
                self.protocol.cancel(rid)
                self._after()

    async def publish(
        self,
        event: str | dict[str, Value],
        *,
        payload: bytes | str = b"",
        key: str = "",
        rank: int = 0,
        timeout: float = REQUEST_TIMEOUT,
    ) -> str:
        """Publish an event (an eventExp text or an ``{attr: value}`` map); returns its id.

        ``payload``: opaque bytes delivered unchanged with every notification
        (a ``str`` is sent as its UTF-8), never matched; at most the cluster's
        ``[cluster] max_payload`` (else ``RequestError`` ``payload_too_large``).
        ``key`` (and optionally ``rank``) ask for ordered delivery (SPEC §10).
        """
        check_order(key, rank)
        data = check_payload(payload, self.protocol.max_payload)
        eid = self.protocol.next_event_id()  # keyed too: its home sequences a re-send once (node.keyhome)
        reply = await self._ask(cm.Publish(0, event, time.time(), key, rank, eid, data), timeout, retry=True)
        assert isinstance(reply, cm.PubAck)
        return reply.event_id

    async def publish_once(
        self,
        event: str | dict[str, Value],
        *,
        key: str = "",
        rank: int = 0,
        timeout: float = REQUEST_TIMEOUT,
        event_id: str = "",
        payload: bytes | str = b"",
    ) -> cm.PubAck | cm.Choke:
        """One attempt, for a caller that handles Choke itself (the routing agent).

        ``event_id``: the id of the event (protocol rule 8), the same on each
        attempt of one publish; "" names a new one.

        Returns the PubAck or the Choke; raises ``RequestError`` (``NotReady``
        for not_ready) for a rejection, ``ConnectionLost`` if the connection
        goes, ``TimeoutError`` after ``timeout``.
        """
        check_order(key, rank)
        data = check_payload(payload, self.protocol.max_payload)
        if not self.connected:
            raise ConnectionLost("not connected to the access node")
        eid = event_id or self.protocol.next_event_id()
        reply = await self._ask(cm.Publish(0, event, time.time(), key, rank, eid, data), timeout, retry=False)
        if isinstance(reply, cm.Error):
            if reply.code == cm.ErrorCode.NOT_READY:
                raise NotReady(reply.message)
            raise RequestError(reply.code, reply.message, reply.position)
        assert isinstance(reply, (cm.PubAck, cm.Choke))
        return reply

    async def publish_windowed(
        self, event: str | dict[str, Value], *, payload: bytes | str = b"", window: int = PUBLISH_WINDOW
    ) -> None:
        """Publish without waiting for this event's PubAck (rule 4).

        Returns once the frame is queued; waits only while ``window`` earlier
        pipelined publishes are unacknowledged (or they hold
        ``PUBLISH_WINDOW_BYTES`` of payload), after a Choke, or while the
        connection is down.  A rejection surfaces in ``publish_errors`` and
        from ``flush()``; ``payload`` as for ``publish``.
        """
        if window < 1:
            raise ValueError("window must be at least 1")
        data = check_payload(payload, self.protocol.max_payload)
        self._check_open()
        protocol = self.protocol
        if (pause := protocol.window.pause_left(time.monotonic())) > 0:
            await asyncio.sleep(pause)
        while not (self.connected and protocol.window.room(window)):
            if protocol.state is ConnState.CLOSED:
                raise ConnectionLost(protocol.closed_reason)
            self._changed.clear()
            await self._changed.wait()
        protocol.publish_windowed(event, wall=time.time(), payload=data)
        self._after()

    async def flush(self, *, timeout: float = REQUEST_TIMEOUT) -> None:
        """Wait until every ``publish_windowed`` event is acknowledged.

        Raises the first rejection since the last flush (``RequestError``),
        ``TimeoutError`` if some are still unacknowledged after ``timeout``,
        ``ConnectionLost`` if the client closed with some unacknowledged.
        """
        protocol = self.protocol
        async with asyncio.timeout(check_timeout(timeout)):
            while len(protocol.window):
                if protocol.state is ConnState.CLOSED:
                    raise ConnectionLost(protocol.closed_reason)
                self._changed.clear()
                await self._changed.wait()
        err = protocol.window.take_error()
        if err is not None:
            raise err

    async def subscribe(
        self,
        expression: str,
        *,
        sub_id: str | None = None,
        queue_size: int = DEFAULT_QUEUE,
        group: str = "",
        weight: float = 1.0,
        load: LoadFactorConfig | None = None,
        sink: Sink | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Subscription:
        """Subscribe; returns once every channel holding it has applied it.

        ``group``/``weight`` join a subscriber group (SPEC §11); ``load`` tunes
        the load factor reported on acks; ``sink`` (for ``overlay.client.routing``)
        receives the notifications instead of the subscription's queue.
        """
        check_timeout(timeout)
        self._check_open()
        sid = sub_id or f"s{next(self._sub_seq)}"
        if sid in self.subscriptions and not self.subscriptions[sid].closed:
            raise RequestError(cm.ErrorCode.DUPLICATE_SUBSCRIPTION, f"subscription {sid!r} is already open")
        sub = Subscription(self, sid, expression, queue_size, group=group, weight=weight, load=load)
        sub.sink = sink
        now = time.monotonic()
        rid = self.protocol.subscribe(sid, expression, group=group, weight=weight, now=now, timeout=timeout)
        self.subscriptions[sid] = sub
        try:
            await self._wait(rid)
        except BaseException:
            if self.subscriptions.get(sid) is sub:
                del self.subscriptions[sid]
            raise
        return sub

    async def unsubscribe(self, sub_id: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        check_timeout(timeout)
        self._check_open()
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            raise RequestError(cm.ErrorCode.UNKNOWN_SUBSCRIPTION, f"no subscription {sub_id!r}")
        sub.closed = True
        await self._wait(self.protocol.unsubscribe(sub_id, now=time.monotonic(), timeout=timeout))

    async def request_unsubscribe(self, sub_id: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        """Unsubscribe ``sub_id`` on the node whether or not this client holds it:
        a subscribe that timed out here may have been applied there."""
        await self._ask(cm.Unsubscribe(0, sub_id), timeout, retry=True)

    async def ping(self, timeout: float = REQUEST_TIMEOUT) -> None:
        """One round trip through the node's inbox and dispatcher, as cheap as a
        publish and changing nothing (the routing agent's probe, SPEC §12)."""
        reply = await self._ask(cm.Unsubscribe(0, PING_SUB_ID), timeout, retry=False)
        if not (isinstance(reply, cm.Error) and reply.code == cm.ErrorCode.UNKNOWN_SUBSCRIPTION):
            log.debug("%s: ping answered with %r", self.client_id, reply)

    async def admin(self, command: str, *, timeout: float = REQUEST_TIMEOUT, **args: Any) -> Any:
        reply = await self._ask(cm.Admin(0, command, args), timeout, retry=True)
        assert isinstance(reply, cm.AdminReply)
        return reply.result


# The two roles; one class serves both, as one connection can do both.
Publisher = Client
Subscriber = Client
