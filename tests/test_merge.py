"""overlay.balance.merge: adjacency, contiguity, string unions and merged channels (SPEC §8.4)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from overlay.balance.merge import merge_pair, mergeable_pairs, merged_space, sort_channels
from overlay.balance.split import choose_cut, divide
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
    parse_subscription,
)
from strategies import SMALL, events, partition

PROPS = settings(max_examples=100, deadline=None)

NUM = Schema(
    [Attribute("a", Kind.INT, 0, 100), Attribute("f", Kind.FLOAT, 0, 100), Attribute("s", Kind.STRING, 0, 8)],
    ["a", "f", "s"],
)


def rng(attr, lo, hi, lo_open=False, hi_open=False):
    return RangeConstraint(attr, Interval(lo, hi, lo_open, hi_open))


def sp(*constraints) -> EventSpace:
    return EventSpace.build(NUM, constraints)


def chan(seq: int, space: EventSpace, *subs: tuple[str, str]) -> Channel:
    ch = Channel(ChannelId(0, seq), space, NUM)
    for sub_id, text in subs:
        ch.add(Subscription(sub_id, parse_subscription(text, NUM)))
    return ch


# -- contiguity -------------------------------------------------------------------------------


def test_adjacent_integer_intervals_merge():
    # [10,20] ∪ [21,50] → [10,50]
    got = merged_space(sp(rng("a", 10, 20)), sp(rng("a", 21, 50)), NUM)
    assert got == sp(rng("a", 10, 50))
    assert merged_space(sp(rng("a", 21, 50)), sp(rng("a", 10, 20)), NUM) == got  # either order


def test_a_gap_does_not_merge():
    # [10,20] and [30,50] do not; nor do [10,20] and [22,50] (21 is missing).
    assert merged_space(sp(rng("a", 10, 20)), sp(rng("a", 30, 50)), NUM) is None
    assert merged_space(sp(rng("a", 10, 20)), sp(rng("a", 22, 50)), NUM) is None


def test_float_intervals_merge_only_without_a_gap():
    assert merged_space(sp(rng("f", 0, 20.0)), sp(rng("f", 20.0, 100, lo_open=True)), NUM) == sp(rng("f", 0, 100))
    # [0,20) ∪ (20,100]: 20 itself is missing.
    assert merged_space(sp(rng("f", 0, 20.0, hi_open=True)), sp(rng("f", 20.0, 100, lo_open=True)), NUM) is None
    # Integers 20 and 21 are neighbours; floats 20 and 21 are not.
    assert merged_space(sp(rng("f", 0, 20.0)), sp(rng("f", 21.0, 100)), NUM) is None


def test_spaces_differing_on_two_attributes_do_not_merge():
    a = sp(rng("a", 0, 20), rng("f", 0, 50))
    b = sp(rng("a", 21, 100), rng("f", 50, 100, lo_open=True))
    assert merged_space(a, b, NUM) is None


def test_equal_spaces_do_not_merge():
    assert merged_space(sp(rng("a", 0, 20)), sp(rng("a", 0, 20)), NUM) is None


def test_string_sets_merge_by_union():
    one = SetConstraint("s", frozenset({"x", "y"}))
    two = SetConstraint("s", frozenset({"z"}))
    assert merged_space(sp(one), sp(two), NUM) == sp(SetConstraint("s", frozenset({"x", "y", "z"})))
    # A type-1 child back into its type-2 sibling: the exclusion is lifted.
    rest = ExceptConstraint("s", frozenset({"x", "y", "q"}))
    assert merged_space(sp(one), sp(rest), NUM) == sp(ExceptConstraint("s", frozenset({"q"})))
    assert merged_space(sp(rest), sp(one), NUM) == sp(ExceptConstraint("s", frozenset({"q"})))
    # Two type-2 constraints: whatever either admits.
    assert merged_space(
        sp(ExceptConstraint("s", frozenset({"x", "q"}))), sp(ExceptConstraint("s", frozenset({"y", "q"}))), NUM
    ) == sp(ExceptConstraint("s", frozenset({"q"})))


def test_a_string_and_a_range_constraint_never_merge():
    # Only possible with a hand-built space; the union must refuse, not guess.
    a = EventSpace((rng("a", 0, 10), rng("f", 0, 100), SetConstraint("s", frozenset({"x"}))))
    b = EventSpace((rng("a", 0, 10), rng("f", 0, 100), rng("s", 0, 3)))
    assert merged_space(a, b, NUM) is None


# -- sorting and mergeable pairs --------------------------------------------------------------


def test_channels_sort_by_interval_low_end_and_type1_before_type2():
    c1 = chan(1, sp(rng("a", 51, 100)))
    c2 = chan(2, sp(rng("a", 0, 20)))
    c3 = chan(3, sp(rng("a", 21, 50)))
    assert [c.id.seq for c in sort_channels([c1, c2, c3])] == [2, 3, 1]
    t2 = chan(4, sp(ExceptConstraint("s", frozenset({"m"}))))
    t1 = chan(5, sp(SetConstraint("s", frozenset({"m"}))))
    assert [c.id.seq for c in sort_channels([t2, t1])] == [5, 4]


def test_mergeable_pairs_are_sorted_neighbours_with_a_contiguous_union():
    c1 = chan(1, sp(rng("a", 51, 100)))
    c2 = chan(2, sp(rng("a", 0, 20)))
    c3 = chan(3, sp(rng("a", 21, 50)))
    pairs = mergeable_pairs([c1, c2, c3], NUM)
    assert [(a.id.seq, b.id.seq) for a, b, _ in pairs] == [(2, 3), (3, 1)]
    assert pairs[0][2] == sp(rng("a", 0, 50)) and pairs[1][2] == sp(rng("a", 21, 100))


def test_non_neighbours_and_gaps_are_not_offered():
    c1 = chan(1, sp(rng("a", 10, 20)))
    c2 = chan(2, sp(rng("a", 30, 50)))
    c3 = chan(3, sp(rng("a", 60, 70)))
    assert mergeable_pairs([c3, c1, c2], NUM) == []
    assert mergeable_pairs([], NUM) == [] and mergeable_pairs([c1], NUM) == []


def test_mergeable_pairs_on_a_grid():
    # a ∈ [0,50] | [51,100] × f ∈ [0,50] | (50,100]: only pieces equal on one attribute merge,
    # and only those next to each other in sort order are offered.
    pieces = [
        sp(rng("a", 0, 50), rng("f", 0, 50)),
        sp(rng("a", 0, 50), rng("f", 50, 100, lo_open=True)),
        sp(rng("a", 51, 100), rng("f", 0, 50)),
        sp(rng("a", 51, 100), rng("f", 50, 100, lo_open=True)),
    ]
    chans = [chan(k, p) for k, p in enumerate(pieces)]
    pairs = mergeable_pairs(list(reversed(chans)), NUM)
    assert [(a.id.seq, b.id.seq) for a, b, _ in pairs] == [(0, 1), (2, 3)]
    assert pairs[0][2] == sp(rng("a", 0, 50)) and pairs[1][2] == sp(rng("a", 51, 100))


# -- merge_pair --------------------------------------------------------------------------------


def test_merge_pair_keeps_each_subscription_once():
    a = chan(1, sp(rng("a", 0, 20)), ("s1", "a < 10"), ("both", "a in [15, 30]"))
    b = chan(2, sp(rng("a", 21, 50)), ("both", "a in [15, 30]"), ("s2", "a > 40"))
    space = merged_space(a.space, b.space, NUM)
    m = merge_pair(a, b, ChannelId(0, 9), space)
    assert m.id == ChannelId(0, 9) and m.space == sp(rng("a", 0, 50)) and m.schema is NUM
    assert sorted(s.id for s in m) == ["both", "s1", "s2"] and len(m) == 3
    assert m.load == 0 and m.last.load == 0  # a fresh slice
    assert m.popularity()["a"] == 1.0
    # The parts are untouched.
    assert len(a) == 2 and len(b) == 2
    # The merged channel matches what either part matched.
    got, _ = m.match({"a": 18, "f": 1.0, "s": "x"}, access_node=0)
    assert [s.id for s in got] == ["both"]


def test_split_then_merge_restores_the_channel():
    parent = chan(
        0, EventSpace.whole(NUM), ("lo", "a < 10"), ("mid", "a in [20, 60]"), ("hi", "a > 90"), ("str", 's = "x"')
    )
    stats = SliceStats(("a", "f", "s"))
    for a in (1, 5, 30, 55, 95):
        stats.add((a, 1.0, "x"), 4, access_node=0)
    cut = choose_cut(parent.space, stats.records(), ("a", "f", "s"), 8, NUM)
    low, high = divide(parent, [(ChannelId(0, 1), cut.low), (ChannelId(0, 2), cut.high)])
    (pair,) = mergeable_pairs([high, low], NUM)
    assert {pair[0].id, pair[1].id} == {low.id, high.id}
    merged = merge_pair(pair[0], pair[1], ChannelId(0, 3), pair[2])
    assert merged.space == parent.space
    assert {s.id for s in merged} == {s.id for s in parent}


# -- properties --------------------------------------------------------------------------------


@PROPS
@given(st.data())
def test_a_merged_space_is_exactly_the_union_of_its_parts(data):
    spaces = partition(data, SMALL, max_steps=6)
    chans = [Channel(ChannelId(0, k), s, SMALL) for k, s in enumerate(spaces)]
    ordered = sort_channels(chans)
    assert [c.space.sort_key() for c in ordered] == sorted(c.space.sort_key() for c in chans)
    pairs = mergeable_pairs(chans, SMALL)
    event(f"{min(len(pairs), 3)} pairs")
    neighbours = list(pairwise(ordered))
    for a, b, space in pairs:
        assert (a, b) in neighbours  # only neighbours in sort order
        assert space == a.space.union(b.space, SMALL)
    evs = data.draw(st.lists(events(SMALL), min_size=1, max_size=20), label="events")
    for a, b, space in pairs:
        for e in evs:
            assert space.contains(e) == (a.space.contains(e) or b.space.contains(e))


@PROPS
@given(st.data())
def test_undoing_the_last_cut_is_always_offered(data):
    """Cut a piece of a partition in two: the two halves are sort neighbours and
    merge back into the piece."""
    spaces = partition(data, SMALL, max_steps=4)
    piece = data.draw(st.sampled_from(spaces), label="piece")
    name = data.draw(st.sampled_from([n for n in SMALL.da if SMALL.attributes[n].kind.ordered]), label="attr")
    attr = SMALL.attributes[name]
    iv = piece.constraint(name).interval
    points = [v for v in (attr.min + k * (attr.max - attr.min) / 8 for k in range(9)) if v in iv and v != iv.hi]
    if attr.kind.discrete:
        points = [int(v) for v in points if int(v) in iv and int(v) != iv.hi]
    if not points:
        return
    at = data.draw(st.sampled_from(points), label="at")
    low, high = piece.cut(attr, at)
    a, b = Channel(ChannelId(0, 1), low, SMALL), Channel(ChannelId(0, 2), high, SMALL)
    ((x, y, space),) = mergeable_pairs([b, a], SMALL)
    assert (x.id, y.id) == (a.id, b.id)
    assert space == piece


@pytest.mark.parametrize("n", [2, 3, 5])
def test_merge_pair_of_many_shared_subscriptions(n):
    subs = [(f"s{k}", f"a >= {k}") for k in range(n)]
    a = chan(1, sp(rng("a", 0, 20)), *subs)
    b = chan(2, sp(rng("a", 21, 50)), *subs)
    m = merge_pair(a, b, ChannelId(0, 3), merged_space(a.space, b.space, NUM))
    assert len(m) == n and sorted(s.id for s in m) == sorted(s for s, _ in subs)
