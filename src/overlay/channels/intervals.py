"""Intervals and interval sets over an ordered attribute's domain.

An ``IntervalSet`` is ``L(f)`` for numeric and rfid predicates (SPEC §2.2): the
values of the attribute that satisfy a predicate, a conjunction of predicates,
or a space constraint.  Rules:

1. Sets are always clipped to the attribute's domain ``[min, max]``: a value
   outside it is not a value of the attribute, so ``price >= 0`` covers
   ``price != 5`` when the domain is ``[0, 100]``.
2. Discrete kinds (int, rfid) only hold closed integer bounds; ``< v`` is stored
   as ``<= v - 1``.  Continuous kinds (float) keep open/closed flags.
3. The intervals of a set are sorted, non-empty, disjoint and not adjacent
   (``[1,3] ∪ [4,6]`` is stored ``[1,6]`` for integers; ``[1,3) ∪ [3,5]`` is
   ``[1,5]`` for floats), so equal sets have equal representations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

__all__ = ["Interval", "IntervalSet"]

Bound = int | float


class Interval(msgspec.Struct, frozen=True, array_like=True):
    """``lo .. hi`` with open/closed ends. Invariant: non-empty (see ``empty``)."""

    lo: Bound
    hi: Bound
    lo_open: bool = False
    hi_open: bool = False

    def empty(self) -> bool:
        return self.lo > self.hi or (self.lo == self.hi and (self.lo_open or self.hi_open))

    def __contains__(self, v: Bound) -> bool:
        lo, hi = self.lo, self.hi
        if not lo <= v <= hi:  # written this way round, NaN is in no interval
            return False
        if v == lo and self.lo_open:
            return False
        return not (v == hi and self.hi_open)

    def text(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo}, {self.hi}{')' if self.hi_open else ']'}"


def _lo_key(iv: Interval) -> tuple[Bound, bool]:
    # A closed low end starts before an open one at the same value.
    return (iv.lo, iv.lo_open)


def _intersect(a: Interval, b: Interval) -> Interval | None:
    if a.lo > b.lo or (a.lo == b.lo and a.lo_open):
        lo, lo_open = a.lo, a.lo_open
    else:
        lo, lo_open = b.lo, b.lo_open
    if a.hi < b.hi or (a.hi == b.hi and a.hi_open):
        hi, hi_open = a.hi, a.hi_open
    else:
        hi, hi_open = b.hi, b.hi_open
    iv = Interval(lo, hi, lo_open, hi_open)
    return None if iv.empty() else iv


class IntervalSet:
    """A normalised union of disjoint intervals within ``domain``.

    Invariant: ``intervals`` is sorted, each non-empty, no two overlapping or
    adjacent (rule 3 of the module docstring), all inside ``domain``.
    """

    __slots__ = ("discrete", "domain", "intervals")

    def __init__(self, intervals: Iterable[Interval], domain: Interval, discrete: bool) -> None:
        self.domain = domain
        self.discrete = discrete
        clipped = []
        for iv in intervals:
            if discrete:
                iv = _close(iv)
            cut = _intersect(iv, domain)
            if cut is not None:
                clipped.append(cut)
        self.intervals: tuple[Interval, ...] = _normalise(clipped, discrete)

    # -- construction --------------------------------------------------------

    @classmethod
    def whole(cls, domain: Interval, discrete: bool) -> IntervalSet:
        return cls((domain,), domain, discrete)

    @classmethod
    def empty_set(cls, domain: Interval, discrete: bool) -> IntervalSet:
        return cls((), domain, discrete)

    # -- queries -------------------------------------------------------------

    def is_empty(self) -> bool:
        return not self.intervals

    def is_whole(self) -> bool:
        return len(self.intervals) == 1 and self.intervals[0] == _normal_domain(self.domain, self.discrete)

    def __contains__(self, v: Bound) -> bool:
        return any(v in iv for iv in self.intervals)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntervalSet) and self.intervals == other.intervals

    def __hash__(self) -> int:
        return hash(self.intervals)

    def __repr__(self) -> str:
        body = " ∪ ".join(iv.text() for iv in self.intervals) or "∅"
        return f"IntervalSet({body})"

    def intersection(self, other: IntervalSet) -> IntervalSet:
        out = []
        for a in self.intervals:
            for b in other.intervals:
                cut = _intersect(a, b)
                if cut is not None:
                    out.append(cut)
        return IntervalSet(out, self.domain, self.discrete)

    def overlaps(self, other: IntervalSet) -> bool:
        return any(_intersect(a, b) is not None for a in self.intervals for b in other.intervals)

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet(self.intervals + other.intervals, self.domain, self.discrete)

    def issubset(self, other: IntervalSet) -> bool:
        """Every value of self is in other (each interval inside one of other's,
        which suffices because other's intervals are not adjacent)."""
        return all(any(_intersect(a, b) == a for b in other.intervals) for a in self.intervals)

    def complement(self) -> IntervalSet:
        """The domain minus this set."""
        out: list[Interval] = []
        d = _normal_domain(self.domain, self.discrete)
        lo, lo_open = d.lo, d.lo_open
        for iv in self.intervals:
            out.append(Interval(lo, iv.lo, lo_open, not iv.lo_open))
            lo, lo_open = iv.hi, not iv.hi_open
        out.append(Interval(lo, d.hi, lo_open, d.hi_open))
        return IntervalSet([iv for iv in out if not iv.empty()], self.domain, self.discrete)

    def hull(self) -> Interval | None:
        """The smallest single interval holding the set (None when empty)."""
        if not self.intervals:
            return None
        first, last = self.intervals[0], self.intervals[-1]
        return Interval(first.lo, last.hi, first.lo_open, last.hi_open)


def _close(iv: Interval) -> Interval:
    """Rule 2: integer bounds, closed ends (a float bound rounds inwards)."""
    lo = math.ceil(iv.lo)
    if iv.lo_open and lo == iv.lo:
        lo += 1
    hi = math.floor(iv.hi)
    if iv.hi_open and hi == iv.hi:
        hi -= 1
    return Interval(lo, hi)


def _normal_domain(domain: Interval, discrete: bool) -> Interval:
    return _close(domain) if discrete else domain


def _touches(a: Interval, b: Interval, discrete: bool) -> bool:
    """a (which starts first) overlaps or is adjacent to b."""
    if discrete:
        return b.lo <= a.hi + 1
    if b.lo < a.hi:
        return True
    if b.lo == a.hi:
        return not (a.hi_open and b.lo_open)
    return False


def _normalise(ivs: list[Interval], discrete: bool) -> tuple[Interval, ...]:
    if not ivs:
        return ()
    ivs.sort(key=_lo_key)
    out = [ivs[0]]
    for iv in ivs[1:]:
        last = out[-1]
        if _touches(last, iv, discrete):
            if iv.hi > last.hi or (iv.hi == last.hi and last.hi_open and not iv.hi_open):
                out[-1] = Interval(last.lo, iv.hi, last.lo_open, iv.hi_open)
        else:
            out.append(iv)
    return tuple(out)
