"""Predicates and filters (subscriptions' conjunctions), with ``L(f)``, matching,
coverage and overlap (SPEC §2.2).

Rules this module keeps:

1. A predicate is ``(attr, op, args)``; the attribute's kind comes from the
   schema, so ``args`` are plain values: none for ``exists``/``not exists``,
   one for comparisons and patterns, two for ``in[lo, hi]`` and ``not in[lo,
   hi]``, any number (≥ 1) for ``in{...}``/``not in{...}``.
2. ``L(f)`` — the values of a *present* attribute ``f`` accepts — of an
   ordered attribute is an ``IntervalSet`` clipped to the domain (``not
   in[]`` its complement, ``exists`` the whole domain, ``not exists``
   nothing).  ``L(f)`` of a string attribute is taken over all strings (the
   schema's length bound validates values; it does not narrow ``L``), and a
   conjunction of string predicates is a ``StringConj`` that decides
   emptiness and containment exactly, whatever the operators
   (``overlay.channels.strings``: every string predicate is an automaton).
3. ``a`` satisfies ``f`` iff same attribute and ``value ∈ L(f)``; ``e``
   matches ``F`` iff every predicate of ``F`` is satisfied by ``e``'s item on
   that attribute (an event has one item per attribute).  An event may lack
   a non-distinguishing attribute: then only ``not exists`` on it holds.
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
   ``not exists a`` in ``F1`` is satisfied iff ``F2`` lets ``a`` take no value.
6. Every operator has a negation (``NEGATION``, ``Predicate.negated``): the
   predicate a *present* value satisfies iff it fails the original (``=`` and
   ``!=``, ``<`` and ``>=``, ``prefix`` and ``not prefix``, …, ``exists`` and
   ``not exists``).  So ``not`` in the language (``overlay.channels.dnf``
   rule 2) needs no operator of its own, and a negated predicate is false on
   an absent attribute, like the original.
7. A conjunction is satisfiable iff on each attribute it names, either every
   predicate is ``not exists`` and the attribute is not distinguishing, or
   the values every predicate allows meet (rule 2): attributes are
   independent, so this is exact.
8. Nothing a stored subscription keeps is traversed by the cyclic GC: a
   node holds hundreds of thousands, and a full collection visits every
   tracked object (10.9 s at 160,000 subscriptions per node, measured —
   peers took the stalled node for dead).  ``Predicate`` and ``Filter`` are
   ``gc=False`` structs (they hold names, operators and values: no cycle
   can run through them), so the tuples holding them are not tracked
   either; the exact test of a filter (``compile_filter``,
   ``overlay.channels.satisfaction``) is a
   ``gc=False`` ``FilterTest`` of rows ``(attr, code, x, y)`` of plain
   values, read by shared code — no closure per predicate or per filter.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec

from overlay.channels.intervals import Interval, IntervalSet
from overlay.channels.operators import MAX_SET_SIZE, NEGATION, ORDERED_OPS, PATTERN_OPS, STRING_OPS, Op
from overlay.channels.satisfaction import MISSING, SMALL_SET, FilterTest, compile_filter, holds, row_of
from overlay.channels.schema import Attribute, Kind, Schema, Value, as_number, as_string
from overlay.channels.strings import STAR, Auto, glob_auto, is_empty, set_auto
from overlay.errors import SchemaError

__all__ = [
    "MAX_SET_SIZE",
    "NEGATION",
    "ORDERED_OPS",
    "PATTERN_OPS",
    "SMALL_SET",
    "STRING_OPS",
    "Filter",
    "FilterTest",
    "Op",
    "Predicate",
    "StringConj",
    "ValueSet",
    "compile_filter",
    "conjunction",
    "predicate_values",
]


class Predicate(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """``f = (type, attr, op, value)``; the type is the schema's kind of ``attr``.

    ``gc=False`` (rule 8): an attribute name, an operator and a tuple of
    values can lead back to nothing, so no cycle runs through a predicate.
    """

    attr: str
    op: Op
    args: tuple[Value, ...]

    def __post_init__(self) -> None:
        # One string per attribute name, however many predicates name it: a
        # parsed or decoded predicate brings a copy of its own (≈ 50 bytes),
        # and a node keeps a million predicates.  Names come from the schema,
        # so the interned ones are few.
        if type(self.attr) is str:
            msgspec.structs.force_setattr(self, "attr", sys.intern(self.attr))

    def text(self, schema: Schema | None = None) -> str:
        fmt = schema.attributes[self.attr].format if schema else _plain
        op = self.op
        if op is Op.EXISTS:
            return f"exists {self.attr}"
        if op is Op.NOT_EXISTS:
            return f"not exists {self.attr}"
        if op is Op.IN_RANGE or op is Op.NOT_IN_RANGE:
            word = "in" if op is Op.IN_RANGE else "not in"
            return f"{self.attr} {word} [{fmt(self.args[0])}, {fmt(self.args[1])}]"
        if op is Op.IN_SET or op is Op.NOT_IN_SET:
            word = "in" if op is Op.IN_SET else "not in"
            return f"{self.attr} {word} {{{', '.join(fmt(a) for a in self.args)}}}"
        if op.value.startswith("not "):  # a negated pattern: `not` before the predicate
            return f"not {self.attr} {op.value[4:]} {fmt(self.args[0])}"
        return f"{self.attr} {op.value} {fmt(self.args[0])}"

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
        if self.op is Op.EXISTS or self.op is Op.NOT_EXISTS:
            if n != 0:
                raise SchemaError(f"{self.op.value} {attr.name} takes no value", attr=attr.name)
            return self
        if self.op is Op.IN_RANGE or self.op is Op.NOT_IN_RANGE:
            if n != 2:
                raise SchemaError(f"in[lo, hi] on {attr.name!r} needs two bounds", attr=attr.name)
        elif self.op is Op.IN_SET or self.op is Op.NOT_IN_SET:
            if not 1 <= n <= MAX_SET_SIZE:
                raise SchemaError(
                    f"in{{...}} on {attr.name!r} needs 1 to {MAX_SET_SIZE} values, got {n}",
                    attr=attr.name,
                )
        elif n != 1:
            raise SchemaError(f"operator {self.op.value!r} on {attr.name!r} takes one value", attr=attr.name)
        if self.op in PATTERN_OPS:
            # A pattern is a fragment of a value: its type matters, not its length bound.
            if type(self.args[0]) is not str:
                raise SchemaError(f"{self.op.value} on {attr.name!r} needs a string", attr=attr.name)
        else:
            for a in self.args:
                attr.check(a)
        # attr.check passed both bounds of in[] (an ordered operator): numbers.
        if self.op in (Op.IN_RANGE, Op.NOT_IN_RANGE) and as_number(self.args[0]) > as_number(self.args[1]):
            raise SchemaError(f"in[lo, hi] on {attr.name!r} has lo above hi", attr=attr.name)
        return self

    def satisfied_by(self, value: Value) -> bool:
        """Whether a present value satisfies the predicate (an absent one
        satisfies only ``not exists``: rule 3)."""
        _attr, code, x, y = row_of(self)
        return holds(code, x, y, value)

    def negated(self) -> Predicate:
        """Rule 6: the predicate a present value satisfies iff it fails this one."""
        return Predicate(self.attr, NEGATION[self.op], self.args)

    def glob(self) -> Auto:
        """This string predicate's automaton (``overlay.channels.strings``)."""
        return _glob_of(self)


