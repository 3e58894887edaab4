"""Messages between nodes: the 16 of SPEC §9 and what a deployment adds.

Every message is a frozen, tagged, array-like ``msgspec.Struct``; new fields
go at the end with defaults so older peers still decode.  ``HIGH`` names the
types that travel on the high-priority queues (SPEC §1.1): RoutingTableInit
and its reply, LIEM, and every load-balancing/migration message (types 7–16).
``BATCHED`` names the normal-queue types a link may carry several of in one
``Batch`` frame (``net.peer_link`` rule 7); a Batch holds nothing else, and
never another Batch.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

import msgspec

from overlay.channels.channel import ChannelId
from overlay.channels.groups import GroupState
from overlay.channels.predicates import Filter
from overlay.channels.routing_table import RouteEntry, Version
from overlay.channels.schema import Value
from overlay.channels.space import EventSpace
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages.client import MAX_RANK

__all__ = [
    "BATCHED",
    "HIGH",
    "LIEM",
    "MAX_BATCH_ITEMS",
    "AckCode",
    "Batch",
    "Batched",
    "ChannelSpec",
    "ChannelSubscriptions",
    "ChannelTransfer",
    "ChannelVersion",
    "CompleteLoadBalance",
    "CopyInFlight",
    "DeadNode",
    "DeliveryHandover",
    "DispatchSign",
    "Event",
    "EventsDelivered",
    "EventsMatched",
    "GroupChoice",
    "GroupTries",
    "Heartbeat",
    "KeyAsk",
    "KeyCopy",
    "KeyOp",
    "KeySync",
    "KeySynced",
    "LinkAck",
    "Notification",
    "NotificationAck",
    "PastOwner",
    "PeerAuth",
    "PeerChallenge",
    "PeerError",
    "PeerHello",
    "PeerMessage",
    "PeerProof",
    "Rebuild",
    "Reforward",
    "ReforwardItem",
    "ReforwardSign",
    "ReplyChannelTransfer",
    "ReplyRequestLoadBalance",
    "ReplyRoutingTableInit",
    "ReplySign",
    "ReplySubscriptionMove",
    "ReplyUpdateGlobal",
    "RequestLoadBalance",
    "RouteItem",
    "RoutingTableInit",
    "Subscription",
    "SubscriptionApplied",
    "SubscriptionMove",
    "SubscriptionType",
    "TableReply",
    "TableRequest",
    "TrackedDelivery",
    "UnSubscription",
    "UpdateRoutingTable",
    "is_high",
]

NodeId = Annotated[int, msgspec.Meta(ge=0, le=65535)]
# Loads, load levels and capacities: finite and non-negative (NaN fails both
# bounds), so one absurd LIEM cannot poison a monitor's mean (SPEC §16).
Load = Annotated[float, msgspec.Meta(ge=0, le=1e300)]
Capacity = Annotated[float, msgspec.Meta(ge=0, le=1e12)]
# A group instance's static weight (overlay.channels.groups.MAX_WEIGHT).
Weight = Annotated[float, msgspec.Meta(gt=0, le=1_000_000.0)]
Rank = Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK)]
# Bounds on identifiers that come from clients and are echoed in every hop.
Ident = Annotated[str, msgspec.Meta(max_length=256)]
# Channels named by one anti-entropy message (node.table_sync): far more than
# a cluster's table holds; the frame cap binds first.
MAX_TABLE_ITEMS: Final = 100_000
Digest = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]  # channels.routing_table rule 9


class DispatchSign(enum.StrEnum):
    SUBSCRIBE_NEW = "SUBSCRIBE_NEW"
    SUBSCRIBE_DISPATCHED = "SUBSCRIBE_DISPATCHED"
    UNSUBSCRIBE_NEW = "UNSUBSCRIBE_NEW"
    UNSUBSCRIBE_DISPATCHED = "UNSUBSCRIBE_DISPATCHED"
    EVENT_NEW = "EVENT_NEW"
    EVENT_DISPATCHED = "EVENT_DISPATCHED"


class ReplySign(enum.StrEnum):
    REPLY_SUCCESS = "REPLY_SUCCESS"
    REPLY_FAIL = "REPLY_FAIL"


class SubscriptionType(enum.StrEnum):
    ATOMIC = "atomic"
    COMPOSITE = "composite"


class ReforwardSign(enum.StrEnum):
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    EVENT_MESSAGE = "EVENT_MESSAGE"


class PeerMessage(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Base of every node-to-node message."""


