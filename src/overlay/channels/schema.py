"""The schema: attributes, their kinds and domains, and the distinguishing attributes.

Rules this module keeps (SPEC §2.1):

1. Every attribute has a name, a kind and a closed domain ``[min, max]``.
   Kinds: ``int`` and ``float`` (the spec's *numeric*), ``rfid`` and ``string``.
2. ``rfid`` values are 64-bit EPC-like codes compared as ordered unsigned
   integers.  Their one textual form is the dotted ``header.manager.class.serial``
   with field widths 8.20.12.24 bits, mapped to
   ``header << 56 | manager << 36 | class << 24 | serial``; a plain integer is
   accepted too.  64 bits, not 96: msgpack carries at most 64-bit integers, and
   native ints keep matching and range cuts at int speed on every node.
3. For ``string`` attributes ``min``/``max`` bound the *length* of a value (strings
   have no useful order for cutting spaces; see SPEC §2.3 type-1/type-2 sets).
4. Values are never coerced: a bool is not a number, a float is not an int, and a
   value outside the domain is refused with a ``SchemaError`` naming the attribute.
5. The distinguishing attributes (DA) are a non-empty subset of the attributes;
   every event carries all of them.
6. An event is checked once, where it enters the cluster (a client's Publish
   at its access node; a peer's Event, ``node.peer_checks``), by
   ``Schema.valid_event``: one pass over its items against a table made with
   the schema (a value's Python types and bounds per attribute), the values
   kept as they are — rule 4 means a valid value is never converted, so the
   decoded dict itself is the event.  What it refuses is told by
   ``check_event_values``, which names the attribute.
"""

from __future__ import annotations

import enum
import math
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from overlay.errors import ConfigError, SchemaError

__all__ = [
    "RFID_MAX",
    "Attribute",
    "Kind",
    "Schema",
    "Value",
    "as_number",
    "as_string",
    "format_rfid",
    "parse_rfid",
]

Value = int | float | str

# Field widths of the dotted rfid form: header, manager, object class, serial.
_RFID_FIELDS: Final = (8, 20, 12, 24)
RFID_MAX: Final = (1 << 64) - 1
# Decimal digits of the widest field, 2**24 - 1.
_RFID_FIELD_DIGITS: Final = len(str((1 << max(_RFID_FIELDS)) - 1))
# Strings longer than this are refused unless the schema says otherwise; a bound
# keeps a single hostile event from pinning memory in every channel record.
DEFAULT_STRING_MAX_LEN: Final = 256


class Kind(enum.StrEnum):
    INT = "int"
    FLOAT = "float"
    RFID = "rfid"
    STRING = "string"

    @property
    def ordered(self) -> bool:
        """Values compare with < and form intervals."""
        return self is not Kind.STRING

    @property
    def discrete(self) -> bool:
        """Values are integers: an open bound ``< v`` is the closed bound ``<= v-1``."""
        return self is Kind.INT or self is Kind.RFID

    @property
    def split_priority(self) -> int:
        """SPEC §8.3: numeric attributes split first, then rfid, then string."""
        return _SPLIT_PRIORITY[self]


_SPLIT_PRIORITY: Final = {Kind.INT: 0, Kind.FLOAT: 0, Kind.RFID: 1, Kind.STRING: 2}


def parse_rfid(text: str) -> int:
    """Map the dotted form ``H.M.C.S`` to its ordered 64-bit integer."""
    parts = text.split(".")
    if len(parts) != len(_RFID_FIELDS):
        raise SchemaError(f"rfid code {text!r} must have 4 dotted fields header.manager.class.serial")
    value = 0
    for part, width in zip(parts, _RFID_FIELDS):
        # isdecimal, not isdigit: int() refuses digits such as "²" that isdigit accepts.
        if not part.isdecimal():
            raise SchemaError(f"rfid field {part!r} of {text!r} is not a decimal number")
        # Bound the length before int(): past 4300 digits int() raises ValueError,
        # and no field of 24 bits or fewer needs more than _RFID_FIELD_DIGITS digits.
        digits = part.lstrip("0") or "0"
        if len(digits) > _RFID_FIELD_DIGITS or int(digits) >= 1 << width:
            shown = digits if len(digits) <= 20 else digits[:20] + "…"
            raise SchemaError(f"rfid field {shown} of {text!r} does not fit in {width} bits")
        value = (value << width) | int(digits)
    return value


def format_rfid(value: int) -> str:
    """The dotted form of an rfid integer (inverse of ``parse_rfid``)."""
    if not 0 <= value <= RFID_MAX:
        # Masking would silently print another code (-1 as the maximum code).
        raise SchemaError(f"{value} is not an rfid code (outside [0, {RFID_MAX}])")
    fields = []
    for width in reversed(_RFID_FIELDS):
        fields.append(value & ((1 << width) - 1))
        value >>= width
    return ".".join(str(f) for f in reversed(fields))


