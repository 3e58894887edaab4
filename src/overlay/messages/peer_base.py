"""What every node-to-node message is made of: the base class, the bounded
field types and the signs (SPEC §9).  The messages themselves are in
``handshake``, ``routing``, ``migration``, ``recovery`` and ``keyhome``; the
union of them all and the queue each takes are in ``overlay.messages.peer``.

Rules this module keeps:

1. Every peer message subclasses ``PeerMessage``: a frozen, tagged,
   array-like ``msgspec.Struct`` whose tag is its class name, so a message
   may move between modules without any change on the wire.
2. New fields go at the end, with defaults, so older peers still decode.
3. Every number and string a peer sends is bounded in its type (``NodeId``,
   ``Load``, ``Ident``, …): an absurd value (NaN, ±inf, 1e308, a megabyte of
   name) fails at the codec, never deeper in a node (SPEC §16).  A sentinel
   too: a node id where -1 means none is a ``NodeOrNone``, not a plain int
   (tests/test_peer_bounds.py).
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

import msgspec

from overlay.messages.client import MAX_RANK

__all__ = [
    "MAX_TABLE_ITEMS",
    "Capacity",
    "Counter",
    "Digest",
    "DispatchSign",
    "Hops",
    "Ident",
    "Load",
    "NodeId",
    "NodeOrNone",
    "PeerMessage",
    "Port",
    "Rank",
    "ReforwardSign",
    "ReplySign",
    "SubscriptionType",
    "Weight",
]

NodeId = Annotated[int, msgspec.Meta(ge=0, le=65535)]
# A node id where -1 means none (a key's home not told, an origin not tracked,
# no dead node): a sentinel, bounded as the ids it stands beside.
NodeOrNone = Annotated[int, msgspec.Meta(ge=-1, le=65535)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
# Re-routes of a message so far: node.router and node.keyhome stop it at
# MAX_HOPS (4); the bound is far above, for the codec only.
Hops = Annotated[int, msgspec.Meta(ge=0, le=255)]
# Counters a node numbers its own things with (sessions, slices): never negative.
Counter = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
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
