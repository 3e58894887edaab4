"""The re-matching's candidate keys (``overlay_spark.filters`` rules 1–4),
without Spark: the key chosen is the selective one in the events' data, and
no event that satisfies a filter lacks a key of that filter (else the replay
would miss the pair and report it ``missing``)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from overlay.channels import Attribute, Kind, Schema, parse_subscription
from overlay.errors import ExpressionError
from overlay_spark import filters

SCHEMA = Schema(
    [
        Attribute("price", Kind.FLOAT, 0, 1000),
        Attribute("sym", Kind.STRING, 1, 8),
        Attribute("qty", Kind.INT, 0, 100_000),
    ],
    ["price", "sym"],
)
NAMES = ["price", "sym", "qty"]
SYMS = ["AAPL", "MSFT", "IBM", "X"]


def _events(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"price": round(rng.uniform(0, 100) if rng.random() < 0.7 else rng.uniform(0, 1000), 2),
         "sym": rng.choice(SYMS), "qty": rng.randint(1, 5000)}
        for _ in range(n)
    ]  # fmt: skip


def _stats(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``rematch.histogram`` computes in Spark, by hand."""
    out: dict[str, Any] = {"events": len(events), "index": {n: i for i, n in enumerate(NAMES)}, "attrs": {}}
    for name in ("price", "qty"):
        vals = [float(e[name]) for e in events]
        lo, hi = min(vals), max(vals)
        counts = [0] * filters.FINEST
        for v in vals:
            counts[filters.bucket(v, lo, hi)] += 1
        prefix = [0]
        for c in counts:
            prefix.append(prefix[-1] + c)
        out["attrs"][name] = {"lo": lo, "hi": hi, "prefix": prefix}
    syms: dict[str, int] = {}
    for e in events:
        syms[e["sym"]] = syms.get(e["sym"], 0) + 1
    out["attrs"]["sym"] = {"counts": syms, "rest": 1}
    return out


def _event_keys(e: dict[str, Any], stats: dict[str, Any]) -> set[str]:
    """Every key an event carries (``rematch._event_keys`` over all families)."""
    keys = {filters.WIDE, f"1={e['sym']}"}
    for i, name in ((0, "price"), (2, "qty")):
        st_ = stats["attrs"][name]
        b = filters.bucket(float(e[name]), st_["lo"], st_["hi"])
        for level in range(len(filters.LEVELS)):
            keys.add(f"{i}@{level}:{b >> (3 * (len(filters.LEVELS) - 1 - level))}")
    return keys


def _key(text: str, stats: dict[str, Any]) -> filters.Key:
    return filters.choose_key(parse_subscription(text, SCHEMA), SCHEMA, stats)


EVENTS = _events(5_000)
STATS = _stats(EVENTS)


def test_a_range_selective_in_the_data_is_keyed_not_wide() -> None:
    # Half of qty's declared domain, but only the top 2 % of the events' quantities.
    kind, attr, group, keys, cost = _key("qty > 4900", STATS)
    assert (kind, attr) == ("range", "qty") and group is not None and group.startswith("2@")
    assert 0 < cost < 0.05 * len(EVENTS) and len(keys) <= filters.MAX_RANGE_KEYS


def test_the_key_is_the_attribute_fewest_events_carry() -> None:
    # sym = "X" is a quarter of the events; a narrow price range high up, far fewer.
    kind, attr, *_ = _key('sym = "X" and price >= 900 and price < 905', STATS)
    assert (kind, attr) == ("range", "price")
    # A narrow range in the crowded low prices (70 % of events in [0, 100]) against a rare symbol.
    rare = _stats([*EVENTS[:4_990], *({**e, "sym": "IBM"} for e in EVENTS[4_990:])])
    rare["attrs"]["sym"]["counts"] = {"AAPL": 1_700, "MSFT": 1_700, "X": 1_590, "IBM": 10}
    kind, attr, _, keys, _ = _key('sym = "IBM" and price >= 10 and price < 60', rare)
    assert (kind, attr, keys) == ("points", "sym", ["1=IBM"])


