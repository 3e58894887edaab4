"""A subscription's plain numeric bound on one attribute, and overlap tests with it.

A split tests every subscription of a hot channel against the cut while its
node waits; the conjunction of a filter's predicates is exact but costs tens
of microseconds, while the comparisons ``= < <= > >= in[]`` on numbers leave
one interval, read in about one.  ``Channel`` keeps these bounds for its
numeric distinguishing attributes, computed when a subscription is indexed —
off the split's path.

Rule: ``bound_of`` returns None for anything but plain numeric comparisons
(a pattern, a set, a bool, a NaN); the caller then falls back to the
conjunction.  ``bound_overlaps`` agrees with ``RangeConstraint.overlaps_conj``
(hypothesis-tested in tests/test_deferred_index.py).
"""

from __future__ import annotations

import math
from typing import Final

from overlay.channels.intervals import Interval
from overlay.channels.predicates import Op, Predicate
from overlay.channels.schema import Attribute, as_number

__all__ = ["Bound", "bound_of", "bound_overlaps"]

_OPS: Final = frozenset({Op.EQ, Op.LT, Op.LE, Op.GT, Op.GE, Op.IN_RANGE})

Bound = tuple[float, bool, float, bool]


def bound_of(preds: tuple[Predicate, ...], name: str, attr: Attribute) -> Bound | None:
    """``(lo, lo_open, hi, hi_open)`` the comparisons of ``preds`` on ``name``
    leave of ``attr``'s domain, or None when one is not a plain numeric
    comparison: the conjunction's answer for those, in a microsecond instead
    of tens (a split tests every subscription of a hot channel while its node
    waits)."""
    lo, lo_open, hi, hi_open = attr.min, False, attr.max, False
    for p in preds:
        if p.attr != name:
            continue
        op = p.op
        if op not in _OPS:
            return None
        args = p.args
        for a in args:
            t = type(a)
            if (t is not int and t is not float) or a != a:
                return None
        # Every arg is an int or a float from here on (as_number only narrows).
        if op is not Op.LE and op is not Op.LT:  # =, in[], >=, >: a lower end
            v = as_number(args[0])
            is_open = op is Op.GT
            if v > lo or (v == lo and is_open):
                lo, lo_open = v, is_open
        if op is not Op.GE and op is not Op.GT:  # =, in[], <=, <: an upper end
            v = as_number(args[-1])
            is_open = op is Op.LT
            if v < hi or (v == hi and is_open):
                hi, hi_open = v, is_open
    return lo, lo_open, hi, hi_open


def bound_overlaps(bound: Bound, iv: Interval, discrete: bool) -> bool:
    """Whether ``bound`` and ``iv`` share a value (integers only if ``discrete``)."""
    lo, lo_open, hi, hi_open = bound
    # The intersection: the higher low end, the lower high end.
    if lo < iv.lo or (lo == iv.lo and iv.lo_open):
        lo, lo_open = iv.lo, iv.lo_open
    if hi > iv.hi or (hi == iv.hi and iv.hi_open):
        hi, hi_open = iv.hi, iv.hi_open
    if discrete:  # open ends step inside to the next integer
        first = math.floor(lo) + 1 if lo_open else math.ceil(lo)
        last = math.ceil(hi) - 1 if hi_open else math.floor(hi)
        return first <= last
    return lo < hi or (lo == hi and not lo_open and not hi_open)
