"""overlay.channels.channel: subscriptions, per-slice event records, popularity, seen values."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import overlay.channels.channel as channel_mod
from overlay.channels import (
    Attribute,
    Channel,
    ChannelId,
    EventRecord,
    EventSpace,
    ExceptConstraint,
    Kind,
    LinearMatcher,
    Schema,
    SetConstraint,
    SliceStats,
    Subscription,
    parse_subscription,
)
from strategies import SMALL, brute_matches, events, filters

PROPS = settings(max_examples=200, deadline=None)

# SPEC §8.3's worked example.
EXAMPLE = Schema([Attribute("a", Kind.INT, 0, 100), Attribute("b", Kind.INT, 50, 80)], ["a", "b"])
EXAMPLE_RECORDS = [
    ((10, 50), 3),
    ((15, 50), 1),
    ((20, 60), 5),
    ((20, 60), 5),
    ((40, 65), 2),
    ((50, 65), 4),
    ((70, 70), 2),
    ((90, 80), 6),
]
EVENT = {"price": 12.5, "qty": 3, "sym": "AB", "tag": 7}


def S(sub_id, text, schema):
    return Subscription(sub_id, parse_subscription(text, schema))


@pytest.fixture
def ch(schema):
    return Channel(ChannelId(1, 0), EventSpace.whole(schema), schema)


# -- ids ---------------------------------------------------------------------------------------


def test_channel_ids_order_and_print():
    assert str(ChannelId(3, 14)) == "3.14"
    assert sorted([ChannelId(2, 0), ChannelId(1, 5), ChannelId(1, 2)]) == [
        ChannelId(1, 2),
        ChannelId(1, 5),
        ChannelId(2, 0),
    ]
    assert ChannelId(1, 2) == ChannelId(1, 2) and hash(ChannelId(1, 2)) == hash(ChannelId(1, 2))


# -- subscriptions ----------------------------------------------------------------------------


def test_add_and_remove_are_idempotent(ch, schema):
    s1 = S("s1", 'qty < 10 and sym = "AB"', schema)
    assert ch.add(s1) is True
    assert ch.add(s1) is False
    assert ch.add(S("s1", "qty > 90", schema)) is False  # the id decides
    assert len(ch) == 1 and "s1" in ch and list(ch) == [s1] and ch.get("s1") == s1
    assert ch.popularity()["qty"] == 1.0  # counted once
    assert ch.remove("s1") == s1
    assert ch.remove("s1") is None
    assert len(ch) == 0 and "s1" not in ch and ch.get("s1") is None
    assert ch.popularity() == {"price": 0.0, "qty": 0.0, "sym": 0.0, "tag": 0.0}


def test_popularity_counts_subscriptions_constraining_each_da(ch, schema):
    ch.add(S("s1", "qty < 10 and qty > 2 and price < 5", schema))  # qty counted once
    ch.add(S("s2", "qty = 3", schema))
    ch.add(S("s3", 'note = "x"', schema))  # a non-DA attribute: no DA counted
    ch.add(S("s4", 'sym prefix "A"', schema))
    assert ch.popularity() == {"price": 0.25, "qty": 0.5, "sym": 0.25, "tag": 0.0}
    ch.remove("s1")
    assert ch.popularity() == pytest.approx({"price": 0.0, "qty": 1 / 3, "sym": 1 / 3, "tag": 0.0})
    ch.remove("missing")
    assert ch.popularity()["qty"] == pytest.approx(1 / 3)


# -- matching records cost -----------------------------------------------------------------------


def test_match_records_the_cost_of_each_event(ch, schema):
    ch.add(S("s1", "qty < 10", schema))
    ch.add(S("s2", "qty > 50", schema))
    ch.add(S("s3", 'sym = "AB"', schema))
    matched, tested = ch.match(EVENT, access_node=4)
    assert sorted(s.id for s in matched) == ["s1", "s3"]
    assert 2 <= tested <= 3
    assert ch.load == tested == ch.current.load
    assert ch.current.events == 1
    [rec] = ch.current.records()
    assert rec == EventRecord((12.5, 3, 7, "AB"), tested, 1)  # price, qty, tag, sym (§8.3)
    assert ch.summary() == {
        "id": "1.0",
        "space": "WES",
        "subscriptions": 3,
        "load": tested,
        "last_load": 0,
    }
    assert "1.0" in repr(ch) and "3 subs" in repr(ch)


def test_spec_worked_example_records_sorted_by_da():
    stats = SliceStats(EXAMPLE.da_priority())
    for point, cost in EXAMPLE_RECORDS:
        stats.add(point, cost, access_node=0)
    assert stats.load == 28 and stats.events == 8
    recs = stats.records()
    assert [(r.point, r.cost, r.count) for r in recs] == [
        ((10, 50), 3, 1),
        ((15, 50), 1, 1),
        ((20, 60), 10, 2),
        ((40, 65), 2, 1),
        ((50, 65), 4, 1),
        ((70, 70), 2, 1),
        ((90, 80), 6, 1),
    ]
    # ΔLD = 14: the shortest prefix reaching it ends at (20, 60); the next record
    # first differs on a, so the cut is a ∈ [0, 20] | [21, 100].
    cumulative = list(itertools.accumulate(r.cost for r in recs))
    k = next(i for i, c in enumerate(cumulative) if c >= 14)
    assert cumulative[k] == 14 and recs[k].point == (20, 60) and recs[k + 1].point[0] == 40
    ch1, ch2 = EventSpace.whole(EXAMPLE).cut(EXAMPLE.attributes["a"], recs[k].point[0])
    assert ch1.text(EXAMPLE) == "{a ∈ [0, 20]}" and ch2.text(EXAMPLE) == "{a ∈ [21, 100]}"


def test_spec_worked_example_through_a_channel():
    """The same eight events matched on a channel: records come out sorted by (a, b)
    and each record's cost is what the matcher reported for its events."""
    ch = Channel(ChannelId(0, 0), EventSpace.whole(EXAMPLE), EXAMPLE)
    # Subscriptions on a only, so each event's cost depends on its a value.
    texts = ["a <= 10", "a in [10, 15]", "a <= 20", "a >= 20", "a in [40, 50]", "a > 60", "b = 80"]
    for i, text in enumerate(texts):
        ch.add(S(f"s{i}", text, EXAMPLE))
    costs = {}
    for (a, b), _ in reversed(EXAMPLE_RECORDS):  # arrival order must not matter
        _, tested = ch.match({"a": a, "b": b}, access_node=0)
        costs.setdefault((a, b), []).append(tested)
    recs = ch.current.records()
    assert [r.point for r in recs] == sorted({p for p, _ in EXAMPLE_RECORDS})
    assert {r.point: (r.cost, r.count) for r in recs} == {p: (sum(c), len(c)) for p, c in costs.items()}
    assert ch.load == sum(sum(c) for c in costs.values())
    assert ch.current.events == 8


