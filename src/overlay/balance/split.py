"""Splitting a channel into children (SPEC §8.3).

``divide`` is the mechanical part shared by the operator's split command and
the balancer: given the children's spaces, build the channels and hand each
subscription to every child it belongs to (covers or overlaps — some go to
both).  Invariant: the children's spaces partition the parent's space, and
every parent subscription that can match an event of a child is in that child.
"""

from __future__ import annotations

from collections.abc import Sequence

from overlay.channels.channel import Channel, ChannelId
from overlay.channels.space import EventSpace
from overlay.errors import LocalProtocolError

__all__ = ["divide"]


def divide(parent: Channel, parts: Sequence[tuple[ChannelId, EventSpace]]) -> list[Channel]:
    if len(parts) < 2:
        raise LocalProtocolError("a split needs at least two children")
    schema = parent.schema
    children = [Channel(chid, space, schema) for chid, space in parts]
    for sub in parent:
        for child in children:
            if child.space.belongs(sub.filter, schema):
                child.add(sub)
    return children
