"""``Audit``: was every acknowledged (event, matching subscription) pair
delivered exactly once, across a node's failure? (SPEC §16)

``Ledger`` (``overlay.testing._ledger``) counts Notifies at the wire of
in-process clients; across failures what counts is what the *application*
received from the client library — a subscription held on two access nodes
(``AgentClient``) is one subscription whose copies the library merges.  So
the tests and ``bench/failover.py`` feed this audit from the iterators the
application reads, and the publishers tell it when each publish started and
when its PubAck came.

Rules:

1. Events are named by their ``qty``, unique in a run.  An event counts from
   its PubAck (``acked``); one never acknowledged (the publish failed, or
   timed out) is owed to no one, but must not be delivered twice either.
2. A subscription counts from its SubAck (``subacked``).  When it lost its
   only access node (``lost_home``: a plain ``Client`` whose node died,
   SPEC §16's one exception), it counts again from its first SubAck after
   that — the re-subscription on another node.
3. A pair is *acknowledged* when the event was PubAck'ed, matches the
   subscription, and its publish started after the subscription counted
   (a SubAck promises the events published after it): it must be delivered
   exactly once.  Any other pair may be delivered at most once, and only an
   event that matches.
4. ``verdict`` lists every breach by kind: lost (an acknowledged pair never
   delivered), duplicated (any pair delivered more than once), wrong (an
   event delivered to a subscription it does not match), unknown (a
   delivery of no known event), ended (a subscription whose iteration ended
   while the run went on — the client library gave it up — or that was
   never SubAck'ed again after it lost its home: nothing would be owed to
   it), disordered (rule 7).
5. A **group** (``group``) is one receiver: each of its acknowledged pairs
   is owed to exactly one of its instances (``instance``), once — a copy to
   a second instance is a duplicate of the group's.  An instance's SubAck
   counts for its group (the group counts from its first instance's).
6. A subscription the application ends (``unsubscribed``, at the moment it
   asked) is owed only the events PubAck'ed before that moment — a PubAck
   promises the notification reached the access node, not the application,
   so the caller keeps reading a while after it; later events may reach it
   at most once.  A keyed event is never owed to it: its PubAck says only
   that the key's home holds it, and the home may release it long after
   (behind a missing rank, ``hold_ttl``), when the subscription is gone.
   Its iteration ending is no breach.
7. **Order.**  Events published with a ``key`` and a ``rank`` reach every
   receiver in rank order: for each (receiver, key), ranks strictly
   increase with the time they were received — a group's instances taken
   together (the key's home releases the next rank only once the previous
   one was acknowledged, whichever instance took it).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from overlay.channels.predicates import Filter
from overlay.client import Client
from overlay.client.deliveries import Notification
from overlay.errors import OverlayError
from overlay.messages import client as cm

__all__ = ["Audit", "Verdict", "consume", "publish_steadily"]

NEVER: Final = float("inf")
# Breaches listed in a verdict's message, per kind: the rest are counted.
SHOWN: Final = 8


@dataclass
class _Event:
    values: dict[str, Any]
    started: float
    acked: float = NEVER
    event_id: str = ""
    key: str = ""  # rule 7
    rank: int = 0


@dataclass
class _Sub:
    expression: str
    filter: Filter
    subacks: list[float] = field(default_factory=list)
    lost_home: float = -NEVER
    closed: float = NEVER  # rule 6: when the application asked to unsubscribe
    group: bool = False  # rule 5: a group, fed by its instances

    def counts_from(self) -> float:
        """Rule 2: the first SubAck after its home was lost (or its first)."""
        return next((t for t in self.subacks if t >= self.lost_home), NEVER)


@dataclass
class Verdict:
    """What ``Audit.verdict`` found: ``expected`` acknowledged pairs; the breaches."""

    expected: int
    delivered: int
    lost: list[str]
    duplicated: list[str]
    wrong: list[str]
    unknown: list[str]
    ended: list[str]
    # When the events of the lost pairs were published: (first, last), or None.
    lost_published: tuple[float, float] | None = None
    disordered: list[str] = field(default_factory=list)  # rule 7
    # The lost and duplicated pairs as (receiver, qty), for a caller sorting them further.
    lost_pairs: list[tuple[str, int]] = field(default_factory=list)
    duplicated_pairs: list[tuple[str, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.wrong or self.unknown or self.ended or self.disordered)

    def __str__(self) -> str:
        parts = [f"{self.expected} acknowledged pairs, {self.delivered} delivered"]
        if self.lost_published:
            a, b = self.lost_published
            parts.append(f"the lost pairs' events were published from {a:.3f} to {b:.3f} ({b - a:.2f}s)")
        for kind in ("lost", "duplicated", "wrong", "unknown", "ended", "disordered"):
            items: list[str] = getattr(self, kind)
            if items:
                more = f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else ""
                parts.append(f"{len(items)} {kind}: " + "; ".join(items[:SHOWN]) + more)
        return "\n".join(parts)


class Audit:
    """Rules 1–7.  Times are ``time.time()`` (the nodes' clock too)."""

    def __init__(self) -> None:
        self.events: dict[int, _Event] = {}
        self.subs: dict[str, _Sub] = {}  # receivers: subscriptions and groups
        self.instances: dict[str, str] = {}  # group instance -> its group (rule 5)
        self.delivered: collections.Counter[tuple[str, int]] = collections.Counter()
        # (publish started, publish→delivery seconds) of every first delivery of a pair.
        self.latencies: list[tuple[float, float]] = []
        self.first_delivery: dict[int, float] = {}  # qty -> when the application first received it
        self.deliveries: list[tuple[str, int, str, float]] = []  # (subscription, qty, event id, received)
        self.failed: dict[int, str] = {}  # qty -> why its publish failed
        self.ended: dict[str, str] = {}  # subscription -> why its iteration ended early

    # -- publishers (rule 1) -------------------------------------------------------------

    def publishing(
        self, qty: int, values: dict[str, Any], at: float | None = None, *, key: str = "", rank: int = 0
    ) -> None:
        """Event ``qty`` is about to be published (with ``key`` and ``rank``: rule 7)."""
        self.events[qty] = _Event(values, time.time() if at is None else at, key=key, rank=rank)

    def acked(self, qty: int, event_id: str, at: float | None = None) -> None:
        ev = self.events[qty]
        ev.acked, ev.event_id = time.time() if at is None else at, event_id

    def publish_failed(self, qty: int, why: str) -> None:
        self.failed[qty] = why

    # -- subscriptions (rule 2) ----------------------------------------------------------

    def subscription(self, name: str, expression: str, f: Filter) -> None:
        """A subscription about to be asked for (it counts from ``subacked``)."""
        self.subs[name] = _Sub(expression, f)

    def group(self, name: str, expression: str, f: Filter) -> None:
        """A subscriber group: one receiver, fed by its instances (rule 5)."""
        self.subs[name] = _Sub(expression, f, group=True)

    def instance(self, name: str, group: str) -> None:
        """``name`` is an instance of ``group`` (declared with ``group``) and
        subscribes with the group's expression: its SubAcks and deliveries are
        the group's."""
        if not self.subs[group].group:
            raise ValueError(f"{group!r} is a subscription, not a group")
        self.instances[name] = group

    def subacked(self, name: str, at: float | None = None) -> None:
        self.subs[self.instances.get(name, name)].subacks.append(time.time() if at is None else at)

    def lost_home(self, name: str, at: float) -> None:
        self.subs[name].lost_home = at

    def unsubscribed(self, name: str, at: float | None = None) -> None:
        """Rule 6: the application asked to end subscription ``name`` (now, or at ``at``)."""
        self.subs[name].closed = time.time() if at is None else at

    def spy_subacks(self, client: Client, names: dict[str, str]) -> None:
        """Record every SubAck ``client`` receives for its subscription ids in
        ``names`` (id -> audit name), re-subscriptions after a reconnect too."""
        inner: Callable[[cm.ClientMessage], None] = client._on_message

        def on_message(msg: cm.ClientMessage) -> None:
            if type(msg) is cm.SubAck and msg.sub_id in names:
                self.subacked(names[msg.sub_id])
            inner(msg)

        client._on_message = on_message  # type: ignore[method-assign]  # a spy at the wire, by design

    # -- what the application received ----------------------------------------------------

    def deliver(self, name: str, note: Notification) -> None:
        """Subscription (or group instance) ``name`` handed ``note`` to the application."""
        qty = int(note.event["qty"])  # every event of these runs has an int qty
        key = (self.instances.get(name, name), qty)
        self.delivered[key] += 1
        received = note.received or time.time()
        self.first_delivery.setdefault(qty, received)
        self.deliveries.append((name, qty, note.event_id, received))
        if self.delivered[key] == 1 and note.publish_time:
            self.latencies.append((note.publish_time, received - note.publish_time))

    # -- the verdict (rules 3–7) ------------------------------------------------------------

    def owed(self) -> list[tuple[str, int]]:
        """Acknowledged pairs (rules 3, 5, 6), as (receiver, qty)."""
        acked = sorted((ev.started, qty) for qty, ev in self.events.items() if ev.acked < NEVER)
        out = []
        for name, s in self.subs.items():
            since = s.counts_from()
            for _, qty in acked[bisect.bisect_left(acked, (since, -1)) :]:
                ev = self.events[qty]
                in_window = s.closed == NEVER or (not ev.key and ev.acked <= s.closed)  # rule 6
                if in_window and s.filter.matches(ev.values):
                    out.append((name, qty))
        return out

    def missing(self) -> int:
        """Acknowledged pairs not delivered yet: what a test waits on."""
        return sum(1 for key in self.owed() if not self.delivered.get(key))

    def verdict(self) -> Verdict:
        owed = self.owed()
        lost_pairs = [(n, q) for n, q in owed if not self.delivered.get((n, q))]
        lost = [self._pair(n, q) for n, q in lost_pairs]
        when = [self.events[q].started for _, q in lost_pairs]
        duplicated, wrong, unknown = [], [], []
        duplicated_pairs = []
        copies: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
        for name, q, eid, _ in self.deliveries:
            receiver = self.instances.get(name, name)
            copies[(receiver, q)].append(eid if receiver == name else f"{eid} to {name}")
        for (name, qty), n in sorted(self.delivered.items()):
            ev = self.events.get(qty)
            if ev is None or name not in self.subs:
                unknown.append(f"event {qty} to {name}")
                continue
            if n > 1:
                duplicated_pairs.append((name, qty))
                duplicated.append(f"{self._pair(name, qty)} {n}x (ids {', '.join(sorted(set(copies[(name, qty)])))})")
            if not self.subs[name].filter.matches(ev.values):
                wrong.append(self._pair(name, qty))
        ended = [f"{name}: {why}" for name, why in sorted(self.ended.items()) if not self._unsubscribed(name)]
        ended += [
            f"{name}: never {'re-' if s.lost_home > -NEVER else ''}subscribed (SubAck)"
            for name, s in sorted(self.subs.items())
            if s.counts_from() == NEVER
        ]
        delivered = sum(1 for k in owed if self.delivered.get(k))
        span = (min(when), max(when)) if when else None
        return Verdict(
            len(owed),
            delivered,
            lost,
            duplicated,
            wrong,
            unknown,
            ended,
            span,
            disordered=self._disordered(),
            lost_pairs=lost_pairs,
            duplicated_pairs=duplicated_pairs,
        )

    def _unsubscribed(self, name: str) -> bool:
        """Rule 6: the application ended ``name`` (its iteration's end is no breach)."""
        s = self.subs.get(name)
        return s is not None and s.closed < NEVER

    def _disordered(self) -> list[str]:
        """Rule 7: per (receiver, key), the ranks in the order they were received."""
        seen: dict[tuple[str, str], list[tuple[float, int, int, str]]] = collections.defaultdict(list)
        for name, qty, _, received in self.deliveries:
            ev = self.events.get(qty)
            if ev is not None and ev.key:
                seen[(self.instances.get(name, name), ev.key)].append((received, ev.rank, qty, name))
        out = []
        for (receiver, key), got in sorted(seen.items()):
            got.sort()
            for (_, r0, q0, n0), (_, r1, q1, n1) in itertools.pairwise(got):
                if r1 < r0:  # an equal rank is a duplicate, listed as one
                    out.append(
                        f"{receiver} key {key!r}: rank {r1} (event {q1}, to {n1}) after rank {r0} (event {q0}, to {n0})"
                    )
        return out

    def dump(self) -> dict[str, Any]:
        """Everything the audit saw, JSON-ready: for the post-mortem of a failed run."""
        return {
            "events": {
                q: {"values": e.values, "started": e.started, "acked": e.acked if e.acked < NEVER else None}
                | {"event_id": e.event_id, "failed": self.failed.get(q)}
                | ({"key": e.key, "rank": e.rank} if e.key else {})
                for q, e in self.events.items()
            },
            "subs": {
                n: {
                    "expression": s.expression,
                    "subacks": s.subacks,
                    "lost_home": s.lost_home if s.lost_home > -NEVER else None,
                    "closed": s.closed if s.closed < NEVER else None,
                    "group": s.group,
                }
                for n, s in self.subs.items()
            },
            "instances": self.instances,
            "deliveries": self.deliveries,
            "ended": self.ended,
        }

    def _pair(self, name: str, qty: int) -> str:
        ev = self.events.get(qty)
        if ev is None:
            return f"event {qty} -> {name}"
        acked = f"PubAck {ev.acked:.3f}" if ev.acked < NEVER else f"no PubAck ({self.failed.get(qty, 'pending')})"
        keyed = f" key={ev.key} rank={ev.rank}" if ev.key else ""
        return f"event {qty} {ev.event_id or '?'} price={ev.values.get('price')}{keyed} (published {ev.started:.3f}, {acked}) -> {name}"


# -- the drivers that feed an audit -------------------------------------------------------

Publish = Callable[[dict[str, Any]], Awaitable[str]]


async def publish_steadily(
    publish: Publish,
    audit: Audit,
    values: Callable[[int], dict[str, Any]],
    qtys: Sequence[int],
    *,
    rate: float,
    tasks: int = 8,
    stop: asyncio.Event | None = None,
) -> None:
    """Publish event ``values(q)`` for each ``q`` of ``qtys``, the k-th at
    ``k / rate`` s from now, over ``tasks`` concurrent publishers that each
    wait for their PubAck (rule 1: the audit learns when each started and was
    acknowledged).  A publisher held up by a failure catches up afterwards; a
    publish that fails is recorded and the next one goes on.  Once ``stop``
    is set no new publish starts (those under way finish)."""
    start = time.monotonic()

    async def one(t: int) -> None:
        for k in range(t, len(qtys), tasks):
            if stop is not None and stop.is_set():
                return
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            qty = qtys[k]
            v = values(qty)
            audit.publishing(qty, v)
            try:
                event_id = await publish(v)
            except (OverlayError, TimeoutError) as exc:
                audit.publish_failed(qty, f"{type(exc).__name__}: {exc}")
                continue
            audit.acked(qty, event_id)

    await asyncio.gather(*(one(t) for t in range(tasks)))


async def consume(notifications: AsyncIterator[Notification], audit: Audit, name: str) -> None:
    """Feed ``audit`` what subscription ``name`` hands the application, until
    it ends (a test cancels this task at its end); an early end is recorded."""
    try:
        async for note in notifications:
            audit.deliver(name, note)
    except OverlayError as exc:
        audit.ended[name] = f"{type(exc).__name__}: {exc}"
        return
    audit.ended.setdefault(name, "closed")
