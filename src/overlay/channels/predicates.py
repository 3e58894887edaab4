"""Predicates and filters (subscriptions' conjunctions), with ``L(f)``, matching,
coverage and overlap (SPEC §2.2).

Rules this module keeps:

1. A predicate is ``(attr, op, args)``; the attribute's kind comes from the
   schema, so ``args`` are plain values: one for comparisons, two for
   ``in[lo, hi]``, any number (≥ 1) for ``in{...}``.
2. ``L(f)`` of an ordered attribute is an ``IntervalSet`` clipped to the
   domain.  ``L(f)`` of a string attribute is taken over all strings (the
   schema's length bound validates values; it does not narrow ``L``), and a
   conjunction of string predicates is a ``StringConj`` that decides
   emptiness, membership, finiteness and containment exactly.
3. ``a`` satisfies ``f`` iff same attribute and ``value ∈ L(f)``; ``e``
   matches ``F`` iff every predicate of ``F`` is satisfied by ``e``'s item on
   that attribute (an event has one item per attribute).
4. ``f1 ⊒ f2`` iff same attribute and ``L(f1) ⊇ L(f2)``; ``F1 ⊒ F2`` iff every
   predicate of ``F1`` covers some predicate of ``F2`` (the spec's definition,
   sound but not complete for conjunctions).
5. ``F1 includes F2`` iff for every predicate ``f`` of ``F1``, ``L(f)``
   contains ``L`` of the conjunction of ``F2``'s predicates on ``f``'s
   attribute (that conjunction is the whole domain when ``F2`` has none there,
   and a non-distinguishing attribute ``F2`` leaves free may be absent from an
   event, which ``f`` then fails).  Since an event has one item per attribute,
   this is exact for the satisfiable filters the parser lets in: every event
   matching ``F2`` matches ``F1``, and ``F1 ⊒ F2`` implies it.  A content
   scope uses it (``overlay.auth``): ``price in [10, 20]`` includes
   ``price >= 10 and price <= 20``, which no single predicate is within.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import msgspec

from overlay.channels.intervals import Interval, IntervalSet
from overlay.channels.schema import Attribute, Kind, Schema, Value, as_number, as_string
from overlay.errors import SchemaError

__all__ = [
    "MAX_SET_SIZE",
    "Filter",
    "Op",
    "Predicate",
    "StringConj",
    "ValueSet",
    "compile_filter",
    "conjunction",
    "predicate_values",
]

# An in{...} set larger than this is refused: the set lives in every channel
# the subscription belongs to and is scanned when coverage is decided.
MAX_SET_SIZE: Final = 1024


class Op(enum.StrEnum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    IN_RANGE = "in[]"
    PREFIX = "prefix"
    SUFFIX = "suffix"
    CONTAINS = "contains"
    IN_SET = "in{}"


ORDERED_OPS: Final = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.IN_RANGE})
STRING_OPS: Final = frozenset({Op.EQ, Op.NE, Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.IN_SET})


class Predicate(msgspec.Struct, frozen=True, array_like=True):
    """``f = (type, attr, op, value)``; the type is the schema's kind of ``attr``."""

    attr: str
    op: Op
    args: tuple[Value, ...]

    def text(self, schema: Schema | None = None) -> str:
        fmt = schema.attributes[self.attr].format if schema else _plain
        if self.op is Op.IN_RANGE:
            return f"{self.attr} in [{fmt(self.args[0])}, {fmt(self.args[1])}]"
        if self.op is Op.IN_SET:
            return f"{self.attr} in {{{', '.join(fmt(a) for a in self.args)}}}"
        return f"{self.attr} {self.op.value} {fmt(self.args[0])}"

    def check(self, schema: Schema) -> Predicate:
        """Validate against the schema (rule 1); return self or raise SchemaError."""
        attr = schema.attribute(self.attr)
        allowed = STRING_OPS if attr.kind is Kind.STRING else ORDERED_OPS
        if self.op not in allowed:
            raise SchemaError(
                f"operator {self.op.value!r} does not apply to {attr.kind.value} attribute {attr.name!r}",
                attr=attr.name,
            )
        n = len(self.args)
        if self.op is Op.IN_RANGE:
            if n != 2:
                raise SchemaError(f"in[lo, hi] on {attr.name!r} needs two bounds", attr=attr.name)
        elif self.op is Op.IN_SET:
            if not 1 <= n <= MAX_SET_SIZE:
                raise SchemaError(
                    f"in{{...}} on {attr.name!r} needs 1 to {MAX_SET_SIZE} values, got {n}",
                    attr=attr.name,
                )
        elif n != 1:
            raise SchemaError(f"operator {self.op.value!r} on {attr.name!r} takes one value", attr=attr.name)
        if self.op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS):
            # A pattern is a fragment of a value: its type matters, not its length bound.
            if type(self.args[0]) is not str:
                raise SchemaError(f"{self.op.value} on {attr.name!r} needs a string", attr=attr.name)
        else:
            for a in self.args:
                attr.check(a)
        # attr.check passed both bounds of in[] (an ordered operator): numbers.
        if self.op is Op.IN_RANGE and as_number(self.args[0]) > as_number(self.args[1]):
            raise SchemaError(f"in[lo, hi] on {attr.name!r} has lo above hi", attr=attr.name)
        return self

    def satisfied_by(self, value: Value) -> bool:
        return _TESTS[self.op](self.args, value)


