"""Subscription text → predicates, on the executors (SPEC §2.2).

The text a subscriber sent is parsed with the overlay's own parser
(``overlay.channels.parse_subscription``, the grammar of the wire); what the
replay does with the result — deciding which events match — is its own,
written as Spark column expressions in ``rematch``.

Besides the predicates, each subscription gets an **access key**: the one
attribute the candidate join looks it up by (an equality set, or the
interval its predicates allow on an ordered attribute).  A subscription with
no selective attribute is *wide* and is tried against every event.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Final

__all__ = ["MAX_KEYS", "PARSED_TYPE", "WIDE_FRACTION", "parse_filter"]

# A subscription whose best attribute still admits more than this share of
# the attribute's domain is tried against every event instead.
WIDE_FRACTION: Final = 0.5
# Equality sets up to this size become one key per value.
MAX_KEYS: Final = 64

PARSED_TYPE: Final = (
    "ok BOOLEAN, error STRING, preds ARRAY<STRUCT<attr: STRING, op: STRING, args: ARRAY<STRING>>>, "
    "key_kind STRING, key_attr STRING, key_vals ARRAY<STRING>, key_lo STRING, key_hi STRING"
)


@lru_cache(maxsize=8)
def _schema(schema_json: str) -> Any:
    from overlay.channels.schema import Schema

    return Schema.from_dict(json.loads(schema_json))


def _text(v: Any) -> str:
    return v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)


# (kind, attr, values, lo, hi): how a subscription is looked up in the candidate join.
Key = tuple[str, str | None, list[str] | None, str | None, str | None]


def _key(f: Any, schema: Any) -> Key:
    """(kind, attr, values, lo, hi) of the most selective attribute of ``f``."""
    from overlay.channels.predicates import Op
    from overlay.channels.schema import Kind

    best: tuple[float, Key] | None = None
    for name in sorted(f.attrs()):
        attr = schema.attributes[name]
        points: set[Any] | None = None
        for p in f.on(name):
            if p.op is Op.EQ:
                vals = {p.args[0]}
            elif p.op is Op.IN_SET:
                vals = set(p.args)
            else:
                continue
            points = vals if points is None else points & vals
        if points is not None:
            if not points:
                return ("never", name, None, None, None)
            if len(points) <= MAX_KEYS:
                cand: tuple[float, Key] = (
                    len(points) * 1e-6,
                    ("points", name, sorted(_text(v) for v in points), None, None),
                )
                if best is None or cand[0] < best[0]:
                    best = cand
                continue
        if attr.kind is Kind.STRING:
            continue
        lo, hi = attr.min, attr.max
        for p in f.on(name):
            a = p.args
            if p.op in (Op.LT, Op.LE):
                hi = min(hi, a[0])
            elif p.op in (Op.GT, Op.GE):
                lo = max(lo, a[0])
            elif p.op is Op.IN_RANGE:
                lo, hi = max(lo, a[0]), min(hi, a[1])
        if lo > hi:
            return ("never", name, None, None, None)
        span = float(attr.max) - float(attr.min)
        frac = (float(hi) - float(lo)) / span if span > 0 else 0.0
        cand = (frac, ("range", name, None, _text(lo), _text(hi)))
        if best is None or cand[0] < best[0]:
            best = cand
    if best is None or best[0] > WIDE_FRACTION:
        return ("wide", None, None, None, None)
    return best[1]


def parse_filter(text: str | None, schema_json: str) -> dict[str, Any]:
    """A row of ``PARSED_TYPE`` for one subscription text."""
    from overlay.channels.expressions import parse_subscription
    from overlay.errors import OverlayError

    empty: dict[str, Any] = {
        "preds": [],
        "key_kind": "never",
        "key_attr": None,
        "key_vals": None,
        "key_lo": None,
        "key_hi": None,
    }
    if text is None:
        return {"ok": False, "error": "no filter text", **empty}
    schema = _schema(schema_json)
    try:
        f = parse_subscription(text, schema)
    except OverlayError as exc:
        return {"ok": False, "error": str(exc), **empty}
    kind, attr, vals, lo, hi = _key(f, schema)
    return {
        "ok": True,
        "error": None,
        "preds": [{"attr": p.attr, "op": p.op.value, "args": [_text(a) for a in p.args]} for p in f.predicates],
        "key_kind": kind,
        "key_attr": attr,
        "key_vals": vals,
        "key_lo": lo,
        "key_hi": hi,
    }
