"""Load scheduling on an overloaded node (SPEC §8.1 steps 1–5), as pure functions.

Theory of operation:

1. ``rank_receivers`` ranks the known underloaded peers lighter than this
   node (``uNodeList``) with rank1 = ω·f2 + (1−ω)·lev(bw_ij / bw_i,max), where
   f2 pairs the most overloaded sender with the most underloaded receiver
   (non-cooperative matching) with ``x = avg(g_i) = d_i / m_i``.  The result is
   the bounded ``candidate_list``, best first.
2. Once a candidate accepts, ``choose_channels`` computes φ for the pair and
   ranks this node's channels with rank2 = α·f1 + β·f3 + γ·f4.  Walking the
   ranked list it takes the first prefix whose total load is within
   ``tolerance·φ`` of φ.  When adding the next channel jumps over that window,
   that channel is to be **split** so that its cut-off part carries
   ``φ − Σ`` of the prefix (the caller cuts it with ``split.choose_cut`` and
   asks again); a single channel, or channels all heavier than the window,
   lead to the same split — this is step 2's "split first", done once a
   receiver has accepted so a refusal never costs a split.
3. Every score of every candidate is returned, so the balancing log shows
   why a receiver or a channel was chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from overlay.balance import evaluators as ev
from overlay.balance.monitor import NodeState, PeerLoad
from overlay.channels.channel import ChannelId

__all__ = [
    "MAX_CANDIDATES",
    "ChannelChoice",
    "ChannelLoad",
    "ChannelScore",
    "ReceiverScore",
    "Weights",
    "choose_channels",
    "rank_receivers",
]

MAX_CANDIDATES: Final = 8


class Weights(msgspec.Struct, frozen=True):
    omega: float = 0.5
    alpha: float = 0.6
    beta: float = 0.2
    gamma: float = 0.2
    levels: int = 10
    tolerance: float = 0.1  # the spec's "alpha" window around φ, as a fraction of φ


class ChannelLoad(msgspec.Struct, frozen=True):
    """One local channel as the scheduler sees it (last completed slice)."""

    ch_id: ChannelId
    load: int
    subscriptions: int
    access: dict[int, float] = {}
    splittable: bool = True


class ReceiverScore(msgspec.Struct, frozen=True):
    node: int
    rank1: float
    f2: float
    f3_bw: float
    rank_o: float
    rank_u: float
    dc: float
    capacity: float


class ChannelScore(msgspec.Struct, frozen=True):
    ch_id: ChannelId
    load: int
    subscriptions: int
    f1: float
    f3: float
    f4: float
    rank2: float


class ChannelChoice(msgspec.Struct, frozen=True):
    """Rule 2's outcome: move ``transfer``, or first split ``split`` cutting off ``split_load``."""

    phi: float
    scores: tuple[ChannelScore, ...]
    transfer: tuple[ChannelId, ...] = ()
    split: ChannelId | None = None
    split_load: float = 0.0

    @property
    def moved_load(self) -> int:
        by_id = {s.ch_id: s.load for s in self.scores}
        return sum(by_id[c] for c in self.transfer)


def rank_receivers(
    me: int,
    d: float,
    dc: float,
    capacity: float,
    channels: int,
    peers: Sequence[PeerLoad],
    bw: Callable[[int, int], float],
    weights: Weights,
    limit: int = MAX_CANDIDATES,
) -> list[ReceiverScore]:
    """Rule 1."""
    L = weights.levels
    x = d / channels if channels else 0.0
    under = [p for p in peers if p.state is NodeState.UNDERLOADED and p.dc < dc]
    over = [(p.dc, p.capacity) for p in peers if p.state is NodeState.OVERLOADED]
    if not under:
        return []
    r_o = ev.rank_o(dc, capacity, over, x, L)
    pool = [(p.dc, p.capacity) for p in under]
    bw_max = max(bw(me, p.node) for p in under)
    out = []
    for p in under:
        r_u = ev.rank_u(p.dc, p.capacity, pool, x, L)
        f2 = ev.f2(r_o, r_u)
        f3b = ev.f3_bandwidth(bw(me, p.node), bw_max, L)
        out.append(ReceiverScore(p.node, ev.rank1(weights.omega, f2, f3b), f2, f3b, r_o, r_u, p.dc, p.capacity))
    out.sort(key=lambda s: (-s.rank1, s.dc, s.node))
    return out[:limit]


def choose_channels(
    channels: Sequence[ChannelLoad],
    *,
    dc: float,
    capacity: float,
    receiver: int,
    receiver_dc: float,
    receiver_capacity: float,
    mean: float,
    n: int,
    bw_ij: float,
    min_mig_cost: float,
    weights: Weights,
) -> ChannelChoice:
    """Rule 2."""
    L = weights.levels
    phi = ev.phi(dc, capacity, receiver_dc, receiver_capacity, mean, n)
    scores = []
    for ch in channels:
        f1 = ev.f1(ch.load, phi, L)
        f3 = ev.f3(ev.mig_cost(ch.subscriptions, bw_ij), min_mig_cost, L)
        f4 = ev.f4(ch.access.get(receiver, 0.0), L)
        scores.append(
            ChannelScore(
                ch.ch_id,
                ch.load,
                ch.subscriptions,
                f1,
                f3,
                f4,
                ev.rank2(weights.alpha, weights.beta, weights.gamma, f1, f3, f4),
            )
        )
    scores.sort(key=lambda s: (-s.rank2, -s.load, s.ch_id))
    result = tuple(scores)
    if phi <= 0.0:
        return ChannelChoice(phi, result)
    window = weights.tolerance * phi
    by_id = {c.ch_id: c for c in channels}
    total = 0.0
    prefix: list[ChannelId] = []
    for s in scores:
        if s.load <= 0:
            continue
        if abs(total + s.load - phi) <= window:
            return ChannelChoice(phi, result, (*prefix, s.ch_id))
        if total + s.load > phi + window:
            if by_id[s.ch_id].splittable:
                return ChannelChoice(phi, result, tuple(prefix), s.ch_id, phi - total)
            continue  # cannot be cut: try the next one
        total += s.load
        prefix.append(s.ch_id)
    # Every channel fits and together they stay under the window: moving all of
    # them still lowers S (each load is in (0, 2φ)).
    return ChannelChoice(phi, result, tuple(prefix))
