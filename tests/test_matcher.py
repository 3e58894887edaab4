"""overlay.channels.matcher: the bucketed bitmap index against the linear reference (SPEC §5 cost)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.channels import (
    Attribute,
    Filter,
    Kind,
    LinearMatcher,
    Op,
    Predicate,
    Schema,
    Subscription,
    SubscriptionIndex,
)
from overlay.channels.schema import RFID_MAX
from strategies import SMALL, brute_matches, constants, events, filters, unchecked_filter

PROPS = settings(max_examples=200, deadline=None)

EVENT = {"price": 12.5, "qty": 3, "sym": "AB", "tag": 7}


def S(sub_id, text, schema):
    return Subscription(sub_id, unchecked_filter(text, schema), subscriber=f"client-{sub_id}")


def ids(result):
    return sorted(s.id for s in result[0])


def both(schema, **kw):
    return SubscriptionIndex(schema, **kw), LinearMatcher(schema)


# -- bookkeeping ----------------------------------------------------------------------------


@pytest.mark.parametrize("make", [SubscriptionIndex, LinearMatcher])
def test_empty_matcher_matches_nothing(schema, make):
    m = make(schema)
    matched, tested = m.match(EVENT)
    assert matched == [] and tested == 0 and len(m) == 0 and list(m) == []


@pytest.mark.parametrize("make", [SubscriptionIndex, LinearMatcher])
def test_add_and_remove_are_idempotent(schema, make):
    m = make(schema)
    s1 = S("s1", "qty < 10", schema)
    assert m.add(s1) is True
    assert m.add(S("s1", "qty > 50", schema)) is False  # same id: no change
    assert len(m) == 1 and list(m) == [s1]
    assert ids(m.match(EVENT)) == ["s1"]
    assert m.remove("s1") == s1
    assert m.remove("s1") is None
    assert m.remove("never") is None
    assert len(m) == 0 and m.match(EVENT) == ([], 0)


def test_index_lookup_by_id(schema):
    ix = SubscriptionIndex(schema)
    s1 = S("s1", "qty < 10", schema)
    ix.add(s1)
    assert "s1" in ix and "s2" not in ix
    assert ix.get("s1") == s1 and ix.get("s2") is None
    ix.remove("s1")
    assert "s1" not in ix and ix.get("s1") is None


def test_add_many_counts_new_subscriptions(schema):
    ix = SubscriptionIndex(schema)
    subs = [S(f"s{i}", f"qty = {i}", schema) for i in range(5)]
    assert ix.add_many(subs) == 5
    assert ix.add_many([*subs[:2], S("s9", "qty = 9", schema)]) == 1
    assert len(ix) == 6


# -- matching and cost -------------------------------------------------------------------------


def test_linear_matcher_tests_every_subscription(schema):
    lin = LinearMatcher(schema)
    for i in range(10):
        lin.add(S(f"s{i}", f"qty = {i}", schema))
    matched, tested = lin.match(EVENT)
    assert [s.id for s in matched] == ["s3"] and tested == 10


def test_index_prunes_selective_subscriptions(schema):
    ix, lin = both(schema)
    for i in range(101):
        for m in (ix, lin):
            m.add(S(f"q{i}", f"qty = {i}", schema))
    matched, tested = ix.match(EVENT)
    assert [s.id for s in matched] == ["q3"]
    assert 1 <= tested < 10 < lin.match(EVENT)[1]


def test_cost_counts_every_candidate_tested_matched_or_not(schema):
    ix = SubscriptionIndex(schema)
    ix.add(S("a", 'qty = 3 and sym = "AB"', schema))
    ix.add(S("b", 'qty = 3 and sym = "ZZ"', schema))  # a candidate by qty; fails on sym
    ix.add(S("c", "price < 100", schema))
    matched, tested = ix.match(EVENT)
    assert sorted(s.id for s in matched) == ["a", "c"]
    assert len(matched) <= tested <= 3


def test_unsatisfiable_subscriptions_are_never_candidates(schema):
    # Rule 2: predicates that no value satisfies put the slot in no bucket.
    ix = SubscriptionIndex(schema)
    ix.add(S("never", "qty > 5 and qty < 3", schema))
    ix.add(S("never2", 'sym = "A" and sym = "B"', schema))
    for qty in (0, 3, 4, 5, 100):
        assert ix.match({**EVENT, "qty": qty}) == ([], 0)
    assert ix.match({**EVENT, "sym": "A"}) == ([], 0)


def test_event_missing_an_attribute_a_subscription_needs(schema):
    ix, lin = both(schema)
    for m in (ix, lin):
        m.add(S("n", 'note prefix "x"', schema))
        m.add(S("n2", 'note != "x"', schema))
        m.add(S("q", "qty >= 0", schema))
    for e in (EVENT, {**EVENT, "note": "xy"}, {**EVENT, "note": "x"}):
        assert ids(ix.match(e)) == ids(lin.match(e))
    assert ids(ix.match(EVENT)) == ["q"]
    assert ids(ix.match({**EVENT, "note": "xy"})) == ["n", "n2", "q"]


def test_domain_edges_and_all_kinds(schema):
    subs = [
        "price <= 0",
        "price >= 1000",
        "price > 999.5",
        "price < 0.5",
        "price != 0",
        "qty = 0",
        "qty = 100",
        "qty != 100",
        "qty in [0, 100]",
        "tag = 0",
        f"tag = {RFID_MAX}",
        "tag > 255.0.0.0",
        "tag in [1.0.0.0, 2.0.0.0]",
        'sym in {"A", "AB", "B"}',
        'sym suffix "B"',
        'sym != "AB"',
        'sym contains ""',
        'note = "" and qty < 50',
    ]
    ix, lin = both(schema)
    for i, text in enumerate(subs):
        ix.add(S(f"s{i}", text, schema))
        lin.add(S(f"s{i}", text, schema))
    for price in (0, 0.25, 0.5, 999.5, 999.75, 1000, 1000.0):
        for qty in (0, 50, 100):
            for tag in (0, 1 << 56, 255 << 56, RFID_MAX):
                for sym in ("A", "AB", "ZB"):
                    e = {"price": price, "qty": qty, "sym": sym, "tag": tag, "note": ""}
                    got, lin_got = ix.match(e), lin.match(e)
                    assert ids(got) == ids(lin_got)
                    assert len(got[0]) <= got[1] <= lin_got[1]


@pytest.mark.parametrize("nbuckets", [1, 2, 3, 128, 1000])
def test_bucket_counts_do_not_change_results(schema, nbuckets):
    ix, lin = both(schema, nbuckets=nbuckets)
    texts = [
        "qty < 10",
        "qty in [10, 20]",
        "qty > 90",
        "price < 1",
        "price > 999",
        'sym in {"A", "B"}',
        'sym = "AB"',
        f"tag >= {RFID_MAX - 1}",
    ]
    for i, text in enumerate(texts):
        ix.add(S(f"s{i}", text, schema))
        lin.add(S(f"s{i}", text, schema))
    for qty in (0, 9, 10, 20, 21, 90, 91, 100):
        for price, tag in ((0, 0), (0.999, RFID_MAX), (999.5, RFID_MAX - 1), (1000, 5)):
            e = {**EVENT, "qty": qty, "price": price, "tag": tag}
            assert ids(ix.match(e)) == ids(lin.match(e))


def test_many_slots_grow_and_are_reused(schema):
    ix, lin = both(schema)
    for i in range(300):  # well past the first 64 slots
        s = S(f"s{i}", f"qty = {i % 101}", schema)
        ix.add(s)
        lin.add(s)
    for i in range(0, 300, 2):
        assert ix.remove(f"s{i}").id == f"s{i}"
        lin.remove(f"s{i}")
    for i in range(300, 400):  # refill freed slots
        s = S(f"s{i}", f"qty <= {i % 101}", schema)
        ix.add(s)
        lin.add(s)
    assert len(ix) == len(lin) == 250
    assert sorted(s.id for s in ix) == sorted(s.id for s in lin)
    for qty in (0, 3, 50, 100):
        e = {**EVENT, "qty": qty}
        got = ix.match(e)
        assert ids(got) == ids(lin.match(e))
        assert len(got[0]) <= got[1] <= 250


def test_rfid_full_domain_buckets():
    s = Schema([Attribute("tag", Kind.RFID, 0, RFID_MAX)], ["tag"])
    ix, lin = both(s, nbuckets=16)
    for i, text in enumerate(["tag < 1.0.0.0", "tag >= 255.0.0.0", f"tag = {RFID_MAX}", "tag = 0"]):
        ix.add(S(f"s{i}", text, s))
        lin.add(S(f"s{i}", text, s))
    for tag in (0, 1, (1 << 56) - 1, 1 << 56, 255 << 56, RFID_MAX):
        assert ids(ix.match({"tag": tag})) == ids(lin.match({"tag": tag}))


# -- the property: the index is the linear scan, only cheaper --------------------------------------


_ORDERED = [a for a in SMALL.attributes.values() if a.kind.ordered]
# Bounds in and out of every domain, the extremes, and what is not plain
# (a bool, a NaN; a float on an integer attribute).
_ODD = st.sampled_from([-(10**400), 10**400, -1e308, 1e308, float("inf"), -float("inf"), True, float("nan")])


@st.composite
def comparisons(draw, odd=True):
    """Mostly conjunctions of comparisons on distinct ordered attributes (rule
    10), now and then one on an attribute already named or on a string, and
    with ``odd`` bounds no checked filter has (out of the domain, a float on
    an integer attribute, a bool, a NaN)."""
    chosen = draw(st.lists(st.sampled_from(_ORDERED), min_size=2, max_size=4, unique_by=lambda a: a.name))
    preds = []
    for a in chosen:
        own = st.sampled_from(constants(a))
        value = (
            st.one_of(own, own, own, st.integers(-20, 40) if a.kind.discrete else st.floats(-10, 20), _ODD)
            if odd
            else own
        )
        op = draw(st.sampled_from(["=", "<", "<=", ">", ">=", "in[]"]))
        args = (draw(value), draw(value)) if op == "in[]" else (draw(value),)
        preds.append(Predicate(a.name, Op(op), args))
    extra = draw(st.sampled_from([None, None, None, "repeat", "string"]))
    if extra == "repeat":
        preds.append(Predicate(chosen[0].name, Op.LT, (5,)))
    elif extra == "string":
        preds.append(Predicate("s", Op.EQ, ("ab",)))
    return Filter(tuple(draw(st.permutations(preds))))


OPS = st.sampled_from(["add", "add", "remove", "match", "match"])


@PROPS
@given(
    data=st.data(),
    pool=st.lists(filters(SMALL) | comparisons(odd=False), min_size=1, max_size=12),
    copies=st.sampled_from([1, 1, 8]),
    nbuckets=st.sampled_from([1, 3, 7, 128]),
)
def test_index_agrees_with_linear_matcher_under_random_changes(data, pool, copies, nbuckets):
    # `copies` repeats each filter under several ids: past 64 slots the bitmaps grow.
    subs = [Subscription(f"{k}.{i}", f) for i, f in enumerate(pool) for k in range(copies)]
    ix, lin = SubscriptionIndex(SMALL, nbuckets), LinearMatcher(SMALL)
    ops = data.draw(st.lists(st.tuples(OPS, st.integers(0, len(subs) - 1)), max_size=60), label="ops")
    for op, i in ops:
        if op == "add":
            for s in subs[i : i + copies]:
                assert ix.add(s) == lin.add(s)
        elif op == "remove":
            for s in subs[i : i + copies]:
                assert ix.remove(s.id) == lin.remove(s.id)
        else:
            e = data.draw(events(SMALL), label="event")
            got, tested = ix.match(e)
            want, linear_tested = lin.match(e)
            assert sorted(s.id for s in got) == sorted(s.id for s in want)
            assert sorted(s.id for s in got) == sorted(s.id for s in lin if brute_matches(s.filter, e))
            assert len(got) == len({s.id for s in got})  # each subscription at most once
            assert len(got) <= tested <= linear_tested == len(lin)
        assert len(ix) == len(lin)
    assert sorted(s.id for s in ix) == sorted(s.id for s in lin)


ODD_VALUES = [True, False, float("nan"), float("inf"), -1, 10**20, -(10**20), 1.5, 0.0, "", "a", None]


@st.composite
def unchecked_events(draw):
    """Events as a caller might pass them unvalidated: wrong types, NaN, out of domain."""
    out = {}
    for name in SMALL.attributes:
        if draw(st.booleans()):
            continue
        out[name] = draw(st.one_of(st.sampled_from(ODD_VALUES), events(SMALL).map(lambda e, n=name: e.get(n))))
    return out


@PROPS
@given(pool=st.lists(filters(SMALL), min_size=1, max_size=12), evs=st.lists(unchecked_events(), max_size=10))
def test_index_agrees_with_linear_matcher_on_unchecked_events(pool, evs):
    ix, lin = SubscriptionIndex(SMALL, 8), LinearMatcher(SMALL)
    for i, f in enumerate(pool):
        ix.add(Subscription(f"s{i}", f))
        lin.add(Subscription(f"s{i}", f))
    for e in evs:
        try:
            want, linear_tested = lin.match(e)
        except (TypeError, AttributeError):
            continue  # "a" < 5, True.startswith: the reference itself cannot decide
        got, tested = ix.match(e)
        assert sorted(s.id for s in got) == sorted(s.id for s in want)
        assert len(got) <= tested <= linear_tested


# -- bulk builds (rule 9) and both ways of reading the rows (overlay.channels._rows rule 5) --------


@PROPS
@given(
    data=st.data(),
    pool=st.lists(filters(SMALL) | comparisons(odd=False), min_size=1, max_size=12),
    copies=st.sampled_from([2, 9]),
    nbuckets=st.sampled_from([1, 5, 16, 256]),
    small=st.booleans(),
)
def test_a_bulk_build_then_churn_agrees_with_brute_force(data, pool, copies, nbuckets, small):
    from overlay.channels import _rows

    subs = [Subscription(f"{k}.{i}", f) for i, f in enumerate(pool) for k in range(copies)]
    saved = _rows.SMALL_WORDS
    _rows.SMALL_WORDS = saved if small else 0  # not a fixture: hypothesis runs many examples per test
    try:
        ix, lin = SubscriptionIndex(SMALL, nbuckets), LinearMatcher(SMALL)
        cut = data.draw(st.integers(0, len(subs)), label="bulk")
        assert ix.add_many(subs[:cut] + subs[:cut]) == cut  # duplicates count once
        for s in subs[:cut]:
            lin.add(s)
        ops = data.draw(st.lists(st.tuples(OPS, st.integers(0, len(subs) - 1)), max_size=30), label="ops")
        for op, i in ops:
            if op == "add":
                batch = subs[i:]
                assert ix.add_many(batch) == sum(lin.add(s) for s in batch)
            elif op == "remove":
                assert ix.remove(subs[i].id) == lin.remove(subs[i].id)
            else:
                e = data.draw(events(SMALL), label="event")
                got, tested = ix.match(e)
                want = sorted(s.id for s in lin if brute_matches(s.filter, e))
                assert sorted(s.id for s in got) == want
                assert len(got) <= tested <= len(lin)
        assert sorted(s.id for s in ix) == sorted(s.id for s in lin)
    finally:
        _rows.SMALL_WORDS = saved


def test_a_bulk_build_equals_one_by_one_at_scale():
    """Thousands of range subscriptions over several attributes (the research
    workload in small): a bulk build, single adds and removals, the numpy
    reading of the rows (past 4,096 slots) — every event's matches and
    tested count equal those of an index built one subscription at a time."""
    import random

    schema = Schema([Attribute(f"a{i}", Kind.INT, 0, 999) for i in range(6)], ["a0"])
    rng = random.Random(3)

    def sub(i):
        preds = []
        for name in rng.sample(list(schema.attributes), rng.randint(2, 4)):
            lo = rng.randrange(800)
            preds.append(f"{name} in [{lo}, {min(999, lo + rng.randrange(1, 500))}]")
        return S(f"s{i}", " and ".join(preds), schema)

    subs = [sub(i) for i in range(5000)]
    bulk, one = SubscriptionIndex(schema), SubscriptionIndex(schema)
    assert bulk.add_many(subs) == 5000
    for s in subs:
        one.add(s)
    for s in subs[::3]:
        assert bulk.remove(s.id) is s and one.remove(s.id) is s
    for s in subs[:300]:
        bulk.add(s)
        one.add(s)
    assert bulk._rows.ints is None  # past SMALL_WORDS: the numpy reading
    live = list(one)
    for _ in range(40):
        e = {name: rng.randrange(1000) for name in schema.attributes}
        got, tested = bulk.match(e)
        want = sorted(s.id for s in live if s.filter.matches(e))
        assert sorted(s.id for s in got) == want
        assert (sorted(s.id for s in one.match(e)[0]), one.match(e)[1]) == (want, tested)


# -- one pass for a conjunction of comparisons (rule 10) ----------------------------------


@PROPS
@given(f=filters(SMALL, max_size=6) | comparisons(), nbuckets=st.sampled_from([1, 5, 16, 256]))
def test_a_conjunction_of_comparisons_is_filed_as_the_general_path_files_it(f, nbuckets):
    """``_ranges`` gives the test the general path (``_prepare``) gives and
    the rows of each bound's ``plain_run`` (its cover, or the wildcards'
    row), the wildcards of the attributes left out and the alive row — or
    leaves the filter to the general path."""
    import numpy as np

    from overlay.channels.matcher import _ALIVE, _Bitmapped

    ix = SubscriptionIndex(SMALL, nbuckets)
    ranges = ix._ranges(f.predicates)
    if ranges is None:
        return
    prepared = ix._prepare(Subscription("s", f))
    assert type(prepared) is _Bitmapped
    test, packed, mask = ranges
    assert mask == sum(1 << pos for pos in test[0::4])
    assert test == prepared.test
    want = [_ALIVE]
    order = ix._order
    for j in range(0, len(test), 4):
        ai = order[test[j]]
        run = ai.plain_run(test[j + 1], test[j + 2])
        if run is not None:
            want += ai.run_rows(*run, 0)
    want += [ai.wild for ai in order if ai.pos not in test[0::4]]
    assert sorted(np.frombuffer(packed, np.int64).tolist()) == sorted(want)


def test_ranges_take_comparisons_on_distinct_ordered_attributes_only(schema):
    ix = SubscriptionIndex(schema)

    def ranges(text):
        return ix._ranges(unchecked_filter(text, schema).predicates)

    assert ranges("qty < 10 and price >= 2.5") is not None
    assert ranges("qty in [1, 5] and price = 3.0 and tag > 2") is not None
    assert ranges("qty < 10") is None  # one attribute: a single (rule 5)
    assert ranges("qty > 1 and qty < 10") is None  # two on one attribute: merged by _plain_bounds
    assert ranges('qty < 10 and sym = "AB"') is None  # a string
    assert ranges("qty < 10 and price != 3.0") is None  # not a comparison


def test_a_bulk_build_leaves_the_packed_covers_single_adds_read():
    """``place_many`` stores the covers it met where ``plain_packed`` looks
    them up: each equals the cover worked out afresh."""
    import random

    import numpy as np

    from overlay.channels._tree import _cover_rows

    schema = Schema([Attribute(f"a{i}", Kind.INT, 0, 999) for i in range(3)], ["a0"])
    rng = random.Random(5)
    subs = [
        S(
            f"s{i}",
            " and ".join(f"a{k} in [{lo}, {lo + rng.randrange(400)}]" for k in range(3) for lo in [rng.randrange(600)]),
            schema,
        )
        for i in range(300)
    ]
    ix = SubscriptionIndex(schema, 64)
    for ai in ix._order:
        ai.packed.clear()  # shared by the layout: start from nothing
    assert ix.add_many(subs) == 300
    for ai in ix._order:
        assert ai.packed
        for key, packed in ai.packed.items():
            first, last = divmod(key, ai.nbuckets)
            assert np.frombuffer(packed, np.int64).tolist() == list(_cover_rows(ai.tree, ai.levels, first, last))


def test_a_bulk_build_of_bounds_past_the_float_range_matches_like_the_reference():
    """A chunk with an int past 1e308 (an unchecked filter) is converted bound
    by bound, clamped to its side (rule 9): the same matches as the linear
    reference, and as single adds."""
    huge = 10**400
    shapes = [
        (Predicate("x", Op.IN_RANGE, (-huge, 3)), Predicate("n", Op.GE, (2,))),
        (Predicate("x", Op.GE, (huge,)), Predicate("y", Op.LT, (2.5,))),
        (Predicate("y", Op.IN_RANGE, (-float("inf"), 1.5)), Predicate("r", Op.LE, (huge,))),
        (Predicate("x", Op.LT, (-huge,)), Predicate("n", Op.EQ, (1,))),
        (Predicate("x", Op.EQ, (4,)), Predicate("y", Op.GT, (-float("inf"),))),
    ]
    subs = [Subscription(f"{k}.{i}", Filter(shape)) for i, shape in enumerate(shapes) for k in range(5)]
    bulk, one, lin = SubscriptionIndex(SMALL), SubscriptionIndex(SMALL), LinearMatcher(SMALL)
    assert bulk.add_many(subs) == len(subs)
    for s in subs:
        one.add(s)
        lin.add(s)
    for x in range(0, 13, 2):
        for y in (0.0, 1.5, 2.5, 4.0):
            for n in (1, 2, 5):
                e = {"x": x, "y": y, "n": n, "r": 3, "s": "a"}
                want = sorted(s.id for s in lin.match(e)[0])
                assert sorted(s.id for s in bulk.match(e)[0]) == want
                assert sorted(s.id for s in one.match(e)[0]) == want