def _plain(v: Value) -> str:
    return repr(v)


@functools.lru_cache(maxsize=65536)
def _glob_of(p: Predicate) -> Auto:
    """Rule 2 (``overlay.channels.strings`` rule 1): a string predicate's automaton."""
    op = p.op
    neg = op in _NEGATIVE
    if op is Op.EQ or op is Op.NE or op is Op.IN_SET or op is Op.NOT_IN_SET:
        return set_auto((v for v in p.args if type(v) is str), negated=neg)
    if op is Op.EXISTS or op is Op.NOT_EXISTS:
        return glob_auto((STAR,), negated=neg)
    x = as_string(p.args[0])
    chars: list[str | None] = list(x)
    kind = op.value.removeprefix("not ")
    folded = kind.startswith("i") and kind != "in{}"
    if kind == "like":
        chars = [STAR if c == "*" else c for c in x]
    elif kind in ("prefix", "iprefix"):
        chars.append(STAR)
    elif kind in ("suffix", "isuffix"):
        chars.insert(0, STAR)
    elif kind == "contains":
        chars = [STAR, *chars, STAR]
    return glob_auto(chars, folded=folded, negated=neg)


_NEGATIVE: Final = frozenset(op for op in Op if op.value.startswith("not ") or op is Op.NE)


