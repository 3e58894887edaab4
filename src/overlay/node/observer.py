"""What a node core reports to an observer, for the simulator's white-box checks.

The simulator (``overlay.testing.sim``) checks invariants that need to see
inside a core: when a channel matched an event, when a notification reached
its subscribers' access node, what the outbox accepted and how often it
dispatched each event.  It used to learn that by replacing the methods that
do those things on each core's instances; a compiled build (mypyc native
classes, ``overlay.build``) cannot replace methods, so the core reports them
itself instead, through one explicit seam.

Rules:

1. A core has no observer unless one is given (``NodeCore.observe``): each
   report costs the hot path one attribute load and an ``is None`` test, no
   call, when there is none.
2. An observer only records: it must not change the core's state nor raise.
   What it is told is what the replaced methods saw, at the same point: the
   simulator's recorded traces do not change with it (tests/test_simulation.py).
3. Each report is made once per call of the method it stands for:

   * ``matched(event_id)`` — ``Router.match`` is about to match the event on
     one of this node's channels;
   * ``notified(event_id, gids)`` — ``Notifier.notify_clients`` or
     ``Notifier.notify`` is about to notify this node's clients of the event
     for the subscriptions ``gids`` (before duplicates are dropped);
   * ``accepted(ev, sid)`` — ``Outbox.send`` keeps the event for session
     ``sid`` and dispatches it;
   * ``dispatched(ev)`` — the outbox sends the event to its channel's owner
     (first time or re-send).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from overlay.messages import peer as pm

__all__ = ["CoreObserver"]


class CoreObserver(Protocol):
    """Rule 3: what a core reports, and when."""

    def matched(self, event_id: str) -> None: ...

    def notified(self, event_id: str, gids: Sequence[str]) -> None: ...

    def accepted(self, ev: pm.Event, sid: int) -> None: ...

    def dispatched(self, ev: pm.Event) -> None: ...
