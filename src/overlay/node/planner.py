"""What a migration session asks balancing (SPEC §7, §8.1): the seam between
``node.migration`` (the session protocol) and ``node.balancing`` (the
decisions), which need each other.  Balancing implements it; migration holds
one, set by the node core.
"""

from __future__ import annotations

from typing import Protocol

from overlay.actions import Action
from overlay.balance.migration import OutgoingMigration
from overlay.channels.channel import ChannelId
from overlay.messages import peer as pm

__all__ = ["Planner"]


class Planner(Protocol):
    """What a session needs from balancing (``overlay.node.balancing``):
    whether to accept one, which channels to send, the next candidate, the
    split under way, and the monitor's busy state."""

    def accepts(self, msg: pm.RequestLoadBalance) -> tuple[bool, str]: ...

    def plan(self, mig: OutgoingMigration, now: float, out: list[Action]) -> bool | None: ...

    def request_next(self, now: float, out: list[Action]) -> None: ...

    def session_ended(self, mig: OutgoingMigration) -> None: ...

    def leave_busy(self, *, completed: bool) -> None: ...

    def splitting(self) -> ChannelId | None: ...
