"""Merging channels (SPEC §8.4).

Rules:
1. Channels sort by their DA constraints (interval low end; type-1 strings
   before type-2).  Two channels adjacent in that order merge when their
   spaces differ on one attribute only and the union there is contiguous
   (``[10,20] ∪ [21,50] → [10,50]``; ``[10,20]`` and ``[30,50]`` do not).
   String sets merge by union.
2. The merged channel holds the union of both subscription sets (each
   subscription once) and starts a fresh slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from overlay.channels.channel import Channel, ChannelId
from overlay.channels.schema import Schema
from overlay.channels.space import EventSpace

__all__ = ["merge_pair", "mergeable_pairs", "merged_space", "sort_channels"]


def sort_channels(channels: Sequence[Channel]) -> list[Channel]:
    return sorted(channels, key=lambda c: c.space.sort_key())


def merged_space(a: EventSpace, b: EventSpace, schema: Schema) -> EventSpace | None:
    return a.union(b, schema)


def mergeable_pairs(channels: Sequence[Channel], schema: Schema) -> list[tuple[Channel, Channel, EventSpace]]:
    """Rule 1: neighbours in sort order whose union is one contiguous space."""
    ordered = sort_channels(channels)
    out = []
    for a, b in pairwise(ordered):
        space = a.space.union(b.space, schema)
        if space is not None:
            out.append((a, b, space))
    return out


def merge_pair(a: Channel, b: Channel, new_id: ChannelId, space: EventSpace, *, consume: bool = False) -> Channel:
    """Rule 2.  With ``consume`` the parts are discarded after, as in
    ``split.divide``: the merged channel adopts the larger part's index and
    indexes the other's subscriptions in the background (``Channel`` rule 5),
    so the node does not stall on a merge."""
    merged = Channel(new_id, space, a.schema)
    if consume:
        big, small = (a, b) if len(a) >= len(b) else (b, a)
        merged.adopt_index(big, {s.id for s in big})
        merged.add_deferred(list(small))
        return merged
    for sub in a:
        merged.add(sub)
    for sub in b:
        merged.add(sub)
    return merged
