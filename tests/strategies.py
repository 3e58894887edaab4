"""Hypothesis strategies and brute-force references shared by the content-model tests.

Everything here is deliberately independent of the library's own evaluation
code: predicates are judged by ``brute_satisfies`` (written from SPEC §2.2), and
domains are kept small so that random events actually match random filters and
whole domains can be enumerated.

Float domains use a grid: predicate constants and cut points lie on multiples
of ``FLOAT_STEP`` and sample values on multiples of ``FLOAT_STEP / 2``.  Every
``L(f)`` then has its end points on the constant grid, so two such sets agree
everywhere iff they agree on the sample grid — enumerating the samples decides
coverage and overlap exactly, open and closed ends included.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from hypothesis import strategies as st

from overlay.channels import (
    Attribute,
    EventSpace,
    Filter,
    Kind,
    Op,
    Predicate,
    RangeConstraint,
    Schema,
    SetConstraint,
)


def unchecked_filter(text: str, schema: Schema) -> Filter:
    """``text``'s conjunction without the parser's refusal of one that can
    never match (``qty > 5 and qty < 3``): the tables, the matcher and the
    spaces must still handle such a filter (a peer may send one)."""
    from overlay.channels import parse_subscription

    return Filter(tuple(p for part in text.split(" and ") for p in parse_subscription(part, schema).predicates))


FLOAT_STEP = 0.5
PATTERN_ALPHABET = "ab"
# Strings over one more letter than the patterns use: the extra letter is a
# separator, so witnesses of non-coverage / overlap are short (see test_predicates).
WITNESS_ALPHABET = "abcAB"
WITNESS_MAX_LEN = 5

# A schema with one attribute of every kind as DA, plus non-DA attributes.
SMALL = Schema(
    [
        Attribute("x", Kind.INT, 0, 12),
        Attribute("y", Kind.FLOAT, 0, 4),
        Attribute("r", Kind.RFID, 0, 15),
        Attribute("s", Kind.STRING, 0, 3),
        Attribute("n", Kind.INT, 0, 5),
        Attribute("t", Kind.STRING, 0, 3),
    ],
    ["x", "y", "r", "s"],
)

# Small enough to enumerate every event: decides space coverage/overlap exactly.
ENUM = Schema(
    [
        Attribute("x", Kind.INT, 0, 5),
        Attribute("y", Kind.FLOAT, 0, 2),
        Attribute("r", Kind.RFID, 0, 3),
        Attribute("n", Kind.INT, 0, 2),
    ],
    ["x", "y", "r"],
)

# Only string DA: the routing table's index is keyed by a string attribute.
STRINGS = Schema(
    [
        Attribute("s", Kind.STRING, 0, 3),
        Attribute("u", Kind.STRING, 0, 3),
        Attribute("x", Kind.INT, 0, 12),
    ],
    ["s", "u"],
)

PROPERTY_SCHEMAS = {"mixed": SMALL, "strings": STRINGS}

ORDERED_OPS = ("=", "!=", "<", "<=", ">", ">=", "in[]", "not in[]", "exists", "not exists")
STRING_OPS = (
    "=",
    "!=",
    "prefix",
    "suffix",
    "contains",
    "in{}",
    "not in{}",
    "not prefix",
    "not suffix",
    "not contains",
    "ieq",
    "not ieq",
    "iprefix",
    "not iprefix",
    "isuffix",
    "not isuffix",
    "like",
    "not like",
    "exists",
    "not exists",
)
# Case-insensitive patterns mix cases; like patterns mix in the wildcard.
FOLDED_ALPHABET = "abAB"
LIKE_ALPHABET = "ab*"


# -- values ---------------------------------------------------------------------


def float_grid(lo: float, hi: float, step: float) -> list[float]:
    n = round((hi - lo) / step)
    return [lo + i * step for i in range(n + 1)]


def constants(attr: Attribute) -> list[object]:
    """The values predicates, cut points and in-sets use."""
    if attr.kind is Kind.FLOAT:
        return float_grid(attr.min, attr.max, FLOAT_STEP)
    if attr.kind.discrete:
        return list(range(int(attr.min), int(attr.max) + 1))
    return [
        "".join(p)
        for n in range(int(attr.min), int(attr.max) + 1)
        for p in itertools.product(PATTERN_ALPHABET, repeat=n)
    ]


def samples(attr: Attribute) -> list[object]:
    """Every value an event may carry in the property tests (finite, small)."""
    if attr.kind is Kind.FLOAT:
        return float_grid(attr.min, attr.max, FLOAT_STEP / 2)
    return constants(attr)


def all_strings(alphabet: str = WITNESS_ALPHABET, max_len: int = WITNESS_MAX_LEN) -> list[str]:
    return ["".join(p) for n in range(max_len + 1) for p in itertools.product(alphabet, repeat=n)]


def values(attr: Attribute) -> st.SearchStrategy[object]:
    return st.sampled_from(samples(attr))


# -- predicates, filters, events --------------------------------------------------------


@st.composite
def predicates(draw: st.DrawFn, schema: Schema, attr_name: str) -> Predicate:
    attr = schema.attributes[attr_name]
    consts = constants(attr)
    if attr.kind is Kind.STRING:
        op = draw(st.sampled_from(STRING_OPS))
        if op in ("exists", "not exists"):
            return Predicate(attr_name, Op(op), ())
        base = op.removeprefix("not ")
        if base in ("prefix", "suffix", "contains"):
            arg = draw(st.text(PATTERN_ALPHABET, max_size=2))
            return Predicate(attr_name, Op(op), (arg,))
        if base in ("ieq", "iprefix", "isuffix"):
            arg = draw(st.text(FOLDED_ALPHABET, max_size=2))
            return Predicate(attr_name, Op(op), (arg,))
        if base == "like":
            arg = draw(st.text(LIKE_ALPHABET, max_size=3))
            return Predicate(attr_name, Op(op), (arg,))
        if base == "in{}":
            vals = draw(st.lists(st.sampled_from(consts), min_size=1, max_size=3, unique=True))
            return Predicate(attr_name, Op(op), tuple(vals))
        return Predicate(attr_name, Op(op), (draw(st.sampled_from(consts)),))
    op = draw(st.sampled_from(ORDERED_OPS))
    if op in ("exists", "not exists"):
        return Predicate(attr_name, Op(op), ())
    if op in ("in[]", "not in[]"):
        a, b = sorted(draw(st.lists(st.sampled_from(consts), min_size=2, max_size=2)))
        return Predicate(attr_name, Op(op), (a, b))
    return Predicate(attr_name, Op(op), (draw(st.sampled_from(consts)),))


def any_predicate(schema: Schema) -> st.SearchStrategy[Predicate]:
    return st.sampled_from(sorted(schema.attributes)).flatmap(lambda a: predicates(schema, a))


def filters(schema: Schema, max_size: int = 4) -> st.SearchStrategy[Filter]:
    return st.lists(any_predicate(schema), min_size=1, max_size=max_size).map(lambda ps: Filter(tuple(ps)))


@st.composite
def events(draw: st.DrawFn, schema: Schema) -> dict[str, object]:
    out = {}
    for name, attr in schema.attributes.items():
        if schema.is_da(name) or draw(st.booleans()):
            out[name] = draw(values(attr))
    return out


def all_events(schema: Schema) -> list[dict[str, object]]:
    """Every event of an enumerable schema: all DA, each non-DA present or absent."""
    axes = []
    for name, attr in schema.attributes.items():
        opts: list[object] = list(samples(attr))
        if not schema.is_da(name):
            opts.append(None)
        axes.append([(name, v) for v in opts])
    return [{n: v for n, v in combo if v is not None} for combo in itertools.product(*axes)]


# -- the brute-force reference (SPEC §2.2) --------------------------------------------


def _glob(pattern: str, v: str) -> bool:
    """``v`` matches ``pattern``, ``*`` any run: by brute recursion."""
    if not pattern:
        return not v
    if pattern[0] == "*":
        return any(_glob(pattern[1:], v[i:]) for i in range(len(v) + 1))
    return bool(v) and v[0] == pattern[0] and _glob(pattern[1:], v[1:])


def brute_satisfies(p: Predicate, v: object) -> bool:
    """A present value ``v`` satisfies ``p`` (written from the language's definition)."""
    op, a = p.op.value, p.args
    if op.startswith("not ") and op != "not exists":
        return not brute_satisfies(Predicate(p.attr, Op(op[4:]), a), v)
    if op == "exists":
        return True
    if op == "not exists":
        return False
    if op == "ieq":
        return v.lower() == a[0].lower()
    if op == "iprefix":
        return v.lower()[: len(a[0])] == a[0].lower()
    if op == "isuffix":
        return len(a[0]) == 0 or v.lower()[-len(a[0]) :] == a[0].lower()
    if op == "like":
        return _glob(a[0], v)
    if op == "=":
        return v == a[0]
    if op == "!=":
        return v != a[0]
    if op == "<":
        return v < a[0]
    if op == "<=":
        return v <= a[0]
    if op == ">":
        return v > a[0]
    if op == ">=":
        return v >= a[0]
    if op == "in[]":
        return a[0] <= v and v <= a[1]
    if op == "in{}":
        return any(v == x for x in a)
    if op == "prefix":
        return v[: len(a[0])] == a[0]
    if op == "suffix":
        return len(a[0]) == 0 or v[-len(a[0]) :] == a[0]
    if op == "contains":
        return any(v[i : i + len(a[0])] == a[0] for i in range(len(v) - len(a[0]) + 1))
    raise AssertionError(op)


def brute_matches(f: Filter, event: Mapping[str, object]) -> bool:
    """e matches F iff every predicate is satisfied by e's item on its attribute."""
    return all(
        (p.attr not in event) if p.op is Op.NOT_EXISTS else (p.attr in event and brute_satisfies(p, event[p.attr]))
        for p in f.predicates
    )


def domain_of(attr: Attribute) -> list[object]:
    """The values over which L(f) is compared exactly in the tests."""
    if attr.kind is Kind.STRING:
        return all_strings()
    return samples(attr)


# -- spaces built the way the balancer builds them ------------------------------------


def _cut_points(c: RangeConstraint, attr: Attribute) -> list[object]:
    iv = c.interval
    return [v for v in constants(attr) if v in iv and v != iv.hi]


def _string_pool(attr: Attribute) -> list[str]:
    return constants(attr)


def partition(data: st.DataObject, schema: Schema, max_steps: int = 8) -> list[EventSpace]:
    """Cut ``EventSpace.whole(schema)`` by random ``cut``/``take_strings`` steps.

    The result partitions the event space (SPEC §2.4 rule of the routing table).
    """
    spaces = [EventSpace.whole(schema)]
    steps = data.draw(st.integers(0, max_steps), label="steps")
    for _ in range(steps):
        i = data.draw(st.integers(0, len(spaces) - 1), label="space")
        name = data.draw(st.sampled_from(schema.da), label="attr")
        attr = schema.attributes[name]
        c = spaces[i].constraint(name)
        if isinstance(c, RangeConstraint):
            points = _cut_points(c, attr)
            if not points:
                continue
            at = data.draw(st.sampled_from(points), label="cut at")
            low, high = spaces[i].cut(attr, at)
        else:
            pool = [v for v in _string_pool(attr) if c.contains_value(v)]
            if isinstance(c, SetConstraint) and len(pool) < 2:
                continue
            if not pool:
                continue
            moved = data.draw(
                st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True),
                label="take",
            )
            if isinstance(c, SetConstraint) and set(moved) == set(c.values):
                continue
            low, high = spaces[i].take_strings(name, moved)
        spaces[i : i + 1] = [low, high]
    return spaces
