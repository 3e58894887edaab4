"""overlay.channels.intervals: Interval and IntervalSet, checked against plain sets.

Discrete sets are compared with Python sets of the domain's integers.  Float
sets have their end points on the integers and are sampled at every half
integer, which decides membership, equality and containment exactly.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.channels import Interval, IntervalSet

PROPS = settings(max_examples=200, deadline=None)

INT_DOMAIN = Interval(0, 12)
INT_VALUES = range(-3, 16)  # a margin outside the domain: clipping is checked too
FLOAT_DOMAIN = Interval(0.0, 8.0)
FLOAT_SAMPLES = [x / 2 for x in range(-4, 21)]


# -- Interval ---------------------------------------------------------------------


def test_interval_membership_and_emptiness():
    closed, open_ = Interval(1, 3), Interval(1, 3, True, True)
    assert 1 in closed and 3 in closed and 2.5 in closed
    assert 1 not in open_ and 3 not in open_ and 2 in open_
    assert 0 not in closed and 4 not in closed
    assert not Interval(2, 2).empty()
    assert Interval(2, 2, True, False).empty() and Interval(2, 2, False, True).empty()
    assert Interval(3, 2).empty()
    assert not Interval(2, 2.5, True, True).empty()
    assert Interval(1, 3, True, False).text() == "(1, 3]"
    assert Interval(1.5, 3).text() == "[1.5, 3]"


# -- normalisation (rules 1-3 of the module) ----------------------------------------------


def test_discrete_open_bounds_become_closed_integers():
    assert IntervalSet([Interval(0, 5, False, True)], INT_DOMAIN, True).intervals == (Interval(0, 4),)
    assert IntervalSet([Interval(5, 12, True, False)], INT_DOMAIN, True).intervals == (Interval(6, 12),)
    # A float bound rounds inwards.
    assert IntervalSet([Interval(0.5, 3.5)], INT_DOMAIN, True).intervals == (Interval(1, 3),)
    assert IntervalSet([Interval(0.5, 0.9)], INT_DOMAIN, True).is_empty()
    got = IntervalSet([Interval(2.0, 4.0, True, True)], INT_DOMAIN, True).intervals
    assert got == (Interval(3, 3),) and all(type(b) is int for b in (got[0].lo, got[0].hi))


def test_clipped_to_the_domain():
    s = IntervalSet([Interval(-5, 3), Interval(10, 99)], INT_DOMAIN, True)
    assert s.intervals == (Interval(0, 3), Interval(10, 12))
    assert IntervalSet([Interval(13, 20)], INT_DOMAIN, True).is_empty()
    f = IntervalSet([Interval(-1.0, 0.0, False, True)], FLOAT_DOMAIN, False)
    assert f.is_empty()
    # The domain's closed end survives clipping of an open interval beyond it.
    g = IntervalSet([Interval(-1.0, 9.0, True, True)], FLOAT_DOMAIN, False)
    assert g.is_whole() and g.intervals == (FLOAT_DOMAIN,)


def test_adjacent_and_overlapping_intervals_merge():
    ints = IntervalSet([Interval(4, 6), Interval(1, 3)], INT_DOMAIN, True)
    assert ints.intervals == (Interval(1, 6),)
    assert IntervalSet([Interval(1, 3), Interval(5, 6)], INT_DOMAIN, True).intervals == (
        Interval(1, 3),
        Interval(5, 6),
    )
    floats = IntervalSet([Interval(1.0, 3.0, False, True), Interval(3.0, 5.0)], FLOAT_DOMAIN, False)
    assert floats.intervals == (Interval(1.0, 5.0),)
    gap = IntervalSet([Interval(1.0, 3.0, False, True), Interval(3.0, 5.0, True, False)], FLOAT_DOMAIN, False)
    assert gap.intervals == (Interval(1.0, 3.0, False, True), Interval(3.0, 5.0, True, False))
    assert 3.0 not in gap
    nested = IntervalSet([Interval(1, 8), Interval(2, 3), Interval(2, 9)], INT_DOMAIN, True)
    assert nested.intervals == (Interval(1, 9),)
    # Same low end, closed sorts first; the wider high end wins.
    same_lo = IntervalSet([Interval(2.0, 4.0, True, False), Interval(2.0, 4.0, False, True)], FLOAT_DOMAIN, False)
    assert same_lo.intervals == (Interval(2.0, 4.0),)


def test_whole_empty_complement_hull_repr():
    whole = IntervalSet.whole(INT_DOMAIN, True)
    empty = IntervalSet.empty_set(INT_DOMAIN, True)
    assert whole.is_whole() and not whole.is_empty()
    assert empty.is_empty() and not empty.is_whole()
    assert whole.complement() == empty and empty.complement() == whole
    assert empty.hull() is None
    s = IntervalSet([Interval(1, 2), Interval(5, 7)], INT_DOMAIN, True)
    assert s.hull() == Interval(1, 7)
    assert s.complement().intervals == (Interval(0, 0), Interval(3, 4), Interval(8, 12))
    assert repr(s) == "IntervalSet([1, 2] ∪ [5, 7])" and repr(empty) == "IntervalSet(∅)"
    point = IntervalSet([Interval(3.0, 3.0)], FLOAT_DOMAIN, False)
    assert point.complement().intervals == (
        Interval(0.0, 3.0, False, True),
        Interval(3.0, 8.0, True, False),
    )
    assert hash(s) == hash(IntervalSet([Interval(5, 7), Interval(1, 2)], INT_DOMAIN, True))
    assert s != s.intervals


def test_issubset_and_overlaps_at_open_ends():
    a = IntervalSet([Interval(0.0, 2.0, False, True)], FLOAT_DOMAIN, False)
    b = IntervalSet([Interval(2.0, 4.0)], FLOAT_DOMAIN, False)
    assert not a.overlaps(b) and a.intersection(b).is_empty()
    c = IntervalSet([Interval(0.0, 2.0)], FLOAT_DOMAIN, False)
    assert c.overlaps(b) and c.intersection(b).intervals == (Interval(2.0, 2.0),)
    assert a.issubset(c) and not c.issubset(a)
    assert IntervalSet.empty_set(FLOAT_DOMAIN, False).issubset(a)


# -- properties against plain sets -----------------------------------------------------


@st.composite
def int_intervals(draw):
    lo = draw(st.integers(-3, 15)) + draw(st.sampled_from([0, 0, 0.5]))
    hi = draw(st.integers(-3, 15)) + draw(st.sampled_from([0, 0, 0.5]))
    return Interval(lo, hi, draw(st.booleans()), draw(st.booleans()))


@st.composite
def float_intervals(draw):
    lo = float(draw(st.integers(-2, 10)))
    hi = float(draw(st.integers(-2, 10)))
    return Interval(lo, hi, draw(st.booleans()), draw(st.booleans()))


def int_sets():
    return st.lists(int_intervals(), max_size=4).map(lambda ivs: IntervalSet(ivs, INT_DOMAIN, True))


def float_sets():
    return st.lists(float_intervals(), max_size=4).map(lambda ivs: IntervalSet(ivs, FLOAT_DOMAIN, False))


def model_of_intervals(ivs, samples, domain):
    return {v for v in samples if v in domain and any(v in iv for iv in ivs)}


def model(s: IntervalSet) -> frozenset:
    samples = INT_VALUES if s.discrete else FLOAT_SAMPLES
    return frozenset(v for v in samples if v in s)


def domain_model(discrete: bool) -> frozenset:
    return frozenset(
        v for v in (INT_VALUES if discrete else FLOAT_SAMPLES) if v in (INT_DOMAIN if discrete else FLOAT_DOMAIN)
    )


def assert_normal(s: IntervalSet) -> None:
    """The class invariant: sorted, non-empty, disjoint, not adjacent, in the domain."""
    for iv in s.intervals:
        assert not iv.empty()
        assert s.domain.lo <= iv.lo and iv.hi <= s.domain.hi
        if s.discrete:
            assert not iv.lo_open and not iv.hi_open
            assert type(iv.lo) is int and type(iv.hi) is int
    for a, b in itertools.pairwise(s.intervals):
        if s.discrete:
            assert a.hi + 1 < b.lo
        else:
            assert a.hi < b.lo or (a.hi == b.lo and a.hi_open and b.lo_open)


@PROPS
@given(st.lists(int_intervals(), max_size=4))
def test_int_construction_is_the_union_clipped_to_the_domain(ivs):
    s = IntervalSet(ivs, INT_DOMAIN, True)
    assert_normal(s)
    assert model(s) == model_of_intervals(ivs, INT_VALUES, INT_DOMAIN)


@PROPS
@given(st.lists(float_intervals(), max_size=4))
def test_float_construction_is_the_union_clipped_to_the_domain(ivs):
    s = IntervalSet(ivs, FLOAT_DOMAIN, False)
    assert_normal(s)
    assert model(s) == model_of_intervals(ivs, FLOAT_SAMPLES, FLOAT_DOMAIN)


@pytest.mark.parametrize("sets", [int_sets, float_sets], ids=["int", "float"])
@PROPS
@given(data=st.data())
def test_set_operations_agree_with_python_sets(sets, data):
    a = data.draw(sets(), label="a")
    b = data.draw(sets(), label="b")
    ma, mb, dom = model(a), model(b), domain_model(a.discrete)

    inter, union, comp = a.intersection(b), a.union(b), a.complement()
    for s in (inter, union, comp):
        assert_normal(s)
    assert model(inter) == ma & mb
    assert model(union) == ma | mb
    assert model(comp) == dom - ma
    assert comp.complement() == a
    assert a.issubset(b) == (ma <= mb)
    assert a.overlaps(b) == bool(ma & mb)
    assert a.is_empty() == (not ma)
    assert a.is_whole() == (ma == dom)
    # Rule 3: equal sets have equal representations.
    assert (a == b) == (ma == mb)
    if a == b:
        assert hash(a) == hash(b)
    hull = a.hull()
    if hull is None:
        assert not ma
    else:
        assert all(v in hull for v in ma)
        assert min(ma) in hull and max(ma) in hull
        assert (hull.lo in a) == (hull.lo in ma) and (hull.hi in a) == (hull.hi in ma)
