"""Per-channel loads as balancing ranks them, and where channels were before (SPEC §5, §7).

Rules (numbered as in ``overlay.node.balancing``):

1. Loads are per configured slice length T: a slice ends on the first tick
   past its end, and anti-jitter stretches T, so a raw slice sum would grow
   with the slice's real length and make nodes incomparable.  A channel's
   load is the mean of its last two slices here (one for a channel new
   here): which slice an event falls in depends on how far the node is
   behind when the slice closes, and the two-slice window cancels that
   ±10 % swing, which Δd would otherwise take for load.  A split child
   starts with its share of the parent's load.
7. A channel does not go back to a node it left less than ``RETURN_SLICES``
   slices ago: the nodes it left travel with it (``ChannelSpec.past_owners``,
   at most ``MAX_PAST_OWNERS``), split children inherit them, merges join
   them, and only local channels keep theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from overlay.channels.channel import Channel, ChannelId
from overlay.messages import peer as pm

__all__ = ["MAX_PAST_OWNERS", "RETURN_SLICES", "ChannelLoads"]

# Rule 7: a channel stays away from a node it left for this many slices, and
# remembers this many of the nodes it left.
RETURN_SLICES: Final = 30
MAX_PAST_OWNERS: Final = 8


class ChannelLoads:
    """Rules 1 and 7 for one node's local channels."""

    def __init__(self, node: int) -> None:
        self._node = node
        self._slice_started = 0.0
        self.scale = 1.0  # configured T / the last slice's real length
        self._load: dict[ChannelId, float] = {}  # per configured T, two-slice mean (rule 1)
        self._slice_load: dict[ChannelId, float] = {}  # per configured T, last slice alone
        self._past_owners: dict[ChannelId, tuple[pm.PastOwner, ...]] = {}  # oldest first

    def start(self, now: float) -> None:
        """The first slice starts now."""
        self._slice_started = now

    def end_slice(self, raw: Mapping[ChannelId, float], now: float, base_slice: float) -> tuple[float, float]:
        """Rule 1 at a slice's end, from each local channel's raw slice load:
        the slice's real length and its total load per configured T."""
        for gone in [c for c in self._past_owners if c not in raw]:  # rule 7: only local channels
            del self._past_owners[gone]
        elapsed, self._slice_started = now - self._slice_started, now
        self.scale = base_slice / elapsed if elapsed > 0 else 1.0
        loads = {c: v * self.scale for c, v in raw.items()}
        # The mean of this slice and the last one (not of the last mean: that
        # decays geometrically, and an idle channel kept a load of 6e-61).
        # A channel without a last slice here (a split child) counts its share.
        last, prev = self._slice_load, self._load
        self._load = {c: (v + last.get(c, prev.get(c, v))) / 2 for c, v in loads.items()}
        self._slice_load = loads
        return elapsed, sum(loads.values())

    def total(self) -> float:
        """This node's load d: the sum of its channels' loads."""
        return sum(self._load.values())

    def all(self) -> Mapping[ChannelId, float]:
        """Every local channel's load, as of the last slice."""
        return self._load

    def past_owners(self, chid: ChannelId) -> tuple[pm.PastOwner, ...]:
        """The nodes ``chid`` left lately, oldest first (rule 7)."""
        return self._past_owners.get(chid, ())

    def get(self, chid: ChannelId) -> float | None:
        return self._load.get(chid)

    def of(self, ch: Channel) -> float:
        """``ch``'s load; a new split child's is its share of the parent's last slice."""
        return self._load.get(ch.id, ch.last.load * self.scale)

    def divide(self, parent: Channel, children: Sequence[Channel]) -> None:
        """A split (rule 1): the children share the parent's load in proportion
        to the last slice; they are channels of their own (rule 7)."""
        whole = parent.last.load or 1
        parent_load = self._load.pop(parent.id, parent.last.load * self.scale)
        for c in children:
            self._load[c.id] = parent_load * c.last.load / whole
        self._past_owners.pop(parent.id, None)

    def merged(self, parts: Iterable[ChannelId], merged: ChannelId) -> None:
        """A merge (rule 7): the merged channel keeps the nodes its parts left."""
        past = sorted({p for c in parts for p in self._past_owners.pop(c, ())}, key=lambda p: p.left)
        if past:
            self._past_owners[merged] = tuple(past[-MAX_PAST_OWNERS:])

    def returns_to(self, chid: ChannelId, node: int, now: float, base_slice: float) -> bool:
        """Rule 7: ``chid`` left ``node`` less than RETURN_SLICES slices ago."""
        horizon = now - RETURN_SLICES * base_slice
        return any(p.node == node and p.left > horizon for p in self._past_owners.get(chid, ()))

    def past_owners_leaving(self, chid: ChannelId, now: float) -> tuple[pm.PastOwner, ...]:
        """What travels with ``chid`` when it leaves this node now (rule 7)."""
        return (*self._past_owners.get(chid, ()), pm.PastOwner(self._node, now))[-MAX_PAST_OWNERS:]

    def arrived_from(self, chid: ChannelId, past: Sequence[pm.PastOwner]) -> None:
        """``chid`` arrived with the nodes it left lately (rule 7)."""
        if past:
            self._past_owners[chid] = tuple(past)
