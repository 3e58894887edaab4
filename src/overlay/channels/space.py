"""Event spaces: the part of the event space a channel owns (SPEC §2.3).

Rules this module keeps:

1. A space has exactly one constraint per distinguishing attribute, in the
   schema's DA order.  An attribute the spec calls *unconstrained* holds its
   whole domain: ``[min, max]`` for ordered kinds, "everything except ∅" for
   strings.  ``EventSpace.whole(schema)`` is the spec's ``WES``.
2. Constraints are contiguous: ordered kinds hold one interval; strings hold
   either a **type 1** explicit value set or a **type 2** "every value except
   ``excluded``" constraint.  (The spec's ``valSet2``, the values a type-2
   channel has seen, is channel state and lives on ``Channel``.)
3. ``contains``/``covers``/``overlaps`` are exact: a filter's predicates on one
   attribute are intersected first (``conjunction``) and compared with the
   constraint as sets.
4. Cutting and merging produce spaces that partition exactly what they came
   from: ``cut`` gives ``[lo, v]`` and ``(v, hi]`` (``[v+1, hi]`` for integers);
   ``take_strings`` moves values into a type-1 child; ``union`` only joins two
   spaces equal on every attribute but one, whose union is contiguous.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from overlay.channels.intervals import Interval, IntervalSet
from overlay.channels.predicates import Filter, StringConj, conjunction, satisfiable
from overlay.channels.schema import Attribute, Kind, Schema, Value, as_number
from overlay.errors import LocalProtocolError

__all__ = [
    "Constraint",
    "EventSpace",
    "ExceptConstraint",
    "RangeConstraint",
    "SetConstraint",
]


class RangeConstraint(msgspec.Struct, frozen=True, tag="range", array_like=True):
    """An ordered attribute inside one interval."""

    attr: str
    interval: Interval

    def contains_value(self, v: Value) -> bool:
        return as_number(v) in self.interval

    def values(self, attr: Attribute) -> IntervalSet:
        return IntervalSet((self.interval,), Interval(attr.min, attr.max), attr.kind.discrete)

    def is_whole(self, attr: Attribute) -> bool:
        return self.values(attr).is_whole()

    def covers_conj(self, conj: IntervalSet | StringConj, attr: Attribute) -> bool:
        assert isinstance(conj, IntervalSet)
        return conj.issubset(self.values(attr))

    def overlaps_conj(self, conj: IntervalSet | StringConj, attr: Attribute) -> bool:
        assert isinstance(conj, IntervalSet)
        return conj.overlaps(self.values(attr))

    def text(self, attr: Attribute) -> str:
        iv = self.interval
        lo, hi = attr.format(iv.lo), attr.format(iv.hi)
        return f"{attr.name} ∈ {'(' if iv.lo_open else '['}{lo}, {hi}{')' if iv.hi_open else ']'}"

    def sort_key(self) -> tuple[Any, ...]:
        return (0, self.interval.lo, self.interval.lo_open)


class SetConstraint(msgspec.Struct, frozen=True, tag="set", array_like=True):
    """Type 1: a string attribute takes one of ``values``."""

    attr: str
    values: frozenset[str]

    def contains_value(self, v: Value) -> bool:
        return v in self.values

    def is_whole(self, attr: Attribute) -> bool:
        return False

    def covers_conj(self, conj: IntervalSet | StringConj, attr: Attribute) -> bool:
        assert isinstance(conj, StringConj)
        return conj.within(self.values)

    def overlaps_conj(self, conj: IntervalSet | StringConj, attr: Attribute) -> bool:
        assert isinstance(conj, StringConj)
        if conj.finite is not None:
            return not conj.finite.isdisjoint(self.values)
        return not conj.is_empty() and any(conj.contains(v) for v in self.values)

    def text(self, attr: Attribute) -> str:
        return f"{attr.name} ∈ {{{', '.join(attr.format(v) for v in sorted(self.values))}}}"

    def sort_key(self) -> tuple[Any, ...]:
        # Type-1 before type-2 (SPEC §8.4); within type 1, by the smallest value.
        return (1, min(self.values, default=""))


class ExceptConstraint(msgspec.Struct, frozen=True, tag="except", array_like=True):
    """Type 2: a string attribute takes any value except ``excluded``."""

    attr: str
    excluded: frozenset[str] = frozenset()

    def contains_value(self, v: Value) -> bool:
        return v not in self.excluded

    def is_whole(self, attr: Attribute) -> bool:
        return not self.excluded

    def covers_conj(self, conj: IntervalSet | StringConj, attr: Attribute) -> bool:
        assert isinstance(conj, StringConj)
        if conj.finite is not None:
            return conj.finite.isdisjoint(self.excluded)
        return not any(conj.contains(x) for x in self.excluded)

    def overlaps_conj(self, conj: IntervalSet | StringConj, attr: Attribute) -> bool:
        assert isinstance(conj, StringConj)
        return not conj.minus_is_empty(self.excluded)

    def text(self, attr: Attribute) -> str:
        if not self.excluded:
            return f"{attr.name} ∈ *"
        return f"{attr.name} ∉ {{{', '.join(attr.format(v) for v in sorted(self.excluded))}}}"

    def sort_key(self) -> tuple[Any, ...]:
        return (2, min(self.excluded, default=""))


Constraint = RangeConstraint | SetConstraint | ExceptConstraint


def whole_constraint(attr: Attribute) -> Constraint:
    if attr.kind is Kind.STRING:
        return ExceptConstraint(attr.name)
    return RangeConstraint(attr.name, Interval(attr.min, attr.max))


class EventSpace(msgspec.Struct, frozen=True, array_like=True):
    """``Es``: one constraint per DA, in the schema's DA order (rule 1)."""

    constraints: tuple[Constraint, ...]

    @classmethod
    def whole(cls, schema: Schema) -> EventSpace:
        return cls(tuple(whole_constraint(schema.attributes[n]) for n in schema.da))

    @classmethod
    def build(cls, schema: Schema, overrides: Iterable[Constraint]) -> EventSpace:
        """The whole space with some constraints replaced (convenient in tests)."""
        by_attr = {c.attr: c for c in overrides}
        unknown = set(by_attr) - set(schema.da)
        if unknown:
            raise LocalProtocolError(f"not distinguishing attributes: {sorted(unknown)}")
        return cls(tuple(by_attr.get(n) or whole_constraint(schema.attributes[n]) for n in schema.da))

    def constraint(self, attr: str) -> Constraint:
        for c in self.constraints:
            if c.attr == attr:
                return c
        raise LocalProtocolError(f"{attr!r} is not a distinguishing attribute of this space")

    def contains(self, values: Mapping[str, Value]) -> bool:
        """``e ∈ Es``. An event missing a DA is in no space."""
        for c in self.constraints:
            v = values.get(c.attr)
            if v is None or not c.contains_value(v):
                return False
        return True

    def covers(self, f: Filter, schema: Schema) -> bool:
        """``Es ⊒ F``: every event matching F lies in Es (rule 3)."""
        for c in self.constraints:
            attr = schema.attributes[c.attr]
            if not c.covers_conj(conjunction(f.on(c.attr), attr), attr):
                return False
        return True

    def overlaps(self, f: Filter, schema: Schema) -> bool:
        """``Es ∩ F ≠ ∅``: some event matching F lies in Es (rule 3)."""
        da = {c.attr for c in self.constraints}
        rest = [p for p in f.predicates if p.attr not in da]
        if rest and not satisfiable(rest, schema):
            return False
        return self.meets(f, schema)

    def meets(self, f: Filter, schema: Schema) -> bool:
        """``overlaps`` for a filter known to be satisfiable (``Filter.satisfiable``):
        only its values on the constrained attributes are compared.  Attributes
        are independent, so a satisfiable filter's other attributes hold a value
        whatever the space; a routing table deciding one filter against many
        spaces checks that once, not once per space."""
        for c in self.constraints:
            attr = schema.attributes[c.attr]
            if not c.overlaps_conj(conjunction(f.on(c.attr), attr), attr):
                return False
        return True

    def belongs(self, f: Filter, schema: Schema) -> bool:
        """A subscription belongs to a channel whose space covers or overlaps it."""
        return self.overlaps(f, schema)

    def is_empty(self, schema: Schema) -> bool:
        for c in self.constraints:
            if isinstance(c, RangeConstraint):
                if c.values(schema.attributes[c.attr]).is_empty():
                    return True
            elif isinstance(c, SetConstraint) and not c.values:
                return True
        return False

    def replace(self, new: Constraint) -> EventSpace:
        return EventSpace(tuple(new if c.attr == new.attr else c for c in self.constraints))

    # -- cutting (SPEC §8.3) ---------------------------------------------------

    def cut(self, attr: Attribute, at: int | float) -> tuple[EventSpace, EventSpace]:
        """Split an ordered attribute after ``at``: ``[lo, at]`` and ``(at, hi]``."""
        c = self.constraint(attr.name)
        if not isinstance(c, RangeConstraint):
            raise LocalProtocolError(f"cannot cut string attribute {attr.name!r} at a value")
        iv = c.interval
        if at not in iv or (at == iv.hi):
            raise LocalProtocolError(f"cut point {at} of {attr.name!r} must lie inside {iv.text()} below its top")
        low = Interval(iv.lo, at, iv.lo_open, False)
        if attr.kind.discrete:
            high = Interval(int(at) + 1, iv.hi, False, iv.hi_open)
        else:
            high = Interval(at, iv.hi, True, iv.hi_open)
        return (
            self.replace(RangeConstraint(attr.name, low)),
            self.replace(RangeConstraint(attr.name, high)),
        )

    def take_strings(self, attr: str, values: Iterable[str]) -> tuple[EventSpace, EventSpace]:
        """Move ``values`` out into a type-1 child: ``(child, rest)``.

        From a type-1 parent the rest keeps the other values; from a type-2
        parent the rest excludes the moved values too.
        """
        c = self.constraint(attr)
        moved = frozenset(v for v in values if c.contains_value(v))
        if not moved:
            raise LocalProtocolError(f"no value to move out of {attr!r}")
        if isinstance(c, SetConstraint):
            if moved == c.values:
                raise LocalProtocolError(f"moving every value of {attr!r} leaves nothing")
            rest: Constraint = SetConstraint(attr, c.values - moved)
        elif isinstance(c, ExceptConstraint):
            rest = ExceptConstraint(attr, c.excluded | moved)
        else:
            raise LocalProtocolError(f"{attr!r} is not a string attribute")
        return self.replace(SetConstraint(attr, moved)), self.replace(rest)

    # -- merging (SPEC §8.4) ---------------------------------------------------

    def union(self, other: EventSpace, schema: Schema) -> EventSpace | None:
        """The merged space, or None when the union is not one contiguous space."""
        diff = [(a, b) for a, b in zip(self.constraints, other.constraints, strict=True) if a != b]
        if len(diff) != 1:
            return None
        a, b = diff[0]
        attr = schema.attributes[a.attr]
        merged = _union_constraint(a, b, attr)
        return None if merged is None else self.replace(merged)

    def sort_key(self) -> tuple[Any, ...]:
        return tuple(c.sort_key() for c in self.constraints)

    def text(self, schema: Schema) -> str:
        parts = [
            c.text(schema.attributes[c.attr]) for c in self.constraints if not c.is_whole(schema.attributes[c.attr])
        ]
        return "{" + ", ".join(parts) + "}" if parts else "WES"


def _union_constraint(a: Constraint, b: Constraint, attr: Attribute) -> Constraint | None:
    if isinstance(a, RangeConstraint) and isinstance(b, RangeConstraint):
        joined = a.values(attr).union(b.values(attr))
        if len(joined.intervals) != 1:
            return None  # a gap between them: not contiguous
        return RangeConstraint(attr.name, joined.intervals[0])
    if isinstance(a, SetConstraint) and isinstance(b, SetConstraint):
        return SetConstraint(attr.name, a.values | b.values)
    if isinstance(a, ExceptConstraint) and isinstance(b, ExceptConstraint):
        return ExceptConstraint(attr.name, a.excluded & b.excluded)
    if isinstance(a, SetConstraint) and isinstance(b, ExceptConstraint):
        return ExceptConstraint(attr.name, b.excluded - a.values)
    if isinstance(a, ExceptConstraint) and isinstance(b, SetConstraint):
        return ExceptConstraint(attr.name, a.excluded - b.values)
    return None