class Filter(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """``F = f1 ∧ … ∧ fn`` (n ≥ 1). Invariant: predicates in the order written.

    ``gc=False`` (rule 8): it holds predicates only, so it is in no cycle.
    """

    predicates: tuple[Predicate, ...]

    def matches(self, values: Mapping[str, Value]) -> bool:
        """Rule 3."""
        for p in self.predicates:
            v = values.get(p.attr, MISSING)
            if v is MISSING:
                if p.op is not Op.NOT_EXISTS:
                    return False
            elif not p.satisfied_by(v):
                return False
        return True

    def attrs(self) -> frozenset[str]:
        return frozenset(p.attr for p in self.predicates)

    def on(self, attr: str) -> tuple[Predicate, ...]:
        return tuple(p for p in self.predicates if p.attr == attr)

    def covers(self, other: Filter, schema: Schema) -> bool:
        """Rule 4: every predicate of self covers some predicate of other."""
        return all(any(covers(p, q, schema) for q in other.predicates) for p in self.predicates)

    def satisfiable(self, schema: Schema) -> bool:
        """Rule 7: whether some event matches this conjunction."""
        return satisfiable(self.predicates, schema)

    def includes(self, other: Filter, schema: Schema) -> bool:
        """Rule 5: every event matching ``other`` matches ``self``, decided
        attribute by attribute (a content scope and a subscription, ``overlay.auth``)."""
        if not other.satisfiable(schema):
            return True
        for p in self.predicates:
            attr = schema.attribute(p.attr)
            on = other.on(p.attr)
            values = conjunction(on, attr)
            # other lets the attribute be absent: every predicate on it is `not exists`.
            absent_ok = not schema.is_da(p.attr) and all(q.op is Op.NOT_EXISTS for q in on)
            if p.op is Op.NOT_EXISTS:
                if not values.is_empty():  # other lets the attribute be present
                    return False
                continue
            if absent_ok:
                return False  # other matches events without the attribute; p never does
            if not _values_within(values, p, attr):
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


def satisfiable(preds: Iterable[Predicate], schema: Schema) -> bool:
    """Rule 7: some event satisfies every predicate of ``preds``.

    Attributes are independent: on each, either every predicate is ``not
    exists`` and the attribute is not distinguishing (an event may lack it),
    or the values every predicate allows (``not exists`` allows none) meet.
    """
    by_attr: dict[str, list[Predicate]] = {}
    for p in preds:
        by_attr.setdefault(p.attr, []).append(p)
    for name, on in by_attr.items():
        if all(p.op is Op.NOT_EXISTS for p in on) and not schema.is_da(name):
            continue
        if conjunction(on, schema.attribute(name)).is_empty():
            return False
    return True


def _values_within(values: ValueSet, p: Predicate, attr: Attribute) -> bool:
    """``values ⊆ L(p)``."""
    if isinstance(values, StringConj):
        return _string_covers(p, values)
    return values.issubset(_interval_values(p, attr))


# -- L(f) ---------------------------------------------------------------------


class StringConj:
    """``L`` of a conjunction of string predicates, decided exactly.

    ``finite`` holds exactly the values satisfying every predicate when some
    ``=``/``in{}`` is present (strings, when the predicates passed
    ``Predicate.check``; ``Value`` is what an unchecked one may hold, which
    the matcher's placement skips), and is None otherwise — the language may
    still be finite (``ieq "ab"``), which the exact tests below never assume
    it is not.  Emptiness, and emptiness once finitely many values are taken
    out, are decided by ``overlay.channels.strings`` (its rule 3), lazily.
    """

    __slots__ = ("_empty", "finite", "predicates")

    def __init__(self, predicates: Sequence[Predicate]) -> None:
        self.predicates = tuple(predicates)
        finite: frozenset[Value] | None = None
        for p in self.predicates:
            if p.op is Op.EQ or p.op is Op.IN_SET:
                vals = frozenset(p.args)
                finite = vals if finite is None else finite & vals
        self._empty: bool | None = None
        if finite is not None:
            finite = frozenset(v for v in finite if self.contains(v))
            self._empty = not finite
        self.finite = finite

    def contains(self, value: Value) -> bool:
        return all(p.satisfied_by(value) for p in self.predicates)

    def is_empty(self) -> bool:
        if self._empty is None:
            self._empty = _strings_empty(self.predicates)
        return self._empty

    def is_whole(self) -> bool:
        return self.finite is None and all(_is_whole_pattern(p) for p in self.predicates)

    def minus_is_empty(self, excluded: Iterable[str]) -> bool:
        """Whether no value is left once ``excluded`` is taken out (False when
        too intricate to decide, ``strings`` rule 4: a subscription then
        overlaps one channel more, which matching, exact per event, never turns
        into a delivery; raised, it failed the node's handling of a Subscribe
        the parser had accepted — a traceback, and no answer)."""
        if self.finite is not None:
            return self.finite <= frozenset(excluded)
        if not self.predicates:
            return False  # every string, minus finitely many
        try:
            if self.is_empty():
                return True
            hit = tuple(sorted(x for x in excluded if self.contains(x)))
            if not hit:
                return False
            return _strings_empty((*self.predicates, Predicate(self.predicates[0].attr, Op.NOT_IN_SET, hit)))
        except SchemaError:
            return False

    def within(self, values: frozenset[str]) -> bool:
        """Whether every value of the language is one of ``values`` (False when
        too intricate to decide: not covered, the safe side)."""
        if self.finite is not None:
            return self.finite <= values
        try:
            if self.is_empty():
                return True
            if not values or not self.predicates:
                return False
            return _strings_empty((*self.predicates, Predicate(self.predicates[0].attr, Op.NOT_IN_SET, tuple(values))))
        except SchemaError:
            return False


def _is_whole_pattern(p: Predicate) -> bool:
    if p.op is Op.EXISTS:
        return True
    if p.op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.IPREFIX, Op.ISUFFIX):
        return p.args[0] == ""
    if p.op is Op.LIKE:
        return type(p.args[0]) is str and p.args[0] != "" and set(p.args[0]) == {"*"}
    return False