def test_roll_slice_starts_a_new_slice_with_priority_from_popularity():
    ch = Channel(ChannelId(0, 0), EventSpace.whole(EXAMPLE), EXAMPLE)
    assert ch.priority == ("a", "b")
    ch.add(S("s1", "b > 60", EXAMPLE))
    ch.match({"a": 5, "b": 70}, access_node=1)
    ch.match({"a": 6, "b": 55}, access_node=1)
    load = ch.load
    done = ch.roll_slice()
    assert done is ch.last and done.load == load and done.events == 2
    assert ch.load == 0 and ch.current.events == 0 and ch.current.records() == []
    # b is constrained by every subscription, a by none: b now splits first.
    assert ch.priority == ("b", "a") and ch.current.priority == ("b", "a")
    ch.match({"a": 5, "b": 70}, access_node=1)
    assert ch.current.records()[0].point == (70, 5)
    assert ch.summary()["last_load"] == load


def test_slice_records_reordered_for_a_new_priority():
    stats = SliceStats(("a", "b"))
    for point, cost in [((1, 9), 2), ((2, 9), 3), ((1, 8), 4)]:
        stats.add(point, cost, 0)
    stats.reordered(("b", "a"), ("a", "b"))
    assert stats.priority == ("b", "a")
    assert [(r.point, r.cost) for r in stats.records()] == [((8, 1), 4), ((9, 1), 2), ((9, 2), 3)]
    assert stats.load == 9
    stats.reordered(("b", "a"), ("b", "a"))  # no change
    assert [r.point for r in stats.records()] == [(8, 1), (9, 1), (9, 2)]


def test_record_cap_keeps_the_load_exact(monkeypatch):
    monkeypatch.setattr(channel_mod, "MAX_RECORDS", 4)
    stats = SliceStats(("a", "b"))
    costs = {}
    for i in range(20):
        point = ((i * 37) % 101, 50 + i % 3)
        stats.add(point, i + 1, access_node=i % 2)
        costs[point] = costs.get(point, 0) + i + 1
    recs = stats.records()
    assert len(recs) == 4
    assert stats.load == sum(costs.values()) == sum(r.cost for r in recs)
    assert stats.events == 20 == sum(r.count for r in recs)
    assert [r.point for r in recs] == sorted(r.point for r in recs)
    # Points seen before the cap was reached keep their own records.
    assert [r.point for r in recs] == sorted(list(costs)[:4])
    # A kept point still aggregates exactly.
    first = recs[0].point
    stats.add(first, 1000, 0)
    assert stats.records()[0].cost == recs[0].cost + 1000 and stats.load == sum(costs.values()) + 1000


