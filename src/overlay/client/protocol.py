"""The client's side of the client protocol, as a state machine (sans-IO).

Bytes and messages in; bytes and events out.  No socket, no event loop, no
clock: ``now`` (seconds on a monotonic clock) and ``wall`` (Unix seconds)
are given.  The asyncio driver (``overlay.client.connection.Client``) reads
the socket and feeds ``receive_data`` then ``receive``, writes
``data_to_send()``, calls ``tick(now)`` once ``next_timer()`` has come, and
turns the events returned into answers to its callers and notifications
queued for the application.  Rules (SPEC §4, §12; Client rules 1–5):

1. **Connection states**, a table (``TRANSITIONS``): IDLE —``connect``→
   HANDSHAKE —Welcome→ OPEN —``connection_lost``→ IDLE, and any state
   —``close``→ CLOSED.  In HANDSHAKE the node's first four bytes must be
   ``CLIENT_MAGIC`` and its first message a Welcome; an Error there is the
   node refusing the session (``RequestError``, back to IDLE).  Any other
   pair is illegal: from the node it raises ``RemoteProtocolError``, from a
   caller ``LocalProtocolError``; either names the input and the state, and
   changes nothing.
2. **Requests** (``overlay.client.requests``) go out only while OPEN; made
   while not, they wait for the next connection, within their deadline.
   Every new seq comes from one counter shared with the publish window.
   A request the node's decoder would refuse is refused when made
   (``LocalProtocolError``), as is a pipelined publish's event of a type
   the protocol lacks (``limits.check_event``).
3. **The re-subscribe list** (``subscriptions``) holds every subscription of
   the client from ``subscribe`` until ``unsubscribe`` (or ``forget``).  On each
   new connection, before anything else goes out: a Subscribe for each one
   the node had acknowledged; then the requests waiting for a connection;
   then every kept pipelined publish (``overlay.client.window``).  A retrying
   Unsubscribe made before this connection, for a subscription neither
   re-subscribed nor being subscribed on it, completes at once unsent: the
   new session never held it.
4. A re-subscription the node refuses, or does not answer in
   ``REQUEST_TIMEOUT``, ends that subscription: ``SubscriptionLost``.
5. A Notify is ``Delivered`` to the subscriptions it lists that the client
   holds; its answer (one Ack, for a tagged Notify only) is the deliveries
   component's (``overlay.client.deliveries``).  Frames are only queued while OPEN and a
   lost connection discards those not taken yet: its session is gone, and
   what must go again is sent again by rules 2 and 3.
6. Chokes answering a retrying request or a pipelined publish count in
   ``chokes`` (a one-shot request's Choke is its caller's to count).
7. An Error that answers nothing of ours is the node's news: ``NodeError``,
   carrying a ``SlowConsumerError`` for ``slow_consumer`` (the node dropped
   notifications for this connection; ``disconnected`` when the Error is
   fatal: the node closes the connection) and a ``RequestError`` otherwise.
8. **Event ids.**  Every unkeyed publish names its event
   (``Publish.event_id``, ``next_event_id``): this instance's random
   ``event_prefix`` and a counter, so two clients given the same
   ``client_id`` — one process after another, or the same program twice —
   never name two events alike.  A publish sent again (rules 2, 3, and the
   publish window's rule 5) keeps its id, so the cluster delivers it once
   (the node's ``client_id/event_id``; ``overlay.node.outbox``).
9. **Once per subscription, across reconnects.**  The client remembers, for
   its last ``RECENT_EVENTS`` events, which of its plain subscriptions each
   was handed to; a copy for one of them again — the same event re-sent or
   released again after its access node died and the client subscribed
   anew elsewhere — is acked as taken when tagged, not delivered twice
   (``duplicates``); an event one of them could not take (``dropped``) is
   forgotten, so a copy again is never taken for delivered.  Group copies are the node's to de-duplicate (a revoked
   copy may come back to the same instance).
"""

from __future__ import annotations

import enum
import itertools
import uuid
from collections import OrderedDict, deque
from typing import Final

