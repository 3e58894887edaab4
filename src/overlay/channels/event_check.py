"""``Schema.valid_event``'s one pass (``channels.schema`` rule 6), compiled.

``channels.schema`` defines a ``msgspec.Struct`` (``Attribute``), so it stays
pure Python (``overlay.build`` rule 4) and its ``valid_event`` runs in the
interpreter: ≈ 5 % of a node's CPU per published event (issue 19).  This
module holds the same test over a table of native records, built from the
schema once, for the access node's hot path (``node.clients``).

Rules:

1. ``EventCheck(schema).valid(values)`` is True exactly when
   ``schema.valid_event(values)`` returns ``values`` itself: every item's
   attribute declared, its value of the attribute's Python type (a bool is
   no number, rule 4 there), within the bounds (a string's length), and
   every distinguishing attribute present.  False says nothing more: the
   caller asks ``check_event_values``, which names what is wrong (or, for
   an event it accepts after all, returns its copy — as ``valid_event`` does).
2. The comparisons are Python's own: an int against a float bound compares
   exactly (no conversion to float), NaN fails every bound.
"""

from __future__ import annotations

from typing import Any, Final, cast

from overlay.channels.schema import Kind, Schema

__all__ = ["EventCheck"]

# What a value's type must be: one of these per attribute.
_STRING: Final = 0
_INT: Final = 1  # int and rfid: an int, never a bool
_NUMBER: Final = 2  # float: a float or an int


class _Domain:
    """One attribute's test: its type code and bounds (a string's length's)."""

    __slots__ = ("hi", "ints", "kind", "lo", "num_hi", "num_lo")

    def __init__(self, kind: int, lo: Any, hi: Any) -> None:
        self.kind = kind
        # Int bounds compared natively; others (the float kind's, a bound set
        # by hand as a float) as the objects they are (rule 2).
        self.ints = type(lo) is int and type(hi) is int
        self.lo: int = lo if self.ints else 0
        self.hi: int = hi if self.ints else 0
        self.num_lo: Any = lo
        self.num_hi: Any = hi


class EventCheck:
    """Rule 1 for one schema."""

    __slots__ = ("_da", "_domains")

    def __init__(self, schema: Schema) -> None:
        domains: dict[str, _Domain] = {}
        for name, attr in schema.attributes.items():
            if attr.kind is Kind.STRING:
                domains[name] = _Domain(_STRING, attr.min, attr.max)
            elif attr.kind is Kind.FLOAT:
                domains[name] = _Domain(_NUMBER, attr.min, attr.max)
            else:
                domains[name] = _Domain(_INT, attr.min, attr.max)
        self._domains = domains
        self._da: tuple[str, ...] = schema.da

    def valid(self, values: dict[str, Any]) -> bool:
        # Any, not Value: a value of another type is refused here, not raised on.
        domains = self._domains
        for name, v in values.items():
            dom = domains.get(name)
            if dom is None:
                return False
            t = type(v)
            kind = dom.kind
            if kind == _STRING:
                if t is not str:
                    return False
                n = len(cast(str, v))
                if (n < dom.lo or n > dom.hi) if dom.ints else not dom.num_lo <= n <= dom.num_hi:
                    return False
            elif kind == _INT:
                if t is not int:
                    return False
                i = cast(int, v)
                if (i < dom.lo or i > dom.hi) if dom.ints else not dom.num_lo <= i <= dom.num_hi:
                    return False
            else:
                if t is not float and t is not int:
                    return False
                x: Any = v
                if not dom.num_lo <= x <= dom.num_hi:
                    return False
        return all(name in values for name in self._da)  # mypyc compiles it to a loop