class RouteItem(msgspec.Struct, frozen=True, array_like=True):
    ch_id: ChannelId
    entry: RouteEntry
    # The entry's version (channels.routing_table rule 4); 0: none (an old
    # peer's, or forged), never newer than anything a table holds.
    version: Version = 0


class ChannelVersion(msgspec.Struct, frozen=True, array_like=True):
    """A channel id and a version: a tombstone (the channel was deleted at
    that version), or what a TableRequest says its sender holds."""

    ch_id: ChannelId
    version: Version


class PastOwner(msgspec.Struct, frozen=True, array_like=True):
    """A node a channel left, and when (the sender's clock)."""

    node: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    left: float


class ChannelSpec(msgspec.Struct, frozen=True, array_like=True):
    """A channel as ChannelTransfer names it: id and space, and the nodes it
    left lately, so balancing does not send it back (node.balancing rule 7)."""

    ch_id: ChannelId
    space: EventSpace
    past_owners: tuple[PastOwner, ...] = ()


class ChannelSubscriptions(msgspec.Struct, frozen=True, array_like=True):
    """One channel's subscriptions in a SubscriptionMove."""

    ch_id: ChannelId
    subscriptions: tuple[StoredSubscription, ...]
    # The channel's group dispatch state (SPEC §11): shares continue after the move.
    groups: tuple[GroupState, ...] = ()
    # Which instance each of its events went to lately (node.groups rule 9):
    # an event reforwarded or re-sent goes to the same one on the receiver.
    choices: tuple[GroupChoice, ...] = ()


# -- membership and errors ------------------------------------------------------


class PeerHello(PeerMessage, frozen=True):
    """First frame on a peer link: who is calling, and whether it holds a table."""

    node_id: NodeId
    cluster: Ident
    has_routing_table: bool = False
    # The caller's address, so a node that does not know it can add it (a node
    # joining a running cluster, overlay.node.membership rule 5).  Optional
    # and trailing: an old peer's hello still decodes.
    host: str = ""
    port: int = 0
    admin_port: int = 0
    capacity: Capacity = 0.0
    # The caller drained and is leaving: drop it from the peers (node.membership rule 6).
    leaving: bool = False
    # This run of the caller's process (its start time in ms): a new value means
    # it restarted, and what was queued for or held on behalf of the old run
    # is stale (node.core rule 7).  0: unknown (tests, the simulator).
    incarnation: Annotated[int, msgspec.Meta(ge=0)] = 0
    # The epoch of the caller's table (node.boot rule 3), when it holds one.
    epoch: Annotated[int, msgspec.Meta(ge=0)] = 0
    # In the callee's answering hello: how many frames it has received from
    # the caller's current run on earlier connections of this link; the
    # caller sends again what it wrote after those (net.peer_link rule 6).
    received: Annotated[int, msgspec.Meta(ge=0)] = 0


class LinkAck(PeerMessage, frozen=True):
    """The receiving end of a peer link → its sender, on the same connection:
    this many frames of the sender's current run have arrived (net.peer_link
    rule 6).  Never reaches a node core."""

    received: Annotated[int, msgspec.Meta(ge=0)]


class PeerError(PeerMessage, frozen=True):
    """The sender refuses something we sent; the link is closed after it."""

    code: Ident
    message: str


# Without TLS (``[tls] insecure = true``) a peer link opens with a
# challenge–response on the cluster secret before the hello
# (``overlay.security.peer_auth``): the caller's PeerAuth, the callee's
# PeerChallenge, the caller's PeerProof.  None reaches a node core.
Nonce = Annotated[bytes, msgspec.Meta(min_length=16, max_length=64)]
Proof = Annotated[bytes, msgspec.Meta(min_length=32, max_length=64)]