from overlay.channels.schema import Value
from overlay.client.deliveries import Deliveries, Notification
from overlay.client.events import (
    Connected,
    Delivered,
    Event,
    Failed,
    NodeError,
    Replied,
    SubscriptionLost,
    SubscriptionSpec,
)
from overlay.client.limits import CLIENT_MAGIC, REQUEST_TIMEOUT, check_event
from overlay.client.requests import Request, RequestMessage, Requests
from overlay.client.window import PublishWindow
from overlay.errors import (
    ConnectionLost,
    LocalProtocolError,
    OverlayError,
    RemoteProtocolError,
    RequestError,
    SlowConsumerError,
)
from overlay.messages import client as cm
from overlay.messages.codec import DEFAULT_MAX_FRAME_SIZE, client_reader, encode_frame

__all__ = ["TRANSITIONS", "Call", "ClientProtocol", "ConnState"]


def _check_request(message: RequestMessage, max_frame: int) -> None:
    """Rule 2: a request the node's decoder would refuse — a field too long,
    a value of a type the protocol lacks — is a ``LocalProtocolError`` now.
    Sent, it was a protocol error that closed the session, and the request,
    sent again on each new connection, closed each until its timeout ("request
    timed out"), re-subscribing everything else each time."""
    try:
        frame = encode_frame(message, max_frame)
    except (OverflowError, TypeError) as exc:  # an int past 64 bits, an object msgpack lacks
        raise LocalProtocolError(f"this {type(message).__name__} cannot be sent: {exc}") from None
    try:
        client_reader(max_frame).feed(frame)  # the node's own decoder
    except RemoteProtocolError as exc:
        raise LocalProtocolError(f"the node would refuse this {type(message).__name__}: {exc}") from None


class ConnState(enum.Enum):
    IDLE = "idle"  # no connection: requests wait
    HANDSHAKE = "handshake"  # Hello sent, waiting for the node's preamble and Welcome
    OPEN = "open"
    CLOSED = "closed"  # for good: every request fails


class Call(enum.Enum):
    """The caller's inputs to the state table."""

    CONNECT = "connect"
    LOST = "connection_lost"
    CLOSE = "close"


_S = ConnState
# Rule 1: (state, input) -> next state; the inputs are the calls above and the
# node's handshake answers.  In OPEN, every other message leaves the state as it is.
# Rule 9: the events whose subscriptions the client remembers (a few MB at most).
RECENT_EVENTS: Final = 65_536

TRANSITIONS: Final[dict[tuple[ConnState, Call | type[cm.ClientMessage]], ConnState]] = {
    (_S.IDLE, Call.CONNECT): _S.HANDSHAKE,
    (_S.HANDSHAKE, cm.Welcome): _S.OPEN,
    (_S.HANDSHAKE, cm.Error): _S.IDLE,
    (_S.HANDSHAKE, Call.LOST): _S.IDLE,
    (_S.OPEN, Call.LOST): _S.IDLE,
    **{(state, Call.CLOSE): _S.CLOSED for state in ConnState},
}


