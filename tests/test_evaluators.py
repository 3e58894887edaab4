"""overlay.balance.evaluators: lev, S, φ, f1–f4, rank1 and rank2 (SPEC §5, §7).

φ is not trusted from its derivation: it is checked against a brute-force S
computed from scratch before and after moving load between two nodes.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from overlay.balance import evaluators as ev

PROPS = settings(max_examples=150, deadline=None)
L = 10


# -- lev ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "want"),
    [
        (0.0, 0.0),
        (0.01, 0.1),
        (0.1, 0.1),
        (0.10001, 0.2),
        (0.3, 0.3),
        (0.1 * 3, 0.3),  # 0.30000000000000004·10 = 3.0000000000000004: still level 3
        (0.31, 0.4),
        (0.7, 0.7),
        (0.99, 1.0),
        (1.0, 1.0),
    ],
)
def test_lev_levels(x, want):
    assert ev.lev(x, L) == want


def test_lev_float_edge_0_3_times_10():
    # A computed 0.3 is often 0.30000000000000004, and ·10 gives 3.0000000000000004,
    # whose plain ceiling would be level 4.
    for x in (0.1 * 3, 1 - 0.7):
        assert x * 10 != 3.0 and math.ceil(x * 10) == 4  # the edge really exists
        assert ev.lev(x, 10) == 0.3
    assert ev.lev(0.3, 10) == 0.3


@pytest.mark.parametrize("x", [-1.0, -1e-12, float("-inf"), float("nan")])
def test_lev_clamps_below_zero_and_nan_to_zero(x):
    assert ev.lev(x, L) == 0.0


@pytest.mark.parametrize("x", [1.0, 1.0000001, 2.0, float("inf")])
def test_lev_clamps_above_one_to_one(x):
    assert ev.lev(x, L) == 1.0


@pytest.mark.parametrize("levels", range(1, 51))
def test_lev_of_an_exact_level_is_that_level(levels):
    for k in range(levels + 1):
        assert ev.lev(k / levels, levels) == k / levels


@PROPS
@given(st.floats(0.0, 1.0), st.integers(1, 100))
def test_lev_is_the_ceiling_level(x, levels):
    y = ev.lev(x, levels)
    assert 0.0 <= y <= 1.0
    k = round(y * levels)
    assert math.isclose(y, k / levels)  # a multiple of 1/L
    # ⌈x·L⌉/L: at or above x (up to the rounding that absorbs float noise), less than a level above.
    assert y >= x - 1e-9
    assert y - x < 1.0 / levels + 1e-12


@PROPS
@given(st.floats(-2.0, 2.0), st.floats(-2.0, 2.0))
def test_lev_is_monotone(a, b):
    a, b = min(a, b), max(a, b)
    assert ev.lev(a, L) <= ev.lev(b, L)


# -- S -----------------------------------------------------------------------------------------


def test_spread_by_hand():
    assert ev.spread([]) == 0.0
    assert ev.spread([5.0]) == 0.0
    assert ev.spread([3.0, 3.0, 3.0]) == 0.0
    assert ev.spread([0.0, 2.0]) == pytest.approx(1.0)
    assert ev.spread([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) == pytest.approx(2.0)


# -- φ against brute force ---------------------------------------------------------------------


def brute_S(d: list[float], c: list[float], i: int, j: int, x: float) -> float:
    """S after moving load ``x`` from node i to node j, from scratch (SPEC §5)."""
    loads = list(d)
    loads[i] -= x
    loads[j] += x
    dc = [lk / ck for lk, ck in zip(loads, c)]
    n = len(dc)
    mean = sum(dc) / n
    return math.sqrt(sum((v - mean) ** 2 for v in dc) / n)


def phi_of(d: list[float], c: list[float], i: int, j: int) -> float:
    dc = [lk / ck for lk, ck in zip(d, c)]
    mean = sum(dc) / len(dc)
    return ev.phi(dc[i], c[i], dc[j], c[j], mean, len(dc))


@st.composite
def clusters(draw, equal_capacities: bool = False):
    n = draw(st.integers(2, 8), label="n")
    d = draw(st.lists(st.floats(0.0, 1000.0), min_size=n, max_size=n), label="loads")
    if equal_capacities:
        c = [draw(st.floats(0.5, 20.0), label="capacity")] * n
    else:
        c = draw(st.lists(st.floats(0.5, 20.0), min_size=n, max_size=n), label="capacities")
    i, j = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True), label="i, j")
    return d, c, i, j


@PROPS
@given(clusters(), st.floats(-500.0, 500.0))
def test_phi_parabola_is_the_exact_change_of_nS2(cluster, x):
    """SPEC §7: Δ(n·S²) = −2x·A + x²·B, with dc̄ taken before the move."""
    d, c, i, j = cluster
    n = len(d)
    dc = [lk / ck for lk, ck in zip(d, c)]
    mean = sum(dc) / n
    a = (dc[i] - mean) / c[i] - (dc[j] - mean) / c[j]
    b = 1 / c[i] ** 2 + 1 / c[j] ** 2 - (1 / c[i] - 1 / c[j]) ** 2 / n
    before = n * brute_S(d, c, i, j, 0.0) ** 2
    after = n * brute_S(d, c, i, j, x) ** 2
    scale = 1.0 + before + after + abs(x * a) + x * x * b
    assert after - before == pytest.approx(-2 * x * a + x * x * b, abs=1e-9 * scale)
    assert ev.phi(dc[i], c[i], dc[j], c[j], mean, n) == pytest.approx(a / b)


@PROPS
@given(clusters())
def test_phi_minimises_brute_force_S(cluster):
    d, c, i, j = cluster
    phi = phi_of(d, c, i, j)
    if phi < 0:  # φ_ji = −φ_ij: orient the pair so load flows i → j
        i, j, phi = j, i, -phi
        assert phi_of(d, c, i, j) == pytest.approx(phi)
    s0 = brute_S(d, c, i, j, 0.0)
    n = len(d)
    b = 1 / c[i] ** 2 + 1 / c[j] ** 2 - (1 / c[i] - 1 / c[j]) ** 2 / n
    # The best gain is A²/B = B·φ²; skip pairs where it drowns in float noise.
    assume(b * phi * phi > 1e-6 * (1.0 + n * s0 * s0))

    # A fine grid over [0, 3φ]: its minimum sits at φ.
    steps = 3000
    grid = [3 * phi * k / steps for k in range(steps + 1)]
    values = [brute_S(d, c, i, j, x) for x in grid]
    best = grid[min(range(len(grid)), key=values.__getitem__)]
    assert abs(best - phi) <= 3 * (3 * phi / steps)
    assert brute_S(d, c, i, j, phi) <= min(values) + 1e-9 * (1.0 + s0)

    # S falls for every x in (0, 2φ), most at φ, and rises beyond 2φ.
    for t in (0.01, 0.1, 0.5, 0.9, 1.0, 1.1, 1.5, 1.9, 1.99):
        assert brute_S(d, c, i, j, t * phi) < s0
    for t in (2.01, 2.1, 3.0, 10.0):
        assert brute_S(d, c, i, j, t * phi) > s0
    # Monotone on each side of φ.
    below = [brute_S(d, c, i, j, t * phi) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
    above = [brute_S(d, c, i, j, t * phi) for t in (1.0, 1.25, 1.5, 1.75, 2.0)]
    assert below == sorted(below, reverse=True)
    assert above == sorted(above)


@PROPS
@given(clusters(equal_capacities=True))
def test_phi_with_equal_capacities_is_half_the_load_gap(cluster):
    d, c, i, j = cluster
    assert phi_of(d, c, i, j) == pytest.approx((d[i] - d[j]) / 2, abs=1e-9 * (1 + max(d)))


def test_phi_by_hand_with_unequal_capacities():
    # g_i: d=60, c=2 (dc 30); g_j: d=0, c=1 (dc 0); n = 2, dc̄ = 15.
    # A = 15/2 − (−15)/1 = 22.5, B = 1/4 + 1 − (1/2 − 1)²/2 = 1.125 → φ = 20.
    assert ev.phi(30.0, 2.0, 0.0, 1.0, 15.0, 2) == pytest.approx(20.0)
    # After moving 20: dc = 20 and 20 — perfectly balanced.
    assert brute_S([60.0, 0.0], [2.0, 1.0], 0, 1, 20.0) == pytest.approx(0.0, abs=1e-12)


def test_phi_not_positive_when_the_receiver_is_heavier():
    assert ev.phi(1.0, 1.0, 5.0, 1.0, 3.0, 2) < 0
    assert ev.phi(3.0, 1.0, 3.0, 1.0, 3.0, 2) == 0.0


# -- f1 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("d", "want"),
    [
        (50.0, 1.0),  # at φ
        (45.0, 0.9),  # |d − φ|/φ = 0.1 → lev 0.1
        (55.0, 0.9),
        (37.5, 0.7),  # 0.25 → lev 0.3
        (65.0, 0.7),  # 0.3 exactly (the float edge) → lev 0.3
        (99.0, 0.0),  # 0.98 → lev 1.0
        (1.0, 0.0),
        (0.0, 0.0),  # outside (0, 2φ)
        (100.0, 0.0),  # 2φ is outside
        (-5.0, 0.0),
        (150.0, 0.0),
    ],
)
def test_f1_levels_and_window(d, want):
    assert ev.f1(d, 50.0, L) == pytest.approx(want)


def test_f1_at_the_float_edge():
    assert abs(0.7 - 1.0) / 1.0 == 0.30000000000000004
    assert ev.f1(0.7, 1.0, L) == pytest.approx(0.7)
    assert ev.f1(1.3, 1.0, L) == pytest.approx(0.7)


@pytest.mark.parametrize("phi", [0.0, -10.0])
def test_f1_is_zero_when_no_move_helps(phi):
    for d in (-1.0, 0.0, 1.0, 10.0):
        assert ev.f1(d, phi, L) == 0.0


@PROPS
@given(st.floats(0.01, 1e4), st.floats(-1e4, 3e4))
def test_f1_in_unit_interval_and_zero_outside_window(phi, d):
    v = ev.f1(d, phi, L)
    assert 0.0 <= v <= 1.0
    if not 0.0 < d < 2 * phi:
        assert v == 0.0
    # Symmetric around φ.
    mirror = 2 * phi - d
    if 0 < d < 2 * phi and 0 < mirror < 2 * phi:
        assert ev.f1(mirror, phi, L) == pytest.approx(v, abs=1.0 / L + 1e-9)


# -- rank_o, rank_u, f2 ------------------------------------------------------------------------


def test_rank_o_and_rank_u_by_hand():
    over = [(10.0, 1.0), (6.0, 1.0)]
    under = [(1.0, 1.0), (4.0, 1.0)]
    assert ev.rank_o(10.0, 1.0, over, 0.0, L) == 1.0
    assert ev.rank_o(6.0, 1.0, over, 0.0, L) == 0.6
    assert ev.rank_u(1.0, 1.0, under, 0.0, L) == 1.0
    assert ev.rank_u(4.0, 1.0, under, 0.0, L) == 0.3  # 1/4 → level 0.3
    # With x: (dc − x/c). x = 2: top = 10 − 2 = 8; 6 − 2 = 4 → 0.5.
    assert ev.rank_o(6.0, 1.0, over, 2.0, L) == 0.5
    # rank_u with x = 2: min = 1 + 2 = 3; mine 4 + 2 = 6 → 0.5.
    assert ev.rank_u(4.0, 1.0, under, 2.0, L) == 0.5


def test_rank_o_and_rank_u_use_capacities():
    # x = 4: (12 − 4/4) = 11 vs (10 − 4/1) = 6 → the big node is the most overloaded.
    over = [(12.0, 4.0), (10.0, 1.0)]
    assert ev.rank_o(12.0, 4.0, over, 4.0, L) == 1.0
    assert ev.rank_o(10.0, 1.0, over, 4.0, L) == ev.lev(6 / 11, L)
    # x = 4: (1 + 4/1) = 5 vs (2 + 4/4) = 3 → the big node is the most underloaded.
    under = [(1.0, 1.0), (2.0, 4.0)]
    assert ev.rank_u(2.0, 4.0, under, 4.0, L) == 1.0
    assert ev.rank_u(1.0, 1.0, under, 4.0, L) == ev.lev(3 / 5, L)


def test_rank_o_counts_itself_and_handles_empty_lists():
    assert ev.rank_o(7.0, 1.0, [], 0.0, L) == 1.0
    assert ev.rank_u(0.5, 1.0, [], 0.0, L) == 1.0
    # Heavier than every node it knows of: rank 1, not above.
    assert ev.rank_o(20.0, 1.0, [(10.0, 1.0)], 0.0, L) == 1.0
    assert ev.rank_u(0.1, 1.0, [(3.0, 1.0)], 0.0, L) == 1.0
    # Degenerate zero loads stay in [0, 1].
    assert ev.rank_o(0.0, 1.0, [(0.0, 1.0)], 0.0, L) == 1.0
    assert ev.rank_u(0.0, 1.0, [(0.0, 1.0)], 0.0, L) == 1.0


def test_f2_pairs_the_most_overloaded_with_the_most_underloaded():
    over = [(10.0, 1.0), (6.0, 1.0)]
    under = [(1.0, 1.0), (4.0, 1.0)]
    ro = {dc: ev.rank_o(dc, 1.0, over, 0.0, L) for dc, _ in over}
    ru = {dc: ev.rank_u(dc, 1.0, under, 0.0, L) for dc, _ in under}
    f2 = {(o, u): ev.f2(ro[o], ru[u]) for o in ro for u in ru}
    assert f2[(10.0, 1.0)] == 1.0 == max(f2.values())
    # The most overloaded prefers the most underloaded …
    assert f2[(10.0, 1.0)] > f2[(10.0, 4.0)]
    # … the mildly overloaded one the mildly underloaded one.
    assert f2[(6.0, 4.0)] > f2[(6.0, 1.0)]


@PROPS
@given(
    st.lists(st.tuples(st.floats(5.0, 100.0), st.floats(0.5, 10.0)), min_size=1, max_size=6),
    st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.5, 10.0)), min_size=1, max_size=6),
    st.floats(0.0, 2.0),
)
def test_f2_is_highest_for_the_extreme_pair(over, under, x):
    top = max(over, key=lambda n: n[0] - x / n[1])
    bottom = min(under, key=lambda n: n[0] + x / n[1])
    ro = [ev.rank_o(dc, c, over, x, L) for dc, c in over]
    ru = [ev.rank_u(dc, c, under, x, L) for dc, c in under]
    for v in ro + ru:
        assert 0.0 <= v <= 1.0
    assert ev.rank_o(*top, over, x, L) == 1.0
    assert ev.rank_u(*bottom, under, x, L) == 1.0
    best = ev.f2(ev.rank_o(*top, over, x, L), ev.rank_u(*bottom, under, x, L))
    assert best == 1.0
    for a in ro:
        for b in ru:
            assert 0.0 <= ev.f2(a, b) <= best


# -- f3, f4 ------------------------------------------------------------------------------------


def test_mig_cost_and_f3():
    assert ev.mig_cost(100, 50.0) == 2.0
    assert ev.mig_cost(0, 50.0) == 0.0
    assert ev.f3(2.0, 2.0, L) == 1.0  # the cheapest move
    assert ev.f3(4.0, 2.0, L) == 0.5
    assert ev.f3(6.0, 2.0, L) == 0.4  # 1/3 → level 0.4
    assert ev.f3(2000.0, 2.0, L) == 0.1
    assert ev.f3(0.0, 0.0, L) == 1.0  # a free move
    assert ev.f3(5.0, 0.0, L) == 0.0  # a free alternative exists


def test_f3_bandwidth():
    assert ev.f3_bandwidth(100.0, 100.0, L) == 1.0
    assert ev.f3_bandwidth(30.0, 100.0, L) == 0.3
    assert ev.f3_bandwidth(31.0, 100.0, L) == 0.4
    assert ev.f3_bandwidth(10.0, 0.0, L) == 0.0


def test_f4():
    assert ev.f4(0.0, L) == 0.0
    assert ev.f4(0.3, L) == 0.3
    assert ev.f4(0.25, L) == 0.3
    assert ev.f4(1.0, L) == 1.0


@PROPS
@given(st.floats(0.0, 1e6), st.floats(0.0, 1e6))
def test_f3_in_unit_interval_and_cheapest_is_best(a, b):
    lo, hi = min(a, b), max(a, b)
    assert 0.0 <= ev.f3(hi, lo, L) <= 1.0
    assert ev.f3(lo, lo, L) == 1.0
    assert ev.f3(hi, lo, L) <= ev.f3(lo, lo, L)


# -- rank1, rank2 ------------------------------------------------------------------------------


def test_rank1_weights():
    assert ev.rank1(1.0, 0.7, 0.2) == 0.7
    assert ev.rank1(0.0, 0.7, 0.2) == 0.2
    assert ev.rank1(0.5, 0.7, 0.2) == pytest.approx(0.45)
    assert ev.rank1(0.25, 1.0, 0.0) == pytest.approx(0.25)


def test_rank2_weights():
    assert ev.rank2(1.0, 0.0, 0.0, 0.9, 0.1, 0.2) == 0.9
    assert ev.rank2(0.0, 1.0, 0.0, 0.9, 0.1, 0.2) == 0.1
    assert ev.rank2(0.0, 0.0, 1.0, 0.9, 0.1, 0.2) == 0.2
    # SPEC defaults α=0.6, β=0.2, γ=0.2.
    assert ev.rank2(0.6, 0.2, 0.2, 1.0, 0.5, 0.0) == pytest.approx(0.7)


unit = st.floats(0.0, 1.0)


@PROPS
@given(unit, unit, unit, unit, unit, unit)
def test_rank1_and_rank2_stay_in_unit_interval(w, a, b, f1, f3, f4):
    assert 0.0 <= ev.rank1(w, f1, f3) <= 1.0 + 1e-12
    total = a + b + 1.0
    alpha, beta, gamma = a / total, b / total, 1.0 / total  # α + β + γ = 1
    r = ev.rank2(alpha, beta, gamma, f1, f3, f4)
    assert min(f1, f3, f4) - 1e-12 <= r <= max(f1, f3, f4) + 1e-12
