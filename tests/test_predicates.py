"""overlay.channels.predicates: every operator of SPEC §2.2, L(f), matching, coverage, overlap."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.channels import Filter, Interval, IntervalSet, Op, Predicate, StringConj, compile_filter
from overlay.channels.predicates import (
    MAX_SET_SIZE,
    SMALL_SET,
    conjunction,
    covers,
    overlaps,
    predicate_values,
)
from overlay.channels.schema import RFID_MAX
from overlay.channels.subscriptions import Subscription
from overlay.errors import SchemaError
from strategies import (
    ENUM,
    SMALL,
    all_events,
    all_strings,
    any_predicate,
    brute_matches,
    brute_satisfies,
    domain_of,
    events,
    filters,
    predicates,
)

PROPS = settings(max_examples=200, deadline=None)
ENUM_EVENTS = all_events(ENUM)


def P(attr, op, *args):
    return Predicate(attr, Op(op), args)


def ivs(schema, attr, *intervals):
    a = schema.attributes[attr]
    return IntervalSet(intervals, Interval(a.min, a.max), a.kind.discrete)


# -- L(f) of every ordered operator, at the domain's edges ---------------------------------


@pytest.mark.parametrize(
    "pred, expected",
    [
        # integers: < and > normalise to closed bounds
        (P("qty", "<", 10), [Interval(0, 9)]),
        (P("qty", "<", 0), []),
        (P("qty", "<", 1), [Interval(0, 0)]),
        (P("qty", "<=", 0), [Interval(0, 0)]),
        (P("qty", "<=", 100), [Interval(0, 100)]),
        (P("qty", ">", 10), [Interval(11, 100)]),
        (P("qty", ">", 100), []),
        (P("qty", ">", 99), [Interval(100, 100)]),
        (P("qty", ">=", 100), [Interval(100, 100)]),
        (P("qty", ">=", 0), [Interval(0, 100)]),
        (P("qty", "=", 0), [Interval(0, 0)]),
        (P("qty", "=", 100), [Interval(100, 100)]),
        (P("qty", "!=", 0), [Interval(1, 100)]),
        (P("qty", "!=", 100), [Interval(0, 99)]),
        (P("qty", "!=", 50), [Interval(0, 49), Interval(51, 100)]),
        (P("qty", "in[]", 3, 3), [Interval(3, 3)]),
        (P("qty", "in[]", 0, 100), [Interval(0, 100)]),
        # floats: open bounds stay open, closed stay closed
        (P("price", "<", 0), []),
        (P("price", "<=", 0), [Interval(0, 0)]),
        (P("price", "<", 10), [Interval(0, 10, False, True)]),
        (P("price", "<", 10.5), [Interval(0, 10.5, False, True)]),
        (P("price", ">", 1000), []),
        (P("price", ">=", 1000), [Interval(1000, 1000)]),
        (P("price", ">", 10), [Interval(10, 1000, True, False)]),
        (P("price", "!=", 0), [Interval(0, 1000, True, False)]),
        (P("price", "!=", 1000), [Interval(0, 1000, False, True)]),
        (P("price", "!=", 5.5), [Interval(0, 5.5, False, True), Interval(5.5, 1000, True, False)]),
        (P("price", "in[]", 1.5, 2.5), [Interval(1.5, 2.5)]),
        (P("price", "=", 0.25), [Interval(0.25, 0.25)]),
        # rfid codes are discrete too
        (P("tag", "<", 1), [Interval(0, 0)]),
        (P("tag", "<", 0), []),
        (P("tag", ">", RFID_MAX - 1), [Interval(RFID_MAX, RFID_MAX)]),
        (P("tag", ">", RFID_MAX), []),
        (P("tag", "!=", 0), [Interval(1, RFID_MAX)]),
        (P("tag", "in[]", 1 << 56, (2 << 56) - 1), [Interval(1 << 56, (2 << 56) - 1)]),
    ],
    ids=lambda x: x.text() if isinstance(x, Predicate) else None,
)
def test_values_of_ordered_predicates(schema, pred, expected):
    pred.check(schema)
    attr = schema.attributes[pred.attr]
    got = predicate_values(pred, attr)
    assert got == ivs(schema, pred.attr, *expected)
    # satisfied_by agrees with L(f) at every interesting value
    for iv in [*expected, Interval(attr.min, attr.max)]:
        for v in (iv.lo, iv.hi):
            assert pred.satisfied_by(v) == (v in got)


@pytest.mark.parametrize(
    "pred, yes, no",
    [
        (P("sym", "=", "AB"), ["AB"], ["A", "ABC", "ab", ""]),
        (P("sym", "!=", "AB"), ["A", "ABC", ""], ["AB"]),
        (P("sym", "prefix", "AB"), ["AB", "ABC"], ["A", "XAB", ""]),
        (P("sym", "prefix", ""), ["", "A", "XYZ"], []),
        (P("sym", "suffix", "AB"), ["AB", "XAB"], ["ABX", "B", ""]),
        (P("sym", "suffix", ""), ["", "A"], []),
        (P("sym", "contains", "B"), ["B", "ABC"], ["A", "ACD", ""]),
        (P("sym", "contains", ""), ["", "A"], []),
        (P("sym", "in{}", "A", "B"), ["A", "B"], ["AB", "", "C"]),
    ],
)
def test_string_operators(schema, pred, yes, no):
    pred.check(schema)
    conj = predicate_values(pred, schema.attributes["sym"])
    assert isinstance(conj, StringConj)
    for v in yes:
        assert pred.satisfied_by(v) and conj.contains(v)
    for v in no:
        assert not pred.satisfied_by(v) and not conj.contains(v)


def test_string_values_are_not_narrowed_by_the_length_bound(schema):
    # Rule 2: L(f) of a string is over all strings; the bound validates values only.
    conj = predicate_values(P("sym", "prefix", "ABCDEFGHIJ"), schema.attributes["sym"])
    assert not conj.is_empty() and conj.finite is None


# -- StringConj -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "preds, empty, finite, whole",
    [
        ([], False, None, True),
        ([P("sym", "prefix", "")], False, None, True),
        ([P("sym", "prefix", ""), P("sym", "contains", "")], False, None, True),
        ([P("sym", "!=", "A")], False, None, False),
        ([P("sym", "=", "A"), P("sym", "=", "B")], True, frozenset(), False),
        ([P("sym", "=", "A"), P("sym", "!=", "A")], True, frozenset(), False),
        ([P("sym", "in{}", "A", "B", "C"), P("sym", "in{}", "B", "C", "D")], False, {"B", "C"}, False),
        ([P("sym", "in{}", "AB", "B"), P("sym", "prefix", "A")], False, {"AB"}, False),
        ([P("sym", "prefix", "AB"), P("sym", "prefix", "AC")], True, None, False),
        ([P("sym", "prefix", "A"), P("sym", "prefix", "AB")], False, None, False),
        ([P("sym", "suffix", "AB"), P("sym", "suffix", "CB")], True, None, False),
        ([P("sym", "suffix", "B"), P("sym", "suffix", "AB")], False, None, False),
        ([P("sym", "prefix", "AB"), P("sym", "suffix", "BA"), P("sym", "contains", "Z")], False, None, False),
    ],
)
def test_string_conjunctions(preds, empty, finite, whole):
    conj = StringConj(preds)
    assert conj.is_empty() == empty
    assert conj.finite == (None if finite is None else frozenset(finite))
    assert conj.is_whole() == whole


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, fragment",
    [
        # operators that do not apply to the kind
        (P("qty", "prefix", "1"), "operator 'prefix' does not apply to int attribute 'qty'"),
        (P("price", "contains", "1"), "does not apply to float"),
        (P("tag", "in{}", 1, 2), "operator 'in{}' does not apply to rfid"),
        (P("qty", "in{}", 1), "does not apply to int"),
        (P("sym", "<", "A"), "operator '<' does not apply to string attribute 'sym'"),
        (P("sym", "in[]", "A", "B"), "does not apply to string"),
        # arity
        (P("qty", "in[]", 1), "needs two bounds"),
        (P("qty", "in[]", 1, 2, 3), "needs two bounds"),
        (P("qty", "=", 1, 2), "takes one value"),
        (P("qty", "="), "takes one value"),
        (P("sym", "in{}"), "needs 1 to 1024 values, got 0"),
        (Predicate("sym", Op.IN_SET, tuple(f"v{i}" for i in range(MAX_SET_SIZE + 1))), "got 1025"),
        # in[lo, hi] with lo > hi
        (P("qty", "in[]", 5, 4), "has lo above hi"),
        (P("price", "in[]", 5.5, 5.25), "has lo above hi"),
        # wrong types: bool is not a number, nothing is coerced
        (P("qty", "=", True), "is an integer, got bool"),
        (P("price", ">", False), "is a number, got bool"),
        (P("qty", "<", 1.0), "is an integer, got float"),
        (P("qty", "in[]", 1, 2.0), "is an integer, got float"),
        (P("tag", "=", 1.0), "is an rfid code, got float"),
        (P("sym", "=", 1), "is a string, got int"),
        (P("sym", "in{}", "A", 2), "is a string, got int"),
        (P("price", "=", "1"), "is a number, got str"),
        (P("sym", "prefix", 1), "prefix on 'sym' needs a string"),
        (P("sym", "suffix", None), "suffix on 'sym' needs a string"),
        # values out of [min, max]
        (P("qty", "<", 101), "outside [0, 100]"),
        (P("qty", ">", -1), "outside [0, 100]"),
        (P("qty", "in[]", -1, 5), "outside"),
        (P("price", "<=", 1000.5), "outside"),
        (P("tag", "=", RFID_MAX + 1), "outside"),
        (P("sym", "=", ""), "length 0"),
        (P("sym", "in{}", "ABCDEFGHI"), "length 9"),
        # unknown attribute
        (P("colour", "=", "red"), "unknown attribute 'colour'"),
    ],
    ids=repr,
)
def test_check_rejects(schema, pred, fragment):
    with pytest.raises(SchemaError) as info:
        pred.check(schema)
    assert fragment in str(info.value)
    assert info.value.attr == pred.attr


@pytest.mark.parametrize(
    "pred",
    [
        P("qty", "=", 0),
        P("qty", "in[]", 0, 100),
        P("qty", "in[]", 7, 7),
        P("price", "<", 0),
        P("price", "=", 1000),
        P("price", "in[]", 0, 1000.0),
        P("price", ">=", 5),  # an int constant for a float attribute
        P("tag", "<", RFID_MAX),
        P("sym", "in{}", *(f"v{i}" for i in range(MAX_SET_SIZE))),
        # a pattern is a fragment: its length is not bounded by the schema
        P("sym", "prefix", ""),
        P("sym", "contains", "ABCDEFGHIJKLMNOP"),
    ],
    ids=repr,
)
def test_check_accepts(schema, pred):
    assert pred.check(schema) is pred


def test_predicate_values_refuses_an_operator_of_the_other_kind(schema):
    with pytest.raises(SchemaError):
        predicate_values(P("qty", "in{}", 1), schema.attributes["qty"])


# -- filters -----------------------------------------------------------------------------------


def test_empty_conjunction_is_refused(schema):
    with pytest.raises(SchemaError, match="at least one predicate"):
        Filter(()).check(schema)


def test_conjunction_without_predicates_is_the_whole_domain(schema):
    assert conjunction([], schema.attributes["qty"]).is_whole()
    assert conjunction([], schema.attributes["sym"]).is_whole()
    both = conjunction([P("qty", ">", 10), P("qty", "<", 20)], schema.attributes["qty"])
    assert both == ivs(schema, "qty", Interval(11, 19))
    none = conjunction([P("qty", ">", 10), P("qty", "<", 5)], schema.attributes["qty"])
    assert none.is_empty()


def test_filter_matches_and_accessors(schema):
    f = Filter((P("price", ">=", 10), P("price", "<", 20), P("sym", "prefix", "AB"))).check(schema)
    assert f.matches({"price": 10, "sym": "AB"})
    assert f.matches({"price": 19.999, "sym": "ABC", "qty": 4})
    assert not f.matches({"price": 20, "sym": "AB"})
    assert not f.matches({"price": 15})  # an item is missing: no predicate on it is satisfied
    assert not f.matches({})
    assert f.attrs() == {"price", "sym"}
    assert f.on("price") == (P("price", ">=", 10), P("price", "<", 20))
    assert f.on("qty") == ()
    assert f.text(schema) == 'price >= 10 and price < 20 and sym prefix "AB"'
    assert f.text() == "price >= 10 and price < 20 and sym prefix 'AB'"
    fn = compile_filter(f)
    assert fn({"price": 10, "sym": "AB"}) and not fn({"price": 15})


def test_predicate_text(schema):
    assert P("tag", "in[]", 0, 1 << 24).text(schema) == "tag in [0.0.0.0, 0.0.1.0]"
    assert P("sym", "in{}", "A", "B").text(schema) == 'sym in {"A", "B"}'
    assert P("qty", "!=", 3).text(schema) == "qty != 3"


# -- coverage and overlap, by example ------------------------------------------------------------


@pytest.mark.parametrize(
    "p, q, cov, ovl",
    [
        (P("qty", ">=", 0), P("qty", "!=", 5), True, True),  # domain-clipped (intervals rule 1)
        (P("qty", "<", 10), P("qty", "<=", 9), True, True),  # integer normalisation
        (P("qty", "<=", 9), P("qty", "<", 10), True, True),
        (P("price", "<", 10), P("price", "<=", 9.99), True, True),
        (P("price", "<=", 9.99), P("price", "<", 10), False, True),
        (P("price", "<", 10), P("price", ">=", 10), False, False),
        (P("price", "<=", 10), P("price", ">=", 10), False, True),
        (P("qty", "<", 10), P("qty", ">", 8), False, True),
        (P("qty", "<", 10), P("qty", ">", 9), False, False),
        (P("qty", "=", 5), P("qty", "in[]", 5, 5), True, True),
        (P("qty", "!=", 5), P("qty", "<", 0), True, False),  # L(q) = ∅ is covered by anything
        (P("qty", "<", 5), P("price", "<", 5), False, False),  # different attributes
        (P("sym", "prefix", "A"), P("sym", "prefix", "AB"), True, True),
        (P("sym", "prefix", "AB"), P("sym", "prefix", "A"), False, True),
        (P("sym", "prefix", "AB"), P("sym", "prefix", "AC"), False, False),
        (P("sym", "contains", "B"), P("sym", "suffix", "AB"), True, True),
        (P("sym", "contains", "BC"), P("sym", "prefix", "AB"), False, True),
        (P("sym", "!=", "A"), P("sym", "prefix", "AB"), True, True),
        (P("sym", "!=", "AB"), P("sym", "prefix", "AB"), False, True),
        (P("sym", "in{}", "A", "B"), P("sym", "=", "A"), True, True),
        (P("sym", "=", "A"), P("sym", "in{}", "A", "B"), False, True),
        (P("sym", "=", "A"), P("sym", "!=", "A"), False, False),
        (P("sym", "in{}", "A"), P("sym", "prefix", "A"), False, True),
        (P("sym", "prefix", ""), P("sym", "!=", "Q"), True, True),
    ],
    ids=repr,
)
def test_covers_and_overlaps_examples(schema, p, q, cov, ovl):
    assert covers(p, q, schema) == cov
    assert overlaps(p, q, schema) == ovl
    assert overlaps(q, p, schema) == ovl


def test_filter_covers_is_the_spec_definition(schema):
    wide = Filter((P("price", "<", 100),))
    narrow = Filter((P("price", "<", 50), P("qty", "=", 3)))
    assert wide.covers(narrow, schema)
    assert not narrow.covers(wide, schema)  # qty = 3 covers no predicate of `wide`
    # Sound, not complete: F1 = price < 50 ∧ price > 10 covers F2 = price in [20, 30] too.
    assert Filter((P("price", "<", 50), P("price", ">", 10))).covers(Filter((P("price", "in[]", 20, 30),)), schema)


# -- properties -------------------------------------------------------------------------------


@PROPS
@given(f=filters(SMALL), event=events(SMALL))
def test_filter_matches_equals_brute_force(f, event):
    f.check(SMALL)
    expected = brute_matches(f, event)
    assert f.matches(event) == expected
    assert compile_filter(f)(event) == expected


ABSENT = object()


def same_attr_pairs():
    return st.sampled_from(sorted(SMALL.attributes)).flatmap(
        lambda a: st.tuples(predicates(SMALL, a), predicates(SMALL, a))
    )


@PROPS
@given(same_attr_pairs())
def test_covers_and_overlaps_are_exact_over_the_domain(pair):
    """For ordered kinds the whole (sampled) domain is enumerated; for strings every
    string over one more letter than the patterns use, up to a length that holds
    a witness for every pair the strategy makes."""
    p, q = pair
    attr = SMALL.attributes[p.attr]
    dom = domain_of(attr)
    # An event may lack a non-distinguishing attribute: only `not exists` holds then.
    absent = () if SMALL.is_da(p.attr) else (ABSENT,)
    lp = {v for v in dom if brute_satisfies(p, v)} | {a for a in absent if p.op is Op.NOT_EXISTS}
    lq = {v for v in dom if brute_satisfies(q, v)} | {a for a in absent if q.op is Op.NOT_EXISTS}
    assert covers(p, q, SMALL) == (lq <= lp)
    assert overlaps(p, q, SMALL) == bool(lp & lq)
    if attr.kind.ordered:
        values = predicate_values(p, attr)
        assert {v for v in dom if v in values} == lp - {ABSENT}


@PROPS
@given(any_predicate(SMALL), any_predicate(SMALL))
def test_predicates_on_different_attributes_neither_cover_nor_overlap(p, q):
    if p.attr != q.attr:
        assert not covers(p, q, SMALL) and not overlaps(p, q, SMALL)


@PROPS
@given(
    st.sampled_from(sorted(SMALL.attributes)).flatmap(
        lambda a: st.lists(predicates(SMALL, a), max_size=4).map(lambda ps: (a, ps))
    )
)
def test_conjunction_membership_and_emptiness(case):
    name, preds = case
    attr = SMALL.attributes[name]
    conj = conjunction(preds, attr)
    dom = domain_of(attr)
    members = {v for v in dom if all(brute_satisfies(p, v) for p in preds)}
    if attr.kind.ordered:
        assert {v for v in dom if v in conj} == members
        assert conj.is_empty() == (not members)
        return
    assert {v for v in dom if conj.contains(v)} == members
    # Exact: every string conjunction the strategy makes has a witness this short.
    assert conj.is_empty() == (not members)
    if conj.finite is not None:
        candidates = set(all_strings()) | {a for p in preds for a in p.args}
        assert conj.finite == {v for v in candidates if all(brute_satisfies(p, v) for p in preds)}
        assert conj.is_empty() == (not conj.finite)


@PROPS
@given(filters(SMALL, max_size=3), filters(SMALL, max_size=3), st.lists(events(SMALL), max_size=30))
def test_filter_covers_is_sound(f1, f2, sample):
    if f1.covers(f2, SMALL):
        for e in sample:
            if brute_matches(f2, e):
                assert brute_matches(f1, e)


# -- includes (rule 5): the exact coverage a content scope uses --------------------------


def _satisfiable(f: Filter, schema) -> bool:
    return all(not conjunction(f.on(a), schema.attributes[a]).is_empty() for a in f.attrs())


def test_includes_decides_per_attribute_where_covers_needs_one_predicate(schema):
    scope = Filter((P("price", "in[]", 10, 20),))
    sub = Filter((P("price", ">=", 10), P("price", "<=", 20), P("sym", "=", "IBM")))
    assert scope.includes(sub, schema) and not scope.covers(sub, schema)
    assert not scope.includes(Filter((P("price", ">=", 10),)), schema)
    # A scope on an attribute the subscription leaves free: not included —
    # unless the scope allows the whole domain of a distinguishing attribute.
    assert not Filter((P("sym", "prefix", "AB"),)).includes(Filter((P("price", "<", 5),)), schema)
    assert Filter((P("price", ">=", 0),)).includes(Filter((P("sym", "=", "A"),)), schema)
    # Not a DA: an event without `note` matches the subscription, never the scope.
    assert not Filter((P("note", "!=", "x"),)).includes(Filter((P("price", "<", 5),)), schema)
    assert Filter((P("sym", "prefix", "AB"),)).includes(
        Filter((P("sym", "prefix", "ABC"), P("sym", "suffix", "Z"))), schema
    )
    assert not Filter((P("sym", "prefix", "AB"),)).includes(Filter((P("sym", "contains", "AB"),)), schema)


@PROPS
@given(scope=filters(SMALL, 3), f=filters(SMALL, 4), event=events(SMALL))
def test_an_included_filter_matches_only_events_inside_the_scope(scope, f, event):
    """Soundness against the brute-force matcher: what ``includes`` lets in never
    matches an event outside the scope; the spec's coverage implies it."""
    if scope.covers(f, SMALL) and _satisfiable(f, SMALL):
        assert scope.includes(f, SMALL)
    if scope.includes(f, SMALL) and brute_matches(f, event):
        assert brute_matches(scope, event)