def _strings_empty(preds: tuple[Predicate, ...]) -> bool:
    """Rule 2: emptiness of a conjunction of string predicates, exactly."""
    autos = []
    for p in preds:
        if p.op is Op.NOT_EXISTS:
            return True  # no present value satisfies it
        if p.op is not Op.EXISTS:
            autos.append(p.glob())
    if not autos:
        return False
    if len(autos) == 1 and not autos[0].negated:
        return False  # a positive automaton always accepts something (rule 1 of strings)
    return is_empty(autos)


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
        case Op.NOT_IN_RANGE:
            inside = IntervalSet([Interval(as_number(a[0]), as_number(a[1]))], dom, discrete)
            return inside.complement()
        case Op.EXISTS:
            return IntervalSet.whole(dom, discrete)
        case Op.NOT_EXISTS:
            return IntervalSet.empty_set(dom, discrete)
        case _:
            raise SchemaError(
                f"operator {p.op.value!r} does not apply to {attr.kind.value} attribute {attr.name!r}",
                attr=attr.name,
            )
    return IntervalSet(ivs, dom, discrete)


def conjunction(preds: Iterable[Predicate], attr: Attribute) -> ValueSet:
    """``L(f1 ∧ … ∧ fk)`` for predicates all on ``attr``; no predicate → whole.
    The values of a present attribute: ``not exists`` allows none."""
    preds = list(preds)
    if attr.kind is Kind.STRING:
        return StringConj(preds)
    if not preds:
        return IntervalSet.whole(_domain(attr), attr.kind.discrete)
    # Every L(f) is already clipped to the domain (intervals rule 1): the
    # first needs no intersection with the whole domain.  Most attributes of
    # a subscription carry one predicate, and a subscription's routing and
    # checks call this for each of them.
    out = _interval_values(preds[0], attr)
    for p in preds[1:]:
        out = out.intersection(_interval_values(p, attr))
    return out


# -- coverage and overlap of single predicates --------------------------------


def covers(p: Predicate, q: Predicate, schema: Schema) -> bool:
    """``p ⊒ q``: same attribute and every attribute state satisfying ``q``
    satisfies ``p`` (``L(p) ⊇ L(q)``, and ``not exists`` only by itself)."""
    if p.attr != q.attr:
        return False
    attr = schema.attribute(p.attr)
    if q.op is Op.NOT_EXISTS:
        return p.op is Op.NOT_EXISTS or schema.is_da(q.attr)
    if p.op is Op.NOT_EXISTS:
        return predicate_values(q, attr).is_empty()
    if attr.kind is Kind.STRING:
        return _string_covers(p, StringConj((q,)))
    lp = _interval_values(p, attr)
    lq = _interval_values(q, attr)
    return lq.issubset(lp)


def overlaps(p: Predicate, q: Predicate, schema: Schema) -> bool:
    """Some attribute state satisfies both (on the same attribute)."""
    if p.attr != q.attr:
        return False
    attr = schema.attribute(p.attr)
    if p.op is Op.NOT_EXISTS or q.op is Op.NOT_EXISTS:
        return p.op is q.op and not schema.is_da(p.attr)
    if attr.kind is Kind.STRING:
        return not StringConj((p, q)).is_empty()
    return _interval_values(p, attr).overlaps(_interval_values(q, attr))


def _string_covers(p: Predicate, q: StringConj) -> bool:
    """``L(p) ⊇ L(q)`` for one string predicate p and a conjunction q: no
    value of q fails p."""
    if q.is_empty():
        return True
    if q.finite is not None:
        return all(p.satisfied_by(v) for v in q.finite)
    return _strings_empty((*q.predicates, p.negated()))
