"""``Ledger``: what the clients saw, to check SPEC §8.2's exactly-once invariant.

Every Notify is counted at the wire, per listed subscription, before the
client library sorts it (``Ledger.hook``); the test records when each
subscription was asked for and acknowledged (``Sub``) and when each event
was published and acknowledged (``Ledger.events``), all on one clock,
``time.time()`` — the nodes' clock too.  ``violations`` then says which
(event, subscription) pairs broke the invariant.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any, Final

from overlay.channels.predicates import Filter
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

    def violations(self) -> tuple[list[str], int, int]:
        """Breaches of the §8.2 invariant; the pairs checked exactly; and the
        pairs that the PubAck boundary would have required but were not delivered."""
        bad: list[str] = []
        exact = 0
        undelivered_in_window = 0
        events = sorted(self.events.items())
        seen_pairs = set()
        for (ci, sid), s in self.subs.items():
            for qty, (values, start, ack) in events:
                n = self.delivered.get((ci, sid, qty), 0)
                if n:
                    seen_pairs.add((ci, sid, qty))
                if not s.filter.matches(values):
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
        stray = set(self.delivered) - seen_pairs
        bad += [f"delivery {k} names no known subscription or event" for k in sorted(stray)[:5]]
        return bad, exact, undelivered_in_window
