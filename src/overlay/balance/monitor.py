"""The monitoring loop of every node (SPEC §5, §6), as a pure class.

Theory of operation:

1. Time is cut into slices of length ``T``.  At the end of a slice the node
   reports its load ``d`` (the sum of its channels' costs in the slice); the
   monitor computes ``dc = d / c``, and, when LIEMs of every live peer are in,
   ``dc̄`` over the node and those peers, ``Δd = δ·dc̄`` and the new state:
   ``UNDERLOADED`` if ``dc < dc̄ − Δd``, ``OVERLOADED`` if ``dc > dc̄ + Δd``,
   ``STABLE`` otherwise.
2. ``BUSY`` is entered only from OVERLOADED (as sender) or UNDERLOADED (as
   receiver) and left to STABLE when the session completes, or back to the
   state before it when refused or aborted.  While BUSY the slice does not
   change the state.  A node starts UNDERLOADED.
3. A peer is live while its last LIEM is at most ``LIVE_SLICES`` slices old.
   ``u_nodes``/``o_nodes`` hold the live peers lighter/heavier than this node;
   a peer is in at most one of them.
4. An OVERLOADED node starts scheduling with probability ``p`` (the random
   source is injected, so the simulator is deterministic).  The draws are
   systematic, not independent: a credit starts at a random phase in [0, 1)
   and grows by ``p`` at each draw; a draw schedules when the credit reaches
   1 (and pays 1).  Every draw still schedules with probability exactly
   ``p`` (the phase is uniform), and nodes' phases are independent, so they
   stay out of step as ``p`` intends; but a node overloaded for ``k`` slices
   schedules ``⌊k·p⌋`` or ``⌈k·p⌉`` times, never waiting more than ``⌈1/p⌉``
   slices — independent draws left the hot node idle for 3–4 slices in a row
   one run in eight (p = ½), which is what slowed convergence.
5. Idle: below ``min_load`` (subscriptions tested per configured slice) a
   node's load is noise, not work.  A node under it is never OVERLOADED
   (STABLE instead: it starts no session), and when every live node is under
   it the cluster is idle and every node is STABLE — two events in an hour
   must not make the node that matched them look overloaded.
6. Anti-jitter: when scheduling ran ``JITTER_RUNS`` times in a row, each
   within ``JITTER_GAP`` slices of the previous, ``T`` grows to 150 % of the
   configured slice; after ``CALM_SLICES`` slices without scheduling it
   returns to the configured length.
"""

from __future__ import annotations

import enum
import random
from itertools import pairwise
from typing import Final

import msgspec

from overlay.errors import LocalProtocolError

__all__ = ["Monitor", "NodeState", "PeerLoad", "SliceReport"]

LIVE_SLICES: Final = 3
JITTER_RUNS: Final = 3
JITTER_GAP: Final = 2
CALM_SLICES: Final = 5
STRETCH: Final = 1.5


class NodeState(enum.StrEnum):
    UNDERLOADED = "UNDERLOADED"
    STABLE = "STABLE"
    OVERLOADED = "OVERLOADED"
    BUSY = "BUSY"


class PeerLoad(msgspec.Struct, frozen=True):
    """What the latest LIEM of a peer said, and in which of our slices it came."""

    node: int
    state: NodeState
    d: float
    dc: float
    capacity: float
    slice_no: int


class SliceReport(msgspec.Struct, frozen=True):
    """The outcome of one slice (rule 1)."""

    slice_no: int
    d: float
    dc: float
    mean: float | None
    state: NodeState
    schedule: bool
    slice_seconds: float
    spread: float | None


