"""Channel rule 5: subscriptions stored at once and indexed in the background.

A channel's members, counts and matches must not depend on how much of the
background work is done: these tests drive random mixes of indexed and
deferred adds, removals, adoptions and index steps against a brute-force
model of the members.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.balance.merge import merge_pair
from overlay.channels import (
    Attribute,
    EventSpace,
    Kind,
    Op,
    Predicate,
    parse_subscription,
)
from overlay.channels.bounds import bound_of, bound_overlaps
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.intervals import Interval
from overlay.channels.predicates import conjunction
from overlay.channels.space import RangeConstraint
from overlay.channels.subscriptions import Subscription
from strategies import SMALL, brute_matches, events, filters

PROPS = settings(max_examples=150, deadline=None)


def _check(ch: Channel, model: dict[str, Subscription], evs: list[dict]) -> None:
    assert {s.id for s in ch} == set(model)
    assert len(ch) == len(model)
    for sid, sub in model.items():
        assert sid in ch and ch.get(sid) == sub
    # Popularity counts exactly the members constraining each DA.
    for name, share in ch.popularity().items():
        n = sum(name in s.filter.attrs() for s in model.values())
        assert share == (n / len(model) if model else 0.0)
    for e in evs:
        matched, tested = ch.match(e, 0)
        ids = [s.id for s in matched]
        assert len(ids) == len(set(ids))
        assert set(ids) == {sid for sid, s in model.items() if brute_matches(s.filter, e)}
        assert tested >= 0


op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 11)),
    st.tuples(st.just("defer"), st.lists(st.integers(0, 11), max_size=5)),
    st.tuples(st.just("remove"), st.integers(0, 11)),
    st.tuples(st.just("step"), st.integers(0, 4)),
)


@PROPS
@given(
    st.lists(filters(SMALL, max_size=3), min_size=12, max_size=12),
    st.lists(op, max_size=30),
    st.lists(events(SMALL), min_size=1, max_size=6),
)
def test_members_and_matches_do_not_depend_on_background_progress(fs, ops, evs):
    subs = [Subscription(f"s{k}", f) for k, f in enumerate(fs)]
    ch = Channel(ChannelId(0, 0), EventSpace.whole(SMALL), SMALL)
    model: dict[str, Subscription] = {}
    for kind, arg in ops:
        if kind == "add":
            assert ch.add(subs[arg]) == (subs[arg].id not in model)
            model[subs[arg].id] = subs[arg]
        elif kind == "defer":
            batch = [subs[k] for k in arg]
            new = len({s.id for s in batch} - set(model))
            assert ch.add_deferred(batch) == new
            model.update({s.id: s for s in batch})
        elif kind == "remove":
            got = ch.remove(subs[arg].id)
            assert (got is not None) == (subs[arg].id in model)
            model.pop(subs[arg].id, None)
        else:
            left = ch.unindexed
            assert ch.index_step(arg) == max(0, left - arg)
        _check(ch, model, evs)
    while ch.index_step(3):
        pass
    assert ch.unindexed == 0
    _check(ch, model, evs)


@PROPS
@given(
    st.lists(filters(SMALL, max_size=3), min_size=8, max_size=8),
    st.lists(st.booleans(), min_size=8, max_size=8),
    st.sets(st.integers(0, 7)),
    st.lists(st.tuples(st.sampled_from(["add", "remove", "step"]), st.integers(0, 7)), max_size=12),
    st.lists(events(SMALL), min_size=1, max_size=6),
)
def test_an_adopted_index_drops_what_the_child_does_not_keep(fs, deferred, keep, ops, evs):
    subs = [Subscription(f"s{k}", f) for k, f in enumerate(fs)]
    parent = Channel(ChannelId(0, 0), EventSpace.whole(SMALL), SMALL)
    for sub, later in zip(subs, deferred):
        parent.add_deferred([sub]) if later else parent.add(sub)
    child = Channel(ChannelId(0, 1), EventSpace.whole(SMALL), SMALL)
    child.adopt_index(parent, {subs[k].id for k in keep})
    assert len(parent) == 0 and parent.unindexed == 0
    model = {subs[k].id: subs[k] for k in keep}
    _check(child, model, evs)
    # Stale subscriptions are never returned, and come back cleanly when re-added.
    for kind, k in ops:
        if kind == "add":
            child.add(subs[k])
            model[subs[k].id] = subs[k]
        elif kind == "remove":
            child.remove(subs[k].id)
            model.pop(subs[k].id, None)
        else:
            child.index_step(k)
        _check(child, model, evs)
    while child.index_step(5):
        pass
    _check(child, model, evs)
    assert len(child.index) == len(model)  # every stale one left the index


def test_a_consuming_merge_keeps_every_subscription_of_both_parts():
    schema = SMALL
    a = Channel(ChannelId(0, 0), EventSpace.whole(schema), schema)
    b = Channel(ChannelId(0, 1), EventSpace.whole(schema), schema)
    s1 = Subscription("s1", parse_subscription("x >= 3", schema))
    s2 = Subscription("s2", parse_subscription("x < 9", schema))
    s3 = Subscription("s3", parse_subscription("y > 1.5", schema))
    a.add(s1), a.add(s2), b.add(s2), b.add(s3)
    merged = merge_pair(a, b, ChannelId(0, 2), EventSpace.whole(schema), consume=True)
    assert {s.id for s in merged} == {"s1", "s2", "s3"} and len(merged) == 3
    assert merged.unindexed == 1  # the smaller part's one new subscription, indexed later
    e = {"x": 4, "y": 2.0, "r": 1, "s": "a", "n": 0, "t": "a"}
    assert {s.id for s in merged.match(e, 0)[0]} == {"s1", "s2", "s3"}
    while merged.index_step(1):
        pass
    assert {s.id for s in merged.match(e, 0)[0]} == {"s1", "s2", "s3"}


# -- the quick numeric overlap of a split (channels.bounds) ---------------------------------------

INT = Attribute("i", Kind.INT, -5, 20)
FLOAT = Attribute("f", Kind.FLOAT, -5.0, 20.0)
NUMS = st.one_of(st.integers(-8, 23), st.sampled_from([x / 2 for x in range(-16, 46)]))


@st.composite
def comparisons(draw, attr):
    op = Op(draw(st.sampled_from(["=", "<", "<=", ">", ">=", "in[]"])))
    if op is Op.IN_RANGE:
        lo, hi = sorted([draw(NUMS), draw(NUMS)])
        return Predicate(attr.name, op, (lo, hi))
    return Predicate(attr.name, op, (draw(NUMS),))


@st.composite
def intervals(draw, attr):
    lo, hi = sorted([draw(NUMS), draw(NUMS)])
    iv = Interval(lo, hi, draw(st.booleans()), draw(st.booleans()))
    return iv


@pytest.mark.parametrize("attr", [INT, FLOAT], ids=["int", "float"])
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_quick_bound_overlap_agrees_with_the_conjunction(attr, data):
    preds = tuple(data.draw(st.lists(comparisons(attr), max_size=3)))
    iv = data.draw(intervals(attr))
    if iv.empty():
        return
    # A predicate on another attribute is no part of this one's bound.
    mixed = (*preds, Predicate("elsewhere", Op.NE, (1,)))
    bound = bound_of(mixed, attr.name, attr)
    assert bound is not None
    want = RangeConstraint(attr.name, iv).overlaps_conj(conjunction(preds, attr), attr)
    assert bound_overlaps(bound, iv, attr.kind.discrete) == want


def test_quick_bound_declines_what_is_not_a_plain_comparison():
    assert bound_of((Predicate("i", Op.NE, (3,)),), "i", INT) is None
    assert bound_of((Predicate("i", Op.GT, (True,)),), "i", INT) is None
    assert bound_of((Predicate("f", Op.GT, (float("nan"),)),), "f", FLOAT) is None


# -- a split child inherits the parent's slice records (split_job.divide_records) ------------------


@pytest.mark.parametrize("first", ["x", "y"], ids=["int-first", "float-first"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_children_inherit_exactly_the_records_of_their_space(first, data):
    from overlay.balance.split import choose_cut, divide
    from overlay.balance.split_job import divide_records

    schema = SMALL
    parent = Channel(ChannelId(0, 0), EventSpace.whole(schema), schema)
    # The DA priority decides the record order: make the cut attribute first or not.
    prio = ("x", "y", "r", "s") if first == "x" else ("y", "x", "r", "s")
    for which in ("last", "current"):
        getattr(parent, which).priority = prio
    parent.priority = prio
    n = data.draw(st.integers(2, 30))
    # One value on the first attribute: the cut falls on the second (no bisection).
    same_first = data.draw(st.booleans())
    for _ in range(n):
        point = (
            (3 if first == "x" else 1.0)
            if same_first
            else data.draw(st.integers(0, 12))
            if first == "x"
            else data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0])),
            data.draw(st.sampled_from([0.0, 1.5, 3.0])) if first == "x" else data.draw(st.integers(0, 12)),
            1,
            "a",
        )
        for which in ("last", "current"):
            getattr(parent, which).add(point, data.draw(st.integers(0, 9)), 0)
    recs = parent.last.records()
    cut = choose_cut(parent.space, recs, prio, parent.last.load / 2, schema)
    if cut is None:
        return
    want = {
        which: [(p, tuple(getattr(parent, which)._records[p])) for p in getattr(parent, which)._records]
        for which in ("last", "current")
    }
    children = divide(parent, [(ChannelId(0, 1), cut.low), (ChannelId(0, 2), cut.high)])
    for which in ("last", "current"):
        divide_records(
            getattr(parent, which),
            [getattr(c, which) for c in children],
            [c.space.constraint(cut.attr) for c in children],
            cut.attr,
        )
    for which in ("last", "current"):
        got = []
        for child in children:
            stats = getattr(child, which)
            mine = [(p, tuple(r)) for p, r in want[which] if child.space.contains(dict(zip(prio, p)))]
            assert [(p, tuple(stats._records[p])) for p in stats._records] == mine
            assert stats.load == sum(r[0] for _, r in mine) and stats.events == sum(r[1] for _, r in mine)
            got += mine
        assert sorted(got) == sorted(want[which])
