"""Peer messages of initialisation and routing (SPEC §9, types 1–5): the
routing table handed to a new node, subscriptions and events on their way
to a channel's owner, notifications on their way back, and the receipts of
both.

Rules this module keeps:

1. ``Subscription``, ``UnSubscription`` and ``Event`` carry their
   ``dispatch_sign`` (SPEC §4): NEW from the access node, DISPATCHED once
   routed; ``hops`` bounds a routing loop while tables settle.
2. An event's payload is opaque bytes carried unchanged on every path the
   event takes (``Notification.payload`` included) and never matched.
3. A ``NotificationAck``'s ``code`` (``AckCode``) names the leg it is; the
   empty code is the access node's answer to the owner.
4. A routing-table entry travels as a ``RouteItem`` at its version;
   version 0 is older than anything a table holds (channels.routing_table
   rule 4).
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from overlay.channels.channel import ChannelId
from overlay.channels.predicates import Filter
from overlay.channels.routing_table import RouteEntry, Version
from overlay.channels.schema import Value
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages.peer_base import (
    MAX_TABLE_ITEMS,
    DispatchSign,
    Hops,
    Ident,
    NodeId,
    NodeOrNone,
    PeerMessage,
    Rank,
    Weight,
)

__all__ = [
    "AckCode",
    "ChannelVersion",
    "Event",
    "EventsDelivered",
    "EventsMatched",
    "Notification",
    "NotificationAck",
    "ReplyRoutingTableInit",
    "RouteItem",
    "RoutingTableInit",
    "Subscription",
    "SubscriptionApplied",
    "UnSubscription",
]


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
    hops: Hops = 0
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
    hops: Hops = 0
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
    hops: Hops = 0  # re-routes so far; bounds a routing loop while tables settle
    key: Ident = ""  # sequence key (SPEC §10); "" = unordered
    rank: Rank = 0  # rank within the key, assigned by the key's home node
    home: NodeOrNone = -1  # the key's home node, told when delivery completes
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
    rank: Rank = 0
    home: NodeOrNone = -1
    # The publisher's access node (the event's ``access_node``): the receiving
    # access node tells it the notification arrived (``EventsDelivered``).
    # -1: not tracked (an older peer).
    origin: NodeOrNone = -1
    # Every other access node the owner sent this event's notifications to
    # (this one included), when the owner leaves its match report to them:
    # the receiving node tells ``origin`` in an ``EventsMatched`` naming
    # these nodes, and that report counts as its own confirmation too
    # (``node.outbox`` rule 2).  Empty: the owner reports the match itself,
    # this node only confirms (``EventsDelivered``).
    confirm: tuple[NodeId, ...] = ()
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