def _plain(v: Value) -> str:
    return repr(v)


# -- satisfaction ------------------------------------------------------------
#
# The tests below apply Python's own operators to an event's value, whatever
# its type: an event need not have been checked against the schema (a caller
# may pass any mapping), and ``LinearMatcher``, the reference the index is
# held to, is these closures.  A value of the wrong kind makes them raise
# (``"a" < 5`` a TypeError, ``(5).startswith`` an AttributeError) instead of
# answering — narrowing the value first would change that answer, and cost a
# check per predicate on the hottest path.  So each comparison of an event's
# value carries an ignore saying so.


def _in_set(args: tuple[Value, ...], v: Value) -> bool:
    return v in args


_TESTS: Final[dict[Op, Callable[[tuple[Value, ...], Value], bool]]] = {
    Op.EQ: lambda a, v: v == a[0],
    Op.NE: lambda a, v: v != a[0],
    Op.LT: lambda a, v: v < a[0],  # type: ignore[operator]  # any event value: Python decides, or raises
    Op.LE: lambda a, v: v <= a[0],  # type: ignore[operator]  # any event value: Python decides, or raises
    Op.GT: lambda a, v: v > a[0],  # type: ignore[operator]  # any event value: Python decides, or raises
    Op.GE: lambda a, v: v >= a[0],  # type: ignore[operator]  # any event value: Python decides, or raises
    Op.IN_RANGE: lambda a, v: a[0] <= v <= a[1],  # type: ignore[operator]  # any event value: Python decides, or raises
    Op.PREFIX: lambda a, v: v.startswith(a[0]),  # type: ignore[union-attr, arg-type]  # any event value: its own method decides, or raises
    Op.SUFFIX: lambda a, v: v.endswith(a[0]),  # type: ignore[union-attr, arg-type]  # any event value: its own method decides, or raises
    Op.CONTAINS: lambda a, v: a[0] in v,  # type: ignore[operator]  # any event value: Python decides, or raises
    Op.IN_SET: _in_set,
}


def _compile_predicate(p: Predicate) -> Callable[[Value], bool]:
    """A closure testing one value: the hot path of matching, so one call each."""
    a = p.args
    x = a[0]
    match p.op:
        case Op.EQ:
            return lambda v: v == x
        case Op.NE:
            return lambda v: v != x
        case Op.LT:
            return lambda v: v < x  # type: ignore[operator]  # any event value: Python decides, or raises
        case Op.LE:
            return lambda v: v <= x  # type: ignore[operator]  # any event value: Python decides, or raises
        case Op.GT:
            return lambda v: v > x  # type: ignore[operator]  # any event value: Python decides, or raises
        case Op.GE:
            return lambda v: v >= x  # type: ignore[operator]  # any event value: Python decides, or raises
        case Op.IN_RANGE:
            y = a[1]
            return lambda v: x <= v <= y  # type: ignore[operator]  # any event value: Python decides, or raises
        case Op.PREFIX:
            return lambda v: v.startswith(x)  # type: ignore[union-attr, arg-type]  # any event value: its own method decides, or raises
        case Op.SUFFIX:
            return lambda v: v.endswith(x)  # type: ignore[union-attr, arg-type]  # any event value: its own method decides, or raises
        case Op.CONTAINS:
            return lambda v: x in v  # type: ignore[operator]  # any event value: Python decides, or raises
        case Op.IN_SET:
            s = frozenset(a)
            return lambda v: v in s
    raise AssertionError(p.op)  # pragma: no cover - Op is exhaustive


