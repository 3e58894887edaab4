"""overlay.balance.split: where to cut a channel, and dividing it (SPEC §8.3).

The worked example of §8.3 is reproduced twice: from records fed to
``SliceStats.add`` and from a real ``Channel`` whose event costs come from its
subscriptions.  The properties check the cut against a brute-force reading of
the records: which records land in which child, and the prefix-sum rule.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from overlay.balance.split import Cut, choose_cut, cut_slice, divide
from overlay.channels import (
    Attribute,
    Channel,
    ChannelId,
    EventSpace,
    ExceptConstraint,
    Interval,
    Kind,
    RangeConstraint,
    Schema,
    SetConstraint,
    SliceStats,
    Subscription,
    parse_rfid,
    parse_subscription,
)
from overlay.errors import LocalProtocolError
from strategies import SMALL, brute_matches, events, filters, partition, samples

PROPS = settings(max_examples=100, deadline=None)
RFID_MAX = (1 << 64) - 1

# SPEC §8.3's worked example: DA = {a, b}, a before b, ch = {a ∈ [0,100], b ∈ [50,80]}.
EXAMPLE = Schema([Attribute("a", Kind.INT, 0, 100), Attribute("b", Kind.INT, 50, 80)], ["a", "b"])
EXAMPLE_F = Schema([Attribute("a", Kind.FLOAT, 0, 100), Attribute("b", Kind.FLOAT, 50, 80)], ["a", "b"])
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


def rng(attr, lo, hi, lo_open=False, hi_open=False):
    return RangeConstraint(attr, Interval(lo, hi, lo_open, hi_open))


def stats_of(records, priority=("a", "b")) -> SliceStats:
    st_ = SliceStats(priority)
    for point, cost in records:
        st_.add(point, cost, access_node=0)
    return st_


def S(sub_id: str, text: str, schema: Schema) -> Subscription:
    return Subscription(sub_id, parse_subscription(text, schema))


# -- the worked example ---------------------------------------------------------------------------


def test_spec_worked_example_from_slice_records():
    stats = stats_of(EXAMPLE_RECORDS)
    assert stats.load == 28
    space = EventSpace.whole(EXAMPLE)
    assert space.constraints == (rng("a", 0, 100), rng("b", 50, 80))
    cut = choose_cut(space, stats.records(), ("a", "b"), 28 / 2, EXAMPLE)
    assert cut == Cut(
        "a",
        EventSpace((rng("a", 0, 20), rng("b", 50, 80))),  # ch1 = {a ∈ [0,20], b ∈ [50,80]}
        EventSpace((rng("a", 21, 100), rng("b", 50, 80))),  # ch2 = {a ∈ [21,100], b ∈ [50,80]}
        14,
        14,
    )
    assert cut.low.text(EXAMPLE) == "{a ∈ [0, 20]}" and cut.high.text(EXAMPLE) == "{a ∈ [21, 100]}"


def test_spec_worked_example_for_floats_cuts_20_open():
    recs = [((float(a), float(b)), c) for (a, b), c in EXAMPLE_RECORDS]
    cut = choose_cut(EventSpace.whole(EXAMPLE_F), stats_of(recs).records(), ("a", "b"), 14, EXAMPLE_F)
    assert cut is not None and cut.attr == "a" and (cut.low_load, cut.high_load) == (14, 14)
    assert cut.low.constraint("a") == rng("a", 0, 20.0)
    assert cut.high.constraint("a") == rng("a", 20.0, 100, lo_open=True)  # (20, 100]
    assert cut.low.constraint("b") == cut.high.constraint("b") == rng("b", 50, 80)
    assert cut.low.contains({"a": 20.0, "b": 60.0}) and not cut.high.contains({"a": 20.0, "b": 60.0})
    assert cut.high.contains({"a": 20.000001, "b": 60.0})


def example_channel() -> Channel:
    """A channel whose costs are the example's: ``n`` subscriptions ``a = v`` are
    exactly the candidates an event with ``a = v`` is tested against."""
    ch = Channel(ChannelId(0, 0), EventSpace.whole(EXAMPLE), EXAMPLE)
    per_value = {10: 3, 15: 1, 20: 5, 40: 2, 50: 4, 70: 2, 90: 6}
    for a, n in per_value.items():
        for k in range(n):
            ch.add(S(f"a{a}-{k}", f"a = {a}", EXAMPLE))
    return ch


def test_spec_worked_example_through_a_real_channel():
    ch = example_channel()
    tested = [ch.match({"a": a, "b": b}, access_node=0)[1] for (a, b), _ in EXAMPLE_RECORDS]
    assert tested == [c for _, c in EXAMPLE_RECORDS]  # costs come from the matcher
    ch.roll_slice()
    assert ch.last.load == 28
    cut = choose_cut(ch.space, ch.last.records(), ch.last.priority, ch.last.load / 2, EXAMPLE)
    assert cut is not None and cut.attr == "a"
    assert cut.low.constraint("a") == rng("a", 0, 20)
    assert cut.high.constraint("a") == rng("a", 21, 100)
    assert (cut.low_load, cut.high_load) == (14, 14)

    # Divide it: a subscription spanning the cut goes to both children.
    ch.add(S("span", "a in [15, 40]", EXAMPLE))
    ch.add(S("b-only", "b > 70", EXAMPLE))
    low, high = divide(ch, [(ChannelId(0, 1), cut.low), (ChannelId(0, 2), cut.high)])
    ids = lambda c: {s.id for s in c}  # noqa: E731
    assert ids(low) == {f"a{a}-{k}" for a, n in {10: 3, 15: 1, 20: 5}.items() for k in range(n)} | {"span", "b-only"}
    assert ids(high) == {f"a{a}-{k}" for a, n in {40: 2, 50: 4, 70: 2, 90: 6}.items() for k in range(n)} | {
        "span",
        "b-only",
    }
    assert (low.id, high.id) == (ChannelId(0, 1), ChannelId(0, 2))
    assert low.load == high.load == 0
    # With the example's subscriptions only, the children carry the loads the cut promised.
    for c in (low, high):
        c.remove("span")
        c.remove("b-only")
    for (a, b), _ in EXAMPLE_RECORDS:
        (low if cut.low.contains({"a": a, "b": b}) else high).match({"a": a, "b": b}, access_node=0)
    assert (low.load, high.load) == (cut.low_load, cut.high_load) == (14, 14)


@pytest.mark.parametrize(
    ("delta", "after_a", "low_load"),
    [
        (14, 20, 14),  # the example
        (10, 20, 14),  # 14 is closer than 4
        (9, 20, 14),  # a tie (4 and 14): the prefix that reaches ΔLD
        (8, 15, 4),  # 4 is closer than 14
        (3, 10, 3),
        (0, 10, 3),  # nothing to cut off: still the smallest real cut
        (20, 50, 20),
        (21, 70, 22),  # a tie (20 and 22): the prefix that reaches ΔLD
        (100, 70, 22),  # more than the channel: the top group stays
    ],
)
def test_cut_is_the_prefix_closest_to_delta(delta, after_a, low_load):
    cut = choose_cut(EventSpace.whole(EXAMPLE), stats_of(EXAMPLE_RECORDS).records(), ("a", "b"), delta, EXAMPLE)
    assert cut is not None
    assert cut.low.constraint("a") == rng("a", 0, after_a)
    assert cut.high.constraint("a") == rng("a", after_a + 1, 100)
    assert (cut.low_load, cut.high_load) == (low_load, 28 - low_load)


def test_cut_inside_an_already_cut_space():
    space = EventSpace((rng("a", 5, 60), rng("b", 50, 80)))
    recs = [r for r in EXAMPLE_RECORDS if 5 <= r[0][0] <= 60]
    cut = choose_cut(space, stats_of(recs).records(), ("a", "b"), 8, EXAMPLE)
    assert cut.low.constraint("a") == rng("a", 5, 15) and cut.high.constraint("a") == rng("a", 16, 60)
    assert (cut.low_load, cut.high_load) == (4, 16)


# -- strings and rfid -----------------------------------------------------------------------------

STR = Schema([Attribute("n", Kind.INT, 0, 9), Attribute("s", Kind.STRING, 0, 8)], ["n", "s"])
STR_RECORDS = [((5, "a"), 2), ((5, "b"), 3), ((5, "c"), 5), ((5, "d"), 4)]


def test_string_cut_from_a_type2_parent_makes_a_type1_child():
    cut = choose_cut(EventSpace.whole(STR), stats_of(STR_RECORDS, ("n", "s")).records(), ("n", "s"), 5, STR)
    assert cut is not None and cut.attr == "s"  # n is the same everywhere: cannot separate
    assert cut.low.constraint("s") == SetConstraint("s", frozenset({"a", "b"}))  # strSet
    assert cut.high.constraint("s") == ExceptConstraint("s", frozenset({"a", "b"}))  # valDomain \ strSet
    assert cut.low.constraint("n") == cut.high.constraint("n") == rng("n", 0, 9)
    assert (cut.low_load, cut.high_load) == (5, 9)


def test_string_cut_from_a_type2_parent_keeps_its_exclusions():
    space = EventSpace.build(STR, [ExceptConstraint("s", frozenset({"z"}))])
    cut = choose_cut(space, stats_of(STR_RECORDS, ("n", "s")).records(), ("n", "s"), 7, STR)
    assert cut.low.constraint("s") == SetConstraint("s", frozenset({"a", "b"}))
    assert cut.high.constraint("s") == ExceptConstraint("s", frozenset({"a", "b", "z"}))


def test_string_cut_from_a_type1_parent():
    space = EventSpace.build(STR, [SetConstraint("s", frozenset("abcde"))])
    cut = choose_cut(space, stats_of(STR_RECORDS, ("n", "s")).records(), ("n", "s"), 10, STR)
    assert cut.low.constraint("s") == SetConstraint("s", frozenset({"a", "b", "c"}))
    assert cut.high.constraint("s") == SetConstraint("s", frozenset({"d", "e"}))
    assert (cut.low_load, cut.high_load) == (10, 4)


def test_rfid_cut():
    schema = Schema([Attribute("r", Kind.RFID, 0, RFID_MAX)], ["r"])
    codes = [parse_rfid(t) for t in ("1.2.3.4", "1.2.3.5", "1.2.4.0", "2.0.0.0")]
    recs = [((c,), cost) for c, cost in zip(codes, (4, 4, 1, 7))]
    cut = choose_cut(EventSpace.whole(schema), stats_of(recs, ("r",)).records(), ("r",), 8, schema)
    assert cut.attr == "r"
    assert cut.low.constraint("r") == rng("r", 0, codes[1])
    assert cut.high.constraint("r") == rng("r", codes[1] + 1, RFID_MAX)
    assert (cut.low_load, cut.high_load) == (8, 8)


# -- attribute priority ---------------------------------------------------------------------------

# Declared string first: only the priority puts the numeric attribute first.
KINDS = Schema(
    [Attribute("s", Kind.STRING, 0, 4), Attribute("r", Kind.RFID, 0, 99), Attribute("a", Kind.INT, 0, 99)],
    ["s", "r", "a"],
)


@pytest.mark.parametrize(
    ("points", "attr"),
    [
        ([(1, 10, "x"), (2, 20, "y"), (3, 30, "z")], "a"),  # numeric first
        ([(1, 10, "x"), (1, 20, "y"), (1, 30, "z")], "r"),  # then rfid
        ([(1, 10, "x"), (1, 10, "y"), (1, 10, "z")], "s"),  # then string
    ],
)
def test_numeric_before_rfid_before_string(points, attr):
    prio = KINDS.da_priority()
    assert prio == ("a", "r", "s")
    recs = stats_of([(p, 5) for p in points], prio).records()
    cut = choose_cut(EventSpace.whole(KINDS), recs, prio, 5, KINDS)
    assert cut is not None and cut.attr == attr
    # The first record is in the low child, the others in the high one.
    vals = [dict(zip(prio, p)) for p in points]
    assert cut.low.contains(vals[0]) and not cut.high.contains(vals[0])
    assert all(cut.high.contains(v) and not cut.low.contains(v) for v in vals[1:])


TWO = Schema([Attribute("x", Kind.INT, 0, 100), Attribute("y", Kind.INT, 0, 100)], ["x", "y"])
TWO_EVENTS = [{"x": x, "y": y} for x, y in [(10, 90), (20, 80), (30, 70), (40, 60), (50, 50), (60, 40)]]


def test_popularity_decides_between_attributes_of_one_kind():
    ch = Channel(ChannelId(0, 0), EventSpace.whole(TWO), TWO)
    ch.add(S("s1", "y < 50", TWO))
    ch.add(S("s2", "y >= 75", TWO))
    ch.add(S("s3", "y > 10 and x < 99", TWO))
    assert ch.popularity() == {"x": pytest.approx(1 / 3), "y": 1.0}
    # The first slice was recorded with the declared order: x is cut.
    for e in TWO_EVENTS:
        ch.match(e, access_node=0)
    ch.roll_slice()
    assert ch.last.priority == ("x", "y")
    cut = choose_cut(ch.space, ch.last.records(), ch.last.priority, ch.last.load / 2, TWO)
    assert cut.attr == "x"
    # The next slice records with the priority from popularity: y is cut.
    for e in TWO_EVENTS:
        ch.match(e, access_node=0)
    ch.roll_slice()
    assert ch.last.priority == ("y", "x")
    cut = choose_cut(ch.space, ch.last.records(), ch.last.priority, ch.last.load / 2, TWO)
    assert cut.attr == "y" and cut.low.constraint("x") == rng("x", 0, 100)
    lows = [e for e in TWO_EVENTS if cut.low.contains(e)]
    assert lows and all(e["y"] < min(f["y"] for f in TWO_EVENTS if f not in lows) for e in lows)


# -- no cut possible: replicate ------------------------------------------------------------------


def test_all_records_on_one_point_cannot_be_cut():
    stats = stats_of([((20, 60), 5)] * 6)
    assert len(stats.records()) == 1
    assert choose_cut(EventSpace.whole(EXAMPLE), stats.records(), ("a", "b"), 15, EXAMPLE) is None


def test_no_records_cannot_be_cut():
    assert choose_cut(EventSpace.whole(EXAMPLE), [], ("a", "b"), 15, EXAMPLE) is None


# -- divide ---------------------------------------------------------------------------------------


def test_divide_needs_two_children():
    ch = example_channel()
    with pytest.raises(LocalProtocolError):
        divide(ch, [(ChannelId(0, 1), ch.space)])
    with pytest.raises(LocalProtocolError):
        divide(ch, [])


def test_divide_by_string_sends_patterns_where_they_overlap():
    ch = Channel(ChannelId(0, 0), EventSpace.whole(STR), STR)
    subs = {
        "eq-a": 's = "a"',
        "eq-d": 's = "d"',
        "pre": 's prefix "a"',
        "ne": 's != "a"',
        "in": 's in {"b", "c"}',
        "n": "n < 3",
    }
    for k, text in subs.items():
        ch.add(S(k, text, STR))
    cut = choose_cut(ch.space, stats_of(STR_RECORDS, ("n", "s")).records(), ("n", "s"), 5, STR)
    low, high = divide(ch, [(ChannelId(0, 1), cut.low), (ChannelId(0, 2), cut.high)])
    assert {s.id for s in low} == {"eq-a", "pre", "ne", "in", "n"}  # low = {a, b}
    assert {s.id for s in high} == {"eq-d", "pre", "ne", "in", "n"}  # high = all but {a, b}


# -- properties ------------------------------------------------------------------------------------

PRIO = SMALL.da_priority()


def _pool(space: EventSpace, name: str) -> list[object]:
    c = space.constraint(name)
    return [v for v in samples(SMALL.attributes[name]) if c.contains_value(v)]


@st.composite
def space_and_records(draw):
    data = draw(st.data())
    space = draw(st.sampled_from([None, "partition"]))
    if space is None:
        space = EventSpace.whole(SMALL)
    else:
        space = draw(st.sampled_from(partition(data, SMALL, max_steps=4)))
    pools = {n: _pool(space, n) for n in SMALL.da}
    # Few distinct values per attribute, so records share prefixes and groups
    # form; the first ``same`` attributes in priority take a single value, so
    # every attribute gets to be the one cut.
    same = draw(st.integers(0, len(PRIO) - 1), label="constant attributes")
    narrow = {
        n: draw(
            st.lists(
                st.sampled_from(pools[n]),
                min_size=min(2, len(pools[n])) if i == same else 1,
                max_size=1 if i < same else 3,
                unique=True,
            ),
            label=f"values of {n}",
        )
        for i, n in enumerate(PRIO)
    }
    points = draw(
        st.lists(st.tuples(*(st.sampled_from(narrow[n]) for n in PRIO)), min_size=1, max_size=12), label="points"
    )
    costs = draw(st.lists(st.integers(0, 20), min_size=len(points), max_size=len(points)), label="costs")
    return space, narrow, list(zip(points, costs))


@PROPS
@given(space_and_records(), st.floats(-5.0, 250.0), st.data())
def test_cut_agrees_with_brute_force_over_the_records(sr, delta, data):
    space, _, raw = sr
    recs = stats_of(raw, PRIO).records()
    cut = choose_cut(space, recs, PRIO, delta, SMALL)
    if len(recs) < 2:
        event("one point: no cut")
        assert cut is None
        return
    assert cut is not None
    event(f"cut on {cut.attr}")
    # Every record lies in exactly one child; the loads are what the records in each carry.
    total = sum(r.cost for r in recs)
    in_low = [r for r in recs if cut.low.contains(dict(zip(PRIO, r.point)))]
    in_high = [r for r in recs if cut.high.contains(dict(zip(PRIO, r.point)))]
    assert len(in_low) + len(in_high) == len(recs) and in_low and in_high
    assert cut.low_load == sum(r.cost for r in in_low)
    assert cut.high_load == sum(r.cost for r in in_high) == total - cut.low_load
    # The cut attribute is the first one (in priority) on which the records differ.
    pos = next(i for i in range(len(PRIO)) if len({r.point[i] for r in recs}) > 1)
    assert cut.attr == PRIO[pos]
    others = [n for n in SMALL.da if n != cut.attr]
    assert all(cut.low.constraint(n) == cut.high.constraint(n) == space.constraint(n) for n in others)
    # low_load is the prefix sum closest to ΔLD among the group boundaries on that attribute.
    values = sorted({r.point[pos] for r in recs})
    boundaries = [sum(r.cost for r in recs if r.point[pos] <= v) for v in values[:-1]]
    assert cut.low_load in boundaries
    best = min(abs(b - delta) for b in boundaries)
    assert abs(cut.low_load - delta) == best
    if sum(abs(b - delta) == best for b in set(boundaries)) > 1:
        assert cut.low_load >= delta  # a tie goes to the prefix that reaches ΔLD


@settings(max_examples=60, deadline=None)
@given(space_and_records(), st.floats(0.0, 250.0), st.data())
def test_divide_partitions_the_parent_and_keeps_every_subscription_where_it_matches(sr, delta, data):
    space, _, raw = sr
    recs = stats_of(raw, PRIO).records()
    cut = choose_cut(space, recs, PRIO, delta, SMALL)
    if cut is None:
        return
    parent = Channel(ChannelId(0, 0), space, SMALL)
    fs = data.draw(st.lists(filters(SMALL, max_size=3), max_size=8), label="filters")
    for k, f in enumerate(fs):
        if space.belongs(f, SMALL):  # the channel invariant: only subscriptions of its space
            parent.add(Subscription(f"s{k}", f))
    # consume: the larger child adopts the parent's index, the other indexes
    # its share in the background (Channel rule 5) — same membership.
    consume = data.draw(st.booleans(), label="consume")
    members = list(parent)
    low, high = divide(parent, [(ChannelId(0, 1), cut.low), (ChannelId(0, 2), cut.high)], consume=consume)
    ids = lambda c: {s.id for s in c}  # noqa: E731
    # Each subscription goes to every child it belongs to, and to at least one.
    for sub in members:
        assert (sub.id in ids(low)) == cut.low.belongs(sub.filter, SMALL)
        assert (sub.id in ids(high)) == cut.high.belongs(sub.filter, SMALL)
        assert (sub.id in low) == (sub.id in ids(low)) and (sub.id in high) == (sub.id in ids(high))
    assert ids(low) | ids(high) == {s.id for s in members}
    assert len(low) == len(ids(low)) and len(high) == len(ids(high))
    if consume:
        assert len(parent) == 0
    # Every event of the parent is in exactly one child, which holds every
    # subscription the event matches: no notification is lost by the split.
    pools = {n: _pool(space, n) for n in SMALL.da}
    inside = data.draw(
        st.lists(st.fixed_dictionaries({n: st.sampled_from(p) for n, p in pools.items()}), min_size=1, max_size=15),
        label="events of the parent",
    )
    anywhere = data.draw(st.lists(events(SMALL), max_size=10), label="any events")
    for drained in (False, True):
        if drained:  # the background work done: nothing pending or stale is left
            for c in (low, high):
                while c.index_step(2):
                    pass
                assert c.unindexed == 0
        for e in inside + anywhere:
            homes = [c for c in (low, high) if c.space.contains(e)]
            assert len(homes) == (1 if space.contains(e) else 0)
            if homes:
                want = {sub.id for sub in members if brute_matches(sub.filter, e) and sub.id in ids(homes[0])}
                for sub in members:
                    if brute_matches(sub.filter, e):
                        assert sub.id in ids(homes[0])
                assert {s.id for s in homes[0].match(e, 0)[0]} == want


# -- the fast cut against the plain reading of rules 1–4 --------------------------------------------


def reference_cut(records, delta):
    """Rules 1–2 as first written: group every record, scan the groups.
    ``(attribute position, last value of the prefix, its load)`` or None."""
    pos = next((i for i in range(len(records[0].point)) if len({r.point[i] for r in records}) > 1), None)
    if len(records) < 2 or pos is None:
        return None
    bounds, total = [], 0
    for r in records:
        v = r.point[pos]
        total += r.cost
        if bounds and bounds[-1][0] == v:
            bounds[-1] = (v, total)
        else:
            bounds.append((v, total))
    bounds.pop()
    k = next((i for i, (_, cum) in enumerate(bounds) if cum >= delta), len(bounds) - 1)
    if k > 0 and abs(bounds[k - 1][1] - delta) < abs(bounds[k][1] - delta):
        k -= 1
    return pos, bounds[k][0], bounds[k][1]


@given(
    recs=st.lists(
        st.tuples(st.tuples(st.integers(0, 6), st.integers(50, 53)), st.integers(0, 9)), min_size=1, max_size=40
    ),
    delta=st.floats(0, 120),
)
@PROPS
def test_cut_agrees_with_the_plain_reading_of_the_rules(recs, delta):
    stats = stats_of(recs)
    records = stats.records()
    want = reference_cut(records, delta)
    cut = choose_cut(EventSpace.whole(EXAMPLE), records, ("a", "b"), delta, EXAMPLE)
    if want is None:
        assert cut is None
        return
    pos, value, low_load = want
    attr = ("a", "b")[pos]
    assert cut is not None and cut.attr == attr and cut.low_load == low_load
    assert cut.low.constraint(attr) == rng(attr, EXAMPLE.attributes[attr].min, value)
    assert cut_slice(EventSpace.whole(EXAMPLE), stats, delta, EXAMPLE) == cut
