"""Messages between a client (publisher or subscriber) and its access node.

Client → node: ``Hello``, ``Publish``, ``Subscribe``, ``Unsubscribe``, ``Ack``,
and the operator's ``Admin`` commands.  Node → client: ``Welcome``,
``PubAck``, ``PubAcks``, ``SubAck``, ``UnsubAck``, ``Notify``, ``Revoke``, ``Choke``,
``Error``, ``AdminReply``.  ``seq`` is the client's correlation number for a request;
the answer carries it back.

Versions: a client says which messages it understands in ``Hello.version``.
From ``BATCHED_ACKS`` (2) on, the node may answer several publishes in one
``PubAcks`` instead of a ``PubAck`` each; an older client (1) gets each its
own.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final

import msgspec

from overlay.channels.schema import Value

__all__ = [
    "BATCHED_ACKS",
    "MAX_RANK",
    "PROTOCOL_VERSION",
    "Ack",
    "Admin",
    "AdminReply",
    "Choke",
    "ClientMessage",
    "Error",
    "ErrorCode",
    "Hello",
    "Notify",
    "PubAck",
    "PubAcks",
    "Publish",
    "Revoke",
    "SubAck",
    "Subscribe",
    "UnsubAck",
    "Unsubscribe",
    "Welcome",
    "internal_error",
]

Ident = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# The largest explicit rank of an ordered publish (SPEC §10): ranks stay exact
# as JSON numbers (the capture, the admin page).  Larger is refused bad_rank.
MAX_RANK: Final = 2**53
# Hello.version (module docstring): the first version that takes PubAcks, and
# the one this library speaks.
BATCHED_ACKS: Final = 2
PROTOCOL_VERSION: Final = 2
Seq = Annotated[int, msgspec.Meta(ge=0)]
# An expression's text.  Its length is bounded by the frame and then by the
# parser (``MAX_EXPRESSION_LENGTH``), whose error names the position: a bound
# here made a long expression a protocol error that closed the session.
ExprText = str


class ErrorCode(StrEnum):
    """The ``code`` values of ``Error``: stable strings clients can switch on
    (a member is its string: ``ErrorCode.NOT_READY == "not_ready"``)."""

    PROTOCOL = "protocol_error"
    NOT_READY = "not_ready"
    BAD_EXPRESSION = "bad_expression"
    BAD_EVENT = "bad_event"
    UNKNOWN_SUBSCRIPTION = "unknown_subscription"
    DUPLICATE_SUBSCRIPTION = "duplicate_subscription"
    SLOW_CONSUMER = "slow_consumer"  # notifications dropped for a full queue; fatal: disconnected (limits)
    NO_ROUTE = "no_route"
    ADMIN = "admin_error"
    # Ordered delivery (SPEC §10) and subscriber groups (SPEC §11).
    BAD_RANK = "bad_rank"  # a rank without a key, or a key the sequencer refuses
    DUPLICATE_RANK = "duplicate_rank"  # the rank was already released, is in flight, or is held
    SEQUENCER_FULL = "sequencer_full"  # too many keys, or too many held events for the key
    BAD_GROUP = "bad_group"  # a weight that is not a positive finite number
    UNDELIVERABLE = "undeliverable"  # no instance of a group could take the event
    DRAINING = "draining"  # the access node drained and leaves: reconnect to another node (fatal)
    UNRESPONSIVE = "unresponsive"  # the client answered neither an ack nor a revoke in time (fatal)
    OVERLOADED = "overloaded"  # the access node holds as many unconfirmed events as it may: retry shortly
    NO_QUORUM = "no_quorum"  # the node is cut off from a majority of the cluster: retry on another node
    # Client authentication (SPEC §16, ``overlay.auth``).
    UNAUTHORIZED = (
        "unauthorized"  # no token, or a bad one (fatal at Hello); or an admin command without the admin token
    )
    FORBIDDEN = "forbidden"  # the token lacks the role, or the request lies outside its content scope
    TOKEN_EXPIRED = "token_expired"  # the session's token expired: it is closed (fatal); reconnect with a new one
    # Limits (SPEC §16, ``overlay.limits``); each message names the limit and its config key.
    TOO_MANY_CONNECTIONS = "too_many_connections"  # at Hello: the client id's (or the node's) connections (fatal)
    TOO_MANY_SUBSCRIPTIONS = "too_many_subscriptions"  # the client id holds its limit of subscriptions here
    EXPRESSION_TOO_LARGE = "expression_too_large"  # the subscription's text or predicates are over the limit
    PAYLOAD_TOO_LARGE = "payload_too_large"  # the event's payload is over [cluster] max_payload
    INTERNAL = "internal_error"  # the node failed handling the request (a bug, logged there); nothing promised


class ClientMessage(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Base of every client-protocol message."""


# The longest frame a Hello can be: its id and its token at 4 bytes of UTF-8
# per character (1 KiB and 64 KiB), and msgpack's few bytes around them.  A
# connection's first frame declaring more is no Hello, and is refused at its
# header before its body is read (``net.clients`` rule 6).
MAX_HELLO_FRAME: Final = 80 * 1024