class PeerAuth(PeerMessage, frozen=True):
    """Caller → callee, first frame: who calls, for which cluster, and a fresh nonce."""

    node_id: NodeId
    cluster: Ident
    nonce: Nonce


class PeerChallenge(PeerMessage, frozen=True):
    """Callee → caller: its own nonce, and its proof of the secret over both nonces."""

    node_id: NodeId
    nonce: Nonce
    proof: Proof


class PeerProof(PeerMessage, frozen=True):
    """Caller → callee: the caller's proof of the secret over both nonces."""

    proof: Proof


# -- 1–2: initialisation ----------------------------------------------------------


class RoutingTableInit(PeerMessage, frozen=True):
    routing_table: tuple[RouteItem, ...]
    # The table's epoch: the initializer's incarnation when it created it (node.boot rule 3).
    epoch: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Not the initializer's offer but a running node's answer to a hello
    # without a table (node.boot rule 1): adopted or merged, never replied to.
    sync: bool = False
    # The latest tombstones (channels.routing_table rule 8), at most
    # ``node.boot.INIT_TOMBSTONES``: a node adopting the table never re-uses
    # their ids, nor takes their entries back from a peer behind.
    deleted: Annotated[tuple[ChannelVersion, ...], msgspec.Meta(max_length=MAX_TABLE_ITEMS)] = ()


class ReplyRoutingTableInit(PeerMessage, frozen=True):
    node_id: NodeId = 0


# -- 3–5: routing -------------------------------------------------------------------


class Subscription(PeerMessage, frozen=True):
    sub_id: Ident
    sub_exp: Filter
    subscriber: Ident
    access_node: NodeId
    dispatch_sign: DispatchSign
    ch_id: ChannelId | None = None
    hops: int = 0
    group: Ident = ""  # subscriber group (SPEC §11); "" = none
    weight: Weight = 1.0  # the instance's static weight Ws in its group
    # Which try of its access node this copy is (node.sessions rule 6): the
    # answer carries it back, and an answer to an earlier try is ignored.
    attempt: Annotated[int, msgspec.Meta(ge=0)] = 0

    def stored(self) -> StoredSubscription:
        return StoredSubscription(self.sub_id, self.sub_exp, self.subscriber, self.access_node, self.group, self.weight)


class UnSubscription(PeerMessage, frozen=True):
    sub_id: Ident
    unsub_exp: Filter
    unsubscriber: Ident
    access_node: NodeId
    dispatch_sign: DispatchSign
    ch_id: ChannelId | None = None
    hops: int = 0
    attempt: Annotated[int, msgspec.Meta(ge=0)] = 0  # as in Subscription


class SubscriptionApplied(PeerMessage, frozen=True):
    """Owner → access node: a (un)subscription took effect on ``ch_id``, so the
    access node can acknowledge its client once every channel has answered."""

    sub_id: Ident
    ch_id: ChannelId
    subscribe: bool
    # Non-empty when ch_id was no longer at the sender and the message went on
    # to these channels instead: the access node waits for them in its place.
    rerouted_to: tuple[ChannelId, ...] = ()
    attempt: Annotated[int, msgspec.Meta(ge=0)] = 0  # the copy's (node.sessions rule 6)


class Event(PeerMessage, frozen=True):
    event_id: Ident
    event_exp: dict[str, Value]
    access_node: NodeId
    dispatch_sign: DispatchSign
    ch_id: ChannelId | None = None
    publish_time: float = 0.0  # publisher's wall clock, for publish→notify latency
    hops: int = 0  # re-routes so far; bounds a routing loop while tables settle
    key: Ident = ""  # sequence key (SPEC §10); "" = unordered
    rank: Rank = 0  # rank within the key, assigned by the key's home node
    home: int = -1  # the key's home node, told when delivery completes
    # The publisher's opaque payload, carried unchanged on every path the
    # event takes (Reforward, re-sends, key hand-overs) and never matched.
    payload: bytes = b""


