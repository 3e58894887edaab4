"""A channel's id and its load records as they travel (rules 1 and 3 of
``overlay.channels.channel``, which re-exports them).

Kept out of ``channel``, which the compiled build (mypyc, setup.py) compiles:
mypyc drops the class keywords of a msgspec Struct it compiles (frozen,
array_like, tag, order), which would change the wire format silently.
"""

from __future__ import annotations

import msgspec

from overlay.channels.schema import Value

__all__ = ["ChannelId", "EventRecord"]


class ChannelId(msgspec.Struct, frozen=True, array_like=True, order=True):
    """``(node_id, local_sequence_number)`` (rule 1)."""

    node: int
    seq: int

    def __str__(self) -> str:
        return f"{self.node}.{self.seq}"


class EventRecord(msgspec.Struct, frozen=True, array_like=True):
    """``<e_i, num_i>`` aggregated: a DA point (in priority order), its total cost
    and how many events fell on it."""

    point: tuple[Value, ...]
    cost: int
    count: int