class Hello(ClientMessage, frozen=True):
    client_id: Ident
    version: int = 1
    # A signed token (``overlay.auth``) when the cluster has ``[auth]``: the
    # session's roles and content scopes; otherwise the cluster's legacy
    # ``[cluster] admin_token``, for the commands that change the cluster.
    # Bounded by ``overlay.auth.tokens.MAX_TOKEN_LENGTH`` (scopes make it long).
    token: Annotated[str, msgspec.Meta(max_length=16 * 1024)] = ""


class Welcome(ClientMessage, frozen=True):
    node_id: int
    session: int
    ready: bool
    cluster: str = ""
    # Seconds the node waits for the answer to a tracked Notify before it
    # revokes a group copy (node.acks rule 2); the client declines copies older.
    ack_timeout: float = 0.0
    # The largest payload a Publish may carry (``[cluster] max_payload``), so
    # the client refuses a larger one before sending it; 0: not told (an older node).
    max_payload: int = 0


class Publish(ClientMessage, frozen=True):
    """``event`` is an eventExp text or an ``{attr: value}`` map."""

    seq: Seq
    event: ExprText | dict[str, Value]
    publish_time: float = 0.0
    # Ordered delivery (SPEC §10): events with the same key reach every
    # subscriber in rank order; rank 0 lets the key's home node assign one.
    key: Annotated[str, msgspec.Meta(max_length=256)] = ""
    rank: Annotated[int, msgspec.Meta(ge=0)] = 0
    # The publisher's own id for the event (unique per client id): a publish
    # re-sent with the same id — to this node or, after it died, to another —
    # is delivered once (``node.outbox``).  "": the node names it.
    event_id: Annotated[str, msgspec.Meta(max_length=128)] = ""
    # The event's opaque payload: delivered unchanged with every Notify, never
    # matched (the attributes are the routing surface).  Bounded by the frame
    # here and by ``[cluster] max_payload`` at the node (``payload_too_large``).
    payload: bytes = b""


class PubAck(ClientMessage, frozen=True):
    seq: Seq
    event_id: str


class PubAcks(ClientMessage, frozen=True):
    """Several ``PubAck``s in one frame, in the order they were given:
    ``event_ids[i]`` answers publish ``seqs[i]`` (the lists are as long as
    each other).  Sent only to a client whose Hello said ``BATCHED_ACKS``."""

    seqs: tuple[Seq, ...]
    event_ids: tuple[str, ...]


class Subscribe(ClientMessage, frozen=True):
    seq: Seq
    sub_id: Ident
    expression: ExprText
    # Subscriber groups (SPEC §11): one instance of a group gets each event.
    group: Annotated[str, msgspec.Meta(max_length=256)] = ""
    weight: float = 1.0


class SubAck(ClientMessage, frozen=True):
    seq: Seq
    sub_id: str
    channels: int = 0


class Unsubscribe(ClientMessage, frozen=True):
    seq: Seq
    sub_id: Ident


class UnsubAck(ClientMessage, frozen=True):
    seq: Seq
    sub_id: str


class Notify(ClientMessage, frozen=True):
    """An event matched the client's subscriptions ``sub_ids`` (each listed once).

    ``tag`` is non-zero when the node tracks this notification (a keyed
    event, or a group instance's copy, which comes alone): the client
    answers it with one ``Ack`` carrying the tag, once every listed
    subscription took it (``node.acks`` rule 1)."""

    event_id: str
    event: dict[str, Value]
    sub_ids: tuple[str, ...]
    publish_time: float = 0.0
    key: str = ""
    rank: int = 0
    tag: int = 0
    payload: bytes = b""  # the event's payload, as published


class Ack(ClientMessage, frozen=True):
    """Every listed subscription took the Notify (or ``declined``: it was not
    handed to the application, and the node may give it to another instance)."""

    event_id: str
    lf: float = 0.0  # the subscriber's load factor (SPEC §11), on every ack
    tag: int = 0  # the Notify's tag
    declined: bool = False


class Revoke(ClientMessage, frozen=True):
    """Give back the group copy ``tag`` if it was not handed over yet: answer
    ``Ack(tag, declined=True)``; if it was, the Ack already sent stands
    (``node.acks`` rule 2)."""

    tag: int
    event_id: str


class Choke(ClientMessage, frozen=True):
    """The node is congested: retry ``seq`` after ``delay`` seconds (SPEC §12)."""

    seq: Seq
    delay: float


class Error(ClientMessage, frozen=True):
    seq: int
    code: str
    message: str
    position: int = -1
    fatal: bool = False


class Admin(ClientMessage, frozen=True):
    """An operator command: ``command`` with JSON-like ``args``."""

    seq: Seq
    command: Ident
    args: dict[str, Any] = {}


class AdminReply(ClientMessage, frozen=True):
    seq: Seq
    result: Any


def internal_error(seq: int, request: str, exc: BaseException) -> Error:
    """The answer to a request whose handling failed on the node (a bug, which
    the node logs with its traceback): ``internal_error``, naming the failure;
    whether the request took effect is not known."""
    return Error(
        seq,
        ErrorCode.INTERNAL,
        f"the node failed handling this {request} ({type(exc).__name__}: {exc}); "
        "it is in the node's log: please report it",
    )