class Notification(PeerMessage, frozen=True):
    """Owner → a subscriber's access node: ``event_id`` matched ``sub_ids``."""

    event_id: Ident
    event_exp: dict[str, Value]
    sub_ids: tuple[Ident, ...]
    ch_id: ChannelId
    publish_time: float = 0.0
    key: Ident = ""
    rank: int = 0
    home: int = -1
    # The publisher's access node (the event's ``access_node``): the receiving
    # access node tells it the notification arrived (``EventsDelivered``).
    # -1: not tracked (an older peer).
    origin: int = -1
    # Every other access node the owner sent this event's notifications to
    # (this one included), when the owner leaves its match report to them:
    # the receiving node tells ``origin`` in an ``EventsMatched`` naming
    # these nodes, and that report counts as its own confirmation too
    # (``node.outbox`` rule 2).  Empty: the owner reports the match itself,
    # this node only confirms (``EventsDelivered``).
    confirm: tuple[int, ...] = ()
    payload: bytes = b""  # the event's payload (``Event.payload``)


class AckCode(enum.StrEnum):
    """The leg a ``NotificationAck`` is (its ``code``; a member is its string)."""

    DELIVERY = ""  # access node -> owner: the notification reached the clients, or failed
    COMPLETE = "complete"  # owner -> the key's home: release the next rank
    SEQUENCED = "sequenced"  # home -> access node: the keyed event is accepted (PubAck)
    ACKED = "acked"  # access node -> owner, batched: (event id, sub id) pairs of plain subscribers
    UNDELIVERABLE = "undeliverable"  # owner -> access node: no instance of the group could take it


class NotificationAck(PeerMessage, frozen=True):
    """The outcome of a tracked delivery (ordered events, group instances).

    ``code`` says which leg it is (``overlay.node.groups``, ``overlay.node.ordering``):

    * ``""`` — access node → owner: the notification reached the clients of
      ``sub_ids`` (or failed / timed out: ``failed``), with their ``lf``;
    * ``"complete"`` — owner → the key's home: every matched subscriber of the
      ordered event acknowledged (or none matched), release the next rank;
    * ``"sequenced"`` — home → access node: the keyed event was accepted by the
      home's sequencer (the access node answers its publisher with PubAck);
      a refusal carries the client error code (``duplicate_rank`` …) and ``failed``;
    * ``"undeliverable"`` — owner → access node: no instance of group
      ``detail`` could take the event; the publisher is told.
    """

    event_id: Ident
    sub_ids: tuple[Ident, ...]
    lf: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0  # the subscriber's load factor from its ack (SPEC §11)
    failed: bool = False  # the delivery failed or timed out (fault surveillance)
    code: Ident = ""
    detail: str = ""


# -- 6: monitoring ---------------------------------------------------------------------


class LIEM(PeerMessage, frozen=True):
    broker_id: NodeId
    broker_status: Ident
    broker_d: Load
    broker_dc: Load
    capacity: Capacity
    slice_no: int = 0


# -- 7–16: load balancing and migration ---------------------------------------------------


class RequestLoadBalance(PeerMessage, frozen=True):
    broker_d: Load
    broker_dc: Load
    session: int = 0
    forced: bool = False  # an operator's move: accepted whatever the receiver's state


class ReplyRequestLoadBalance(PeerMessage, frozen=True):
    status: ReplySign
    session: int = 0
    reason: str = ""


class ChannelTransfer(PeerMessage, frozen=True):
    channels: tuple[ChannelSpec, ...]
    session: int = 0


class ReplyChannelTransfer(PeerMessage, frozen=True):
    reply_sign: ReplySign
    channel_ids: tuple[ChannelId, ...]
    session: int = 0
    reason: str = ""


class SubscriptionMove(PeerMessage, frozen=True):
    subscription_type: SubscriptionType
    ch_sub_set: tuple[ChannelSubscriptions, ...]
    session: int = 0


class ReplySubscriptionMove(PeerMessage, frozen=True):
    session: int = 0


