"""overlay.channels.space: event spaces, their constraints, cutting and merging (SPEC §2.3, §8.3, §8.4)."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.channels import (
    Attribute,
    ChannelId,
    EventSpace,
    ExceptConstraint,
    Interval,
    Kind,
    RangeConstraint,
    RouteEntry,
    RoutingTable,
    Schema,
    SetConstraint,
)
from overlay.errors import LocalProtocolError
from strategies import ENUM, SMALL, all_events, brute_matches, events, filters, partition, samples, unchecked_filter

PROPS = settings(max_examples=200, deadline=None)

# SPEC §8.3's worked example: DA = {a, b}, a before b.
EXAMPLE = Schema([Attribute("a", Kind.INT, 0, 100), Attribute("b", Kind.INT, 50, 80)], ["a", "b"])


def rng(attr, lo, hi, lo_open=False, hi_open=False):
    return RangeConstraint(attr, Interval(lo, hi, lo_open, hi_open))


def sub(text, schema):
    return unchecked_filter(text, schema)


EVENT = {"price": 12.5, "qty": 3, "sym": "AB", "tag": 7}


# -- construction and membership ---------------------------------------------------------------


def test_whole_space_is_one_unconstrained_constraint_per_da(schema):
    wes = EventSpace.whole(schema)
    assert [c.attr for c in wes.constraints] == list(schema.da)
    assert wes.constraint("price") == rng("price", 0, 1000)
    assert wes.constraint("qty") == rng("qty", 0, 100)
    assert wes.constraint("sym") == ExceptConstraint("sym")
    assert wes.constraint("tag") == rng("tag", 0, (1 << 64) - 1)
    assert wes.text(schema) == "WES"
    assert wes.contains(EVENT)
    assert not wes.is_empty(schema)


def test_an_event_missing_a_da_is_in_no_space(schema):
    wes = EventSpace.whole(schema)
    for name in schema.da:
        assert not wes.contains({k: v for k, v in EVENT.items() if k != name})


def test_build_and_constraint_lookup(schema):
    sp = EventSpace.build(schema, [rng("qty", 10, 20), SetConstraint("sym", frozenset({"A"}))])
    assert sp.constraints == (
        rng("price", 0, 1000),
        rng("qty", 10, 20),
        SetConstraint("sym", frozenset({"A"})),
        rng("tag", 0, (1 << 64) - 1),
    )
    assert sp.text(schema) == '{qty ∈ [10, 20], sym ∈ {"A"}}'
    assert sp.contains({**EVENT, "qty": 10, "sym": "A"})
    assert not sp.contains({**EVENT, "qty": 21, "sym": "A"})
    assert not sp.contains({**EVENT, "qty": 10, "sym": "B"})
    with pytest.raises(LocalProtocolError, match="not distinguishing"):
        EventSpace.build(schema, [SetConstraint("note", frozenset({"x"}))])
    with pytest.raises(LocalProtocolError, match="'note' is not a distinguishing attribute"):
        sp.constraint("note")


def test_text_of_constraints(schema):
    sp = EventSpace.build(
        schema,
        [rng("price", 20, 100, True), ExceptConstraint("sym", frozenset({"B", "A"})), rng("tag", 0, 1 << 24)],
    )
    assert sp.text(schema) == '{price ∈ (20, 100], sym ∉ {"A", "B"}, tag ∈ [0.0.0.0, 0.0.1.0]}'


def test_is_empty(schema):
    assert EventSpace.build(schema, [rng("qty", 5, 4)]).is_empty(schema)
    assert EventSpace.build(schema, [rng("price", 5, 5, True)]).is_empty(schema)
    assert EventSpace.build(schema, [SetConstraint("sym", frozenset())]).is_empty(schema)
    assert not EventSpace.build(schema, [rng("qty", 5, 5)]).is_empty(schema)


def test_spaces_round_trip_through_msgpack(schema):
    sp = EventSpace.build(
        schema,
        [rng("price", 20, 100.5, True), SetConstraint("sym", frozenset({"A", "B"})), rng("tag", 3, 9)],
    )
    sp2 = EventSpace.build(schema, [ExceptConstraint("sym", frozenset({"Q"}))])
    for space in (sp, sp2, EventSpace.whole(schema)):
        wire = msgspec.msgpack.encode(space)
        assert msgspec.msgpack.decode(wire, type=EventSpace) == space


# -- covers / overlaps, by example -----------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, text, cov, ovl",
    [
        ([], "qty < 10", True, True),
        ([], 'note = "x" and note = "y"', True, False),  # unsatisfiable on a non-DA
        ([rng("qty", 0, 20)], "qty < 10", True, True),
        ([rng("qty", 0, 20)], "qty < 21", True, True),
        ([rng("qty", 0, 20)], "qty < 30", False, True),
        ([rng("qty", 0, 20)], "qty > 20", False, False),
        ([rng("qty", 0, 20)], "qty >= 20", False, True),
        ([rng("qty", 0, 20)], "qty != 5", False, True),
        ([rng("qty", 0, 20)], "qty > 5 and qty < 5", True, False),  # empty on a DA
        ([rng("price", 20, 100, True)], "price <= 20", False, False),
        ([rng("price", 20, 100, True)], "price < 20.5", False, True),
        ([rng("price", 20, 100, True)], "price > 20 and price <= 100", True, True),
        ([rng("price", 20, 100, True)], "price >= 20 and price <= 100", False, True),
        ([SetConstraint("sym", frozenset({"A", "B"}))], 'sym in {"A"}', True, True),
        ([SetConstraint("sym", frozenset({"A", "B"}))], 'sym prefix "A"', False, True),
        ([SetConstraint("sym", frozenset({"A", "B"}))], 'sym prefix "C"', False, False),
        ([SetConstraint("sym", frozenset({"A", "B"}))], 'sym != "A"', False, True),
        ([SetConstraint("sym", frozenset({"A"}))], 'sym != "A"', False, False),
        ([ExceptConstraint("sym", frozenset({"A"}))], 'sym = "A"', False, False),
        ([ExceptConstraint("sym", frozenset({"A"}))], 'sym in {"A", "B"}', False, True),
        ([ExceptConstraint("sym", frozenset({"A"}))], 'sym = "B"', True, True),
        ([ExceptConstraint("sym", frozenset({"A"}))], 'sym prefix "A"', False, True),
        ([ExceptConstraint("sym", frozenset({"A"}))], 'sym prefix "B"', True, True),
        ([ExceptConstraint("sym", frozenset({"A"}))], 'sym != "A"', True, True),
        ([rng("qty", 0, 20), SetConstraint("sym", frozenset({"A"}))], 'qty < 5 and sym = "A"', True, True),
        ([rng("qty", 0, 20), SetConstraint("sym", frozenset({"A"}))], 'qty < 5 and sym = "B"', False, False),
        ([rng("qty", 0, 20), SetConstraint("sym", frozenset({"A"}))], 'qty > 30 and sym = "A"', False, False),
    ],
)
def test_covers_and_overlaps_examples(schema, overrides, text, cov, ovl):
    sp = EventSpace.build(schema, overrides)
    f = sub(text, schema)
    assert sp.covers(f, schema) == cov
    assert sp.overlaps(f, schema) == ovl
    assert sp.belongs(f, schema) == ovl  # covers or overlaps


# -- cutting (SPEC §8.3) -------------------------------------------------------------------------


def test_spec_worked_example_cut_at_a_20():
    ch = EventSpace.whole(EXAMPLE)
    assert ch.constraints == (rng("a", 0, 100), rng("b", 50, 80))
    ch1, ch2 = ch.cut(EXAMPLE.attributes["a"], 20)
    assert ch1.constraints == (rng("a", 0, 20), rng("b", 50, 80))
    assert ch2.constraints == (rng("a", 21, 100), rng("b", 50, 80))
    assert ch1.text(EXAMPLE) == "{a ∈ [0, 20]}" and ch2.text(EXAMPLE) == "{a ∈ [21, 100]}"
    assert ch1.contains({"a": 20, "b": 60}) and ch2.contains({"a": 21, "b": 50})
    assert not ch1.contains({"a": 21, "b": 50}) and not ch2.contains({"a": 20, "b": 60})


def test_cut_floats_leaves_an_open_low_end(schema):
    price = schema.attributes["price"]
    low, high = EventSpace.build(schema, [rng("price", 0, 100)]).cut(price, 20)
    assert low.constraint("price") == rng("price", 0, 20)
    assert high.constraint("price") == rng("price", 20, 100, lo_open=True)
    assert low.contains({**EVENT, "price": 20}) and not high.contains({**EVENT, "price": 20})
    assert high.contains({**EVENT, "price": 20.000001})
    # Cutting the open-ended child again keeps its open low end.
    a, b = high.cut(price, 50.5)
    assert a.constraint("price") == rng("price", 20, 50.5, lo_open=True)
    assert b.constraint("price") == rng("price", 50.5, 100, lo_open=True)


def test_cut_rfid(schema):
    tag = schema.attributes["tag"]
    low, high = EventSpace.whole(schema).cut(tag, 1 << 56)
    assert low.constraint("tag") == rng("tag", 0, 1 << 56)
    assert high.constraint("tag") == rng("tag", (1 << 56) + 1, (1 << 64) - 1)


@pytest.mark.parametrize("at", [100, 101, -1, 250])
def test_cut_point_must_be_inside_and_below_the_top(schema, at):
    sp = EventSpace.build(schema, [rng("qty", 0, 100)])
    with pytest.raises(LocalProtocolError, match="must lie inside"):
        sp.cut(schema.attributes["qty"], at)


def test_cut_at_the_open_low_end_is_refused(schema):
    sp = EventSpace.build(schema, [rng("price", 20, 100, lo_open=True)])
    with pytest.raises(LocalProtocolError, match="must lie inside"):
        sp.cut(schema.attributes["price"], 20)


def test_cut_at_the_bottom_leaves_a_single_point(schema):
    low, high = EventSpace.whole(schema).cut(schema.attributes["qty"], 0)
    assert low.constraint("qty") == rng("qty", 0, 0)
    assert high.constraint("qty") == rng("qty", 1, 100)


def test_cut_a_string_attribute_is_refused(schema):
    with pytest.raises(LocalProtocolError, match="cannot cut string attribute"):
        EventSpace.whole(schema).cut(schema.attributes["sym"], 3)


def test_take_strings_from_a_type_2_constraint(schema):
    child, rest = EventSpace.whole(schema).take_strings("sym", ["A", "B"])
    assert child.constraint("sym") == SetConstraint("sym", frozenset({"A", "B"}))
    assert rest.constraint("sym") == ExceptConstraint("sym", frozenset({"A", "B"}))
    child2, rest2 = rest.take_strings("sym", ["C", "A"])  # "A" is not in rest: ignored
    assert child2.constraint("sym") == SetConstraint("sym", frozenset({"C"}))
    assert rest2.constraint("sym") == ExceptConstraint("sym", frozenset({"A", "B", "C"}))


def test_take_strings_from_a_type_1_constraint(schema):
    sp = EventSpace.build(schema, [SetConstraint("sym", frozenset({"A", "B", "C"}))])
    child, rest = sp.take_strings("sym", ["B", "Z"])
    assert child.constraint("sym") == SetConstraint("sym", frozenset({"B"}))
    assert rest.constraint("sym") == SetConstraint("sym", frozenset({"A", "C"}))
    with pytest.raises(LocalProtocolError, match="leaves nothing"):
        sp.take_strings("sym", ["A", "B", "C"])
    with pytest.raises(LocalProtocolError, match="no value to move"):
        sp.take_strings("sym", ["Z"])
    with pytest.raises(LocalProtocolError, match="no value to move"):
        sp.take_strings("sym", [])


def test_take_strings_needs_a_string_attribute(schema):
    with pytest.raises(LocalProtocolError, match="not a string attribute"):
        EventSpace.whole(schema).take_strings("qty", [3])
    with pytest.raises(LocalProtocolError, match="not a distinguishing attribute"):
        EventSpace.whole(schema).take_strings("note", ["x"])


# -- merging (SPEC §8.4) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, merged",
    [
        (rng("qty", 10, 20), rng("qty", 21, 50), rng("qty", 10, 50)),
        (rng("qty", 21, 50), rng("qty", 10, 20), rng("qty", 10, 50)),
        (rng("qty", 10, 20), rng("qty", 30, 50), None),
        (rng("qty", 10, 20), rng("qty", 22, 50), None),
        (rng("qty", 10, 30), rng("qty", 20, 50), rng("qty", 10, 50)),
        (rng("price", 10, 20), rng("price", 20, 50, True), rng("price", 10, 50)),
        (rng("price", 10, 20, False, True), rng("price", 20, 50, True), None),
        (rng("price", 10, 20), rng("price", 21, 50), None),
        (
            SetConstraint("sym", frozenset({"A"})),
            SetConstraint("sym", frozenset({"B", "C"})),
            SetConstraint("sym", frozenset({"A", "B", "C"})),
        ),
        (
            SetConstraint("sym", frozenset({"A"})),
            ExceptConstraint("sym", frozenset({"A", "B"})),
            ExceptConstraint("sym", frozenset({"B"})),
        ),
        (
            ExceptConstraint("sym", frozenset({"A", "B"})),
            SetConstraint("sym", frozenset({"A", "B"})),
            ExceptConstraint("sym"),
        ),
        (
            ExceptConstraint("sym", frozenset({"A", "B"})),
            ExceptConstraint("sym", frozenset({"B", "C"})),
            ExceptConstraint("sym", frozenset({"B"})),
        ),
    ],
)
def test_union_of_spaces_differing_in_one_attribute(schema, a, b, merged):
    sa, sb = EventSpace.build(schema, [a]), EventSpace.build(schema, [b])
    got = sa.union(sb, schema)
    if merged is None:
        assert got is None
    else:
        assert got == EventSpace.build(schema, [merged])


def test_union_needs_exactly_one_differing_attribute(schema):
    a = EventSpace.build(schema, [rng("qty", 10, 20), rng("price", 0, 5)])
    b = EventSpace.build(schema, [rng("qty", 21, 50), rng("price", 5, 10, True)])
    assert a.union(b, schema) is None  # two attributes differ
    assert a.union(a, schema) is None  # none differs


def test_sort_order_type_1_before_type_2_and_by_low_end(schema):
    spaces = [
        EventSpace.build(schema, [rng("price", 50, 100, True), ExceptConstraint("sym", frozenset({"A"}))]),
        EventSpace.build(schema, [rng("price", 0, 50), ExceptConstraint("sym", frozenset({"A"}))]),
        EventSpace.build(schema, [rng("price", 50, 100, True), SetConstraint("sym", frozenset({"A"}))]),
        EventSpace.build(schema, [rng("price", 50, 100)]),
    ]
    ordered = sorted(spaces, key=EventSpace.sort_key)
    assert ordered == [spaces[1], spaces[3], spaces[2], spaces[0]]


# -- properties ------------------------------------------------------------------------------------


@PROPS
@given(st.data())
def test_cuts_partition_the_event_space(data):
    spaces = partition(data, SMALL)
    for e in data.draw(st.lists(events(SMALL), min_size=1, max_size=20), label="events"):
        assert sum(sp.contains(e) for sp in spaces) == 1
    for sp in spaces:
        assert not sp.is_empty(SMALL)


@PROPS
@given(st.data())
def test_children_merge_back_into_their_parent(data):
    parent = data.draw(st.sampled_from(partition(data, SMALL, max_steps=4)), label="parent")
    children = partition_once(data, parent)
    if children is None:
        return
    low, high = children
    assert low.union(high, SMALL) == parent
    assert high.union(low, SMALL) == parent


def partition_once(data, parent):
    """One more cut or take of ``parent``, or None when no step applies."""
    for name in SMALL.da:
        attr = SMALL.attributes[name]
        c = parent.constraint(name)
        if isinstance(c, RangeConstraint):
            points = [v for v in samples(attr) if v in c.interval and v != c.interval.hi]
            if attr.kind is Kind.FLOAT:
                points = [v for v in points if v * 2 == int(v * 2)]
            if points:
                return parent.cut(attr, data.draw(st.sampled_from(points), label=f"cut {name}"))
        else:
            pool = [v for v in ("", "a", "b", "ab", "ba") if c.contains_value(v)]
            if isinstance(c, SetConstraint):
                pool = sorted(c.values)[1:]
            if pool:
                return parent.take_strings(name, pool[:1])
    return None


@PROPS
@given(st.data())
def test_union_holds_exactly_the_events_of_both(data):
    spaces = partition(data, SMALL, max_steps=10)
    sample = data.draw(st.lists(events(SMALL), min_size=1, max_size=20), label="events")
    for a, b in itertools.combinations(spaces, 2):
        u = a.union(b, SMALL)
        if u is None:
            continue
        for e in sample:
            assert u.contains(e) == (a.contains(e) or b.contains(e))


def sample_values(space, name):
    attr = ENUM.attributes[name]
    c = space.constraint(name)
    return {v for v in samples(attr) if c.contains_value(v)}


@PROPS
@given(st.data())
def test_union_is_refused_exactly_when_there_is_a_gap(data):
    spaces = partition(data, ENUM, max_steps=8)
    for a, b in itertools.combinations(spaces, 2):
        differ = [c.attr for c, d in zip(a.constraints, b.constraints) if c != d]
        u = a.union(b, ENUM)
        if len(differ) != 1:
            assert u is None
            continue
        name = differ[0]
        joined = sorted(sample_values(a, name) | sample_values(b, name))
        grid = samples(ENUM.attributes[name])
        contiguous = joined == grid[grid.index(joined[0]) : grid.index(joined[-1]) + 1]
        assert (u is not None) == contiguous
        if u is not None:
            assert sample_values(u, name) == set(joined)


@PROPS
@given(st.data(), filters(SMALL), st.lists(events(SMALL), max_size=30))
def test_covers_and_overlaps_are_sound_on_sampled_events(data, f, sample):
    for sp in partition(data, SMALL):
        matching = [e for e in sample if brute_matches(f, e)]
        if sp.covers(f, SMALL):
            assert all(sp.contains(e) for e in matching)
        if not sp.overlaps(f, SMALL):
            assert not any(sp.contains(e) for e in matching)


ALL_ENUM_EVENTS = all_events(ENUM)


@PROPS
@given(st.data(), filters(ENUM))
def test_covers_and_overlaps_are_exact_over_an_enumerable_schema(data, f):
    matching = [e for e in ALL_ENUM_EVENTS if brute_matches(f, e)]
    for sp in partition(data, ENUM):
        inside = [sp.contains(e) for e in matching]
        assert sp.overlaps(f, ENUM) == any(inside)
        if matching:  # an unsatisfiable F is vacuously covered: either answer is sound
            assert sp.covers(f, ENUM) == all(inside)


@PROPS
@given(st.data())
def test_partition_spaces_round_trip_through_msgpack(data):
    for sp in partition(data, SMALL):
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(sp), type=EventSpace) == sp


def test_whole_space_covers_a_satisfiable_filter(schema):
    wes = EventSpace.whole(schema)
    f = sub('sym prefix "A" and qty in [1, 2] and note contains "x"', schema)
    assert wes.covers(f, schema) and wes.overlaps(f, schema)


@PROPS
@given(st.data())
def test_meets_is_overlaps_for_a_satisfiable_filter_and_the_table_routes_by_it(data):
    # The routing table checks a filter's satisfiability once and each
    # candidate space with ``meets``: the same channels as ``overlaps`` space
    # by space, and none for a filter no event matches.
    spaces = partition(data, SMALL)
    f = data.draw(filters(SMALL), label="filter")
    table = RoutingTable(SMALL)
    for k, sp in enumerate(spaces):
        table.set(ChannelId(0, k + 1), RouteEntry(sp, (0,)))
    expected = sorted(ChannelId(0, k + 1) for k, sp in enumerate(spaces) if sp.overlaps(f, SMALL))
    assert table.lookup_subscription(f) == expected
    if f.satisfiable(SMALL):
        assert [sp.meets(f, SMALL) for sp in spaces] == [sp.overlaps(f, SMALL) for sp in spaces]
    else:
        assert expected == []
