"""Copies of key states a home keeps on its backup (SPEC §10; ``node.keyhome``).

A key's home tells the key's backup what its sequencer does, in the order it
does it; the backup keeps what it needs to carry on where the home stopped:
the state of ``overlay.seq.Sequencer`` rule 8, and nothing about timers.

Rules:

1. ``arrived(key, rank, event)``: the key holds ``event`` at ``rank`` (held
   or in flight: a copy does not tell them apart — whatever it holds at the
   sequence rank or above is not complete).
2. ``advanced(key, seq)``: every rank below ``seq`` is complete (delivered,
   skipped, or timed out); their events go.  A sequence rank never goes down.
3. ``put(state)`` replaces the key's copy with the home's whole state (a new
   backup, a drop by expiry); ``merge(state)`` unites a state with the copy
   (handovers: two copies of one key agree on every rank they share, one
   home assigned it); ``forget(key)`` drops it (the home forgot it, or the
   key has another backup now); ``take(key)`` removes and returns it.  A
   state's ``released`` flag (its event of the sequence rank is out, from a
   home that passes its completion on) holds until the rank is complete.
4. Bounded as the sequencer is: at most ``max_keys`` keys and ``max_held``
   + 1 events per key (what the home can hold plus the one in flight).  The
   home refuses arrivals past its own bounds, so a copy past them means two
   views disagreed: the newest key or event is refused, counted
   (``copies_refused``), and the home's next full state mends it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from overlay.seq.sequencer import KeyState

__all__ = ["KeyCopies"]


class _Copy:
    __slots__ = ("events", "last_assigned", "released", "seq")

    def __init__(self, seq: int = 1, last_assigned: int = 0, events: dict[int, Any] | None = None) -> None:
        self.seq = seq
        self.last_assigned = last_assigned
        self.events: dict[int, Any] = events if events is not None else {}
        self.released = False  # KeyState.released, of this sequence rank


class KeyCopies:
    """Rules 1–4.  Invariant: every event of a copy has a rank at least its
    sequence rank and at most its last rank assigned."""

    def __init__(self, max_keys: int, max_held: int) -> None:
        self.max_keys = max_keys
        self.max_events = max_held + 1
        self._keys: dict[str, _Copy] = {}
        self.counters: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def key_list(self) -> list[str]:
        return list(self._keys)

    def _copy(self, key: str) -> _Copy | None:
        c = self._keys.get(key)
        if c is None:
            if len(self._keys) >= self.max_keys:
                self.counters["copies_refused"] += 1
                return None
            c = self._keys[key] = _Copy()
        return c

    def arrived(self, key: str, rank: int, event: Any) -> None:
        """Rule 1."""
        c = self._copy(key)
        if c is None or rank < c.seq:
            return
        if rank not in c.events and len(c.events) >= self.max_events:
            self.counters["copies_refused"] += 1
            return
        c.events[rank] = event
        if rank > c.last_assigned:
            c.last_assigned = rank

    def advanced(self, key: str, seq: int) -> None:
        """Rule 2."""
        c = self._copy(key)
        if c is None or seq <= c.seq:
            return
        c.seq = seq
        c.released = False
        c.last_assigned = max(c.last_assigned, seq - 1)
        for r in [r for r in c.events if r < seq]:
            del c.events[r]

    def put(self, state: KeyState) -> None:
        """Rule 3: the home's whole state."""
        self._keys.pop(state.key, None)
        c = self._copy(state.key)
        if c is None:
            return
        c.seq = max(1, state.seq)
        c.released = state.released
        c.last_assigned = max(state.last_assigned, c.seq - 1)
        for r in sorted(state.events)[: self.max_events]:
            if r >= c.seq:
                c.events[r] = state.events[r]

    def merge(self, state: KeyState) -> None:
        """Rule 3: ``state`` united with the copy held."""
        if state.key not in self._keys:
            self.put(state)
            return
        self.advanced(state.key, state.seq)
        c = self._keys[state.key]
        if state.seq == c.seq and state.released:
            c.released = True
        c.last_assigned = max(c.last_assigned, state.last_assigned)
        for r in sorted(state.events):
            self.arrived(state.key, r, state.events[r])

    def forget(self, key: str) -> None:
        self._keys.pop(key, None)

    def state(self, key: str) -> KeyState | None:
        c = self._keys.get(key)
        return None if c is None else KeyState(key, c.seq, c.last_assigned, dict(c.events), c.released)

    def take(self, key: str) -> KeyState | None:
        st = self.state(key)
        self._keys.pop(key, None)
        return st
