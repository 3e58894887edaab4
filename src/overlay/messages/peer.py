"""Messages between nodes: the 16 of SPEC §9 and what a deployment adds —
the union a peer decoder accepts, and the queue each message travels on.

The messages are defined by what they are for, and re-exported here, where
every importer finds them: ``peer_base`` (the base class, bounded field
types, signs), ``handshake`` (opening a link), ``routing`` (types 1–5 and
receipts), ``migration`` (types 6–16 and what a moving channel takes
along), ``recovery`` (heartbeats, anti-entropy, rebuild) and ``keyhome``
(a key's sequencer state on its backup).

Rules this module keeps:

1. ``PeerUnion`` is every message a peer may send; a type outside it fails
   at the codec.  Tags are class names (``peer_base`` rule 1): where a
   class is defined is no part of the wire.
2. ``HIGH`` names the types that travel on the high-priority queues (SPEC
   §1.1): RoutingTableInit and its reply, LIEM, and every
   load-balancing/migration message (types 7–16), heartbeats, key
   replication and anti-entropy.  Every other type takes the normal queue.
3. ``BATCHED`` names the normal-queue types a link may carry several of in
   one ``Batch`` frame (``net.peer_link`` rule 7); a Batch holds nothing
   else, and never another Batch.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages.handshake import LinkAck, Nonce, PeerAuth, PeerChallenge, PeerError, PeerHello, PeerProof, Proof
from overlay.messages.keyhome import KeyAsk, KeyCopy, KeyOp, KeySync, KeySynced
from overlay.messages.migration import (
    LIEM,
    ChannelSpec,
    ChannelSubscriptions,
    ChannelTransfer,
    CompleteLoadBalance,
    CopyInFlight,
    DeliveryHandover,
    GroupChoice,
    GroupTries,
    PastOwner,
    Reforward,
    ReforwardItem,
    ReplyChannelTransfer,
    ReplyRequestLoadBalance,
    ReplySubscriptionMove,
    ReplyUpdateGlobal,
    RequestLoadBalance,
    SubscriptionMove,
    TrackedDelivery,
    UpdateRoutingTable,
)
from overlay.messages.peer_base import (
    MAX_TABLE_ITEMS,
    Capacity,
    Digest,
    DispatchSign,
    Ident,
    Load,
    NodeId,
    PeerMessage,
    Rank,
    ReforwardSign,
    ReplySign,
    SubscriptionType,
    Weight,
)
from overlay.messages.recovery import DeadNode, Heartbeat, Rebuild, TableReply, TableRequest
from overlay.messages.routing import (
    AckCode,
    ChannelVersion,
    Event,
    EventsDelivered,
    EventsMatched,
    Notification,
    NotificationAck,
    ReplyRoutingTableInit,
    RouteItem,
    RoutingTableInit,
    Subscription,
    SubscriptionApplied,
    UnSubscription,
)

__all__ = [
    "BATCHED",
    "HIGH",
    "LIEM",
    "MAX_BATCH_ITEMS",
    "MAX_TABLE_ITEMS",
    "AckCode",
    "Batch",
    "Batched",
    "Capacity",
    "ChannelSpec",
    "ChannelSubscriptions",
    "ChannelTransfer",
    "ChannelVersion",
    "CompleteLoadBalance",
    "CopyInFlight",
    "DeadNode",
    "DeliveryHandover",
    "Digest",
    "DispatchSign",
    "Event",
    "EventsDelivered",
    "EventsMatched",
    "GroupChoice",
    "GroupTries",
    "Heartbeat",
    "Ident",
    "KeyAsk",
    "KeyCopy",
    "KeyOp",
    "KeySync",
    "KeySynced",
    "LinkAck",
    "Load",
    "NodeId",
    "Nonce",
    "Notification",
    "NotificationAck",
    "PastOwner",
    "PeerAuth",
    "PeerChallenge",
    "PeerError",
    "PeerHello",
    "PeerMessage",
    "PeerProof",
    "PeerUnion",
    "Proof",
    "Rank",
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
    "StoredSubscription",
    "Subscription",
    "SubscriptionApplied",
    "SubscriptionMove",
    "SubscriptionType",
    "TableReply",
    "TableRequest",
    "TrackedDelivery",
    "UnSubscription",
    "UpdateRoutingTable",
    "Weight",
    "is_high",
]
# The field types and StoredSubscription (what SubscriptionMove and Rebuild
# carry) are named here too, for the importers that build messages.


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
