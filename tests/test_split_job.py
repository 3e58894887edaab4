"""overlay.balance.split_job: a split worked out in steps while the channel serves.

The property drives a job a step at a time with (un)subscriptions, events and
even a slice closing in between, then checks the commit against what a split
of the parent as it stood at the commit must give: every subscription in
exactly the children it belongs to, the slice records divided by the cut,
and every event matched by its child exactly as by brute force.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from overlay.balance.split import cut_slice, divide
from overlay.balance.split_job import SplitJob
from overlay.channels import Channel, ChannelId, EventSpace, Subscription
from overlay.errors import LocalProtocolError
from strategies import SMALL, brute_matches, events, filters

IDS = (ChannelId(0, 1), ChannelId(0, 2))
PRIO = SMALL.da_priority()


def da_event(draw: st.DrawFn) -> dict[str, object]:
    return draw(events(SMALL))


def records(stats) -> dict[tuple, tuple[int, int]]:
    return {p: tuple(stats._records[p]) for p in stats._records}


def a_filter(draw: st.DrawFn):
    """A filter some event of the whole space matches (the channel invariant:
    only subscriptions of its space)."""
    return draw(filters(SMALL, max_size=3).filter(lambda f: EventSpace.whole(SMALL).belongs(f, SMALL)))


def fed_parent(draw: st.DrawFn, n_subs: int) -> tuple[Channel, dict[str, Subscription]]:
    parent = Channel(ChannelId(0, 0), EventSpace.whole(SMALL), SMALL)
    model: dict[str, Subscription] = {}
    for k in range(n_subs):
        sub = Subscription(f"s{k}", a_filter(draw))
        parent.add(sub)
        model[sub.id] = sub
    for _ in range(draw(st.integers(2, 25))):
        parent.match(da_event(draw), 0)
    parent.roll_slice()
    for _ in range(draw(st.integers(0, 10))):
        parent.match(da_event(draw), 1)
    return parent, model


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_job_interleaved_with_traffic_commits_the_split_of_the_parent_as_it_stands(data):
    draw = data.draw
    parent, model = fed_parent(draw, draw(st.integers(0, 12), label="subscriptions"))
    expected_cut = cut_slice(parent.space, parent.last, parent.last.load / 2, SMALL)
    job = SplitJob(
        parent,
        IDS,
        SMALL,
        delta_ld=parent.last.load / 2,
        records_per_step=draw(st.integers(1, 4)),
        subs_per_step=draw(st.integers(1, 4)),
    )
    next_id = len(model)
    rolled = False
    while not job.done:
        op = draw(st.sampled_from(["step", "step", "subscribe", "unsubscribe", "event", "roll"]), label="op")
        if op == "step":
            job.step()
        elif op == "subscribe":
            sub = Subscription(f"s{next_id}", a_filter(draw))
            next_id += 1
            (parent.add if draw(st.booleans()) else lambda s: parent.add_deferred([s]))(sub)
            model[sub.id] = sub
        elif op == "unsubscribe" and model:
            sid = draw(st.sampled_from(sorted(model)))
            assert parent.remove(sid) is not None
            del model[sid]
        elif op == "event":
            parent.match(da_event(draw), 2)
        elif op == "roll" and not rolled and draw(st.integers(0, 4)) == 0:
            parent.roll_slice()
            rolled = True
    event(f"rolled={rolled}, replicate={job.replicate}")
    assert job.cut == expected_cut  # the cut of the slice the job began on
    if job.replicate:
        assert expected_cut is None and not job.children
        assert {s.id for s in parent} == set(model)  # the parent is left as it is
        return
    cut = job.cut
    assert cut is not None
    last, current = records(parent.last), records(parent.current)
    low, high = job.commit()
    assert (low.id, high.id) == IDS
    for child, space in ((low, cut.low), (high, cut.high)):
        # Membership: the parent's subscriptions at the commit that belong to it.
        want = {sid for sid, sub in model.items() if space.belongs(sub.filter, SMALL)}
        assert {s.id for s in child} == want and len(child) == len(want)
        assert all(sid in child for sid in want)
        # Slices: exactly the parent's records that fall in its space.
        for got, whole in ((child.last, last), (child.current, current)):
            mine = {p: r for p, r in whole.items() if space.contains(dict(zip(got.priority, p)))}
            assert records(got) == mine
            assert got.load == sum(r[0] for r in mine.values()) and got.events == sum(r[1] for r in mine.values())
    assert {s.id for s in low} | {s.id for s in high} == set(model)
    # Matching: every event lands in one child and matches what brute force says.
    evs = [da_event(draw) for _ in range(draw(st.integers(1, 12)))]
    for drained in (False, True):
        if drained:
            for c in (low, high):
                while c.index_step(3):
                    pass
        for e in evs:
            (home,) = [c for c in (low, high) if c.space.contains(e)]
            got = {s.id for s in home.match(e, 0)[0]}
            assert got == {sid for sid, sub in model.items() if brute_matches(sub.filter, e)}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_job_run_at_once_splits_like_divide(data):
    draw = data.draw
    parent, _model = fed_parent(draw, draw(st.integers(0, 12)))
    twin = Channel(ChannelId(0, 9), parent.space, SMALL)
    for sub in parent:
        twin.add(sub)
    cut = cut_slice(parent.space, parent.last, parent.last.load / 3, SMALL)
    if cut is None:
        return
    job = SplitJob(parent, IDS, SMALL, cut=cut)
    job.run()
    got = job.commit()
    want = divide(twin, [(IDS[0], cut.low), (IDS[1], cut.high)])
    assert [{s.id for s in c} for c in got] == [{s.id for s in c} for c in want]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_cancelled_job_leaves_the_parent_as_it_was(data):
    draw = data.draw
    parent, model = fed_parent(draw, draw(st.integers(1, 10)))
    job = SplitJob(parent, IDS, SMALL, delta_ld=parent.last.load / 2, records_per_step=2, subs_per_step=2)
    for _ in range(draw(st.integers(0, 12))):
        job.step()
    parent.remove(sorted(model)[0])
    job.cancel()
    assert parent._changes is None  # the log stopped
    assert {s.id for s in parent} == set(model) - {sorted(model)[0]}
    e = da_event(draw)
    assert {s.id for s in parent.match(e, 0)[0]} == {
        sid for sid, sub in model.items() if sid != sorted(model)[0] and brute_matches(sub.filter, e)
    }


def test_one_point_replicates_and_cannot_commit():
    parent = Channel(ChannelId(0, 0), EventSpace.whole(SMALL), SMALL)
    for _ in range(5):
        parent.match({"x": 3, "y": 1.0, "r": 2, "s": "a", "n": 1, "t": "b"}, 0)
    parent.roll_slice()
    job = SplitJob(parent, IDS, SMALL, delta_ld=2)
    job.run()
    assert job.replicate and job.cut is None and parent._changes is None
    with pytest.raises(LocalProtocolError, match="not ready"):
        job.commit()


def test_commit_before_the_end_is_refused():
    parent = Channel(ChannelId(0, 0), EventSpace.whole(SMALL), SMALL)
    for x in range(6):
        parent.match({"x": x, "y": 1.0, "r": 2, "s": "a", "n": 1, "t": "b"}, 0)
    parent.roll_slice()
    job = SplitJob(parent, IDS, SMALL, delta_ld=2, records_per_step=1)
    assert not job.step()
    with pytest.raises(LocalProtocolError, match="not ready"):
        job.commit()
