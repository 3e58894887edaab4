"""``Ledger``: what the clients saw, to check SPEC §8.2's exactly-once invariant.

Every Notify is counted at the wire, per listed subscription, before the
client library sorts it (``Ledger.hook``); the test records when each
subscription was asked for and acknowledged (``Sub``) and when each event
was published and acknowledged (``Ledger.events``), all on one clock,
``time.time()`` — the nodes' clock too.  ``violations`` then says which
(event, subscription) pairs broke the invariant.

Rules this module keeps:

1. ``violations`` judges every (event, subscription) pair that can break the
   invariant without testing each filter on every event: a run of 20,000
   events and some 600 subscriptions is 12 million pairs, and testing them
   all held the test's event loop — its nodes' too — for 23–28 s on a busy
   machine.  A pair can only break it if the event matches the filter or was
   delivered to it, so the events a filter may match come from the events
   sorted by a numeric attribute (a slice between the bounds of one of its
   comparisons, ``_Sorted``) and the filter itself decides on those; every
   delivered pair is judged too.  The verdict is the one a check of every
   pair gives (``tests/test_ledger.py`` compares them).
2. A test whose nodes share its event loop judges with
   ``violations_off_loop``: the pairs still take seconds of pure CPU on a
   busy machine, so they are judged in a worker thread, on a snapshot (a
   late delivery may still reach a hook meanwhile); the thread gives the
   loop the GIL back every switch interval, so the nodes' heartbeats go on.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeGuard

from overlay.channels.predicates import Filter, Op, Predicate, compile_filter
from overlay.client import Client
from overlay.messages import client as cm

__all__ = ["Ledger", "Sub"]

NEVER: Final = float("inf")


@dataclass
class Sub:
    """One subscription of ledger client ``client``: when it was asked for,
    SubAck'ed, and (if it was) unsubscribed and UnsubAck'ed; ``NEVER`` until then."""

    client: int
    sub_id: str
    expression: str
    filter: Filter
    started: float
    acked: float = NEVER
    unsub_started: float = NEVER
    unsub_acked: float = NEVER


@dataclass
class Ledger:
    """What the clients saw.  Events are named by their ``qty``, which the
    test makes unique; ``events[qty]`` is (values, publish started, PubAck)."""

    subs: dict[tuple[int, str], Sub] = field(default_factory=dict)
    events: dict[int, tuple[dict[str, Any], float, float]] = field(default_factory=dict)
    delivered: collections.Counter[tuple[int, str, int]] = field(default_factory=collections.Counter)
    access: dict[int, int] = field(default_factory=dict)  # ledger client -> its access node
    # (access node, event) -> when a client of that node first received the event.
    first_seen: dict[tuple[int, int], float] = field(default_factory=dict)

    def received(self) -> int:
        """Notifications counted so far, over every subscription."""
        return sum(self.delivered.values())

    def hook(self, index: int, client: Client, node: int) -> None:
        """Count every Notify ``client`` (ledger client ``index``, on ``node``)
        receives, per listed subscription, then let the client handle it."""
        inner = client._on_message
        self.access[index] = node

        def on_message(msg: cm.ClientMessage) -> None:
            if type(msg) is cm.Notify:
                qty = int(msg.event["qty"])  # the test's events all carry an int qty
                self.first_seen.setdefault((node, qty), time.time())
                for sid in msg.sub_ids:
                    self.delivered[(index, sid, qty)] += 1
            inner(msg)

        client._on_message = on_message  # type: ignore[method-assign]  # a spy at the wire, by design

    def expected(self, s: Sub, qty: int, start: float) -> bool:
        """Must ``s`` get event ``qty`` exactly once?

        Subscribe side: SubAck'ed before the publish started (the SubAck
        means every channel holding ``s`` applied it).  Unsubscribe side: the
        access node stops forwarding a subscription's notifications when it
        handles the Unsubscribe, and a PubAck only says the event was routed,
        not matched — so "PubAck before the unsubscribe" is not a sound
        boundary.  Sound: a client of the same access node received the event
        before the unsubscribe started.  The owner sends that node one
        Notification per event listing every match there, so ``s`` was in it.
        """
        if not s.acked < start:
            return False
        if s.unsub_started == NEVER:
            return True
        seen = self.first_seen.get((self.access[s.client], qty))
        return seen is not None and seen < s.unsub_started

    def snapshot(self) -> Ledger:
        """A copy no client hook changes any more (rule 2)."""
        return Ledger(
            subs={k: replace(s) for k, s in self.subs.items()},
            events=dict(self.events),
            delivered=collections.Counter(self.delivered),
            access=dict(self.access),
            first_seen=dict(self.first_seen),
        )

    async def violations_off_loop(self) -> tuple[list[str], int, int]:
        """``violations`` of a ``snapshot``, judged in a worker thread (rule 2)."""
        return await asyncio.to_thread(self.snapshot().violations)

    def violations(self) -> tuple[list[str], int, int]:
        """Breaches of the §8.2 invariant; the pairs checked exactly; and the
        pairs that the PubAck boundary would have required but were not delivered.

        Rule 1: only the pairs that can matter are looked at — an event a
        subscription's filter may match (``_Sorted.candidates``) and an event
        it was delivered — in the order of the events' ``qty``, so the
        messages come out as a check of every pair would list them."""
        bad: list[str] = []
        exact = 0
        undelivered_in_window = 0
        events = self.events
        got: dict[tuple[int, str], dict[int, int]] = collections.defaultdict(dict)
        stray = []
        for (ci, sid, qty), n in self.delivered.items():
            if n and (ci, sid) in self.subs and qty in events:
                got[(ci, sid)][qty] = n
            else:
                stray.append((ci, sid, qty))
        index = _Sorted(events)
        for key, s in self.subs.items():
            ci, sid = key
            mine = got.get(key, {})
            matches = compile_filter(s.filter)  # Filter.matches's verdict, its rows made once
            for qty in sorted(index.candidates(s.filter).union(mine)):
                values, start, ack = events[qty]
                n = mine.get(qty, 0)
                if not matches(values):
                    if n:
                        bad.append(
                            f"event {qty} {values} delivered {n}x to {ci}/{sid} ({s.expression}) it does not match"
                        )
                    continue
                if self.expected(s, qty, start):
                    exact += 1
                    if n != 1:
                        bad.append(f"event {qty} {values} delivered {n}x to {ci}/{sid} ({s.expression}), expected once")
                elif n > 1:
                    bad.append(f"event {qty} delivered {n}x to {ci}/{sid} (in-flight window)")
                elif n and start > s.unsub_acked:
                    bad.append(f"event {qty} published after the UnsubAck of {ci}/{sid} was delivered to it")
                elif not n and s.acked < start and ack < s.unsub_started:
                    undelivered_in_window += 1
        bad += [f"delivery {k} names no known subscription or event" for k in sorted(stray)[:5]]
        return bad, exact, undelivered_in_window


class _Sorted:
    """Rule 1: the events sorted by each numeric attribute every one of them
    carries, to find the events a filter may match without testing it on all.

    ``candidates(f)`` is a superset of the events ``f`` matches: an event
    matching ``f`` satisfies each of its predicates, and a comparison or a
    range on such an attribute (``<``, ``<=``, ``>``, ``>=``, ``=``, ``in
    [lo, hi]``) is satisfied only by values within its bounds taken
    inclusive — strict or not, the slice between them holds every value it
    accepts.  Of the filter's predicates the one with the fewest events in
    its slice is used; a filter with none of them gets every event."""

    def __init__(self, events: Mapping[int, tuple[Mapping[str, Any], float, float]]) -> None:
        self.all: frozenset[int] = frozenset(events)
        numeric: dict[str, list[tuple[int | float, int]]] | None = None
        for qty, (values, _start, _ack) in events.items():
            if numeric is None:
                numeric = {a: [] for a, v in values.items() if _is_number(v)}
            for a in list(numeric):
                v = values.get(a)
                if _is_number(v):
                    numeric[a].append((v, qty))
                else:
                    del numeric[a]  # not a number in every event: no slice can stand for it
        self.keys: dict[str, list[int | float]] = {}
        self.qtys: dict[str, list[int]] = {}
        for a, pairs in (numeric or {}).items():
            pairs.sort()
            self.keys[a] = [v for v, _ in pairs]
            self.qtys[a] = [q for _, q in pairs]

    def _bounds(self, p: Predicate) -> tuple[float, float] | None:
        """The inclusive bounds of the values ``p`` accepts, if it is a comparison or a range."""
        # The values as they are, not as floats: an int past 2**53 (an rfid) would round.
        args = [x for x in p.args if _is_number(x)]
        if not args or len(args) != len(p.args):
            return None
        if p.op is Op.LT or p.op is Op.LE:
            return -math.inf, args[0]
        if p.op is Op.GT or p.op is Op.GE:
            return args[0], math.inf
        if p.op is Op.EQ:
            return args[0], args[0]
        if p.op is Op.IN_RANGE and len(args) == 2:
            return args[0], args[1]
        return None

    def candidates(self, f: Filter) -> frozenset[int] | set[int]:
        best: tuple[int, str, int, int] | None = None
        for attr in f.attrs() & self.keys.keys():
            keys = self.keys[attr]
            lo_i, hi_i = 0, len(keys)
            for p in f.on(attr):
                if (b := self._bounds(p)) is not None:  # the predicates on one attribute: their slices meet
                    lo_i = max(lo_i, bisect.bisect_left(keys, b[0]))
                    hi_i = min(hi_i, bisect.bisect_right(keys, b[1]))
            size = max(0, hi_i - lo_i)
            if best is None or size < best[0]:
                best = (size, attr, lo_i, hi_i)
        if best is None:
            return self.all
        _, attr, lo_i, hi_i = best
        return set(self.qtys[attr][lo_i:hi_i])


def _is_number(v: object) -> TypeGuard[int | float]:
    """A real number that sorts with the others (not a bool, not NaN)."""
    return type(v) is int or (type(v) is float and not math.isnan(v))