class UpdateRoutingTable(PeerMessage, frozen=True):
    delete_chs: tuple[ChannelId, ...]
    update_chs: tuple[RouteItem, ...]
    session: int = 0
    origin: NodeId = 0
    # >= 0: the channels of ``update_chs`` are recovered from this dead node
    # (``node.recovery``): each new owner starts them empty and every access
    # node sends it its clients' subscriptions (``Rebuild``).
    dead: int = -1
    # The version of each deletion of ``delete_chs``, in order (the versions
    # of the updates are in their RouteItems); missing: 0, older than anything.
    delete_versions: Annotated[tuple[Version, ...], msgspec.Meta(max_length=MAX_TABLE_ITEMS)] = ()


class ReplyUpdateGlobal(PeerMessage, frozen=True):
    session: int = 0
    origin: NodeId = 0


class CompleteLoadBalance(PeerMessage, frozen=True):
    session: int = 0
    aborted: bool = False  # the sender rolled back: drop what the session added
    reason: str = ""  # why it was aborted, for the receiver's log


class DeliveryHandover(PeerMessage, frozen=True):
    """A moved channel's sender → its receiver, at <3> (``node.groups`` rule
    10): the deliveries of channel ``ch_id`` it still tracked, now the
    receiver's, and the group choices as they stand (taken since the
    SubscriptionMove, or not).  One or more per channel, each at most half
    a frame (events carry payloads)."""

    session: int
    ch_id: ChannelId
    deliveries: tuple[TrackedDelivery, ...]
    choices: tuple[GroupChoice, ...] = ()


class ReforwardItem(msgspec.Struct, frozen=True, array_like=True):
    sign: ReforwardSign
    message: Subscription | UnSubscription | Event


class Reforward(PeerMessage, frozen=True):
    ch_id: ChannelId
    messages: tuple[ReforwardItem, ...]
    session: int = 0


# -- failures (SPEC §16): heartbeats, recovery of a dead node's channels, event receipts ------


class DeadNode(msgspec.Struct, frozen=True, array_like=True):
    """A node a majority declared dead, in the run (incarnation) it died in."""

    node: NodeId
    incarnation: Annotated[int, msgspec.Meta(ge=0)] = 0


class Heartbeat(PeerMessage, frozen=True):
    """Every ``heartbeat_interval`` to every peer, on the high queue
    (``node.liveness``): the sender is alive, whom it suspects, and whom a
    majority declared dead (a node listed there in its current run learns it
    was declared dead and rejoins empty)."""

    incarnation: Annotated[int, msgspec.Meta(ge=0)] = 0
    suspects: tuple[NodeId, ...] = ()
    dead: tuple[DeadNode, ...] = ()
    # The sender's table may have been rebuilt after a death: its number of
    # deaths seen, so a node behind learns it (informational).
    deaths: Annotated[int, msgspec.Meta(ge=0)] = 0
    # The quorum lease (node.liveness rule 4): the sender's clock when it
    # sent this, and the latest such ``sent`` it had from the recipient — a
    # value of the recipient's own clock, so no clocks need to agree.  -1: none.
    sent: Annotated[float, msgspec.Meta(ge=-1.0, le=1e12)] = -1.0
    echo: Annotated[float, msgspec.Meta(ge=-1.0, le=1e12)] = -1.0
    # Anti-entropy (node.table_sync rule 1): the digest of the sender's
    # routing table (channels.routing_table rule 9; 0: it holds none) and its
    # clock (rule 5), so a peer whose table differs fetches what it lacks.
    table_digest: Digest = 0
    table_clock: Annotated[int, msgspec.Meta(ge=0, lt=1 << 31)] = 0


class TableRequest(PeerMessage, frozen=True):
    """Anti-entropy (``node.table_sync`` rule 2): the sender's table differs
    from the recipient's; ``have`` is every channel it holds, at its version
    (at most what fits half a frame), so the answer carries only what differs."""

    request: Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
    epoch: Annotated[int, msgspec.Meta(ge=0)]
    digest: Digest
    have: Annotated[tuple[ChannelVersion, ...], msgspec.Meta(max_length=MAX_TABLE_ITEMS)] = ()


