"""Subscription text → predicates and candidate keys, on the executors (SPEC §2.2).

The text a subscriber sent is parsed with the overlay's own parser
(``overlay.channels.parse_expression``, the grammar of the wire) into its
disjunctive normal form: one or more *conjuncts*, each with its predicates
and its own key (an event matches a subscription iff it matches some
conjunct, ``spark/SCHEMA.md``).  What the replay does with the result —
deciding which events match — is its own, written as Spark column
expressions in ``rematch``; arguments travel as text prepared for Spark (a
case-insensitive operator's pattern lowercased, a ``like`` pattern followed
by its anchored Java regular expression).  Nothing here imports
Spark: the key choice is plain Python, tested directly.

Rules:

1. **Buckets.** An ordered attribute's observed event range ``[lo, hi]`` is
   cut into ``FINEST`` equal buckets: ``bucket(x) = floor((x − lo) / (hi −
   lo) · FINEST)`` clamped to ``[0, FINEST − 1]`` — the same double
   operations, in the same order, as ``rematch``'s column expression, so a
   value lands in the same bucket on both sides.  Coarser levels
   (``LEVELS``) are the finest bucket shifted right: level ``l`` has
   ``LEVELS[l]`` buckets.  ``bucket`` is monotone, so a value inside a
   range lies in a bucket between the buckets of its ends.
2. **Options.** Each attribute a filter constrains offers one way to look
   the subscription up: a set of points (its equality and ``in{}``
   predicates; an ordered point is looked up by its finest bucket, a string
   by its value), or, on an ordered attribute, the range its ``<``, ``<=``,
   ``>``, ``>=`` and ``in[]`` predicates allow, as the buckets of the finest
   level that covers it in at most ``MAX_RANGE_KEYS`` keys.  An event that
   satisfies the filter carries a key of every option.
3. **Choice.** The option kept is the one whose keys the fewest events carry,
   estimated from the events' own histogram (``Stats``): selective in the
   data, not in the declared domain (``qty > 4902`` is selective when the
   events' quantities stop at 5,000).  A filter with no option — only
   ``!=``, ``prefix``, ``suffix``, ``contains`` — is *wide*: key ``*``,
   which every event carries.  A filter no event can satisfy (empty point
   set, empty range) gets no key at all (kind ``never``).
4. Every key is a string ``<attr index>@<level>:<bucket>``, ``<attr
   index>=<value>`` or ``*``; ``group`` names the key's family
   (``<i>@<level>``, ``<i>=`` or ``*``), so the events need only carry the
   families some subscription uses.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any, Final

__all__ = [
    "FINEST",
    "LEVELS",
    "MAX_POINT_KEYS",
    "MAX_RANGE_KEYS",
    "PARSED_TYPE",
    "WIDE",
    "bucket",
    "choose_key",
    "parse_filter",
]

# Rule 1: buckets per level, coarse to fine; each level 8× the one before.
LEVELS: Final = (8, 64, 512, 4096)
FINEST: Final = LEVELS[-1]
# Rule 2: a range is looked up under at most this many keys of one level
# (the default; ``choose_key`` takes a smaller budget when there are many
# subscriptions, so that all their keys stay a table that can be broadcast).
MAX_RANGE_KEYS: Final = 512
# Rule 2: point sets larger than this are not an option (a range still is).
MAX_POINT_KEYS: Final = 64
# Rule 3: the key every event carries.
WIDE: Final = "*"

PARSED_TYPE: Final = (
    "ok BOOLEAN, error STRING, conjuncts ARRAY<STRUCT<"
    "preds: ARRAY<STRUCT<attr: STRING, op: STRING, args: ARRAY<STRING>>>, "
    "key_kind: STRING, key_attr: STRING, key_group: STRING, keys: ARRAY<STRING>, cost: DOUBLE>>"
)
# Operators whose one pattern is compared lowercased (with Spark's lower() of the value).
_FOLDED: Final = frozenset({"ieq", "not ieq", "iprefix", "not iprefix", "isuffix", "not isuffix"})


@lru_cache(maxsize=8)
def _schema(schema_json: str) -> Any:
    from overlay.channels.schema import Schema

    return Schema.from_dict(json.loads(schema_json))


@lru_cache(maxsize=8)
def _stats(stats_json: str) -> dict[str, Any]:
    return dict(json.loads(stats_json))


def _text(v: Any) -> str:
    return v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)


def bucket(x: float, lo: float, hi: float, n: int = FINEST) -> int:
    """Rule 1: the bucket of ``x`` among ``n`` over ``[lo, hi]`` (as ``rematch._bucket``)."""
    span = hi - lo
    if not span > 0:
        return 0
    return min(n - 1, max(0, math.floor((float(x) - lo) / span * n)))


def _range_cost(st: dict[str, Any], b_lo: int, b_hi: int) -> float:
    """Events whose finest bucket is in ``[b_lo, b_hi]`` (prefix sums of the histogram)."""
    prefix = st["prefix"]
    return float(prefix[b_hi + 1] - prefix[b_lo])


# (kind, attr, group, keys, cost): how a subscription is looked up in the candidate join.
Key = tuple[str, str | None, str | None, list[str], float]


def _ordered_range(i: int, lo: float, hi: float, st: dict[str, Any], budget: int) -> tuple[str, list[str], float]:
    """Rule 2: the range ``[lo, hi]`` as keys of the finest level that holds it in
    ``budget`` keys (the coarsest level, with ``LEVELS[0]`` buckets, always does)."""
    f_lo, f_hi = bucket(lo, st["lo"], st["hi"]), bucket(hi, st["lo"], st["hi"])
    for level in range(len(LEVELS) - 1, -1, -1):
        shift = 3 * (len(LEVELS) - 1 - level)
        b_lo, b_hi = f_lo >> shift, f_hi >> shift
        if b_hi - b_lo + 1 <= budget or level == 0:
            cost = _range_cost(st, b_lo << shift, min(FINEST - 1, ((b_hi + 1) << shift) - 1))
            return f"{i}@{level}", [f"{i}@{level}:{b}" for b in range(b_lo, b_hi + 1)], cost
    raise AssertionError("level 0 always holds the range")  # pragma: no cover


def choose_key(f: Any, schema: Any, stats: dict[str, Any]) -> Key:
    """Rules 2–3: the cheapest way to look ``f`` up, given the events' ``stats``.

    ``stats``: ``{"events": N, "key_budget": keys per range, "index": {name: position in the header's
    schema}, "attrs": {name: {"lo", "hi", "prefix"} for an
    ordered attribute with events, {"counts": {value: n}, "rest": n} for a
    string one}}`` (``rest`` bounds the count of a value not listed).
    """
    from overlay.channels.predicates import Op
    from overlay.channels.schema import Kind

    total = float(stats.get("events", 0))
    index: dict[str, int] = stats["index"]
    budget = max(LEVELS[0], min(MAX_RANGE_KEYS, int(stats.get("key_budget", MAX_RANGE_KEYS))))
    best: tuple[float, int, str, Key] | None = None
    for name in sorted(f.attrs()):
        attr = schema.attributes[name]
        i = index[name]
        st = stats["attrs"].get(name)
        points: set[Any] | None = None
        for p in f.on(name):
            if p.op is Op.EQ:
                vals = {p.args[0]}
            elif p.op is Op.IN_SET:
                vals = set(p.args)
            else:
                continue
            points = vals if points is None else points & vals
        if points is not None and not points:
            return ("never", name, None, [], 0.0)
        options: list[tuple[float, str, str, list[str]]] = []
        if points is not None and len(points) <= MAX_POINT_KEYS:
            if attr.kind is Kind.STRING:
                counts = st["counts"] if st else {}
                rest = st["rest"] if st else 0
                keys = sorted(f"{i}={_text(v)}" for v in points)
                cost = float(sum(counts.get(_text(v), rest) for v in points))
                options.append((cost, "points", f"{i}=", keys))
            elif st is None:  # no event has this attribute: none can match
                return ("never", name, None, [], 0.0)
            else:
                level = len(LEVELS) - 1
                buckets = sorted({bucket(float(v), st["lo"], st["hi"]) for v in points})
                cost = sum(_range_cost(st, b, b) for b in buckets)
                options.append((cost, "points", f"{i}@{level}", [f"{i}@{level}:{b}" for b in buckets]))
        if attr.kind is not Kind.STRING:
            lo, hi = -math.inf, math.inf
            bounded = False
            for p in f.on(name):
                a = p.args
                if p.op in (Op.LT, Op.LE):
                    hi, bounded = min(hi, float(a[0])), True
                elif p.op in (Op.GT, Op.GE):
                    lo, bounded = max(lo, float(a[0])), True
                elif p.op is Op.IN_RANGE:
                    lo, hi, bounded = max(lo, float(a[0])), min(hi, float(a[1])), True
            if bounded:
                if lo > hi:
                    return ("never", name, None, [], 0.0)
                if st is None or lo > st["hi"] or hi < st["lo"]:
                    return ("never", name, None, [], 0.0)  # outside every event's value
                group, keys, cost = _ordered_range(i, max(lo, st["lo"]), min(hi, st["hi"]), st, budget)
                options.append((cost, "range", group, keys))
        for cost, kind, group, keys in options:
            cand = (cost, len(keys), name, (kind, name, group, keys, cost))
            if best is None or cand[:3] < best[:3]:
                best = cand
    if best is None or best[0] >= total > 0:
        return ("wide", None, WIDE, [WIDE], total)
    return best[3]


def like_regex(pattern: str) -> str:
    """A ``like`` pattern as a Java regular expression matching the whole value:
    the text between ``*``s quoted, each ``*`` any run of characters."""
    quoted = ".*".join("\\Q" + part.replace("\\E", "\\E\\\\E\\Q") + "\\E" for part in pattern.split("*"))
    return f"(?s)^{quoted}\\z"


def _args(p: Any) -> list[str]:
    op = p.op.value
    if op in _FOLDED:
        return [str(p.args[0]).lower()]
    if op in ("like", "not like"):
        return [str(p.args[0]), like_regex(str(p.args[0]))]
    return [_text(a) for a in p.args]


def parse_filter(text: str | None, schema_json: str, stats_json: str) -> dict[str, Any]:
    """A row of ``PARSED_TYPE`` for one subscription text: at least one
    conjunct (an unparsed text's has no key and never matches)."""
    from overlay.channels.expressions import parse_expression
    from overlay.errors import OverlayError

    empty: dict[str, Any] = {
        "preds": [],
        "key_kind": "never",
        "key_attr": None,
        "key_group": None,
        "keys": [],
        "cost": 0.0,
    }
    if text is None:
        return {"ok": False, "error": "no filter text", "conjuncts": [empty]}
    schema = _schema(schema_json)
    try:
        expr = parse_expression(text, schema)
    except OverlayError as exc:
        return {"ok": False, "error": str(exc), "conjuncts": [empty]}
    stats = _stats(stats_json)
    conjuncts = []
    for f in expr.conjuncts:
        kind, attr, group, keys, cost = choose_key(f, schema, stats)
        conjuncts.append(
            {
                "preds": [{"attr": p.attr, "op": p.op.value, "args": _args(p)} for p in f.predicates],
                "key_kind": kind,
                "key_attr": attr,
                "key_group": group,
                "keys": keys,
                "cost": cost,
            }
        )
    return {"ok": True, "error": None, "conjuncts": conjuncts}
