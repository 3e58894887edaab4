"""Whether an event's value passes a predicate, and a filter's exact test
(``overlay.channels.predicates`` rules 3 and 8).

Rules this module keeps:

1. A predicate's test is a *row* ``(attr, code, x, y)`` (``row_of``): its
   attribute, an operator code, and its arguments as plain values — a
   pattern folded once for the case-insensitive operators, an ``in{...}``
   of up to ``SMALL_SET`` values as a tuple, a larger one as a frozenset.
2. ``holds`` applies one row to a present value with Python's own
   operators; an absent value (``MISSING``) passes only ``not exists``.
3. ``compile_filter`` gives a filter's exact test, a ``FilterTest`` of its
   rows: the common operators tested inline, the rest through ``holds``.
   It answers as ``Filter.matches`` does, raising where it raises.
4. Nothing here is traversed by the cyclic GC (``predicates`` rule 8): rows
   hold scalars and tuples of them, ``FilterTest`` is a ``gc=False``
   struct, and there is no closure per predicate or per filter.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import msgspec

from overlay.channels.operators import Op
from overlay.channels.schema import Value, as_string
from overlay.channels.strings import fold


class PredicateLike(Protocol):
    """What a test row is made from: ``predicates.Predicate`` (named by its
    shape, so this module and ``predicates`` do not import each other)."""

    @property
    def attr(self) -> str: ...
    @property
    def op(self) -> Op: ...
    @property
    def args(self) -> tuple[Value, ...]: ...


class FilterLike(Protocol):
    """What ``compile_filter`` reads: ``predicates.Filter``."""

    @property
    def predicates(self) -> tuple[PredicateLike, ...]: ...


__all__ = [
    "MISSING",
    "SMALL_SET",
    "FilterLike",
    "FilterTest",
    "Missing",
    "PredicateLike",
    "Row",
    "compile_filter",
    "holds",
    "row_of",
]


class Missing(enum.Enum):
    """The value of an attribute the event lacks (no predicate on it holds
    but ``not exists``)."""

    MISSING = enum.auto()


MISSING: Final = Missing.MISSING


# The tests below apply Python's own operators to an event's value, whatever
# its type: an event need not have been checked against the schema (a caller
# may pass any mapping), and ``LinearMatcher``, the reference the index is
# held to, is these tests.  A value of the wrong kind makes them raise
# (``"a" < 5`` a TypeError, ``(5).startswith`` an AttributeError) instead of
# answering — narrowing the value first would change that answer, and cost a
# check per predicate on the hottest path.  So each comparison of an event's
# value carries an ignore saying so.
#
# Rule 4 (``predicates`` rule 8): a predicate's test is a row ``(attr, code, x, y)`` of scalars (or
# of a tuple of scalars), read by one shared function — never a closure of
# its own, which the cyclic GC would traverse on every full pass, a million
# stored subscriptions' worth.

# Operator codes of a test row (rule 1).  ``FilterTest`` tests the first
# seven inline, in this order (the common ones first), the rest by ``holds``.
_C_RANGE: Final = 0
_C_EQ: Final = 1
_C_GE: Final = 2
_C_LT: Final = 3
_C_NE: Final = 4
_C_PREFIX: Final = 5
_C_IN: Final = 6  # in{...}: a small set, as a tuple (``SMALL_SET``)
_C_NOT_EXISTS: Final = 7
_C_LE: Final = 8
_C_GT: Final = 9
_C_NOT_RANGE: Final = 10
_C_SUFFIX: Final = 11
_C_CONTAINS: Final = 12
_C_NOT_PREFIX: Final = 13
_C_NOT_SUFFIX: Final = 14
_C_NOT_CONTAINS: Final = 15
_C_SET: Final = 16  # in{...}: a frozenset
_C_NOT_SET: Final = 17  # not in{...}: a frozenset
_C_NOT_IN: Final = 18  # not in{...}: a small set, as a tuple
_C_IEQ: Final = 19
_C_NOT_IEQ: Final = 20
_C_IPREFIX: Final = 21
_C_NOT_IPREFIX: Final = 22
_C_ISUFFIX: Final = 23
_C_NOT_ISUFFIX: Final = 24
_C_LIKE: Final = 25
_C_NOT_LIKE: Final = 26
_C_EXISTS: Final = 27

_CODES: Final = {
    Op.EQ: _C_EQ,
    Op.NE: _C_NE,
    Op.LT: _C_LT,
    Op.LE: _C_LE,
    Op.GT: _C_GT,
    Op.GE: _C_GE,
    Op.IN_RANGE: _C_RANGE,
    Op.NOT_IN_RANGE: _C_NOT_RANGE,
    Op.PREFIX: _C_PREFIX,
    Op.SUFFIX: _C_SUFFIX,
    Op.CONTAINS: _C_CONTAINS,
    Op.NOT_PREFIX: _C_NOT_PREFIX,
    Op.NOT_SUFFIX: _C_NOT_SUFFIX,
    Op.NOT_CONTAINS: _C_NOT_CONTAINS,
    Op.IEQ: _C_IEQ,
    Op.NOT_IEQ: _C_NOT_IEQ,
    Op.IPREFIX: _C_IPREFIX,
    Op.NOT_IPREFIX: _C_NOT_IPREFIX,
    Op.ISUFFIX: _C_ISUFFIX,
    Op.NOT_ISUFFIX: _C_NOT_ISUFFIX,
    Op.LIKE: _C_LIKE,
    Op.NOT_LIKE: _C_NOT_LIKE,
    Op.EXISTS: _C_EXISTS,
    Op.NOT_EXISTS: _C_NOT_EXISTS,
}
# An in{...} set up to this size is tested as a tuple: a tuple of scalars is
# not traversed by the cyclic GC, a frozenset always is (rule 4).  The value
# is hashed first, so it raises where the frozenset would (an unhashable
# value), and among hashable values ``in`` agrees with the set's look-up.
SMALL_SET: Final = 8

# A test row (rule 1): (attr, code, x, y).
Row = tuple[str, int, Any, Any]


@functools.lru_cache(maxsize=4096)
def _like_full(pattern: str) -> Callable[[str], bool]:
    """Whether a value matches the whole ``like`` pattern (``*`` any run, all
    else literal), made once per pattern (bounded).  Not a regular
    expression: ``.*a.*a…b`` backtracks over every placement of the ``a``s
    (``*a`` eight times and ``*b`` took 0.4 s on 32 ``a``s, and doubles with
    each character more — one event held its owner's loop).  With ``*`` the
    only wildcard, the leftmost place of each piece between stars is the
    right one, so a match is a prefix, a suffix and ``str.find`` in order."""
    parts = pattern.split("*")
    if len(parts) == 1:

        def exact(v: str) -> bool:
            if type(v) is not str:  # as the regular expression did (str.__eq__ would give NotImplemented)
                raise TypeError(f"like {pattern!r} on a {type(v).__name__}")
            return v == pattern

        return exact
    head, middle, tail = parts[0], [m for m in parts[1:-1] if m], parts[-1]
    least = len(head) + len(tail)

    def match(v: str) -> bool:
        if len(v) < least or not v.startswith(head) or not v.endswith(tail):
            return False
        at, end = len(head), len(v) - len(tail)
        for piece in middle:
            at = v.find(piece, at, end)
            if at < 0:
                return False
            at += len(piece)
        return True

    return match


def row_of(p: PredicateLike) -> Row:
    """Rule 8: ``p`` as a test row.  Raises where the old closure did when
    it was built: a pattern that is not a string (``as_string``)."""
    a, op = p.args, p.op
    if op is Op.IN_SET or op is Op.NOT_IN_SET:
        if len(a) <= SMALL_SET:
            return (p.attr, _C_IN if op is Op.IN_SET else _C_NOT_IN, a, None)
        return (p.attr, _C_SET if op is Op.IN_SET else _C_NOT_SET, frozenset(a), None)
    x: object = a[0] if a else None
    y: object = a[1] if len(a) > 1 else None
    code = _CODES[op]
    if _C_IEQ <= code <= _C_NOT_ISUFFIX:
        x = fold(as_string(x))  # type: ignore[arg-type]  # a pattern: a str (predicates rule 1)
    elif code in (_C_LIKE, _C_NOT_LIKE):
        x = as_string(x)  # type: ignore[arg-type]  # a pattern: a str (predicates rule 1)
    return (p.attr, code, x, y)


def holds(code: int, x: Any, y: Any, v: Any) -> bool:
    """Whether the present value ``v`` passes the test row ``(code, x, y)``
    (rule 2).  ``Any``: an event's value meets Python's own operators."""
    if code == _C_RANGE:
        return bool(x <= v <= y)
    if code == _C_EQ:
        return bool(v == x)
    if code == _C_GE:
        return bool(v >= x)
    if code == _C_LT:
        return bool(v < x)
    if code == _C_NE:
        return bool(v != x)
    if code == _C_PREFIX:
        return bool(v.startswith(x))
    if code == _C_IN:
        hash(v)
        return v in x
    if code == _C_NOT_IN:
        hash(v)
        return v not in x
    if code == _C_NOT_EXISTS:
        return False
    if code == _C_LE:
        return bool(v <= x)
    if code == _C_GT:
        return bool(v > x)
    if code == _C_NOT_RANGE:
        return not x <= v <= y
    if code == _C_SUFFIX:
        return bool(v.endswith(x))
    if code == _C_CONTAINS:
        return x in v
    if code == _C_NOT_PREFIX:
        return not v.startswith(x)
    if code == _C_NOT_SUFFIX:
        return not v.endswith(x)
    if code == _C_NOT_CONTAINS:
        return x not in v
    if code == _C_SET:
        return v in x
    if code == _C_NOT_SET:
        return v not in x
    if code == _C_IEQ:
        return bool(fold(v) == x)
    if code == _C_NOT_IEQ:
        return bool(fold(v) != x)
    if code == _C_IPREFIX:
        return fold(v).startswith(x)
    if code == _C_NOT_IPREFIX:
        return not fold(v).startswith(x)
    if code == _C_ISUFFIX:
        return fold(v).endswith(x)
    if code == _C_NOT_ISUFFIX:
        return not fold(v).endswith(x)
    if code == _C_LIKE:
        return _like_full(x)(v)
    if code == _C_NOT_LIKE:
        return not _like_full(x)(v)
    if code == _C_EXISTS:
        return True
    raise AssertionError(code)  # pragma: no cover - _CODES is exhaustive


def compile_filter(f: FilterLike) -> FilterTest:
    """``e matches F`` as one callable over the event's ``{attr: value}`` map (rule 3)."""
    return FilterTest(tuple(row_of(p) for p in f.predicates))


class FilterTest(msgspec.Struct, frozen=True, gc=False):
    """The exact test of a filter (rule 3): ``test(values)`` is whether the
    event matches it, as ``Filter.matches`` decides, raising where it raises.

    ``gc=False``: its rows hold strings, numbers and tuples of them (a
    frozenset for a set past ``SMALL_SET``), never anything that could lead
    back to it, so it can be in no reference cycle — and a channel holds one
    per stored subscription, which the cyclic GC then never traverses.
    """

    rows: tuple[Row, ...]

    def __call__(self, values: Mapping[str, Value]) -> bool:
        get = values.get
        missing = MISSING
        # The common operators inline (a call each would cost more than the
        # comparison); the rest through holds.
        for attr, code, x, y in self.rows:
            v: Any = get(attr, missing)
            if v is missing:
                if code != _C_NOT_EXISTS:
                    return False
            elif code == _C_RANGE:
                if not x <= v <= y:
                    return False
            elif code == _C_EQ:
                if not v == x:  # noqa: SIM201  # ``v == x`` itself: any value's own __eq__ decides
                    return False
            elif code == _C_GE:
                if not v >= x:
                    return False
            elif code == _C_LT:
                if not v < x:
                    return False
            elif code == _C_NE:
                if not v != x:  # noqa: SIM202  # ``v != x`` itself: any value's own __ne__ decides
                    return False
            elif code == _C_PREFIX:
                if not v.startswith(x):
                    return False
            elif code == _C_IN:
                hash(v)  # SMALL_SET: raise where a set would
                if v not in x:
                    return False
            elif not holds(code, x, y, v):
                return False
        return True