class TableReply(PeerMessage, frozen=True):
    """The answer to a TableRequest, in chunks under the frame cap (``last`` on
    the final one): the entries the requester lacks or holds at an older
    version, and tombstones of channels it holds that were deleted since."""

    request: Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
    epoch: Annotated[int, msgspec.Meta(ge=0)]
    entries: Annotated[tuple[RouteItem, ...], msgspec.Meta(max_length=MAX_TABLE_ITEMS)] = ()
    deleted: Annotated[tuple[ChannelVersion, ...], msgspec.Meta(max_length=MAX_TABLE_ITEMS)] = ()
    last: bool = True


class Rebuild(PeerMessage, frozen=True):
    """Access node → the new owner of a channel recovered from a dead node
    (``node.recovery``): the subscriptions its clients hold that overlap the
    channel, in chunks; ``last`` on the final one.  Normal queue, so on each
    link it arrives after the Subscriptions sent before it and before the
    Events sent after it."""

    ch_id: ChannelId
    subscriptions: tuple[StoredSubscription, ...]
    last: bool = True
    dead: NodeId = 0  # the node the channel was recovered from
    # Group copies of this channel's events the dead owner gave this node's
    # instances lately: a re-sent event goes to the same instance (node.groups rule 9).
    groups: tuple[GroupChoice, ...] = ()


class GroupChoice(msgspec.Struct, frozen=True, array_like=True):
    """Event ``event_id`` went to instance ``sub_id`` of ``group`` (``Rebuild.groups``);
    ``taken``: its client acked it."""

    event_id: Ident
    group: Ident
    sub_id: Ident
    taken: bool = False


class CopyInFlight(msgspec.Struct, frozen=True, array_like=True):
    """A tracked notification not answered yet (``DeliveryHandover``): the
    subscription, its access node, and its group ("": a plain subscriber of a
    keyed event)."""

    sub_id: Ident
    access_node: NodeId
    group: Ident = ""


class GroupTries(msgspec.Struct, frozen=True, array_like=True):
    """One group of a handed-over delivery: the instances tried so far, and the
    matching instances it may still go to."""

    group: Ident
    tried: tuple[Ident, ...]
    candidates: tuple[Ident, ...]


class TrackedDelivery(msgspec.Struct, frozen=True, array_like=True):
    """An event whose tracked notifications a moving channel's sender had not
    seen answered (``node.groups`` rule 10)."""

    event: Event
    waiting: tuple[CopyInFlight, ...]
    groups: tuple[GroupTries, ...] = ()


class KeyCopy(msgspec.Struct, frozen=True, array_like=True):
    """A key's state at its home (``overlay.seq`` rule 8): the sequence rank,
    the last rank assigned, and its events not complete, each with its rank
    (a long one is cut: more come as ``KeyOp.event``)."""

    key: Ident
    seq: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANK + 1)]
    last_assigned: Rank
    events: tuple[Event, ...] = ()
    # A live home handing the key over: its event of ``seq`` is out, and its
    # completion will be passed on (node.keyhome rule 7).
    released: bool = False


class KeyOp(msgspec.Struct, frozen=True, array_like=True):
    """One change of a key at its home (``node.keyhome`` rule 2): ``event``
    arrived (at its rank); every rank below ``seq`` is complete; ``copy`` is
    the whole state; ``forget``: the home forgot the key."""

    key: Ident
    event: Event | None = None
    seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK + 1)] = 0
    copy: KeyCopy | None = None
    forget: bool = False


class KeySync(PeerMessage, frozen=True):
    """A key's home → its backup, batched (``node.keyhome``; high queue): what its
    sequencer did, in order; answered ``KeySynced(no)``.  ``handover``: any
    node → a key's new home, the states it holds of the key; ``last`` on the
    final answer to a ``KeyAsk`` (node.keyhome rule 6)."""

    no: Annotated[int, msgspec.Meta(ge=0)]
    ops: tuple[KeyOp, ...]
    handover: bool = False
    last: bool = False


class KeyAsk(PeerMessage, frozen=True):
    """A new run → every member, once at its start (``node.keyhome`` rule 6):
    send me what you hold of the keys I am home of (``KeySync`` marked
    ``handover``, ``last`` on the final one, empty if you hold nothing)."""

    incarnation: Annotated[int, msgspec.Meta(ge=0)] = 0