def test_wide_and_never() -> None:
    assert _key('sym prefix "A"', STATS)[:3] == ("wide", None, filters.WIDE)
    assert _key("price != 3", STATS)[0] == "wide"
    assert _key("qty > 6000", STATS)[0] == "never"  # above every event's quantity


def test_parse_filter_reports_a_parse_error_without_raising() -> None:
    sj = json.dumps(
        {"distinguishing": ["price"], "attributes": [{"name": "price", "type": "float", "min": 0, "max": 9}]}
    )
    row = filters.parse_filter("price >", sj, json.dumps({"events": 0, "index": {"price": 0}, "attrs": {}}))
    assert row["ok"] is False and row["error"] and [c["keys"] for c in row["conjuncts"]] == [[]]


def test_parse_filter_gives_each_conjunct_its_predicates_and_key() -> None:
    """The extended language (issue 18): one row per conjunct of the DNF,
    arguments prepared for Spark (lowercased, a like's regular expression)."""
    sj = json.dumps(
        {
            "distinguishing": ["price"],
            "attributes": [{"name": "price", "type": "float", "min": 0, "max": 9}, {"name": "sym", "type": "string"}],
        }
    )
    stats = json.dumps({"events": 0, "index": {"price": 0, "sym": 1}, "attrs": {}})
    row = filters.parse_filter('price < 1 or (sym ieq "AB" and not sym like "A*")', sj, stats)
    assert row["ok"] is True and len(row["conjuncts"]) == 2
    first, second = row["conjuncts"]
    assert [p["op"] for p in first["preds"]] == ["<"]
    assert [(p["op"], p["args"]) for p in second["preds"]] == [
        ("ieq", ["ab"]),
        ("not like", ["A*", filters.like_regex("A*")]),
    ]
    assert filters.like_regex("a*b.c") == "(?s)^\\Qa\\E.*\\Qb.c\\E\\z"


_price = st.floats(0, 1000, allow_nan=False).map(lambda x: round(x, 1))
_qty = st.integers(0, 6000)
_pred = st.one_of(
    st.tuples(st.sampled_from(["<", "<=", ">", ">="]), _price).map(lambda t: f"price {t[0]} {t[1]}"),
    st.tuples(_price, _price).map(lambda t: f"price in [{min(t)}, {max(t)}]"),
    st.tuples(st.sampled_from(["<", "<=", ">", ">=", "="]), _qty).map(lambda t: f"qty {t[0]} {t[1]}"),
    st.sampled_from(SYMS).map(lambda s: f'sym = "{s}"'),
    st.lists(st.sampled_from(SYMS), min_size=1, max_size=3).map(
        lambda s: "sym in {" + ", ".join(f'"{x}"' for x in s) + "}"
    ),
    _price.map(lambda p: f"price = {p}"),
    st.just('sym prefix "A"'),
)


@settings(max_examples=300)
@given(st.lists(_pred, min_size=1, max_size=4), st.integers(0, 1_000))
def test_every_event_that_matches_carries_one_of_the_filters_keys(preds: list[str], seed: int) -> None:
    text = " and ".join(preds)
    try:
        f = parse_subscription(text, SCHEMA)
    except ExpressionError:  # a contradiction: the parser refuses it, so no capture holds it
        assume(False)
        return
    events = _events(300, seed)
    stats = _stats(events)
    kind, _, _, keys, _ = filters.choose_key(f, SCHEMA, stats)
    for e in events:
        if f.matches(e):
            assert kind != "never", (text, e)
            assert _event_keys(e, stats) & set(keys), (text, e, keys[:5])


def test_the_match_test_has_a_code_for_every_operator_of_the_language() -> None:
    """``rematch.satisfied`` compares integer operator codes: an operator of the
    filter language without one would match nothing (extra pairs in every replay)."""
    pytest.importorskip("pyspark")
    from overlay.channels.predicates import Op
    from overlay_spark.rematch import OP_CODES

    assert set(OP_CODES) == {op.value for op in Op}
    assert sorted(OP_CODES.values()) == list(range(len(OP_CODES)))