def test_past_the_cap_a_point_joins_a_neighbouring_record(monkeypatch):
    monkeypatch.setattr(channel_mod, "MAX_RECORDS", 2)
    stats = SliceStats(("a", "b"))
    stats.add((10, 50), 1, 0)
    stats.add((30, 50), 1, 0)
    stats.add((5, 50), 10, 0)  # below every kept point: the first
    stats.add((40, 50), 100, 0)  # above every kept point: the last
    assert [(r.point, r.cost, r.count) for r in stats.records()] == [
        ((10, 50), 11, 2),
        ((30, 50), 101, 2),
    ]
    stats.add((20, 50), 1000, 0)  # between: one of its two neighbours
    costs = sorted(r.cost for r in stats.records())
    assert costs in ([11, 1101], [101, 1011])
    assert stats.load == 1112


def test_record_cap_through_a_channel(monkeypatch):
    monkeypatch.setattr(channel_mod, "MAX_RECORDS", 3)
    ch = Channel(ChannelId(0, 0), EventSpace.whole(EXAMPLE), EXAMPLE)
    ch.add(S("s", "a >= 0", EXAMPLE))
    total = 0
    for a in range(30):
        total += ch.match({"a": a, "b": 60}, access_node=0)[1]
    assert len(ch.current.records()) == 3
    assert ch.load == total == sum(r.cost for r in ch.current.records()) == 30


def test_access_rates():
    stats = SliceStats(("a", "b"))
    assert stats.access_rate(1) == 0.0  # no events yet
    for node in (1, 1, 1, 2):
        stats.add((0, 50), 1, node)
    assert stats.access == {1: 3, 2: 1}
    assert stats.access_rate(1) == 0.75
    assert stats.access_rate(2) == 0.25
    assert stats.access_rate(3) == 0.0


def test_access_rates_through_a_channel(ch):
    for node in (7, 7, 8):
        ch.match(EVENT, access_node=node)
    assert ch.current.access_rate(7) == pytest.approx(2 / 3)
    assert ch.current.access_rate(8) == pytest.approx(1 / 3)


# -- seen values of type-2 string constraints ------------------------------------------------------


def test_seen_values_tracked_for_type_2_constraints(schema):
    space = EventSpace.build(schema, [ExceptConstraint("sym", frozenset({"X"}))])
    ch = Channel(ChannelId(0, 1), space, schema)
    for sym in ("AB", "C", "AB"):
        ch.match({**EVENT, "sym": sym}, access_node=0)
    assert ch.seen == {"sym": {"AB", "C"}}
    ch.roll_slice()
    assert ch.seen == {"sym": {"AB", "C"}}  # kept across slices for later splits


def test_seen_values_not_tracked_for_type_1_constraints(schema):
    space = EventSpace.build(schema, [SetConstraint("sym", frozenset({"AB", "C"}))])
    ch = Channel(ChannelId(0, 1), space, schema)
    ch.match(EVENT, access_node=0)
    assert ch.seen == {}


def test_seen_values_are_bounded(monkeypatch, schema):
    monkeypatch.setattr(channel_mod, "MAX_SEEN", 3)
    ch = Channel(ChannelId(0, 1), EventSpace.whole(schema), schema)
    for i in range(10):
        ch.match({**EVENT, "sym": f"S{i}"}, access_node=0)
    assert ch.seen["sym"] == {"S0", "S1", "S2"}
    assert ch.current.events == 10


def test_seen_values_for_two_string_da():
    s = Schema([Attribute("s", Kind.STRING, 0, 3), Attribute("u", Kind.STRING, 0, 3)], ["s", "u"])
    space = EventSpace.build(s, [SetConstraint("s", frozenset({"a", "b"}))])
    ch = Channel(ChannelId(0, 1), space, s)
    ch.match({"s": "a", "u": "x"}, 0)
    ch.match({"s": "b", "u": "y"}, 0)
    assert ch.seen == {"u": {"x", "y"}}


# -- property: a channel matches like the linear scan and its load is the sum of costs ----------


@PROPS
@given(st.lists(filters(SMALL), max_size=12), st.lists(events(SMALL), min_size=1, max_size=12))
def test_channel_matches_like_a_linear_scan(fs, evs):
    ch = Channel(ChannelId(0, 0), EventSpace.whole(SMALL), SMALL, nbuckets=8)
    lin = LinearMatcher(SMALL)
    for i, f in enumerate(fs):
        s = Subscription(f"s{i}", f)
        ch.add(s)
        lin.add(s)
    total = 0
    for node, e in enumerate(evs):
        matched, tested = ch.match(e, access_node=node % 3)
        assert sorted(s.id for s in matched) == sorted(f"s{i}" for i, f in enumerate(fs) if brute_matches(f, e))
        assert len(matched) <= tested <= len(lin)
        total += tested
    recs = ch.current.records()
    assert ch.load == total == sum(r.cost for r in recs)
    assert sum(r.count for r in recs) == len(evs) == ch.current.events
    assert [r.point for r in recs] == sorted(r.point for r in recs)
    assert len(recs) == len({tuple(e[n] for n in ch.priority) for e in evs})
    assert sum(ch.current.access_rate(n) for n in range(3)) == pytest.approx(1.0)