class Attribute(msgspec.Struct, frozen=True):
    """One attribute of the schema. Invariant: ``min <= max`` and both fit the kind."""

    name: str
    kind: Kind
    min: int | float
    max: int | float

    def check(self, value: object) -> Value:
        """Return ``value`` if it is a valid value of this attribute, else raise."""
        kind = self.kind
        if kind is Kind.STRING:
            if type(value) is not str:
                raise SchemaError(
                    f"attribute {self.name!r} is a string, got {_describe(value)}",
                    attr=self.name,
                )
            if not self.min <= len(value) <= self.max:
                raise SchemaError(
                    f"value of {self.name!r} has length {len(value)}, outside [{self.min}, {self.max}]",
                    attr=self.name,
                )
            return value
        if kind is Kind.FLOAT:
            if type(value) is not float and type(value) is not int:
                raise SchemaError(
                    f"attribute {self.name!r} is a number, got {_describe(value)}",
                    attr=self.name,
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise SchemaError(f"value of {self.name!r} must be finite, got {value}", attr=self.name)
        elif type(value) is not int:
            raise SchemaError(
                f"attribute {self.name!r} is {'an rfid code' if kind is Kind.RFID else 'an integer'}, "
                f"got {_describe(value)}",
                attr=self.name,
            )
        if not self.min <= value <= self.max:
            raise SchemaError(
                f"value {self.format(value)} of {self.name!r} is outside "
                f"[{self.format(self.min)}, {self.format(self.max)}]",
                attr=self.name,
            )
        return value

    def format(self, value: Value) -> str:
        """The value as it is written in an expression."""
        if self.kind is Kind.RFID and isinstance(value, int) and 0 <= value <= RFID_MAX:
            return format_rfid(value)
        if isinstance(value, str):
            return _quote(value)
        return repr(value)


def as_number(value: Value) -> int | float:
    """``value`` as the number it is: the value of an ordered attribute (int,
    float, rfid), which ``Attribute.check`` and ``Predicate.check`` make sure of.

    A string here means the value never went through the check; it is refused
    with the ``TypeError`` Python raises when such a value meets a number.
    """
    if isinstance(value, str):
        raise TypeError(f"expected a number, got the string {value!r}")
    return value


def as_string(value: Value) -> str:
    """``value`` as the string it is: the value of a string attribute or a
    pattern, which ``Attribute.check`` and ``Predicate.check`` make sure of.

    A number here means the value never went through the check; it is refused
    with a ``TypeError``, as Python refuses a number where a string is needed.
    """
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {_describe(value)}")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


class Schema:
    """The attributes and the distinguishing attributes, identical on every node.

    Invariant: ``da`` is a non-empty tuple of names of ``attributes``, no repeats.
    """

    __slots__ = ("_da_set", "_domains", "attributes", "da")

    def __init__(self, attributes: Iterable[Attribute], da: Iterable[str]) -> None:
        attrs: dict[str, Attribute] = {}
        for attr in attributes:
            if attr.name in attrs:
                raise ConfigError(f"attribute {attr.name!r} is declared twice")
            attrs[attr.name] = attr
        da_names = tuple(da)
        if not da_names:
            raise ConfigError("the schema needs at least one distinguishing attribute")
        for name in da_names:
            if name not in attrs:
                raise ConfigError(f"distinguishing attribute {name!r} is not declared")
        if len(set(da_names)) != len(da_names):
            raise ConfigError("a distinguishing attribute is listed twice")
        self.attributes: Mapping[str, Attribute] = attrs
        self.da: tuple[str, ...] = da_names
        self._da_set = frozenset(da_names)
        # Rule 6: per attribute, the Python types of its values and the bounds
        # of the value (of its length, for strings).
        domains: dict[str, tuple[tuple[type, ...], int | float, int | float]] = {}
        for name, attr in attrs.items():
            kinds: tuple[type, ...] = (str,) if attr.kind is Kind.STRING else (int,)
            if attr.kind is Kind.FLOAT:
                kinds = (float, int)
            domains[name] = (kinds, attr.min, attr.max)
        self._domains = domains

    def __repr__(self) -> str:
        return f"Schema(attributes={list(self.attributes)}, da={list(self.da)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.attributes == other.attributes and self.da == other.da

    def __hash__(self) -> int:
        return hash((tuple(self.attributes.values()), self.da))

    def attribute(self, name: str) -> Attribute:
        try:
            return self.attributes[name]
        except KeyError:
            raise SchemaError(
                f"unknown attribute {name!r} (known: {', '.join(self.attributes)})",
                attr=name,
            ) from None

    def is_da(self, name: str) -> bool:
        return name in self._da_set

    def da_priority(self, popularity: Mapping[str, float] | None = None) -> tuple[str, ...]:
        """DA names in split priority (SPEC §8.3): numeric, rfid, string; ties by
        popularity (higher first), then by declaration order."""
        pop = popularity or {}
        order = {name: i for i, name in enumerate(self.da)}
        return tuple(
            sorted(
                self.da,
                key=lambda n: (
                    self.attributes[n].kind.split_priority,
                    -pop.get(n, 0.0),
                    order[n],
                ),
            )
        )

    def check_event_values(self, values: Mapping[str, object]) -> dict[str, Value]:
        """Validate an event's items: known attributes, right types, in range, all DA."""
        out: dict[str, Value] = {}
        for name, value in values.items():
            out[name] = self.attribute(name).check(value)
        missing = [name for name in self.da if name not in out]
        if missing:
            raise SchemaError(
                f"event lacks distinguishing attribute(s) {', '.join(map(repr, missing))}",
                attr=missing[0],
            )
        return out

    def valid_event(self, values: dict[str, Value]) -> dict[str, Value]:
        """Rule 6: ``values`` itself when it is a valid event (what
        ``check_event_values`` accepts), else the ``SchemaError`` it raises.
        ≈ 0.5 µs for two attributes, a third of the copying check; NaN fails
        the range test, a bool is no number."""
        domains = self._domains
        for name, v in values.items():
            dom = domains.get(name)
            if dom is None or type(v) not in dom[0] or not dom[1] <= (len(v) if type(v) is str else v) <= dom[2]:  # type: ignore[operator]
                return self.check_event_values(values)  # raises, naming what is wrong
        if not self._da_set <= values.keys():
            return self.check_event_values(values)
        return values

    # -- configuration -------------------------------------------------------

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> Schema:
        """Build from the ``[schema]`` table of a cluster TOML file."""
        if not isinstance(table, Mapping):
            raise ConfigError("[schema] must be a table")
        raw_attrs = table.get("attributes")
        if not isinstance(raw_attrs, list) or not raw_attrs:
            raise ConfigError("[schema] needs a non-empty [[schema.attributes]] list")
        attrs = [_attribute_from_dict(i, raw) for i, raw in enumerate(raw_attrs)]
        da = table.get("distinguishing")
        if not isinstance(da, list) or not all(isinstance(n, str) for n in da):
            raise ConfigError("[schema] distinguishing must be a list of attribute names")
        try:
            return cls(attrs, da)
        except ConfigError as exc:  # the key path, as every other config error gives it
            raise ConfigError(f"[schema] {exc}") from None

    @classmethod
    def from_toml(cls, path: str | Path) -> Schema:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        if "schema" not in doc:
            raise ConfigError(f"{path} has no [schema] table")
        try:
            return cls.from_dict(doc["schema"])
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def _attribute_from_dict(index: int, raw: object) -> Attribute:
    """Attribute ``#index + 1`` of ``[schema] attributes``; an error names it so
    (the key path the config's unknown-key check gives too)."""
    where = f"[schema] attributes #{index + 1}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table")
    name = raw.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"{where} needs a name that is an identifier")
    try:
        return _attribute(name, raw)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _attribute(name: str, raw: Mapping[str, Any]) -> Attribute:
    raw_kind = raw.get("type")
    if raw_kind == "numeric":  # the spec's word; a numeric attribute takes floats
        raw_kind = "float"
    kind = _kind_named(raw_kind)
    if kind is None:
        raise ConfigError(
            f"attribute {name!r}: type must be one of int, float, numeric, rfid, string (got {raw_kind!r})"
        )
    lo = _bound(name, kind, raw.get("min"), "min")
    hi = _bound(name, kind, raw.get("max"), "max")
    if lo > hi:
        raise ConfigError(f"attribute {name!r}: min {lo} is above max {hi}")
    return Attribute(name=name, kind=kind, min=lo, max=hi)


