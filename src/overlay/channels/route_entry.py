"""Where a channel lives: one entry of the routing table (``overlay.channels.routing_table``,
which re-exports it).

Kept out of ``routing_table``, which the compiled build (mypyc, setup.py) compiles:
mypyc drops the class keywords of a msgspec Struct it compiles (frozen,
array_like, tag, order), which would change the wire format silently.
"""

from __future__ import annotations

import msgspec

from overlay.channels.space import EventSpace

__all__ = ["RouteEntry"]


class RouteEntry(msgspec.Struct, frozen=True, array_like=True):
    """Where a channel lives. Invariant: ``owners`` is non-empty; more than one
    owner means the channel is replicated (SPEC §8.3 degenerate case)."""

    space: EventSpace
    owners: tuple[int, ...]

    @property
    def owner(self) -> int:
        return self.owners[0]

    @property
    def replicated(self) -> bool:
        return len(self.owners) > 1
