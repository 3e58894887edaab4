"""The evaluators of SPEC §7: ``lev``, φ, f1–f4, rank1 and rank2.

All pure functions; each evaluator lies in ``[0, 1]``, larger is better.

φ (SPEC §7, "optimal amount"): moving load ``x`` from ``g_i`` to ``g_j``
changes ``n·S²`` by the parabola ``−2x·A + x²·B`` with

    A = (dc_i − dc̄)/c_i − (dc_j − dc̄)/c_j
    B = 1/c_i² + 1/c_j² − (1/c_i − 1/c_j)²/n

(``dc̄`` before the move), so the best amount is ``φ = A / B`` and any load in
``(0, 2φ)`` lowers S.  With equal capacities ``φ = (d_i − d_j)/2``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = [
    "f1",
    "f2",
    "f3",
    "f3_bandwidth",
    "f4",
    "lev",
    "mig_cost",
    "phi",
    "rank1",
    "rank2",
    "rank_o",
    "rank_u",
    "spread",
]


def lev(x: float, levels: int) -> float:
    """``lev(x) = ⌈x·L⌉ / L`` for ``x`` clamped to ``[0, 1]``."""
    if x <= 0.0 or math.isnan(x):
        return 0.0
    if x >= 1.0:
        return 1.0
    # Round first so a computed 0.3 (0.1·3 → ·10 = 3.0000000000000004) stays at level 3.
    return math.ceil(round(x * levels, 9)) / levels


def spread(dc: Sequence[float]) -> float:
    """``S = sqrt((1/n) Σ (dc_i − dc̄)²)`` (SPEC §5)."""
    n = len(dc)
    if n == 0:
        return 0.0
    mean = sum(dc) / n
    return math.sqrt(sum((v - mean) ** 2 for v in dc) / n)


def phi(dc_i: float, c_i: float, dc_j: float, c_j: float, dc_mean: float, n: int) -> float:
    """The load to move from ``g_i`` to ``g_j`` that lowers S the most (≤ 0: none)."""
    a = (dc_i - dc_mean) / c_i - (dc_j - dc_mean) / c_j
    b = 1.0 / c_i**2 + 1.0 / c_j**2 - (1.0 / c_i - 1.0 / c_j) ** 2 / n
    return a / b


def f1(d_ik: float, phi_: float, levels: int) -> float:
    """How good moving a channel of load ``d_ik`` is: 1 at φ, 0 outside ``(0, 2φ)``."""
    if phi_ <= 0.0 or not 0.0 < d_ik < 2.0 * phi_:
        return 0.0
    return 1.0 - lev(abs(d_ik - phi_) / phi_, levels)


def rank_o(dc_i: float, c_i: float, overloaded: Iterable[tuple[float, float]], x: float, levels: int) -> float:
    """``lev((dc_i − x/c_i) / max_o(dc_o − x/c_o))`` over known overloaded ``(dc, c)``."""
    top = max((dc - x / c for dc, c in overloaded), default=dc_i - x / c_i)
    top = max(top, dc_i - x / c_i)
    if top <= 0.0:
        return 1.0
    return lev((dc_i - x / c_i) / top, levels)


def rank_u(dc_j: float, c_j: float, underloaded: Iterable[tuple[float, float]], x: float, levels: int) -> float:
    """``lev(min_u(dc_u + x/c_u) / (dc_j + x/c_j))`` over known underloaded ``(dc, c)``."""
    low = min((dc + x / c for dc, c in underloaded), default=dc_j + x / c_j)
    low = min(low, dc_j + x / c_j)
    mine = dc_j + x / c_j
    if mine <= 0.0:
        return 1.0
    return lev(low / mine, levels)


def f2(rank_o_i: float, rank_u_j: float) -> float:
    """``1 − |rank_o(g_i) − rank_u(g_j)|``: the most overloaded prefers the most underloaded."""
    return 1.0 - abs(rank_o_i - rank_u_j)


def mig_cost(subscriptions: int, bw: float) -> float:
    """``mig_cost = mig_chsize / bw_ij`` (SPEC §5)."""
    return subscriptions / bw


def f3(cost: float, min_cost: float, levels: int) -> float:
    """``lev(min_mig_cost / mig_cost)``; a free move scores 1."""
    if cost <= 0.0:
        return 1.0
    return lev(min_cost / cost, levels)


def f3_bandwidth(bw_ij: float, bw_max: float, levels: int) -> float:
    """f3 in rank1, before any channel is chosen: ``lev(bw_ij / bw_i,max)``."""
    if bw_max <= 0.0:
        return 0.0
    return lev(bw_ij / bw_max, levels)


def f4(acc_rate: float, levels: int) -> float:
    """``lev(n_ikj / n_ik)``: the share of the channel's events that entered at g_j."""
    return lev(acc_rate, levels)


def rank1(omega: float, f2_: float, f3_bw: float) -> float:
    """``ω·f2 + (1−ω)·lev(bw_ij / bw_i,max)``: how good g_j is as receiver."""
    return omega * f2_ + (1.0 - omega) * f3_bw


def rank2(alpha: float, beta: float, gamma: float, f1_: float, f3_: float, f4_: float) -> float:
    """``α·f1 + β·f3 + γ·f4``: how good moving a channel to the chosen receiver is."""
    return alpha * f1_ + beta * f3_ + gamma * f4_
