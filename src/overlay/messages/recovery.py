"""Peer messages of failures (SPEC §16): heartbeats and the deaths a
majority declared, anti-entropy of the routing table, and the rebuild of a
dead node's channels on their new owners.

Rules this module keeps:

1. Heartbeats travel on the high queue; a node named in ``dead`` in its
   current run learns it was declared dead and rejoins empty
   (``node.liveness``).
2. The quorum lease compares clocks of one node only: ``echo`` is a value
   of the recipient's own clock (``node.liveness`` rule 4).
3. A ``TableRequest`` names what its sender holds, so the ``TableReply``
   carries only what differs, in chunks under the frame cap, ``last`` on
   the final one (``node.table_sync``).
4. ``Rebuild`` travels on the normal queue: on each link it arrives after
   the subscriptions sent before it and before the events sent after it
   (``node.recovery``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from overlay.channels.channel import ChannelId
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages.migration import GroupChoice
from overlay.messages.peer_base import MAX_TABLE_ITEMS, Digest, NodeId, PeerMessage
from overlay.messages.routing import ChannelVersion, RouteItem

__all__ = [
    "DeadNode",
    "Heartbeat",
    "Rebuild",
    "TableReply",
    "TableRequest",
]


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
