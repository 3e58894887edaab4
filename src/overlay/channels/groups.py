"""Subscriber groups: one instance of a group per matching event (SPEC §11).

Theory of operation:

1. Instances subscribing with the same group name are functionally
   equivalent; each has a static weight ``Ws`` and a load factor ``LF`` in
   ``[0, 1]`` (reported by its client on every ack).  Its dynamic weight is
   ``Wd = Ws·(1 − LF)``, kept as integers: ``Ws`` in thousandths and ``LF`` in
   thousandths, so the hot path has no floating point.
2. Dispatch is Bresenham's rule in accumulator form.  Each instance keeps an
   error term ``acc_i``; for an event, every eligible instance gains its
   ``Wd_i``, the one with the largest ``acc_i`` is chosen and loses ``ΣWd``.
   With constant weights ``acc_i = k·Wd_i − N_i·ΣWd``, i.e. minus the spec's
   ``N_i − k·Wd_i/ΣWd`` scaled by ``ΣWd``: choosing the largest ``acc`` is
   choosing the most negative spec value, and over k events each instance gets
   its share within one event.  When weights change the terms carry over, so
   the flow bends smoothly toward the new shares; terms are clamped to
   ``±ACC_LIMIT·ΣWd`` so an old imbalance is not repaid forever.
3. An instance is ineligible while ``LF = 1`` (``Wd = 0``) or while marked
   faulty (a failed or timed-out delivery) until its fault period ends.
   ``pick`` takes the instances whose filters matched the event, so each
   event goes to exactly one of them, or to none when none is eligible — the
   caller then tells the publisher (returned / dead-letter), never silently.
4. Throttling: when every instance of the group has ``LF`` above the
   threshold, events the caller marks low-priority are dropped, counted.
5. ``state()``/``restore()`` carry the dispatch state with the channel when it
   migrates, so shares continue where they left off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Final

import msgspec

from overlay.errors import LocalProtocolError

__all__ = ["MAX_WEIGHT", "MILLI", "GroupDispatcher", "GroupState", "InstanceState"]

MILLI: Final = 1000
# Weights are relative: a million to one is past any real use, and keeps
# ``Ws`` in thousandths a small integer (1e308 overflowed ``round``, and every
# matching event of the channel then failed).
MAX_WEIGHT: Final = 1_000_000.0
ACC_LIMIT: Final = 4


class InstanceState(msgspec.Struct, array_like=True):
    """One instance's dispatch state (rule 1, 2, 3)."""

    ws: int  # static weight, thousandths
    lf: int = 0  # load factor, thousandths
    acc: int = 0
    faulty_until: float = 0.0
    sent: int = 0

    @property
    def wd(self) -> int:
        return self.ws * (MILLI - self.lf)


class GroupState(msgspec.Struct, array_like=True):
    """What migrates with a channel (rule 5)."""

    name: str
    instances: dict[str, InstanceState]
    dispatched: int = 0


class GroupDispatcher:
    """Rules 1–5 for one group. Invariant: ``sum(acc)`` stays within one ``ΣWd``
    of zero while weights are constant (each pick adds ΣWd and removes ΣWd)."""

    def __init__(self, name: str, *, fault_period: float = 5.0, throttle_lf: float = 0.9) -> None:
        self.name = name
        self.fault_period = fault_period
        self.throttle_lf = int(throttle_lf * MILLI)
        self.instances: dict[str, InstanceState] = {}
        self.dispatched = 0
        self.counters: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.instances)

    def add(self, instance: str, weight: float) -> None:
        if not weight > 0:
            raise LocalProtocolError(f"group {self.name!r}: weight of {instance!r} must be > 0, got {weight}")
        if not 0 < weight <= MAX_WEIGHT:  # NaN fails this too
            raise LocalProtocolError(f"weight of {instance!r} must be in (0, {MAX_WEIGHT:g}], got {weight!r}")
        ws = max(1, round(weight * MILLI))
        st = self.instances.get(instance)
        if st is None:
            self.instances[instance] = InstanceState(ws)
        else:
            st.ws = ws

    def remove(self, instance: str) -> None:
        self.instances.pop(instance, None)

    def update_lf(self, instance: str, lf: float) -> None:
        """A missing update keeps the last value (rule 1); values are clamped."""
        st = self.instances.get(instance)
        if st is not None:
            st.lf = min(MILLI, max(0, round(lf * MILLI)))

    def mark_faulty(self, instance: str, now: float) -> None:
        st = self.instances.get(instance)
        if st is not None:
            st.faulty_until = now + self.fault_period
            self.counters["faults"] += 1

    def eligible(self, instance: str, now: float) -> bool:
        st = self.instances.get(instance)
        return st is not None and st.lf < MILLI and st.faulty_until <= now

    def throttled(self, now: float) -> bool:
        """Rule 4: every live instance is above the throttle threshold."""
        live = [s for s in self.instances.values() if s.faulty_until <= now]
        return bool(live) and all(s.lf > self.throttle_lf for s in live)

    def pick(self, candidates: Iterable[str], now: float) -> str | None:
        """Rule 2 over the instances whose filters matched the event."""
        pool = [
            (i, st)
            for i in candidates
            if (st := self.instances.get(i)) is not None and st.lf < MILLI and st.faulty_until <= now
        ]
        if not pool:
            self.counters["no_instance"] += 1
            return None
        total = 0
        for _, st in pool:
            w = st.wd
            st.acc += w
            total += w
        best_id, best = max(pool, key=lambda p: (p[1].acc, p[1].wd, p[0]))
        best.acc -= total
        best.sent += 1
        limit = ACC_LIMIT * total
        for _, st in pool:
            if st.acc > limit:
                st.acc = limit
            elif st.acc < -limit:
                st.acc = -limit
        self.dispatched += 1
        return best_id

    def shares(self) -> dict[str, float]:
        total = sum(s.sent for s in self.instances.values()) or 1
        return {i: s.sent / total for i, s in self.instances.items()}

    def state(self) -> GroupState:
        return GroupState(
            self.name,
            {i: InstanceState(s.ws, s.lf, s.acc, s.faulty_until, s.sent) for i, s in self.instances.items()},
            self.dispatched,
        )

    @classmethod
    def restore(cls, state: GroupState, *, fault_period: float = 5.0, throttle_lf: float = 0.9) -> GroupDispatcher:
        g = cls(state.name, fault_period=fault_period, throttle_lf=throttle_lf)
        g.instances = {i: InstanceState(s.ws, s.lf, s.acc, s.faulty_until, s.sent) for i, s in state.instances.items()}
        g.dispatched = state.dispatched
        return g