class KeySynced(PeerMessage, frozen=True):
    """The backup holds everything of ``KeySync`` ``no`` and before (node.keyhome rule 2)."""

    no: Annotated[int, msgspec.Meta(ge=0)]


class EventsMatched(PeerMessage, frozen=True):
    """Owner → the publisher's access node, batched (``node.outbox``): these
    events were matched; ``nodes[i]`` are the other access nodes each one's
    notifications went to (each will confirm with ``EventsDelivered``)."""

    event_ids: tuple[Ident, ...]
    nodes: tuple[tuple[NodeId, ...], ...]


class EventsDelivered(PeerMessage, frozen=True):
    """A subscribers' access node → the publisher's access node, batched:
    the notifications of these events arrived here (``node.outbox``)."""

    event_ids: tuple[Ident, ...]


# -- framing: many hot-path messages in one frame (net.peer_link rule 7) --------------------

# Messages one Batch may hold on the wire: far more than a sender puts in one
# (``net.peer_link.BATCH_ITEMS``); the frame cap binds first for all but tiny ones.
MAX_BATCH_ITEMS: Final = 4096


Batched = (
    Event
    | Notification
    | NotificationAck
    | Subscription
    | UnSubscription
    | SubscriptionApplied
    | EventsMatched
    | EventsDelivered
)


class Batch(PeerMessage, frozen=True):
    """Several normal-queue messages of one link in one frame, in the order
    they were sent (``net.peer_link`` rule 7): one frame, one encode and one
    decode for a burst of events or notifications instead of one each.  Not
    a message of the protocol's own: the receiving shell hands its messages
    to the node one by one, exactly as if each had come in a frame of its
    own, and counts the Batch as one frame (rule 6)."""

    messages: Annotated[tuple[Batched, ...], msgspec.Meta(max_length=MAX_BATCH_ITEMS)]


PeerUnion = (
    PeerHello
    | PeerError
    | RoutingTableInit
    | ReplyRoutingTableInit
    | Subscription
    | UnSubscription
    | SubscriptionApplied
    | Event
    | Notification
    | NotificationAck
    | LIEM
    | RequestLoadBalance
    | ReplyRequestLoadBalance
    | ChannelTransfer
    | ReplyChannelTransfer
    | SubscriptionMove
    | ReplySubscriptionMove
    | UpdateRoutingTable
    | ReplyUpdateGlobal
    | CompleteLoadBalance
    | DeliveryHandover
    | Reforward
    | Heartbeat
    | Rebuild
    | EventsMatched
    | EventsDelivered
    | LinkAck
    | PeerAuth
    | PeerChallenge
    | PeerProof
    | KeySync
    | KeySynced
    | KeyAsk
    | TableRequest
    | TableReply
    | Batch
)

HIGH: Final[frozenset[type]] = frozenset(
    {
        PeerHello,
        PeerError,
        RoutingTableInit,
        ReplyRoutingTableInit,
        LIEM,
        RequestLoadBalance,
        ReplyRequestLoadBalance,
        ChannelTransfer,
        ReplyChannelTransfer,
        SubscriptionMove,
        ReplySubscriptionMove,
        UpdateRoutingTable,
        ReplyUpdateGlobal,
        CompleteLoadBalance,
        Reforward,
        Heartbeat,
        # A key's state on its backup (node.keyhome): a keyed event's PubAck and
        # release wait for KeySynced, so it must not queue behind the events.
        KeySync,
        KeySynced,
        KeyAsk,
        TableRequest,
        TableReply,
    }
)


# The types a link may put in a Batch: the hot path's normal-queue messages,
# each small (an event's payload is at most half a frame, a receipt message
# too).  Rebuild and DeliveryHandover stay frames of their own: large and rare.
BATCHED: Final[frozenset[type]] = frozenset(
    {
        Event,
        Notification,
        NotificationAck,
        Subscription,
        UnSubscription,
        SubscriptionApplied,
        EventsMatched,
        EventsDelivered,
    }
)


def is_high(msg: PeerMessage) -> bool:
    """SPEC §1.1: which queue a message travels on."""
    return type(msg) in HIGH
