"""The node's journal of balancing and membership decisions (SPEC §7, §8, §14).

Every decision a node takes — a slice closed, a state change, a migration,
an abort, a split, a drain step, a peer joining — is one JSON-ready dict
appended here (the last ``JOURNAL_SIZE``), mirrored into the capture when the
shell captures (SPEC §13, kind ``journal``), and counted as
``journal_<kind>``.  Operators read it through ``admin journal`` and the
admin endpoint; the replay checks the decisions against the loads.

An entry's ``time`` is when its decision was taken, which is not always when
it was recorded: a state change is stamped with the close of its slice but
recorded when the peers' loads of that slice are in, an abort with the start
of its session.  So the entries are in the order they were recorded, not in
time order, and ``latest`` — what ``/balancing`` answers — orders them by time
and selects by time (every entry newer than ``since``, wherever it sits).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from overlay.capture import CaptureBuffer

__all__ = ["JOURNAL_SIZE", "Journal", "latest"]

# Entries a node keeps (a few hundred bytes each).
JOURNAL_SIZE: Final = 2000


class Journal:
    """The entries, and how to stamp one: node id, time, slice number."""

    __slots__ = ("_node", "_stats", "capture", "entries", "slice_no")

    def __init__(self, node: int, stats: Counter[str]) -> None:
        self._node = node
        self._stats = stats
        self.entries: deque[dict[str, Any]] = deque(maxlen=JOURNAL_SIZE)
        self.capture: CaptureBuffer | None = None
        # The current slice number: balancing's monitor owns it (set when it exists).
        self.slice_no: Callable[[], int] = lambda: 0

    def record(self, kind: str, now: float, **fields: Any) -> None:
        entry = {"kind": kind, "node": self._node, "time": round(now, 4), "slice": self.slice_no(), **fields}
        self.entries.append(entry)
        if self.capture is not None:
            self.capture.journal(entry)
        self._stats[f"journal_{kind}"] += 1


def latest(
    entries: Iterable[dict[str, Any]],
    n: int,
    kinds: Iterable[str],
    since: float | None = None,
    idle: bool = True,
) -> list[dict[str, Any]]:
    """The ``n`` latest entries of ``kinds`` newer than ``since``, oldest
    first, by their ``time`` (the module docstring says why not by their
    place); ``idle=False`` leaves out receiver rankings that found no
    candidate (an overloaded node with no underloaded peer logs one per slice).
    Entries of one time keep their recorded order."""
    wanted = set(kinds)
    out = [
        e
        for e in entries
        if e["kind"] in wanted
        and (since is None or e["time"] > since)
        and (idle or e["kind"] != "decision" or e.get("phase") != "receivers" or e.get("candidates"))
    ]
    out.sort(key=lambda e: e["time"])  # stable: ties stay in recorded order
    return out[-n:] if n > 0 else []
