"""The events a key's home released and not yet saw complete (SPEC §10; ``node.keyhome``).

Rules:

1. A released event is routed to its channel's owner with the home's
   routing table, as ``EVENT_DISPATCHED`` carrying its ``rank`` and this
   node as its ``home``.  One that a release releases in turn (a local
   owner found nothing to wait for and completed it at once, which releases
   the next rank) waits in a queue: nothing recurses.
2. It stays here until its completion comes (``pop``), the sequencer moved
   on without it (a processing timeout: ``prune``) or its key moved to
   another home (``forget``; one whose completion this node passes on stays
   at most ``processing_ttl`` more: ``passing``): at most one per key.
3. ``again`` routes every event still here once more, to its channel's
   current owner (``node.keyhome`` rule 9), without counting it released
   again — those whose completions this node passes on too.
4. An event no channel of the routing table takes (a home that has no
   table yet — a new run — or one in flux) is not sent: it waits, counted
   ``ordered_unrouted``, and is tried again on every tick (``retry``) until
   a table routes it or ``processing_ttl`` moves its key on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container
from typing import Final

import msgspec

from overlay.actions import Action
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.seq import Release, SeqStatus, Sequencer

__all__ = ["InFlight"]

_EVENT_DISPATCHED: Final = pm.DispatchSign.EVENT_DISPATCHED
_PROCESSING: Final = SeqStatus.PROCESSING
_replace: Final = msgspec.structs.replace

Route = Callable[[pm.Event, list[Action]], None]


class InFlight:
    """Rules 1–4; ``route`` dispatches an event to its owner."""

    def __init__(self, ctx: NodeContext, *, route: Route) -> None:
        self._ctx = ctx
        self._route = route
        self._released: dict[str, Release] = {}  # event id -> its release
        self._passing: dict[str, float] = {}  # event id -> until when (rule 2: a key handed over)
        self._unrouted: set[str] = set()  # rule 4: event ids waiting for a table that routes them
        self._queue: deque[Release] = deque()
        self._releasing = False

    def __len__(self) -> int:
        return len(self._released)

    def release(self, release: Release, out: list[Action]) -> None:
        """Rule 1."""
        queue = self._queue
        queue.append(release)
        if self._releasing:
            return
        self._releasing = True
        try:
            while queue:
                r = queue.popleft()
                self._released[r.event.event_id] = r
                self._ctx.stats["ordered_released"] += 1
                self._dispatch(r, out)
        finally:
            self._releasing = False

    def track(self, release: Release) -> None:
        """Rule 2 for an event released by another home, which passes its completion on."""
        self._released[release.event.event_id] = release

    def pop(self, event_id: str) -> Release | None:
        self._passing.pop(event_id, None)
        self._unrouted.discard(event_id)
        return self._released.pop(event_id, None)

    def retry(self, out: list[Action]) -> None:
        """Rule 4: the events no table routed, again."""
        for eid in sorted(self._unrouted):
            r = self._released.get(eid)
            if r is None:
                self._unrouted.discard(eid)
            else:
                self._dispatch(r, out)

    def again(self, keys: Container[str], out: list[Action]) -> None:
        """Rule 3, for the events of ``keys`` (those this node is still home of)
        and those whose completions it passes on: their new home keeps them in
        flight on this node's word and sends nothing (fault seed 785)."""
        passing = self._passing
        for eid, r in list(self._released.items()):
            if r.key in keys or eid in passing:
                self._ctx.stats["ordered_redispatched"] += 1
                self._dispatch(r, out)

    def forget(self, keys: Container[str]) -> None:
        """The events of ``keys`` (handed over: ``node.keyhome`` rule 7)."""
        for eid in [eid for eid, r in self._released.items() if r.key in keys]:
            del self._released[eid]

    def passing(self, keys: Container[str], until: float) -> None:
        """Rule 2: the events of ``keys`` stay only to pass their completions on
        (their keys were handed over, ``node.keyhome`` rule 7), until ``until``:
        one that never comes (the new home's own copy completed) is forgotten."""
        for eid, r in self._released.items():
            if r.key in keys:
                self._passing[eid] = until

    def expire(self, now: float) -> None:
        if self._passing:
            for eid in [eid for eid, t in self._passing.items() if t <= now]:
                del self._passing[eid]
                self._released.pop(eid, None)

    def prune(self, seq: Sequencer) -> None:
        """Rule 2: forget what the sequencer no longer has in flight."""
        for eid, r in list(self._released.items()):
            c = seq.context(r.key)
            if c is not None and (c[0] is not _PROCESSING or c[1] != r.rank):
                del self._released[eid]

    def _dispatch(self, r: Release, out: list[Action]) -> None:
        ev: pm.Event = r.event
        # A channel id names one space for life: the access node's lookup holds
        # while the channel exists (a split or merge replaces the id).
        chid = ev.ch_id
        routing = self._ctx.routing
        if chid is None or chid not in routing:
            chid = routing.lookup_event(ev.event_exp)
        if chid is None:  # rule 4
            if ev.event_id not in self._unrouted:
                self._ctx.stats["ordered_unrouted"] += 1
                self._unrouted.add(ev.event_id)
            return
        self._unrouted.discard(ev.event_id)
        self._route(
            _replace(ev, ch_id=chid, dispatch_sign=_EVENT_DISPATCHED, rank=r.rank, home=self._ctx.id, hops=0), out
        )