def _kind_named(raw: object) -> Kind | None:
    """The kind whose name is ``raw`` (None: not a kind's name)."""
    if not isinstance(raw, str):
        return None
    try:
        return Kind(raw)
    except ValueError:
        return None


def _bound(name: str, kind: Kind, raw: object, which: str) -> int | float:
    if raw is None:
        if kind is Kind.STRING:
            return 0 if which == "min" else DEFAULT_STRING_MAX_LEN
        if kind is Kind.RFID:
            return 0 if which == "min" else RFID_MAX
        raise ConfigError(f"attribute {name!r} needs {which}")
    if kind is Kind.RFID and isinstance(raw, str):
        try:
            return parse_rfid(raw)
        except SchemaError as exc:
            raise ConfigError(f"attribute {name!r} {which}: {exc}") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(f"attribute {name!r}: {which} must be a number, got {raw!r}")
    if kind in (Kind.INT, Kind.RFID, Kind.STRING) and not isinstance(raw, int):
        raise ConfigError(f"attribute {name!r}: {which} must be an integer, got {raw!r}")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ConfigError(f"attribute {name!r}: {which} must be finite")
    if kind is Kind.STRING and raw < 0:
        raise ConfigError(f"attribute {name!r}: string length bound {which} is negative")
    if kind is Kind.RFID and not 0 <= raw <= RFID_MAX:
        raise ConfigError(f"attribute {name!r}: {which} {raw} is outside the rfid range [0, {RFID_MAX}]")
    return raw