@PROPS
@given(scope=filters(ENUM, 3), f=filters(ENUM, 4))
def test_includes_is_exact_over_an_enumerable_schema(scope, f):
    if not _satisfiable(f, ENUM):
        return
    inside = all(brute_matches(scope, e) for e in ENUM_EVENTS if brute_matches(f, e))
    assert scope.includes(f, ENUM) == inside


# -- rule 8: exact tests the cyclic GC never traverses -------------------------------------


@pytest.mark.parametrize("n", [1, SMALL_SET, SMALL_SET + 1, 40])
@pytest.mark.parametrize("op", ["in{}", "not in{}"])
def test_set_tests_agree_on_both_sides_of_the_small_set_bound(op, n):
    # Up to SMALL_SET values a tuple, past it a frozenset: the same answers,
    # and the same TypeError for a value no set could hold.
    vals = tuple(f"v{i}" for i in range(n))
    f = Filter((P("sym", op, *vals),))
    test = compile_filter(f)
    for v in (*vals, "other", ""):
        assert test({"sym": v}) == f.matches({"sym": v}) == ((v in vals) == (op == "in{}"))
    with pytest.raises(TypeError):
        test({"sym": ["unhashable"]})
    with pytest.raises(TypeError):
        f.matches({"sym": ["unhashable"]})


