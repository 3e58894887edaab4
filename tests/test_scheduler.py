"""overlay.balance.scheduler: ranking receivers (rank1) and choosing channels (rank2, φ) — SPEC §7, §8.1.

Pure functions; the "does it help" checks recompute S from scratch with the
evaluators' ``spread``.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from overlay.balance import evaluators as ev
from overlay.balance.monitor import NodeState, PeerLoad
from overlay.balance.scheduler import (
    MAX_CANDIDATES,
    ChannelLoad,
    Weights,
    choose_channels,
    rank_receivers,
)
from overlay.channels import ChannelId

PROPS = settings(max_examples=150, deadline=None)
U, S, OV, B = NodeState.UNDERLOADED, NodeState.STABLE, NodeState.OVERLOADED, NodeState.BUSY
W = Weights()


def peer(node: int, dc: float, state: NodeState = U, capacity: float = 1.0) -> PeerLoad:
    return PeerLoad(node, state, dc * capacity, dc, capacity, 0)


def flat_bw(i: int, j: int) -> float:
    return 100.0


def cid(k: int) -> ChannelId:
    return ChannelId(0, k)


# -- rank_receivers (rule 1) ----------------------------------------------------------------------


def test_only_underloaded_peers_lighter_than_me_are_offered():
    peers = [
        peer(1, 2.0),  # underloaded, lighter: yes
        peer(2, 3.0, S),  # stable
        peer(3, 1.0, B),  # busy
        peer(4, 30.0, OV),  # overloaded
        peer(5, 25.0, U),  # claims underloaded but heavier than me (a stale LIEM)
        peer(6, 20.0, U),  # as heavy as me: not lighter
        peer(7, 5.0),
    ]
    got = rank_receivers(0, 20.0, 20.0, 1.0, 4, peers, flat_bw, W)
    assert {s.node for s in got} == {1, 7}


def test_no_underloaded_peer_no_candidate():
    assert rank_receivers(0, 20.0, 20.0, 1.0, 4, [peer(1, 5.0, S), peer(2, 30.0, OV)], flat_bw, W) == []
    assert rank_receivers(0, 20.0, 20.0, 1.0, 4, [], flat_bw, W) == []


def test_rank1_scores_are_the_spec_formula():
    peers = [peer(1, 2.0), peer(2, 6.0, capacity=2.0), peer(3, 40.0, OV), peer(4, 4.0)]
    bw = {1: 50.0, 2: 100.0, 4: 80.0}
    got = rank_receivers(0, 60.0, 30.0, 2.0, 3, peers, lambda i, j: bw[j], W)
    x = 60.0 / 3  # avg(g_i) = d_i / m_i
    over = [(40.0, 1.0)]
    under = [(2.0, 1.0), (6.0, 2.0), (4.0, 1.0)]
    r_o = ev.rank_o(30.0, 2.0, over, x, 10)
    for s in got:
        p = next(q for q in peers if q.node == s.node)
        r_u = ev.rank_u(p.dc, p.capacity, under, x, 10)
        f3 = ev.lev(bw[s.node] / 100.0, 10)
        assert (s.rank_o, s.rank_u, s.f3_bw) == (r_o, r_u, f3)
        assert s.f2 == ev.f2(r_o, r_u)
        assert s.rank1 == pytest.approx(0.5 * s.f2 + 0.5 * f3)
        assert (s.dc, s.capacity) == (p.dc, p.capacity)
    assert [s.rank1 for s in got] == sorted((s.rank1 for s in got), reverse=True)


def test_bandwidth_breaks_an_otherwise_equal_choice():
    peers = [peer(1, 2.0), peer(2, 2.0), peer(3, 2.0)]
    bw = {1: 10.0, 2: 100.0, 3: 50.0}
    got = rank_receivers(0, 20.0, 20.0, 1.0, 4, peers, lambda i, j: bw[j], W)
    assert [s.node for s in got] == [2, 3, 1]
    assert [s.f3_bw for s in got] == [1.0, 0.5, 0.1]


def test_omega_weighs_load_matching_against_bandwidth():
    # The most overloaded node: f2 prefers the lightest peer (1); bandwidth prefers 2.
    peers = [peer(1, 1.0), peer(2, 8.0)]
    bw = {1: 10.0, 2: 100.0}
    by_f2 = rank_receivers(0, 20.0, 20.0, 1.0, 4, peers, lambda i, j: bw[j], Weights(omega=1.0))
    by_bw = rank_receivers(0, 20.0, 20.0, 1.0, 4, peers, lambda i, j: bw[j], Weights(omega=0.0))
    assert [s.node for s in by_f2] == [1, 2]
    assert [s.node for s in by_bw] == [2, 1]


def test_a_mildly_overloaded_node_prefers_a_mildly_underloaded_one():
    peers = [peer(1, 1.0), peer(2, 8.0), peer(3, 40.0, OV)]
    got = rank_receivers(0, 12.0, 12.0, 1.0, 1, peers, flat_bw, Weights(omega=1.0))
    assert got[0].node == 2
    top = rank_receivers(
        3, 40.0, 40.0, 1.0, 1, [peer(1, 1.0), peer(2, 8.0), peer(0, 12.0, OV)], flat_bw, Weights(omega=1.0)
    )
    assert top[0].node == 1


def test_ties_go_to_the_lighter_then_lower_node():
    peers = [peer(3, 2.0), peer(1, 2.0), peer(2, 2.0)]
    got = rank_receivers(0, 20.0, 20.0, 1.0, 4, peers, flat_bw, W)
    assert [s.node for s in got] == [1, 2, 3]


def test_candidate_list_is_bounded():
    peers = [peer(k, 1.0 + k / 100) for k in range(1, 30)]
    assert len(rank_receivers(0, 20.0, 20.0, 1.0, 4, peers, flat_bw, W)) == MAX_CANDIDATES
    assert len(rank_receivers(0, 20.0, 20.0, 1.0, 4, peers, flat_bw, W, limit=3)) == 3


def test_zero_channels_does_not_divide_by_zero():
    got = rank_receivers(0, 20.0, 20.0, 1.0, 0, [peer(1, 2.0)], flat_bw, W)
    assert [s.node for s in got] == [1]


# -- choose_channels (rule 2) ---------------------------------------------------------------------

F1_ONLY = Weights(alpha=1.0, beta=0.0, gamma=0.0)


def choose(loads, *, d=None, receiver_d=0.0, weights=F1_ONLY, splittable=None, subs=None, access=None):
    """Two nodes of capacity 1: me (load ``d``, default Σ loads) and the receiver."""
    chans = [
        ChannelLoad(
            cid(k),
            load,
            (subs or {}).get(k, 10),
            (access or {}).get(k, {}),
            splittable=(splittable or {}).get(k, True),
        )
        for k, load in enumerate(loads)
    ]
    d = sum(loads) if d is None else d
    mean = (d + receiver_d) / 2
    return choose_channels(
        chans,
        dc=d,
        capacity=1.0,
        receiver=9,
        receiver_dc=receiver_d,
        receiver_capacity=1.0,
        mean=mean,
        n=2,
        bw_ij=10.0,
        min_mig_cost=1.0,
        weights=weights,
    )


def test_one_channel_near_phi_is_moved_alone():
    c = choose([48, 52], receiver_d=0.0)  # φ = 50
    assert c.phi == pytest.approx(50.0)
    assert c.transfer in ((cid(0),), (cid(1),)) and c.split is None
    assert abs(c.moved_load - 50) <= 5


def test_prefix_within_ten_percent_of_phi():
    # φ = 50 (d = 100 incl. 15 elsewhere). f1: 35 → 0.7, 15 → 0.3, 5 → 0.1, 45 → 0.9 …
    c = choose([35, 15, 5], d=100.0)
    assert c.phi == pytest.approx(50.0)
    assert [s.ch_id for s in c.scores] == [cid(0), cid(1), cid(2)]
    assert c.transfer == (cid(0), cid(1)) and c.split is None and c.moved_load == 50


def test_the_channel_that_jumps_over_the_window_is_split():
    # Ranked 35 (f1 0.7), 80 (0.4), 15 (0.3): 35 + 80 jumps over [45, 55].
    c = choose([35, 80, 15], d=100.0)
    assert [s.load for s in c.scores] == [35, 80, 15]
    assert c.transfer == (cid(0),)
    assert c.split == cid(1) and c.split_load == pytest.approx(50.0 - 35)


def test_a_single_heavy_channel_is_split_at_phi():
    c = choose([100])
    assert c.transfer == () and c.split == cid(0) and c.split_load == pytest.approx(50.0)


def test_unsplittable_channels_are_skipped():
    c = choose([35, 80, 15], d=100.0, splittable={1: False})
    assert c.transfer == (cid(0), cid(2)) and c.split is None
    c = choose([100], splittable={0: False})
    assert c.transfer == () and c.split is None


def test_empty_channels_are_never_moved():
    c = choose([0, 0, 48], d=100.0)
    assert c.transfer == (cid(2),)
    c = choose([0, 0], d=100.0)
    assert c.transfer == () and c.split is None


def test_all_channels_under_the_window_are_all_moved():
    c = choose([10, 10], d=100.0)  # φ = 50; 20 < 45, and each lowers S
    assert set(c.transfer) == {cid(0), cid(1)} and c.split is None


@pytest.mark.parametrize("receiver_d", [100.0, 150.0])
def test_phi_not_positive_chooses_nothing(receiver_d):
    c = choose([40, 60], d=100.0, receiver_d=receiver_d)
    assert c.phi <= 0
    assert c.transfer == () and c.split is None and c.split_load == 0.0
    assert len(c.scores) == 2 and all(s.f1 == 0.0 for s in c.scores)


def test_rank2_scores_follow_the_spec():
    w = Weights()
    c = choose([45, 30], d=100.0, weights=w, subs={0: 40, 1: 10}, access={1: {9: 0.75}})
    by_id = {s.ch_id: s for s in c.scores}
    a, b = by_id[cid(0)], by_id[cid(1)]
    assert (a.f1, b.f1) == (ev.f1(45, 50.0, 10), ev.f1(30, 50.0, 10)) == (0.9, 0.6)
    # mig_cost = subs / bw = 4 and 1; min_mig_cost = 1.
    assert (a.f3, b.f3) == (ev.lev(1 / 4, 10), 1.0)
    assert (a.f4, b.f4) == (0.0, 0.8)
    assert a.rank2 == pytest.approx(0.6 * 0.9 + 0.2 * 0.3 + 0.2 * 0.0)
    assert b.rank2 == pytest.approx(0.6 * 0.6 + 0.2 * 1.0 + 0.2 * 0.8)
    assert [s.ch_id for s in c.scores] == [cid(1), cid(0)]  # rank2 order, not load order


def test_unequal_capacities_use_the_general_phi():
    chans = [ChannelLoad(cid(0), 20, 1), ChannelLoad(cid(1), 40, 1)]
    # g_i: d = 60, c = 2 (dc 30); g_j: dc 0, c = 1; φ = 20 (see test_evaluators).
    c = choose_channels(
        chans,
        dc=30.0,
        capacity=2.0,
        receiver=1,
        receiver_dc=0.0,
        receiver_capacity=1.0,
        mean=15.0,
        n=2,
        bw_ij=1.0,
        min_mig_cost=1.0,
        weights=F1_ONLY,
    )
    assert c.phi == pytest.approx(20.0) and c.transfer == (cid(0),)


# -- the chosen move lowers S (brute force) ----------------------------------------------------


def spread_after(d, c, i, j, x):
    loads = list(d)
    loads[i] -= x
    loads[j] += x
    return ev.spread([lk / ck for lk, ck in zip(loads, c)])


@st.composite
def situations(draw):
    n = draw(st.integers(2, 6), label="n")
    caps = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=n, max_size=n), label="capacities")
    chan_loads = draw(st.lists(st.integers(0, 200), min_size=1, max_size=8), label="channel loads")
    others = draw(st.lists(st.integers(0, 300), min_size=n - 1, max_size=n - 1), label="other loads")
    splittable = draw(st.lists(st.booleans(), min_size=len(chan_loads), max_size=len(chan_loads)), label="splittable")
    subs = draw(st.lists(st.integers(0, 50), min_size=len(chan_loads), max_size=len(chan_loads)), label="subs")
    j = draw(st.integers(1, n - 1), label="receiver")
    w = draw(st.sampled_from([Weights(), F1_ONLY, Weights(alpha=0.2, beta=0.4, gamma=0.4)]), label="weights")
    return caps, chan_loads, others, splittable, subs, j, w


@PROPS
@given(situations())
def test_the_chosen_set_lowers_the_spread(sit):
    caps, chan_loads, others, splittable, subs, j, w = sit
    d = [float(sum(chan_loads))] + [float(o) for o in others]  # node 0 is me
    dc = [lk / ck for lk, ck in zip(d, caps)]
    n = len(d)
    mean = sum(dc) / n
    chans = [
        ChannelLoad(cid(k), load, subs[k], {j: 0.5}, splittable=splittable[k]) for k, load in enumerate(chan_loads)
    ]
    choice = choose_channels(
        chans,
        dc=dc[0],
        capacity=caps[0],
        receiver=j,
        receiver_dc=dc[j],
        receiver_capacity=caps[j],
        mean=mean,
        n=n,
        bw_ij=10.0,
        min_mig_cost=0.1,
        weights=w,
    )
    phi = choice.phi
    assert phi == pytest.approx(ev.phi(dc[0], caps[0], dc[j], caps[j], mean, n))
    assert sorted(s.ch_id for s in choice.scores) == [c.ch_id for c in chans]
    assert [s.rank2 for s in choice.scores] == sorted((s.rank2 for s in choice.scores), reverse=True)
    s0 = ev.spread(dc)
    if phi <= 0:
        event("phi <= 0")
        assert choice.transfer == () and choice.split is None
        return
    load = {c.ch_id: c.load for c in chans}
    order = [s.ch_id for s in choice.scores]
    # The transfer is taken in rank2 order, never an empty channel, each once.
    assert list(choice.transfer) == [c for c in order if c in choice.transfer]
    assert len(set(choice.transfer)) == len(choice.transfer)
    assert all(load[c] > 0 for c in choice.transfer)
    moved = sum(load[c] for c in choice.transfer)
    assert choice.moved_load == moved
    window = w.tolerance * phi
    event("split" if choice.split else "transfer" if choice.transfer else "nothing")
    if choice.split is not None:
        split = choice.split
        assert next(c for c in chans if c.ch_id == split).splittable
        assert split not in choice.transfer
        # The split channel jumps over the window; its cut-off part brings the total to φ.
        assert moved + load[split] > phi + window
        assert choice.split_load == pytest.approx(phi - moved)
        assert 0 < choice.split_load < load[split]
        moved += choice.split_load
    else:
        # Either a prefix within 10 % of φ, or every splittable channel fit under the window.
        within = abs(moved - phi) <= window + 1e-9
        splittable_positive = {c.ch_id for c in chans if c.splittable and c.load > 0}
        assert within or (splittable_positive <= set(choice.transfer) and moved < phi - window)
    # Every splittable channel ranked before the last one taken is taken too.
    taken = set(choice.transfer) | ({choice.split} if choice.split else set())
    if taken:
        last = max(order.index(c) for c in taken)
        for c in order[:last]:
            if load[c] > 0 and next(x for x in chans if x.ch_id == c).splittable:
                assert c in taken
    assert moved <= phi + window + 1e-9  # so inside (0, 2φ): S must fall
    if moved > 0:
        assert spread_after(d, caps, 0, j, moved) < s0
        # And a move within the window is close to the best possible.
        if abs(moved - phi) <= window:
            best = spread_after(d, caps, 0, j, phi)
            worst = max(spread_after(d, caps, 0, j, phi - window), spread_after(d, caps, 0, j, phi + window))
            assert best - 1e-9 <= spread_after(d, caps, 0, j, moved) <= worst + 1e-9
