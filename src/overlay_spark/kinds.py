"""The record kinds of a capture, as the replay sees them: read, or skipped on purpose.

Rules this module keeps (``spark/SCHEMA.md``, schema version 1):

1. Every kind a node writes is in exactly one of ``CONSUMED`` (the replay
   parses it with its schema in ``KIND_SCHEMAS`` and a job reads it) or
   ``SKIPPED`` (the replay counts it and does not parse it, for the reason
   given).  ``tests/test_capture_kinds.py`` collects the kinds the node code
   writes and holds both lists to it, and to ``spark/SCHEMA.md``.
2. A kind in neither list is *unknown* — written by a newer node, or a line
   without a ``kind`` (counted as ``?``).  Adding a kind does not change the
   schema version, so the replay does not refuse the file: it goes on
   without those records and **warns** — on stderr, under the report's
   notes, and in its Records table.  It never drops them silently.
3. Nothing here imports Spark: the lists are checked without a JVM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["BULK_KINDS", "CONSUMED", "KIND_SCHEMAS", "NOTE_WHEN_PRESENT", "SKIPPED", "KindReport", "classify"]

_BASE: Final = "node INT, n LONG, time DOUBLE"
_JOURNAL: Final = _BASE + ", slice INT"
_SESSION: Final = (
    _JOURNAL + ", session INT, receiver INT, channels ARRAY<STRING>, subscriptions LONG, bytes LONG, "
    "bw DOUBLE, mig_cost DOUBLE, forced BOOLEAN, duration DOUBLE"
)

# Rule 1: kind -> what reads it.
CONSUMED: Final[Mapping[str, str]] = {
    "header": "records: nodes and capacities, initializer, T, schema, version check",
    "end": "records and the capture.complete check: clean shutdown, records the writer dropped",
    "publish": "rematch (values re-matched), audit (events no owner matched)",
    "event": "loads (windows, slice costs), rematch (reported matches), audit",
    "deliver": "audit (exactly once, losses, rank order, payload bytes)",
    "drop": "audit (pairs dropped on a slow consumer are not lost)",
    "subscribe": "rematch (filter text, when asked)",
    "subscribed": "rematch (when acknowledged)",
    "unsubscribe": "rematch (when its end was asked)",
    "unsubscribed": "rematch (when its end was acknowledged)",
    "slice": "loads (per-slice d, dc, S, S/dc̄; reported channel costs)",
    "migration": "loads (S around each move, Σ mig_cost); marks the slice changed",
    "replication": "loads (as migration)",
    "replicate": "loads: marks the slice changed",
    "split": "loads: marks the slice changed; headline count",
    "merge": "loads: marks the slice changed; headline count",
    "abort": "loads: marks the slice changed; headline count",
    "sequencer": "audit (keyed events lost to expiry are counted, not lost)",
}

# Rule 1: kind -> why the replay does not read it.
SKIPPED: Final[Mapping[str, str]] = {
    "liem": "a peer's copy of another node's slice report; the replay reads each node's own `slice` record, "
    "which carries the same d, dc and state",
    "state": "the replay judges loads, moves and delivery, not the state machine; `slice.state` gives "
    "each node's state per slice",
    "decision": "the balancer's reasons (rank1/rank2 and f1–f4 scores, drain choices); the replay judges "
    "what the moves did, not why they were chosen — read them with grep/jq or /balancing",
    "slow": "loop stalls the node timed (what, source, ms): they explain latency, not load or delivery",
    "join": "membership: the replay's node set is the first header's nodes, so a node that joined "
    "mid-run is left out of S and of the per-window loads",
    "leave": "membership: a node that drained and left counts as a node with no load in the windows "
    "after it left, and slices without its report are not complete",
    "rejoin": "a node restarted and found the cluster running: channels it owned were re-created and "
    "rebuilt from the access nodes, and its capture file of before the restart was renamed `.old`, which the replay does not read — "
    "losses of that node's subscriptions around the restart are expected",
}

# Skipped kinds whose presence changes how the report reads: a note says so.
NOTE_WHEN_PRESENT: Final = frozenset({"join", "leave", "rejoin"})

# One DDL schema per consumed kind (SCHEMA.md documents each field).  Event
# values are read as map<string,string>: a JSON number keeps its exact text,
# and the re-matching casts it by the attribute's kind from the header.
KIND_SCHEMAS: Final[Mapping[str, str]] = {
    "header": _BASE + ", schema_version INT, run STRING, cluster STRING, initializer INT, slice_seconds DOUBLE, "
    "nodes ARRAY<STRUCT<id: INT, capacity: DOUBLE>>, "
    "bandwidth STRUCT<default: DOUBLE, links: ARRAY<STRUCT<a: INT, b: INT, bw: DOUBLE>>>, "
    "schema STRUCT<distinguishing: ARRAY<STRING>, attributes: ARRAY<STRUCT<name: STRING, type: STRING, min: STRING, max: STRING>>>, "
    "balancing BOOLEAN, delta DOUBLE",
    "end": _BASE + ", records LONG, dropped LONG",
    "publish": _BASE + ", event STRING, channel STRING, values MAP<STRING, STRING>, key STRING, rank LONG, "
    "payload_bytes LONG",
    "event": _BASE
    + ", event STRING, access INT, channel STRING, tested LONG, matched ARRAY<STRING>, slice INT, key STRING, rank LONG",
    "deliver": _BASE + ", event STRING, subs ARRAY<STRING>, orphans ARRAY<STRING>, payload_bytes LONG",
    "drop": _BASE + ", event STRING, session INT, subs ARRAY<STRING>",
    "subscribe": _BASE + ", sub STRING, local STRING, session INT, subscriber STRING, filter STRING",
    "subscribed": _BASE + ", sub STRING",
    "unsubscribe": _BASE + ", sub STRING, reason STRING",
    "unsubscribed": _BASE + ", sub STRING",
    "slice": _JOURNAL + ", d DOUBLE, dc DOUBLE, mean DOUBLE, spread DOUBLE, state STRING, "
    "channels MAP<STRING, DOUBLE>, slice_seconds DOUBLE, elapsed DOUBLE, d_slice DOUBLE",
    "migration": _SESSION,
    "replication": _SESSION,
    "replicate": _JOURNAL + ", channel STRING, receiver INT, load DOUBLE",
    "split": _JOURNAL
    + ", parent STRING, attr STRING, children ARRAY<STRUCT<id: STRING, space: STRING, subscriptions: LONG>>",
    "merge": _JOURNAL + ", parts ARRAY<STRING>, merged STRING, space STRING, subscriptions LONG",
    "abort": _JOURNAL + ", session INT, receiver INT, reason STRING",
    "sequencer": _JOURNAL + ", held LONG, released LONG, expired_dropped LONG, gaps_skipped LONG, ranks_skipped LONG",
}


# The kinds nearly every line of a big capture is (one per event, or per
# event and access node): ``records`` parses them into flat typed columns
# once, and these are the columns of each (the same fields as its entry in
# ``KIND_SCHEMAS``; ``values`` typed by the header's schema).
BULK_KINDS: Final[Mapping[str, tuple[str, ...]]] = {
    "publish": ("node", "n", "time", "event", "channel", "values", "key", "rank", "payload_bytes"),
    "event": ("node", "n", "time", "event", "access", "channel", "tested", "matched", "slice", "key", "rank"),
    "deliver": ("node", "n", "time", "event", "subs", "orphans", "payload_bytes"),
    "drop": ("node", "n", "time", "event", "session", "subs"),
}


@dataclass(frozen=True)
class KindReport:
    """A capture's record counts sorted by rule 1 and 2."""

    counts: Mapping[str, int]
    consumed: Mapping[str, int]
    skipped: Mapping[str, int]
    unknown: Mapping[str, int]

    def use(self, kind: str) -> str:
        """What the replay does with ``kind`` (the report's Records table)."""
        if kind in CONSUMED:
            return "read: " + CONSUMED[kind]
        if kind in SKIPPED:
            return "skipped: " + SKIPPED[kind]
        return "UNKNOWN: not read (warning)"

    @property
    def warning(self) -> str | None:
        """Rule 2: the warning for unknown kinds, or None."""
        if not self.unknown:
            return None
        listed = ", ".join(f"{'(no kind)' if k == '?' else k} ({n})" for k, n in sorted(self.unknown.items()))
        return (
            f"records of unknown kinds not read: {listed} — written by a newer node, or damaged lines; "
            "this replay does not know them, so no check uses them"
        )

    def notes(self, nodes: list[int]) -> list[str]:
        """Notes for skipped kinds that change how the report reads (``NOTE_WHEN_PRESENT``)."""
        out = []
        for k in sorted(NOTE_WHEN_PRESENT & set(self.skipped)):
            out.append(f"{self.skipped[k]} `{k}` record(s): {SKIPPED[k]}; nodes of the first header: {nodes}")
        return out


def classify(counts: Mapping[str, int]) -> KindReport:
    """Sort record counts per kind into consumed, skipped and unknown (rules 1, 2)."""
    return KindReport(
        counts=dict(counts),
        consumed={k: n for k, n in counts.items() if k in CONSUMED},
        skipped={k: n for k, n in counts.items() if k in SKIPPED},
        unknown={k: n for k, n in counts.items() if k not in CONSUMED and k not in SKIPPED},
    )
