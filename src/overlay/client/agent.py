"""The client's routing agent: pick the access node with the lowest predicted
ack latency (SPEC §12, seed 002).

Theory of operation:

1. For each node the agent fits ``m ≈ x1·t + x0`` to its last ``l`` ack
   latencies ``(t, m)`` by recursive least squares over a sliding window: each
   new measurement is a rank-one *update* of ``P = (AᵀA)⁻¹`` and ``x = P·Aᵀb``,
   and the measurement leaving the window a rank-one *downdate* — never a refit
   from scratch.  Times are taken relative to the node's first sample so the
   normal equations stay well conditioned.
2. A node's link cost is the prediction at ``now``, kept within the range of
   the latencies in its window: a straight line fitted to samples taken over
   a few milliseconds (a node that was used in a burst, then avoided) has a
   slope that means nothing an hour later, and must not extrapolate an idle
   node's cost towards infinity (never chosen again) or below its best.  A
   node with fewer than two samples predicts the mean of what it has (0 when
   it has none, so every node gets tried).
2b. A caller with several publishes in flight at once passes ``pending``
   (requests sent to each node and not yet answered): between nodes of equal
   cost the one with fewer pending wins.  Without it every concurrent publish
   would pick the same unmeasured node at the start (all cost 0).  Only a
   tie-break: scaling the cost by the pending count sends traffic to a slow
   node whenever a fast one has a brief spike and a few requests queued.
3. ``Choke(delay)`` feeds ``(now, delay)`` into that node's estimator; the
   caller re-chooses, and if the same node is still best it waits the delay.
4. No ack within ``mean + 3σ`` of the node's recent latencies (at least
   ``min_timeout``) is a failure: the agent feeds a large latency
   (``FAILURE_FACTOR × timeout``), so the node is avoided until its estimate
   recovers as new measurements slide the failure out of the window.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from typing import Final, Generic, TypeVar

__all__ = ["FAILURE_FACTOR", "RlsEstimator", "RoutingAgent"]

FAILURE_FACTOR: Final = 10.0
_P0: Final = 1e6  # initial P = _P0·I: an uninformative prior

N = TypeVar("N", bound=Hashable)  # how the caller names its nodes


class RlsEstimator:
    """Rule 1 for one node. Invariant: ``_window`` holds exactly the samples that
    ``P`` and ``x`` summarise (plus the prior)."""

    def __init__(self, window: int = 16) -> None:
        if window < 2:
            raise ValueError("the RLS window needs at least 2 samples")
        self.window = window
        self._window: deque[tuple[float, float]] = deque()
        self._t0: float | None = None
        self._p = [[_P0, 0.0], [0.0, _P0]]
        self._x = [0.0, 0.0]  # (x1, x0)

    def __len__(self) -> int:
        return len(self._window)

    def _rank_one(self, t: float, m: float, sign: float) -> None:
        # a = (t, 1); update (sign=+1) or downdate (sign=-1) of P and x.
        p = self._p
        pa0 = p[0][0] * t + p[0][1]
        pa1 = p[1][0] * t + p[1][1]
        denom = sign + t * pa0 + pa1
        if abs(denom) < 1e-12:
            return
        k0, k1 = pa0 / denom, pa1 / denom
        err = m - (self._x[0] * t + self._x[1])
        self._x[0] += k0 * err
        self._x[1] += k1 * err
        # P ← P − k·(aᵀP)   (aᵀP = (pa0, pa1) since P is symmetric)
        self._p = [
            [p[0][0] - k0 * pa0, p[0][1] - k0 * pa1],
            [p[1][0] - k1 * pa0, p[1][1] - k1 * pa1],
        ]

    def add(self, t: float, m: float) -> None:
        if self._t0 is None:
            self._t0 = t
        rel = t - self._t0
        self._window.append((rel, m))
        self._rank_one(rel, m, 1.0)
        if len(self._window) > self.window:
            old_t, old_m = self._window.popleft()
            self._rank_one(old_t, old_m, -1.0)

    def predict(self, t: float) -> float:
        """Rule 2."""
        n = len(self._window)
        if n == 0:
            return 0.0
        if n < 2 or self._t0 is None:
            return max(0.0, sum(m for _, m in self._window) / n)
        value = self._x[0] * (t - self._t0) + self._x[1]
        if not math.isfinite(value):
            return max(0.0, sum(m for _, m in self._window) / n)
        low = min(m for _, m in self._window)
        high = max(m for _, m in self._window)
        return max(0.0, low, min(value, high))

    def mean_std(self) -> tuple[float, float]:
        ms = [m for _, m in self._window]
        if not ms:
            return 0.0, 0.0
        mean = sum(ms) / len(ms)
        return mean, math.sqrt(sum((m - mean) ** 2 for m in ms) / len(ms))


class RoutingAgent(Generic[N]):
    """Rules 2–4 over a set of access nodes."""

    def __init__(
        self, nodes: Iterable[N], *, window: int = 16, min_timeout: float = 0.05, max_timeout: float = 5.0
    ) -> None:
        self.estimators: dict[N, RlsEstimator] = {n: RlsEstimator(window) for n in nodes}
        if not self.estimators:
            raise ValueError("the routing agent needs at least one node")
        self.min_timeout = min_timeout
        self.max_timeout = max_timeout
        self.failures: dict[N, int] = dict.fromkeys(self.estimators, 0)

    def cost(self, node: N, now: float) -> float:
        return self.estimators[node].predict(now)

    def choose(self, now: float, exclude: Iterable[N] = (), pending: Mapping[N, int] | None = None) -> N:
        """Rules 2 and 2b: the cheapest node not in ``exclude`` (all of them if that leaves none)."""
        skip = set(exclude)
        pool = [n for n in self.estimators if n not in skip] or list(self.estimators)
        if not pending:
            return min(pool, key=lambda n: (self.cost(n, now), len(self.estimators[n])))
        return min(pool, key=lambda n: (self.cost(n, now), pending.get(n, 0), len(self.estimators[n])))

    def on_ack(self, node: N, latency: float, now: float) -> None:
        self.estimators[node].add(now, latency)

    def on_choke(self, node: N, delay: float, now: float) -> None:
        """Rule 3."""
        self.estimators[node].add(now, delay)

    def timeout(self, node: N) -> float:
        """Rule 4: ``mean + 3σ`` of the node's recent latencies, bounded."""
        mean, std = self.estimators[node].mean_std()
        if len(self.estimators[node]) < 3:
            return self.max_timeout
        return min(self.max_timeout, max(self.min_timeout, mean + 3 * std))

    def on_timeout(self, node: N, now: float) -> None:
        self.failures[node] += 1
        self.estimators[node].add(now, FAILURE_FACTOR * self.timeout(node))