def compile_filter(f: Filter) -> Callable[[Mapping[str, Value]], bool]:
    """``e matches F`` as one closure over the event's ``{attr: value}`` map."""
    checks = tuple((p.attr, _compile_predicate(p)) for p in f.predicates)
    missing = _MISSING

    def matches(values: Mapping[str, Value]) -> bool:
        get = values.get
        for attr, test in checks:
            v = get(attr, missing)
            if v is missing or not test(v):
                return False
        return True

    return matches


class _Missing(enum.Enum):
    """The value of an attribute the event lacks (no predicate on it holds)."""

    MISSING = enum.auto()


_MISSING: Final = _Missing.MISSING


class Filter(msgspec.Struct, frozen=True, array_like=True):
    """``F = f1 ∧ … ∧ fn`` (n ≥ 1). Invariant: predicates in the order written."""

    predicates: tuple[Predicate, ...]

    def matches(self, values: Mapping[str, Value]) -> bool:
        """Rule 3."""
        for p in self.predicates:
            v = values.get(p.attr, _MISSING)
            if v is _MISSING or not p.satisfied_by(v):
                return False
        return True

    def attrs(self) -> frozenset[str]:
        return frozenset(p.attr for p in self.predicates)

    def on(self, attr: str) -> tuple[Predicate, ...]:
        return tuple(p for p in self.predicates if p.attr == attr)

    def covers(self, other: Filter, schema: Schema) -> bool:
        """Rule 4: every predicate of self covers some predicate of other."""
        return all(any(covers(p, q, schema) for q in other.predicates) for p in self.predicates)

    def includes(self, other: Filter, schema: Schema) -> bool:
        """Rule 5: every event matching ``other`` matches ``self``, decided
        attribute by attribute (a content scope and a subscription, ``overlay.auth``)."""
        for p in self.predicates:
            attr = schema.attribute(p.attr)
            on = other.on(p.attr)
            if not on and not schema.is_da(p.attr):
                return False  # other matches events without the attribute; self never does
            if attr.kind is Kind.STRING:
                if not _string_covers(p, StringConj(on)):
                    return False
                continue
            allowed = IntervalSet.whole(_domain(attr), attr.kind.discrete)
            for q in on:
                allowed = allowed.intersection(_interval_values(q, attr))
            if not allowed.issubset(_interval_values(p, attr)):
                return False
        return True

    def text(self, schema: Schema | None = None) -> str:
        return " and ".join(p.text(schema) for p in self.predicates)

    def check(self, schema: Schema) -> Filter:
        if not self.predicates:
            raise SchemaError("a subscription needs at least one predicate")
        for p in self.predicates:
            p.check(schema)
        return self


# -- L(f) ---------------------------------------------------------------------


class StringConj:
    """``L`` of a conjunction of string predicates, decided exactly.

    Either finite (some ``=``/``in{}`` present: ``finite`` holds exactly the
    values satisfying every predicate — strings, when the predicates passed
    ``Predicate.check``; ``Value`` is what an unchecked one may hold, which
    the matcher's placement skips) or infinite: then it is non-empty iff
    the prefixes are pairwise prefix-consistent and the suffixes
    suffix-consistent — ``longest prefix + contains… + longest suffix`` plus any
    padding is a member, and ``!=`` removes only finitely many.
    """

    __slots__ = ("_empty", "finite", "predicates")

    def __init__(self, predicates: Sequence[Predicate]) -> None:
        self.predicates = tuple(predicates)
        finite: frozenset[Value] | None = None
        for p in self.predicates:
            if p.op is Op.EQ or p.op is Op.IN_SET:
                vals = frozenset(p.args)
                finite = vals if finite is None else finite & vals
        if finite is not None:
            finite = frozenset(v for v in finite if self.contains(v))
            self._empty = not finite
        else:
            self._empty = not (
                _chain(self._args(Op.PREFIX), str.startswith) and _chain(self._args(Op.SUFFIX), str.endswith)
            )
        self.finite = finite

    def _args(self, op: Op) -> list[str]:
        """The patterns of the ``op`` predicates (strings, rule 1)."""
        return [as_string(p.args[0]) for p in self.predicates if p.op is op]

    def contains(self, value: Value) -> bool:
        return all(p.satisfied_by(value) for p in self.predicates)

    def is_empty(self) -> bool:
        return self._empty

    def is_whole(self) -> bool:
        return self.finite is None and all(
            p.op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS) and p.args[0] == "" for p in self.predicates
        )


