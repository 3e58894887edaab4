"""Fixed-bucket histograms the node core fills on its hot path (SPEC §14 metrics).

The core records two distributions while it matches and notifies: how many
subscriptions a channel tested for one event (SPEC §5's event cost) and how
long an event took from its publish to the access node's Notify.  Recording
must cost next to nothing and must not import the metrics library into the
sans-IO core, so a ``BucketCounts`` is a list of integers, one per upper
bound, plus the running sum.  ``overlay.net.admin`` turns it into Prometheus
histograms at scrape time.

Invariant: ``counts[i]`` is the number of observations ``v`` with
``bounds[i-1] < v <= bounds[i]`` (the last slot: above every bound), so the
cumulative counts read in order are Prometheus's ``le`` buckets.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from overlay.errors import LocalProtocolError

__all__ = ["LATENCY_BOUNDS", "TESTED_BOUNDS", "BucketCounts"]

# Subscriptions tested per event: 0 (an empty channel) up to a channel of
# 100k subscriptions scanned whole (bench/matching.py's largest).
TESTED_BOUNDS: Final = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000)
# Publish → Notify seconds: sub-millisecond on loopback, seconds under choke.
# Typed as a variable-length tuple: the compiled build (mypyc) would unbox a
# fixed tuple of floats into a C struct, and reading that Final from another
# compiled module raises NameError (a mypyc bug in 2.4.1).
LATENCY_BOUNDS: Final[tuple[float, ...]] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class BucketCounts:
    """Counts per fixed upper bound and their sum (module invariant)."""

    __slots__ = ("_search", "bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds: tuple[float, ...] = tuple(bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise LocalProtocolError(f"bucket bounds must increase strictly: {self.bounds}")
        self.counts = [0] * (len(self.bounds) + 1)
        # The bounds as floats for observe: compiled, a float item is read
        # straight, an int one converted on every comparison.  The same
        # numbers (the bounds here are exact as floats).
        self._search: tuple[float, ...] = tuple([float(b) for b in self.bounds])
        if self._search != self.bounds:
            raise LocalProtocolError(f"bucket bounds must be exact as floats: {self.bounds}")
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect.bisect_left's search written out (the same comparisons, so the
        # same slot for every value, NaN included): compiled, it runs natively,
        # where the call into bisect compared boxed floats through the generic
        # rich comparison — two observations per event (issue 19).
        bounds = self._search
        lo = 0
        hi = len(bounds)
        while lo < hi:
            mid = (lo + hi) >> 1
            if bounds[mid] < value:
                lo = mid + 1
            else:
                hi = mid
        self.counts[lo] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, observations <= le)`` per bound, then ``(inf, total)``."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out
