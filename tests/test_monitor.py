"""overlay.balance.monitor: node states, live peers, probability p and anti-jitter (SPEC §5, §6).

The monitor is a pure class: LIEMs and the slice's load go in, a report comes
out; the random source is injected and seeded here.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.balance import evaluators as ev
from overlay.balance.monitor import (
    CALM_SLICES,
    JITTER_GAP,
    JITTER_RUNS,
    LIVE_SLICES,
    STRETCH,
    Monitor,
    NodeState,
)
from overlay.errors import LocalProtocolError

PROPS = settings(max_examples=150, deadline=None)
U, S, OV, B = NodeState.UNDERLOADED, NodeState.STABLE, NodeState.OVERLOADED, NodeState.BUSY
BASE = 2.0


def monitor(p: float = 0.5, seed: int = 1, peers=(1, 2, 3), capacity: float = 1.0, delta: float = 0.1) -> Monitor:
    return Monitor(0, capacity, list(peers), delta=delta, slice_seconds=BASE, probability=p, rng=random.Random(seed))


def liems(m: Monitor, dcs: dict[int, float], state: str = "STABLE") -> None:
    for node, dc in dcs.items():
        m.on_liem(node, state, dc, dc, 1.0)


def slice_with(m: Monitor, d: float, peers: dict[int, float]):
    liems(m, peers)
    return m.end_slice(d)


PEERS = {1: 10.0, 2: 10.0, 3: 10.0}


def overloaded(m: Monitor) -> None:
    slice_with(m, 40.0, PEERS)
    assert m.state is OV


def underloaded(m: Monitor) -> None:
    slice_with(m, 0.0, PEERS)
    assert m.state is U


# -- states (SPEC §5) ---------------------------------------------------------------------------


def test_starts_underloaded_and_not_busy():
    m = monitor()
    assert m.state is U and not m.busy and m.slice_no == 0 and m.slice_seconds == BASE


@pytest.mark.parametrize(
    ("dc", "want"),
    [(0.0, U), (8.9, U), (9.0, S), (10.0, S), (11.0, S), (11.1, OV), (100.0, OV)],
)
def test_classify_against_mean_plus_minus_delta(dc, want):
    # dc̄ = 10, δ = 0.1 → Δd = 1: UNDERLOADED below 9, OVERLOADED above 11, both ends STABLE.
    assert monitor().classify(dc, 10.0) is want


@PROPS
@given(st.floats(0.0, 1e4), st.floats(0.0, 1e4), st.floats(0.01, 0.99))
def test_classify_reference(dc, mean, delta):
    m = monitor(delta=delta)
    dd = delta * mean
    want = U if dc < mean - dd else OV if dc > mean + dd else S
    assert m.classify(dc, mean) is want


def test_end_slice_computes_dc_mean_and_state():
    m = monitor(capacity=2.0)
    r = slice_with(m, 40.0, {1: 10.0, 2: 10.0, 3: 4.0})
    # dc = 40 / 2 = 20; dc̄ = (20 + 10 + 10 + 4)/4 = 11; Δd = 1.1.
    assert (r.slice_no, r.d, r.dc) == (1, 40.0, 20.0)
    assert r.mean == pytest.approx(11.0) and m.mean == r.mean
    assert r.state is OV and m.state is OV
    assert r.spread == pytest.approx(ev.spread([20.0, 10.0, 10.0, 4.0]))
    r = slice_with(m, 20.0, {1: 10.0, 2: 10.0, 3: 10.0})
    assert r.dc == 10.0 and r.state is S
    r = slice_with(m, 2.0, {1: 10.0, 2: 10.0, 3: 10.0})
    assert r.state is U


def test_below_the_minimum_load_a_node_is_never_overloaded_and_an_idle_cluster_is_stable():
    m = Monitor(0, 1.0, [1, 2, 3], delta=0.1, slice_seconds=BASE, probability=1.0, rng=random.Random(1), min_load=100.0)
    # Two events in the whole cluster: the node that matched them is not overloaded.
    r = slice_with(m, 2.0, {1: 0.0, 2: 0.0, 3: 0.0})
    assert r.state is S and not r.schedule
    # The same at the other end: a node at 0 in an idle cluster is not underloaded either.
    r = slice_with(m, 0.0, {1: 6e-61, 2: 2.0, 3: 0.0})
    assert r.state is S
    # Real work elsewhere: this idle node is a receiver; a busy node above the minimum is overloaded.
    assert slice_with(m, 0.0, {1: 500.0, 2: 500.0, 3: 500.0}).state is U
    r = slice_with(m, 2000.0, {1: 500.0, 2: 500.0, 3: 500.0})
    assert r.state is OV and r.schedule
    # Above the others but under the minimum itself: stable, however uneven.
    assert slice_with(m, 90.0, {1: 150.0, 2: 0.0, 3: 0.0}).state is S  # mean 60: above it, but idle


def test_alone_a_node_is_at_the_mean():
    m = monitor(peers=())
    r = m.end_slice(50.0)
    assert r.mean == 50.0 and r.state is S and r.spread == 0.0 and not r.schedule


# -- BUSY (SPEC §5, figure 5) -------------------------------------------------------------------


def test_busy_as_receiver_from_underloaded_then_stable_on_completion():
    m = monitor()
    m.enter_busy(as_sender=False)
    assert m.state is B and m.busy
    m.leave_busy(completed=True)
    assert m.state is S and not m.busy


def test_busy_as_receiver_then_back_to_underloaded_on_refusal():
    m = monitor()
    m.enter_busy(as_sender=False)
    m.leave_busy(completed=False)
    assert m.state is U


def test_busy_as_sender_from_overloaded_both_ways():
    m = monitor()
    overloaded(m)
    m.enter_busy(as_sender=True)
    assert m.state is B
    m.leave_busy(completed=False)
    assert m.state is OV
    m.enter_busy(as_sender=True)
    m.leave_busy(completed=True)
    assert m.state is S


def _put_in(m: Monitor, state: NodeState) -> None:
    if state is U:
        underloaded(m)
    elif state is OV:
        overloaded(m)
    elif state is S:
        slice_with(m, 10.0, PEERS)
        assert m.state is S
    else:
        underloaded(m)
        m.enter_busy(as_sender=False)


@pytest.mark.parametrize(
    ("state", "as_sender"),
    [(U, True), (S, True), (S, False), (OV, False), (B, True), (B, False)],
)
def test_illegal_enter_busy_raises_and_changes_nothing(state, as_sender):
    m = monitor()
    _put_in(m, state)
    with pytest.raises(LocalProtocolError, match=state.value):
        m.enter_busy(as_sender=as_sender)
    assert m.state is state
    if state is B:  # still remembers where it came from
        m.leave_busy(completed=False)
        assert m.state is U


def test_leave_busy_when_not_busy_changes_nothing():
    m = monitor()
    overloaded(m)
    m.leave_busy(completed=True)
    assert m.state is OV
    m.leave_busy(completed=False)
    assert m.state is OV


def test_slices_while_busy_keep_busy_and_never_schedule():
    m = monitor(p=1.0)
    overloaded(m)
    m.enter_busy(as_sender=True)
    for d in (40.0, 0.0, 10.0, 100.0):
        r = slice_with(m, d, PEERS)
        assert r.state is B and m.state is B and not r.schedule
    m.leave_busy(completed=False)
    assert m.state is OV  # the state from before BUSY, not the last slice's
    r = slice_with(m, 0.0, PEERS)
    assert r.state is U  # and the next slice reclassifies


# -- LIEMs and live peers (SPEC §6 rules 1–3) ---------------------------------------------------


def test_bad_state_in_a_liem_raises_and_records_nothing():
    m = monitor()
    with pytest.raises(LocalProtocolError, match="SLEEPY"):
        m.on_liem(1, "SLEEPY", 1.0, 1.0, 1.0)
    with pytest.raises(LocalProtocolError):
        m.on_liem(1, "underloaded", 1.0, 1.0, 1.0)  # states are spelled exactly
    assert m.loads == {} and m.live() == []


def test_liem_keeps_the_latest_report_per_peer():
    m = monitor()
    m.on_liem(1, "OVERLOADED", 30.0, 15.0, 2.0)
    m.on_liem(1, "STABLE", 10.0, 5.0, 2.0)
    (p,) = m.live()
    assert (p.node, p.state, p.d, p.dc, p.capacity, p.slice_no) == (1, S, 10.0, 5.0, 2.0, 0)


def test_a_peer_is_live_for_live_slices_after_its_last_liem():
    m = monitor(peers=(1, 2))
    liems(m, {1: 5.0, 2: 5.0})
    for _ in range(LIVE_SLICES):
        m.end_slice(5.0)
        assert {p.node for p in m.live()} == {1, 2}
        m.on_liem(2, "STABLE", 5.0, 5.0, 1.0)  # 2 keeps reporting, 1 falls silent
    m.end_slice(5.0)
    assert {p.node for p in m.live()} == {2}


def test_a_dead_peer_leaves_the_mean():
    m = monitor(peers=(1,))
    m.on_liem(1, "STABLE", 100.0, 100.0, 1.0)
    assert m.end_slice(0.0).mean == 50.0
    for _ in range(LIVE_SLICES):
        m.end_slice(0.0)
    r = m.end_slice(0.0)
    assert r.mean == 0.0 and not m.live()


def test_liems_of_strangers_are_kept_but_ignored_until_they_are_peers():
    m = monitor(peers=(1,))
    m.on_liem(7, "STABLE", 9.0, 9.0, 1.0)
    assert [p.node for p in m.live()] == []
    m.add_peer(7)
    assert [p.node for p in m.live()] == [7]
    m.add_peer(7)
    m.add_peer(0)  # itself: never a peer
    assert m.peers == [1, 7]
    m.remove_peer(7)
    assert m.peers == [1] and 7 not in m.loads and m.live() == []


@PROPS
@given(st.floats(0.0, 100.0), st.dictionaries(st.integers(1, 8), st.floats(0.0, 100.0), max_size=8))
def test_u_nodes_and_o_nodes_are_disjoint_and_correct(d, peers):
    m = monitor(peers=range(1, 9))
    slice_with(m, d, peers)
    u = {p.node for p in m.u_nodes()}
    o = {p.node for p in m.o_nodes()}
    assert u.isdisjoint(o)
    assert u == {n for n, dc in peers.items() if dc < m.dc}
    assert o == {n for n, dc in peers.items() if dc > m.dc}
    assert u | o == {n for n, dc in peers.items() if dc != m.dc}


def test_a_peer_moves_between_lists():
    m = monitor(peers=(1,))
    slice_with(m, 10.0, {1: 5.0})
    assert [p.node for p in m.u_nodes()] == [1] and m.o_nodes() == []
    slice_with(m, 10.0, {1: 15.0})
    assert m.u_nodes() == [] and [p.node for p in m.o_nodes()] == [1]
    slice_with(m, 10.0, {1: 10.0})
    assert m.u_nodes() == [] and m.o_nodes() == []


# -- probability p (SPEC §6 rule 5) -------------------------------------------------------------


def test_p_zero_never_schedules():
    m = monitor(p=0.0)
    for _ in range(50):
        r = slice_with(m, 40.0, PEERS)
        assert r.state is OV and not r.schedule


def test_p_one_always_schedules_when_overloaded_with_live_peers():
    m = monitor(p=1.0)
    for _ in range(20):
        r = slice_with(m, 40.0, PEERS)
        assert r.state is OV and r.schedule


@pytest.mark.parametrize("d", [0.0, 10.0])
def test_p_one_never_schedules_unless_overloaded(d):
    m = monitor(p=1.0)
    for _ in range(10):
        assert not slice_with(m, d, PEERS).schedule


def schedules(m: Monitor, pattern: str) -> list[bool]:
    """One slice per letter: 'o' overloaded (a draw), '.' stable (no draw)."""
    return [slice_with(m, 40.0 if ch == "o" else 10.0, PEERS).schedule for ch in pattern]


@pytest.mark.parametrize("p", [0.5, 0.3, 0.25, 0.7])
def test_each_draw_schedules_with_probability_p(p):
    # Over many seeds (phases), the k-th draw of a node schedules with
    # probability p for every k: the draws are systematic, not biased.
    runs = 2000
    hits = [0] * 8
    for seed in range(runs):
        for k, s in enumerate(schedules(monitor(p=p, seed=seed), "o" * 8)):
            hits[k] += s
    for k, h in enumerate(hits):
        assert abs(h / runs - p) < 0.04, (k, h / runs)


@given(p=st.floats(0.05, 1.0), seed=st.integers(0, 2**32 - 1), pattern=st.text("o.", min_size=1, max_size=60))
@PROPS
def test_overloaded_slices_schedule_at_rate_p_and_never_wait_long(p, seed, pattern):
    got = schedules(monitor(p=p, seed=seed), pattern)
    draws = pattern.count("o")
    assert not any(g for g, ch in zip(got, pattern) if ch == ".")  # a draw only when OVERLOADED
    assert abs(sum(got) - draws * p) < 1.0 + 1e-9  # floor(k*p) or ceil(k*p)
    waited = 0
    for g, ch in zip(got, pattern):
        if ch == "o":
            waited = 0 if g else waited + 1
            assert waited < math.ceil(1 / p - 1e-9)


def test_nodes_with_different_seeds_are_out_of_step():
    # p = 1/2: a node schedules every other overloaded slice; which of the two
    # depends on its phase, so some pairs of nodes alternate instead of colliding.
    firsts = {schedules(monitor(p=0.5, seed=seed), "oo")[0] for seed in range(20)}
    assert firsts == {True, False}


def test_same_seed_same_decisions():
    runs = []
    for _ in range(2):
        m = monitor(p=0.3, seed=9)
        runs.append([slice_with(m, 40.0, PEERS).schedule for _ in range(30)])
    assert runs[0] == runs[1]


# -- anti-jitter (SPEC §6 rule 6) ---------------------------------------------------------------


def drive(m: Monitor, pattern: str) -> list[float]:
    """One slice per letter: 'x' schedules (overloaded, p = 1), '.' does not (stable)."""
    out = []
    for ch in pattern:
        r = slice_with(m, 40.0 if ch == "x" else 10.0, PEERS)
        assert r.schedule is (ch == "x")
        assert r.slice_seconds == m.slice_seconds
        out.append(r.slice_seconds)
    return out


def test_constants_are_the_spec_examples():
    assert (JITTER_RUNS, JITTER_GAP, STRETCH) == (3, 2, 1.5)


def test_three_runs_in_a_row_stretch_the_slice_to_150_percent():
    m = monitor(p=1.0)
    assert drive(m, "xxx") == [BASE, BASE, BASE * STRETCH]
    assert m.slice_seconds == 3.0


def test_three_runs_each_within_two_slices_stretch():
    m = monitor(p=1.0)
    assert drive(m, "x.x.x") == [BASE] * 4 + [BASE * STRETCH]


def test_a_gap_longer_than_two_slices_does_not_stretch():
    m = monitor(p=1.0)
    assert drive(m, "x..x.x") == [BASE] * 6
    assert drive(m, "..x..x..x") == [BASE] * 9


def test_stretch_holds_until_calm_slices_pass_then_returns():
    m = monitor(p=1.0)
    drive(m, "xxx")
    calm = drive(m, "." * CALM_SLICES)
    assert calm == [BASE * STRETCH] * (CALM_SLICES - 1) + [BASE]
    # And it can stretch again.
    assert drive(m, "xxx")[-1] == BASE * STRETCH


def test_a_lone_run_during_the_stretch_does_not_end_it_early():
    m = monitor(p=1.0)
    drive(m, "xxx...x...")
    assert m.slice_seconds == BASE * STRETCH
    drive(m, ".")
    assert m.slice_seconds == BASE * STRETCH
    drive(m, "." * CALM_SLICES)
    assert m.slice_seconds == BASE


def test_the_run_history_stays_bounded():
    """Only the last JITTER_RUNS runs matter; a node up for weeks must not keep all of them."""
    m = monitor(p=1.0)
    drive(m, "x" * 500)
    assert m.slice_seconds == BASE * STRETCH
    assert len(m._runs) <= JITTER_RUNS
    drive(m, "." * CALM_SLICES)
    assert m.slice_seconds == BASE