def _chain(items: list[str], extends: Callable[[str, str], bool]) -> bool:
    longest = max(items, key=len, default="")
    return all(extends(longest, x) for x in items)


ValueSet = IntervalSet | StringConj


def _domain(attr: Attribute) -> Interval:
    return Interval(attr.min, attr.max)


def predicate_values(p: Predicate, attr: Attribute) -> ValueSet:
    """``L(f)`` (rule 2)."""
    if attr.kind is Kind.STRING:
        return StringConj((p,))
    return _interval_values(p, attr)


def _interval_values(p: Predicate, attr: Attribute) -> IntervalSet:
    """``L(f)`` on an ordered attribute, whose values are numbers (rule 1)."""
    dom = _domain(attr)
    discrete = attr.kind.discrete
    a = p.args
    match p.op:
        case Op.EQ:
            x = as_number(a[0])
            ivs = [Interval(x, x)]
        case Op.NE:
            x = as_number(a[0])
            return IntervalSet([Interval(x, x)], dom, discrete).complement()
        case Op.LT:
            ivs = [Interval(attr.min, as_number(a[0]), False, True)]
        case Op.LE:
            ivs = [Interval(attr.min, as_number(a[0]))]
        case Op.GT:
            ivs = [Interval(as_number(a[0]), attr.max, True, False)]
        case Op.GE:
            ivs = [Interval(as_number(a[0]), attr.max)]
        case Op.IN_RANGE:
            ivs = [Interval(as_number(a[0]), as_number(a[1]))]
        case _:
            raise SchemaError(
                f"operator {p.op.value!r} does not apply to {attr.kind.value} attribute {attr.name!r}",
                attr=attr.name,
            )
    return IntervalSet(ivs, dom, discrete)


def conjunction(preds: Iterable[Predicate], attr: Attribute) -> ValueSet:
    """``L(f1 ∧ … ∧ fk)`` for predicates all on ``attr``; no predicate → whole."""
    preds = list(preds)
    if attr.kind is Kind.STRING:
        return StringConj(preds)
    out = IntervalSet.whole(_domain(attr), attr.kind.discrete)
    for p in preds:
        out = out.intersection(_interval_values(p, attr))
    return out


# -- coverage and overlap of single predicates --------------------------------


def covers(p: Predicate, q: Predicate, schema: Schema) -> bool:
    """``p ⊒ q``: same attribute and ``L(p) ⊇ L(q)``."""
    if p.attr != q.attr:
        return False
    attr = schema.attribute(p.attr)
    if attr.kind is Kind.STRING:
        return _string_covers(p, StringConj((q,)))
    lp = _interval_values(p, attr)
    lq = _interval_values(q, attr)
    return lq.issubset(lp)


def overlaps(p: Predicate, q: Predicate, schema: Schema) -> bool:
    """``L(p) ∩ L(q) ≠ ∅`` on the same attribute."""
    if p.attr != q.attr:
        return False
    attr = schema.attribute(p.attr)
    if attr.kind is Kind.STRING:
        return not StringConj((p, q)).is_empty()
    return _interval_values(p, attr).overlaps(_interval_values(q, attr))


def _string_covers(p: Predicate, q: StringConj) -> bool:
    """``L(p) ⊇ L(q)`` for one string predicate p and a conjunction q."""
    if q.is_empty():
        return True
    if q.finite is not None:
        return all(p.satisfied_by(v) for v in q.finite)
    # q is infinite from here on.  Patterns are strings (rule 1).
    x = p.args[0]
    qs = q.predicates
    match p.op:
        case Op.EQ | Op.IN_SET:
            return False
        case Op.NE:
            return not q.contains(x)
        case Op.PREFIX:
            return x == "" or any(r.op is Op.PREFIX and as_string(r.args[0]).startswith(as_string(x)) for r in qs)
        case Op.SUFFIX:
            return x == "" or any(r.op is Op.SUFFIX and as_string(r.args[0]).endswith(as_string(x)) for r in qs)
        case Op.CONTAINS:
            return x == "" or any(
                r.op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS) and as_string(x) in as_string(r.args[0]) for r in qs
            )
    raise AssertionError(p.op)  # pragma: no cover