class ClientProtocol:
    """Rules 1–7 for one client, across its connections.

    Invariant: messages are queued to send only while OPEN; ``subscriptions``
    holds a spec for each subscription of the client, ``acked`` once the
    node acknowledged it (then it is re-subscribed on every new connection)."""

    def __init__(
        self,
        client_id: str,
        *,
        token: str = "",
        max_frame: int = DEFAULT_MAX_FRAME_SIZE,
        event_prefix: str | None = None,
    ) -> None:
        self.client_id = client_id
        # Rule 8: 32 random bits per instance (a counter alone would repeat the
        # ids of an earlier run under the same client id); "." then the counter.
        self.event_prefix = (event_prefix if event_prefix is not None else uuid.uuid4().hex[:8]) + "."
        self._event_no = itertools.count(1)
        self.token = token
        self.max_frame = max_frame
        self.state = ConnState.IDLE
        self.closed_reason = ""
        self.conn = 0  # connections opened so far (a Welcome each)
        self.node_id: int | None = None
        self.cluster = ""
        self.ready = False
        self.max_payload = 0  # the node's [cluster] max_payload, from its Welcome (0: not known)
        self.chokes = 0
        self.late_answers = 0  # answers to requests given up on the wire (requests rule 6)
        self.duplicates = 0  # copies of an event a subscription had already (rule 9)
        self._recent: OrderedDict[str, tuple[str, ...]] = OrderedDict()  # rule 9: event id -> its subscriptions
        self.requests = Requests()
        self.window = PublishWindow()
        self.deliveries = Deliveries()
        self.subscriptions: dict[str, SubscriptionSpec] = {}
        self._resubscribing: dict[int, str] = {}  # internal request id -> its sub_id
        self._seq = 0
        self._out: deque[cm.ClientMessage] = deque()  # to send, in order
        self._frames = client_reader(max_frame)
        self._preamble = b""

    # -- rule 1: the connection -----------------------------------------------------------

    def _transition(self, what: Call | type[cm.ClientMessage]) -> None:
        new = TRANSITIONS.get((self.state, what))
        if new is None:
            name = what.value if isinstance(what, Call) else what.__name__
            error = LocalProtocolError if isinstance(what, Call) else RemoteProtocolError
            raise error(f"{name} in state {self.state.name}")
        self.state = new

    def connect(self) -> bytes:
        """A connection is open: the bytes to send first (preamble and Hello)."""
        hello = encode_frame(cm.Hello(self.client_id, cm.PROTOCOL_VERSION, self.token), self.max_frame)
        self._transition(Call.CONNECT)
        self._frames = client_reader(self.max_frame)
        self._preamble = b""
        return CLIENT_MAGIC + hello

    def receive_data(self, data: bytes) -> list[cm.ClientMessage]:
        """Bytes from the node: the whole messages they complete, to ``receive`` in order."""
        if self.state is ConnState.HANDSHAKE and len(self._preamble) < len(CLIENT_MAGIC):
            need = len(CLIENT_MAGIC) - len(self._preamble)
            self._preamble += data[:need]
            data = data[need:]
            if not CLIENT_MAGIC.startswith(self._preamble):
                raise RemoteProtocolError(f"the node answered with {self._preamble!r}, not {CLIENT_MAGIC!r}")
        elif self.state not in (ConnState.HANDSHAKE, ConnState.OPEN):
            raise LocalProtocolError(f"receive_data in state {self.state.name}")
        return self._frames.feed(data)

    def receive(self, msg: cm.ClientMessage, now: float, wall: float) -> list[Event]:
        """One message from the node (``now`` monotonic, ``wall`` Unix seconds)."""
        if self.state is ConnState.OPEN:
            return self._dispatch(msg, now, wall)
        if self.state is not ConnState.HANDSHAKE:
            raise LocalProtocolError(f"receive of {type(msg).__name__} in state {self.state.name}")
        self._transition(type(msg))  # a Welcome, or an Error: the node refuses the session
        if isinstance(msg, cm.Error):
            raise RequestError(msg.code, msg.message, msg.position)
        assert isinstance(msg, cm.Welcome)  # the only other legal pair of TRANSITIONS
        return self._welcome(msg, now)

    def _welcome(self, msg: cm.Welcome, now: float) -> list[Event]:
        self.conn += 1
        self.node_id = msg.node_id
        self.cluster = msg.cluster
        self.ready = msg.ready
        self.deliveries.window = msg.ack_timeout
        self.max_payload = msg.max_payload
        events: list[Event] = [Connected(msg.node_id, msg.cluster, msg.ready, self.conn)]
        for spec in self.subscriptions.values():  # rule 3
            if spec.acked:
                sub = cm.Subscribe(0, spec.sub_id, spec.expression, spec.group, spec.weight)
                req = self.requests.add(
                    sub, now=now, timeout=REQUEST_TIMEOUT, retry=True, internal=True, conn=self.conn
                )
                self._resubscribing[req.id] = spec.sub_id
                self._send_request(req)
        for req in self.requests.ready(now):
            if req.internal:
                continue
            if self._never_held(req):
                self.requests.cancel(req.id)
                events.append(Replied(req.id, cm.UnsubAck(0, req.sub_id)))
            else:
                self._send_request(req)
        for pub in self.window.kept():
            self._out.append(pub)
        return events

    def _never_held(self, req: Request) -> bool:
        """Rule 3: an Unsubscribe the new session has nothing to do with."""
        sub_id = req.sub_id
        return (
            req.retry
            and isinstance(req.message, cm.Unsubscribe)
            and req.conn < self.conn
            and sub_id not in self.subscriptions
            and not any(isinstance(r.message, cm.Subscribe) and r.sub_id == sub_id for r in self.requests.pending())
        )

    def connection_lost(self) -> list[Event]:
        """The connection is gone (or a handshake failed): back to IDLE."""
        was_open = self.state is ConnState.OPEN
        self._transition(Call.LOST)
        if was_open:
            self.deliveries.connection_lost(self.conn)  # its group copies are void (deliveries rule 3)
        self._out.clear()
        self.window.connection_lost()
        self._resubscribing.clear()
        return [Failed(req.id, exc) for req, exc in self.requests.connection_lost()]

    def close(self, reason: str) -> list[Event]:
        """For good: every pending request fails with ``ConnectionLost(reason)``."""
        self._transition(Call.CLOSE)
        self.closed_reason = self.closed_reason or reason
        self._out.clear()
        self.window.connection_lost()
        failed = self.requests.close(reason)
        self._resubscribing.clear()
        return [Failed(req.id, exc) for req, exc in failed if not req.internal]

    # -- output and time ------------------------------------------------------------------

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def messages_to_send(self) -> list[cm.ClientMessage]:
        """Every message to send, in order (for a driver that encodes them itself)."""
        out = list(self._out)
        self._out.clear()
        return out

    def data_to_send(self) -> bytes:
        """Every message to send, as the frames to write."""
        return b"".join(encode_frame(msg, self.max_frame) for msg in self.messages_to_send())

    def next_timer(self) -> float | None:
        """When ``tick`` has something to do next (maybe nothing, by then)."""
        a, b = self.requests.next_timer(), self.window.next_timer()
        return b if a is None else a if b is None else min(a, b)

    def tick(self, now: float) -> list[Event]:
        """Deadlines and pauses that came by ``now`` (requests rules 3, 4; window rules 2, 3)."""
        resume, expired = self.requests.tick(now)
        events: list[Event] = []
        for req in expired:
            events += self._settled(req, TimeoutError("request timed out"))
        if self.state is ConnState.OPEN:
            for req in resume:
                self._send_request(req)
            for pub in self.window.due(now):
                self._out.append(pub)
        return events

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def next_event_id(self) -> str:
        """Rule 8: a new id for an event of this client."""
        return f"{self.event_prefix}{next(self._event_no)}"

    def _send_request(self, req: Request) -> None:
        self._out.append(self.requests.on_wire(req, self._next_seq()))

    # -- rule 2: requests -----------------------------------------------------------------

    def request(self, message: RequestMessage, *, now: float, timeout: float, retry: bool) -> int:
        """A request (its ``seq`` is set when sent); returns its id for ``Replied``/``Failed``."""
        if self.state is ConnState.CLOSED:
            raise ConnectionLost(self.closed_reason)
        _check_request(message, self.max_frame)  # refused now, not when a connection comes
        req = self.requests.add(message, now=now, timeout=timeout, retry=retry, conn=self.conn)
        if self.state is ConnState.OPEN:
            self._send_request(req)
        return req.id

    def cancel(self, rid: int) -> None:
        """The caller gave up on request ``rid`` (its answer, if any, is ignored)."""
        req = self.requests.cancel(rid)
        if req is not None:
            self._drop_spec(req)

    def subscribe(
        self, sub_id: str, expression: str, *, group: str = "", weight: float = 1.0, now: float, timeout: float
    ) -> int:
        """Rule 3: ``sub_id`` joins the re-subscribe list; its Subscribe is a retrying request."""
        if sub_id in self.subscriptions:
            raise RequestError(cm.ErrorCode.DUPLICATE_SUBSCRIPTION, f"subscription {sub_id!r} is already open")
        rid = self.request(cm.Subscribe(0, sub_id, expression, group, weight), now=now, timeout=timeout, retry=True)
        self.subscriptions[sub_id] = SubscriptionSpec(sub_id, expression, group, weight, request=rid)
        return rid

    def unsubscribe(self, sub_id: str, *, now: float, timeout: float) -> int:
        """Rule 3: ``sub_id`` leaves the list (no notification is delivered to it
        from now on); its Unsubscribe is a retrying request."""
        self.subscriptions.pop(sub_id, None)
        return self.request(cm.Unsubscribe(0, sub_id), now=now, timeout=timeout, retry=True)

    def forget(self, sub_id: str) -> None:
        """``sub_id`` leaves the list without an Unsubscribe (the routing agent
        moves it away from a lost connection, which must not re-subscribe it)."""
        self.subscriptions.pop(sub_id, None)

    def publish_windowed(self, event: str | dict[str, Value], *, wall: float, payload: bytes = b"") -> int:
        """A pipelined publish (window rule 1; the caller checked ``window.room``
        and ``payload``, ``check_payload``); returns its seq."""
        if self.state is ConnState.CLOSED:
            raise ConnectionLost(self.closed_reason)
        check_event(event)
        msg = cm.Publish(self._next_seq(), event, wall, event_id=self.next_event_id(), payload=payload)
        encode_frame(msg, self.max_frame)  # refused now if it cannot be sent
        self.window.add(msg)
        if self.state is ConnState.OPEN:
            self._out.append(msg)
        return msg.seq

    # -- rule 5: deliveries ---------------------------------------------------------------

    def claim(self, note: Notification, lf: float, now: float) -> bool:
        """A subscription hands ``note`` to the application now, if it may (deliveries rules 2, 3)."""
        ok, ack = self.deliveries.claim(note, lf, now)
        self._ack(ack)
        return ok

    def took(self, note: Notification, lf: float) -> None:
        """Taken, not handed over: a copy the application saw already."""
        self._ack(self.deliveries.took(note, lf))

    def dropped(self, note: Notification) -> None:
        """Not taken: a full queue, or a subscription that closed."""
        self._recent.pop(note.event_id, None)  # rule 9: a copy again may be handed over
        self._ack(self.deliveries.dropped(note))

    def _ack(self, ack: cm.Ack | None) -> None:
        if ack is not None and self.state is ConnState.OPEN:
            self._out.append(ack)

    # -- what the node sends --------------------------------------------------------------

    def _dispatch(self, msg: cm.ClientMessage, now: float, wall: float) -> list[Event]:
        match msg:
            case cm.Notify():
                return self._notify(msg, now, wall)
            case cm.Revoke():
                self._ack(self.deliveries.revoke(msg.tag, msg.event_id))
            case cm.PubAcks():
                return self._pub_acks(msg, now)
            case cm.PubAck() | cm.Choke() | cm.Error() if msg.seq in self.window:
                if isinstance(msg, cm.Choke):
                    self.chokes += 1
                self.window.answer(msg, now)
            case cm.PubAck() | cm.SubAck() | cm.UnsubAck() | cm.AdminReply() | cm.Choke() | cm.Error() if (
                msg.seq in self.requests
            ):
                return self._answered(msg, now)
            case cm.Error() if self.requests.abandoned(msg.seq):  # a late answer (requests rule 6)
                self.late_answers += 1
            case cm.Error():
                return [NodeError(self._node_error(msg))]
            case cm.PubAck() | cm.SubAck() | cm.UnsubAck() | cm.AdminReply() | cm.Choke():
                pass  # a late answer to a request given up on
            case cm.Welcome() | cm.Hello() | cm.Publish() | cm.Subscribe() | cm.Unsubscribe() | cm.Ack() | cm.Admin():
                raise RemoteProtocolError(f"{type(msg).__name__} in state {self.state.name}")
        return []

    def _pub_acks(self, msg: cm.PubAcks, now: float) -> list[Event]:
        """Several PubAcks in one frame: each as if it came alone, in order."""
        if len(msg.seqs) != len(msg.event_ids):
            raise RemoteProtocolError(f"PubAcks lists {len(msg.seqs)} seqs but {len(msg.event_ids)} event ids")
        window, requests = self.window, self.requests
        events: list[Event] = []
        for seq, event_id in zip(msg.seqs, msg.event_ids):
            if seq in window:
                window.acked(seq)
            elif seq in requests:
                events.extend(self._answered(cm.PubAck(seq, event_id), now))
            # else a late answer to a request given up on
        return events

    def _notify(self, msg: cm.Notify, now: float, wall: float) -> list[Event]:
        note = Notification(
            msg.event_id, msg.event, msg.sub_ids, msg.publish_time, wall, msg.key, msg.rank, msg.tag, msg.payload
        )
        subs = self.subscriptions
        takers = tuple(sid for sid in dict.fromkeys(msg.sub_ids) if sid in subs)
        group = bool(msg.tag) and any(subs[sid].group for sid in takers)
        if not group and takers:  # rule 9
            recent = self._recent
            had = recent.get(msg.event_id)
            if had is not None:
                fresh = tuple(sid for sid in takers if sid not in had)
                if len(fresh) < len(takers):
                    self.duplicates += len(takers) - len(fresh)
                    if not fresh:
                        if msg.tag:  # an untagged Notify is not answered (deliveries rule 1)
                            self._ack(cm.Ack(msg.event_id, 0.0, msg.tag))
                        return []
                    takers = fresh
                recent[msg.event_id] = had + takers
            else:
                recent[msg.event_id] = takers
                if len(recent) > RECENT_EVENTS:
                    recent.popitem(last=False)
        self._ack(self.deliveries.arrived(note, len(takers), group=group, conn=self.conn, now=now))
        return [Delivered(note, takers)] if takers else []

    def _answered(
        self, msg: cm.PubAck | cm.SubAck | cm.UnsubAck | cm.AdminReply | cm.Choke | cm.Error, now: float
    ) -> list[Event]:
        answered = self.requests.answer(msg.seq, msg, now)
        assert answered is not None  # the caller checked msg.seq in self.requests
        req, outcome = answered
        if isinstance(msg, cm.Choke) and req.retry:
            self.chokes += 1
        if isinstance(outcome, float):
            return []  # paused: sent again by tick
        return self._settled(req, outcome)

    def _settled(self, req: Request, outcome: cm.ClientMessage | Exception) -> list[Event]:
        """``req`` is done: its event, and what it means for the re-subscribe list."""
        if req.internal:  # rule 4
            sub_id = self._resubscribing.pop(req.id, "")
            if isinstance(outcome, Exception) and self.subscriptions.pop(sub_id, None) is not None:
                return [SubscriptionLost(sub_id, self._resubscribe_error(sub_id, outcome))]
            return []
        if isinstance(outcome, Exception):
            self._drop_spec(req)
            return [Failed(req.id, outcome)]
        spec = self.subscriptions.get(req.sub_id)
        if isinstance(outcome, cm.SubAck) and spec is not None and spec.request == req.id:
            spec.acked = True
            spec.request = 0
        return [Replied(req.id, outcome)]

    def _drop_spec(self, req: Request) -> None:
        """A caller's Subscribe that failed or was given up: not a subscription of ours."""
        spec = self.subscriptions.get(req.sub_id)
        if isinstance(req.message, cm.Subscribe) and spec is not None and spec.request == req.id:
            del self.subscriptions[req.sub_id]

    def _resubscribe_error(self, sub_id: str, exc: Exception) -> OverlayError:
        if isinstance(exc, OverlayError):
            return exc
        return ConnectionLost(f"node {self.node_id} did not take subscription {sub_id!r} back after a reconnect: {exc}")

    def _node_error(self, msg: cm.Error) -> OverlayError:
        if msg.code == cm.ErrorCode.SLOW_CONSUMER:  # fatal: the node disconnects us (overlay.limits.budget)
            return SlowConsumerError("", node_id=self.node_id, disconnected=msg.fatal, reason=msg.message)
        return RequestError(msg.code, msg.message, msg.position)