class Monitor:
    """Rules 1–6. Invariant: ``state`` is BUSY iff ``_before_busy`` is not None."""

    def __init__(
        self,
        node_id: int,
        capacity: float,
        peers: list[int],
        *,
        delta: float,
        slice_seconds: float,
        probability: float,
        rng: random.Random,
        min_load: float = 0.0,
    ) -> None:
        self.node_id = node_id
        self.capacity = capacity
        self.peers = list(peers)
        self.delta = delta
        self.base_slice = slice_seconds
        self.slice_seconds = slice_seconds
        self.probability = probability
        self.min_load = min_load
        self.rng = rng
        self.state = NodeState.UNDERLOADED
        self._before_busy: NodeState | None = None
        self.slice_no = 0
        self.d = 0.0
        self.dc = 0.0
        self.mean: float | None = None
        self.loads: dict[int, PeerLoad] = {}
        self._runs: list[int] = []
        self._credit: float | None = None  # rule 4: drawn at the first draw, from ``rng``

    # -- LIEMs (rule 3) ------------------------------------------------------------------

    def on_liem(self, node: int, state: str, d: float, dc: float, capacity: float) -> None:
        try:
            st = NodeState(state)
        except ValueError:
            raise LocalProtocolError(f"LIEM from node {node} has unknown state {state!r}") from None
        self.loads[node] = PeerLoad(node, st, d, dc, capacity, self.slice_no)

    def live(self) -> list[PeerLoad]:
        peers = set(self.peers)  # ``peers`` is a list: testing it per LIEM made this O(n²)
        return [p for p in self.loads.values() if self.slice_no - p.slice_no <= LIVE_SLICES and p.node in peers]

    def u_nodes(self) -> list[PeerLoad]:
        """Live peers lighter than this node (``dc_j < dc_i``)."""
        return [p for p in self.live() if p.dc < self.dc]

    def o_nodes(self) -> list[PeerLoad]:
        """Live peers heavier than this node (``dc_j > dc_i``)."""
        return [p for p in self.live() if p.dc > self.dc]

    def add_peer(self, node: int) -> None:
        if node not in self.peers and node != self.node_id:
            self.peers.append(node)

    def remove_peer(self, node: int) -> None:
        if node in self.peers:
            self.peers.remove(node)
        self.loads.pop(node, None)

    # -- slices (rules 1, 4–6) ------------------------------------------------------------

    def end_slice(self, d: float, *, decide: bool = True) -> SliceReport:
        """Close a slice with load ``d``.  With ``decide=False`` only the load and
        a provisional state are computed — no draw of p, no anti-jitter — and
        ``refresh()`` decides once the peers' LIEMs of the same slice are in."""
        self.slice_no += 1
        self.d = d
        self.dc = d / self.capacity
        return self._assess(decide)

    def refresh(self) -> SliceReport:
        """Rules 1, 4, 5 and 6 for the slice last closed, with the LIEMs in now."""
        return self._assess(True)

    def _assess(self, decide: bool) -> SliceReport:
        d = self.d
        live = self.live()
        levels = [self.dc] + [p.dc for p in live]
        self.mean = sum(levels) / len(levels)
        if self.state is not NodeState.BUSY:
            self.state = self._state(live)
        schedule = decide and self.state is NodeState.OVERLOADED and bool(live) and self._draw()
        if schedule:
            self._runs.append(self.slice_no)
            del self._runs[:-JITTER_RUNS]  # rule 6 reads only the last runs; keep memory bounded
        if decide:
            self._stretch()
        n = len(levels)
        spread = (sum((v - self.mean) ** 2 for v in levels) / n) ** 0.5
        return SliceReport(self.slice_no, d, self.dc, self.mean, self.state, schedule, self.slice_seconds, spread)

    def _draw(self) -> bool:
        """Rule 4: one systematic draw with probability ``p``."""
        if self._credit is None:
            self._credit = self.rng.random()
        self._credit += self.probability
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False

    def _state(self, live: list[PeerLoad]) -> NodeState:
        """Rules 1 and 5."""
        assert self.mean is not None
        if max((p.d for p in live), default=0.0) < self.min_load and self.d < self.min_load:
            return NodeState.STABLE  # an idle cluster
        state = self.classify(self.dc, self.mean)
        if state is NodeState.STABLE:
            state = self._pair_state(live)
        if state is NodeState.OVERLOADED and self.d < self.min_load:
            return NodeState.STABLE
        return state

    def classify(self, dc: float, mean: float) -> NodeState:
        dd = self.delta * mean
        if dc < mean - dd:
            return NodeState.UNDERLOADED
        if dc > mean + dd:
            return NodeState.OVERLOADED
        return NodeState.STABLE

    def _pair_state(self, live: list[PeerLoad]) -> NodeState:
        """Rule 1's STABLE is "close to the mean and no move improves it" (SPEC
        §5).  A node on one side of the mean, with a live peer beyond Δd on the
        other side and more than 2·Δd away, has a move that lowers S by a
        useful amount (φ > Δd, SPEC §7): it is OVERLOADED (above) or
        UNDERLOADED (below).  Without this, e.g. three nodes at +δ and two at
        −1.5·δ are all left alone with S/dc̄ ≈ 1.2·δ; with it, only pairs of
        nodes less than 2·Δd apart stay, so S/dc̄ stays about δ or below.  The
        2·Δd gap keeps slice-to-slice noise from moving channels to and fro."""
        assert self.mean is not None
        dd = self.delta * self.mean
        if self.dc > self.mean and any(p.dc < self.mean - dd and self.dc - p.dc > 2 * dd for p in live):
            return NodeState.OVERLOADED
        if self.dc < self.mean and any(p.dc > self.mean + dd and p.dc - self.dc > 2 * dd for p in live):
            return NodeState.UNDERLOADED
        return NodeState.STABLE

    def _stretch(self) -> None:
        runs = self._runs[-JITTER_RUNS:]
        if (
            len(runs) == JITTER_RUNS
            and runs[-1] == self.slice_no
            and all(b - a <= JITTER_GAP for a, b in pairwise(runs))
        ):
            self.slice_seconds = self.base_slice * STRETCH
        elif self._runs and self.slice_no - self._runs[-1] >= CALM_SLICES:
            self.slice_seconds = self.base_slice

    # -- BUSY (rule 2) ----------------------------------------------------------------------

    def enter_busy(self, as_sender: bool) -> None:
        allowed = NodeState.OVERLOADED if as_sender else NodeState.UNDERLOADED
        if self.state is not allowed:
            raise LocalProtocolError(
                f"node {self.node_id} cannot become BUSY as {'sender' if as_sender else 'receiver'} "
                f"from {self.state.value}"
            )
        self._before_busy = self.state
        self.state = NodeState.BUSY

    def leave_busy(self, completed: bool) -> None:
        if self._before_busy is None:
            return
        self.state = NodeState.STABLE if completed else self._before_busy
        self._before_busy = None

    @property
    def busy(self) -> bool:
        return self.state is NodeState.BUSY
