"""Peer messages of monitoring, load balancing and migration (SPEC §6 and
§8, types 6–16), and what a moving channel takes along: its subscriptions,
its group dispatch state and the deliveries it still tracks.

Rules this module keeps:

1. Every message of a balancing session carries the session's number: the
   receiver keys its state by sender and session (``node.arrivals``), so
   two sessions between the same nodes never mix.
2. A channel names the nodes it left lately (``ChannelSpec.past_owners``),
   so balancing does not send it back (``node.balancing`` rule 7).
3. A channel's group dispatch state and choices travel with its
   subscriptions (``ChannelSubscriptions``) and its tracked deliveries in
   ``DeliveryHandover`` (``node.groups`` rules 9 and 10): shares, choices
   and retries continue on the receiver.
4. ``Reforward`` carries what reached the sender for a moved channel after
   the move, in arrival order (SPEC §8.2).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from overlay.channels.channel import ChannelId
from overlay.channels.groups import GroupState
from overlay.channels.routing_table import Version
from overlay.channels.space import EventSpace
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages.peer_base import (
    MAX_TABLE_ITEMS,
    Capacity,
    Counter,
    Ident,
    Load,
    NodeId,
    NodeOrNone,
    PeerMessage,
    ReforwardSign,
    ReplySign,
    SubscriptionType,
)
from overlay.messages.routing import Event, RouteItem, Subscription, UnSubscription

__all__ = [
    "LIEM",
    "ChannelSpec",
    "ChannelSubscriptions",
    "ChannelTransfer",
    "CompleteLoadBalance",
    "CopyInFlight",
    "DeliveryHandover",
    "GroupChoice",
    "GroupTries",
    "PastOwner",
    "Reforward",
    "ReforwardItem",
    "ReplyChannelTransfer",
    "ReplyRequestLoadBalance",
    "ReplySubscriptionMove",
    "ReplyUpdateGlobal",
    "RequestLoadBalance",
    "SubscriptionMove",
    "TrackedDelivery",
    "UpdateRoutingTable",
]


class PastOwner(msgspec.Struct, frozen=True, array_like=True):
    """A node a channel left, and when (the sender's clock)."""

    node: NodeId
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


# -- 6: monitoring ---------------------------------------------------------------------


class LIEM(PeerMessage, frozen=True):
    broker_id: NodeId
    broker_status: Ident
    broker_d: Load
    broker_dc: Load
    capacity: Capacity
    slice_no: Counter = 0


# -- 7–16: load balancing and migration ---------------------------------------------------


class RequestLoadBalance(PeerMessage, frozen=True):
    broker_d: Load
    broker_dc: Load
    session: Counter = 0
    forced: bool = False  # an operator's move: accepted whatever the receiver's state


class ReplyRequestLoadBalance(PeerMessage, frozen=True):
    status: ReplySign
    session: Counter = 0
    reason: str = ""


class ChannelTransfer(PeerMessage, frozen=True):
    channels: tuple[ChannelSpec, ...]
    session: Counter = 0


class ReplyChannelTransfer(PeerMessage, frozen=True):
    reply_sign: ReplySign
    channel_ids: tuple[ChannelId, ...]
    session: Counter = 0
    reason: str = ""


class SubscriptionMove(PeerMessage, frozen=True):
    subscription_type: SubscriptionType
    ch_sub_set: tuple[ChannelSubscriptions, ...]
    session: Counter = 0


class ReplySubscriptionMove(PeerMessage, frozen=True):
    session: Counter = 0


class UpdateRoutingTable(PeerMessage, frozen=True):
    delete_chs: tuple[ChannelId, ...]
    update_chs: tuple[RouteItem, ...]
    session: Counter = 0
    origin: NodeId = 0
    # >= 0: the channels of ``update_chs`` are recovered from this dead node
    # (``node.recovery``): each new owner starts them empty and every access
    # node sends it its clients' subscriptions (``Rebuild``).
    dead: NodeOrNone = -1
    # The version of each deletion of ``delete_chs``, in order (the versions
    # of the updates are in their RouteItems); missing: 0, older than anything.
    delete_versions: Annotated[tuple[Version, ...], msgspec.Meta(max_length=MAX_TABLE_ITEMS)] = ()


class ReplyUpdateGlobal(PeerMessage, frozen=True):
    session: Counter = 0
    origin: NodeId = 0


class CompleteLoadBalance(PeerMessage, frozen=True):
    session: Counter = 0
    aborted: bool = False  # the sender rolled back: drop what the session added
    reason: str = ""  # why it was aborted, for the receiver's log


class DeliveryHandover(PeerMessage, frozen=True):
    """A moved channel's sender → its receiver, at <3> (``node.groups`` rule
    10): the deliveries of channel ``ch_id`` it still tracked, now the
    receiver's, and the group choices as they stand (taken since the
    SubscriptionMove, or not).  One or more per channel, each at most half
    a frame (events carry payloads)."""

    session: Counter
    ch_id: ChannelId
    deliveries: tuple[TrackedDelivery, ...]
    choices: tuple[GroupChoice, ...] = ()


class ReforwardItem(msgspec.Struct, frozen=True, array_like=True):
    sign: ReforwardSign
    message: Subscription | UnSubscription | Event


class Reforward(PeerMessage, frozen=True):
    ch_id: ChannelId
    messages: tuple[ReforwardItem, ...]
    session: Counter = 0


# -- what a moving channel's deliveries take along (node.groups rules 9 and 10) ----------


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