WRONG_KIND = [
    (P("price", "<", 5), "a"),
    (P("price", "in[]", 1, 5), "a"),
    (P("price", "not in[]", 1, 5), "a"),
    (P("price", ">=", 5), None),
    (P("sym", "prefix", "a"), 5),
    (P("sym", "suffix", "a"), 5),
    (P("sym", "contains", "a"), 5),
    (P("sym", "not prefix", "a"), 5),
    (P("sym", "ieq", "a"), 5),
    (P("sym", "not iprefix", "a"), 5),
    (P("sym", "like", "a*"), 5),
]


@pytest.mark.parametrize("pred, value", WRONG_KIND, ids=lambda x: repr(x))
def test_a_value_of_the_wrong_kind_raises_as_python_does(pred, value):
    # LinearMatcher and the index rely on it: a raising test is that
    # subscription's fault, never a silent "no".
    with pytest.raises((TypeError, AttributeError)) as single:
        pred.satisfied_by(value)
    with pytest.raises(single.type):
        compile_filter(Filter((pred,)))({pred.attr: value})


def test_stored_filters_and_their_tests_are_not_tracked_by_the_cyclic_gc():
    f = Filter(
        (
            P("price", "in[]", 1.5, 9.5),
            P("sym", "in{}", "a", "b"),
            P("sym", "not in{}", *(f"x{i}" for i in range(SMALL_SET + 1))),
            P("sym", "like", "a*"),
            P("sym", "iprefix", "A"),
        )
    )
    sub = Subscription("s", f, "client", 1)
    test = compile_filter(f)
    gc.collect()  # a tuple holding only untracked objects is untracked by a pass
    assert not any(gc.is_tracked(x) for x in (sub, f, f.predicates, *f.predicates, test))
    # Only the big set's frozenset (and its row, and the rows) stays tracked.
    assert [gc.is_tracked(r) for r in test.rows] == [False, False, True, False, False]
    assert test({"price": 2.0, "sym": "a"}) and not test({"price": 2.0, "sym": "b"})


