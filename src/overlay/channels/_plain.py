"""A plain subscription's exact test, as one bound per attribute
(``overlay.channels.matcher`` rules 4 and 5).

Rules this module keeps:

1. A filter is *plain* when each of its predicates is ``= < <= > >= in[]``
   with numbers of its ordered attribute's own kind (an int on a discrete
   one; an int or a float, not NaN, otherwise), or ``=`` (a one-value
   ``in{}``) with a string on a string attribute.  ``_plain_bounds`` gives
   it as ``{attr: (lo, hi, strict)}`` — per attribute the tightest bounds of
   its predicates, a strict one winning a tie — or None when it is not plain.
2. A bound holds for ``v`` when ``lo <= v <= hi`` and no strict end
   (``_LO_STRICT``, ``_HI_STRICT``) equals ``v``.  Python compares ints and
   floats exactly, so for a value of the attribute's kind (``_NUMBER_TYPES``
   on an ordered one, str on a string one) a bound answers as the compiled
   filter does; two ``=`` of different strings leave ``lo > hi``, which no
   value passes, as none passes the filter.
3. An attribute the event lacks reads as ``_NEVER``: no comparison with it
   holds, as no predicate on a missing attribute does.
4. Written for speed (every indexed subscription and every single-attribute
   entry an event scans comes through here): the operators are module names
   compared by identity, and values are compared as they are once their
   types are checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

from overlay.channels.predicates import Filter, Op
from overlay.channels.schema import Value, as_string
from overlay.channels.subscriptions import Subscription

_NEG_INF: Final = -math.inf
_POS_INF: Final = math.inf
# Strictness flags of a plain bound (rule 2).
_LO_STRICT: Final = 1
_HI_STRICT: Final = 2
# Value types a plain bound compares exactly as the compiled predicate would.
_NUMBER_TYPES: Final = frozenset({int, float, bool})

_Compiled = Callable[[Mapping[str, Value]], bool]
# A plain subscription's exact test (matcher rule 4): ``(pos, lo, hi, strict) * k``.
_Plain = tuple[object, ...]
# A single-attribute entry (matcher rule 5): ``(lo, hi, strict, sub)``.
_Entry = tuple[Value, Value, int, Subscription]
_Bound = tuple[Value, Value, int]


class _Never:
    """The value of an attribute the event lacks: no comparison with it holds,
    as no predicate on a missing attribute does."""

    __slots__ = ()

    # Each comparison spelled out (not ``__lt__ = __le__ = ... = __eq__``):
    # the compiled build (mypyc) takes no assignments of methods in a class body.
    def __eq__(self, other: object) -> bool:
        return False

    def __lt__(self, other: object) -> bool:
        return False

    def __le__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False

    def __ge__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)


_NEVER: Final = _Never()
_ABSENT: Final = object()


def _scan(entries: Iterable[_Entry], v: object, append: Callable[[Subscription], None]) -> None:
    """Rule 2 on single-attribute entries (matcher rule 5): append the subscriptions ``v`` satisfies."""
    for lo, hi, s, sub in entries:
        # v has the entries' kind (the callers check its type): strings with
        # strings, numbers with numbers — Python's comparison, inline, for speed.
        if lo <= v <= hi and not (  # type: ignore[operator]  # see the comment above
            s and ((s & _LO_STRICT and v == lo) or (s & _HI_STRICT and v == hi))
        ):
            append(sub)


def _above(a: Value, b: Value) -> bool:
    """``a > b`` for two values of one kind: two strings or two numbers."""
    if isinstance(a, str) or isinstance(b, str):
        return as_string(a) > as_string(b)
    return a > b


# The operators of rule 1, bound to module names: compared by identity in the
# loop below (an Op is a str enum; hashing one runs Python code).
_EQ: Final = Op.EQ
_IN_SET: Final = Op.IN_SET
_IN_RANGE: Final = Op.IN_RANGE
_GE: Final = Op.GE
_GT: Final = Op.GT
_LE: Final = Op.LE
_LT: Final = Op.LT


class _Domain(Protocol):
    """What ``_plain_bounds`` reads of an attribute's index
    (``_buckets._AttrIndex``; named by its shape, so this module and
    ``_buckets`` do not import each other)."""

    @property
    def ordered(self) -> bool: ...

    @property
    def discrete(self) -> bool: ...


def _plain_bounds(f: Filter, attrs: Mapping[str, _Domain]) -> dict[str, _Bound] | None:
    """Rule 1: ``{attr: (lo, hi, strict)}`` equivalent to ``f`` for every value
    of a type in ``_NUMBER_TYPES`` (ordered) or str (strings), or None when
    some predicate has no such form.  (Written for speed: every indexed
    subscription comes through here.)"""
    bounds: dict[str, _Bound] = {}
    for p in f.predicates:
        name = p.attr
        ai = attrs.get(name)
        if ai is None:
            return None
        args = p.args
        op = p.op
        if not ai.ordered:
            if not (op is _EQ or (op is _IN_SET and len(args) == 1)):
                return None
            x = args[0]
            if type(x) is not str:
                return None
            prev = bounds.get(name)
            # x <= v <= x is v == x for strings; two different = leave lo > hi,
            # which no string satisfies, as none satisfies the filter.
            bounds[name] = (x, x, 0) if prev is None else (max(prev[0], x), min(prev[1], x), 0)
            continue
        # Which ends the operator bounds, and how strictly.
        if op is _IN_RANGE or op is _EQ:
            lower = upper = True
            s = 0
        elif op is _GE or op is _GT:
            lower, upper = True, False
            s = 0 if op is _GE else _LO_STRICT
        elif op is _LE or op is _LT:
            lower, upper = False, True
            s = 0 if op is _LE else _HI_STRICT
        else:
            return None
        # Numbers of the attribute's own kind only: a float bound on an int
        # attribute, a bool or a NaN is left to compile_filter.
        discrete = ai.discrete
        for a in args:
            t = type(a)
            if not (t is int or (t is float and not discrete and a == a)):
                return None
        # From here on every value is a number (checked just above, or a bound
        # this loop made of them): compared as they are, for speed.
        prev = bounds.get(name)
        # Declared Value, not inferred from the infinities: the compiled build
        # (mypyc) would hold a float-typed local as a C double, and an int
        # bound (a 64-bit rfid code) stored in it would lose its low bits.
        lo: Value
        hi: Value
        if prev is None:
            lo, hi, strict = _NEG_INF, _POS_INF, 0
        else:
            lo, hi, strict = prev
        if lower:  # the tightest lower bound; strict wins a tie
            x = args[0]
            if x > lo:  # type: ignore[operator]  # numbers (see above)
                lo, strict = x, (strict & _HI_STRICT) | s
            elif x == lo:
                strict |= s
        if upper:
            x = args[-1]
            if x < hi:  # type: ignore[operator]  # numbers (see above)
                hi, strict = x, (strict & _LO_STRICT) | s
            elif x == hi:
                strict |= s
        bounds[name] = (lo, hi, strict)
    return bounds