@pytest.mark.timeout(30)
def test_like_matching_does_not_backtrack_over_placements() -> None:
    # As a regular expression (.*a.*a…b) this backtracked over every placement
    # of the a's: C(300, 30) tries, an owner's loop held for good by one event.
    stars = "*a" * 30
    assert not P("venue", "like", stars + "*b").satisfied_by("a" * 300)
    assert P("venue", "not like", stars + "*b").satisfied_by("a" * 300)
    assert P("venue", "like", stars + "*b").satisfied_by("a" * 300 + "b")
    assert P("venue", "like", "x" + stars + "*y").satisfied_by("x" + "a" * 300 + "y")
    assert not P("venue", "like", "ab*ba").satisfied_by("aba")  # head and tail may not share a character


def test_like_without_a_star_on_a_value_that_is_not_a_string_raises_as_the_other_string_tests() -> None:
    # str.__eq__ gave NotImplemented, which is true: an int "matched" like "A".
    with pytest.raises(TypeError):
        P("sym", "like", "A").satisfied_by(5)
    assert P("sym", "like", "A").satisfied_by("A") and not P("sym", "like", "A").satisfied_by("AB")


def test_a_channel_test_too_intricate_to_decide_takes_the_safe_side_not_an_error() -> None:
    # A type-2 channel's space against a subscription's patterns: the search
    # past its budget raised SchemaError out of the node's Subscribe handling.
    pairs = [(chr(97 + 2 * i), chr(98 + 2 * i)) for i in range(12)]
    conj = StringConj(tuple(P("sym", "like", f"*{a}*{b}*") for a, b in pairs))
    assert conj.minus_is_empty({"x"}) is False  # may overlap: stored there, matched exactly per event
    assert conj.within(frozenset({"x"})) is False  # not provably covered
