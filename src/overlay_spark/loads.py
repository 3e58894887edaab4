"""Loads and spread (SPEC §5): per slice as the nodes reported them, per
T-window as the captured events say (with and without migrations), S around
each migration, and the nodes' reported costs against the events' costs.

Formulas (SPEC §5): ``dc_i = d_i / c_i``, ``dc̄ = (1/n) Σ dc_i``,
``S = sqrt((1/n) Σ (dc_i − dc̄)²)`` — the population deviation over the nodes.

Rules:

1. Two Spark jobs gather what every table here needs (``gather``): the
   journal records the tables read (``slice``, ``migration``,
   ``replication`` and the other table changes: a few per node and slice)
   and the owners' ``event`` records summed per (node, slice, channel,
   T-window) — rows per node, slice and channel, never per event.  Each
   table is then plain Python over those rows (``slice_table`` …
   ``slice_cost_check``): a table per Spark plan made the replay plan,
   compile and JIT-compile some sixty small stages (10–20 s of CPU on the
   1M-event capture, on the cores the audit runs on) for a few thousand
   rows.
2. The tables keep the semantics of SQL over those rows: an aggregate skips
   nulls (a sum or average of nulls only is null), a division by zero is
   null, a record whose key is null joins nothing, and nulls sort first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pyspark.sql import functions as F

from overlay_spark.kinds import KIND_SCHEMAS
from overlay_spark.records import Capture, NodeInfo

__all__ = [
    "TABLE_CHANGES",
    "LoadInputs",
    "gather",
    "migration_table",
    "slice_cost_check",
    "slice_table",
    "window_table",
]

# Journal kinds after which a node's reported slice load legitimately differs
# from the sum of its events' costs: a channel split, merged, moved or
# dropped mid-slice takes its slice-in-progress cost with it.
TABLE_CHANGES: Final = ("split", "merge", "migration", "replication", "replicate", "abort")
# The kinds whose sessions are listed in migrations.csv.
_SESSIONS: Final = ("migration", "replication")

Row = dict[str, Any]


@dataclass
class LoadInputs:
    """What the tables are computed from (rule 1): the header's nodes, start
    and T, the journal records by kind (each a dict of its ``KIND_SCHEMAS``
    fields), and per (node, slice, channel, window ``w``) the events' summed
    ``tested`` and their count ``events``."""

    nodes: list[NodeInfo]
    t0: float
    slice_seconds: float
    initializer: int
    journal: dict[str, list[Row]] = field(default_factory=dict)
    events: list[Row] = field(default_factory=list)

    def records(self, kind: str) -> list[Row]:
        return self.journal.get(kind, [])


def gather(cap: Capture) -> LoadInputs:
    """Rule 1: the two jobs (none for a kind the capture does not have)."""
    inp = LoadInputs(list(cap.nodes), cap.t0, cap.slice_seconds, cap.initializer)
    kinds = [k for k in dict.fromkeys(("slice", *_SESSIONS, *TABLE_CHANGES)) if cap.has(k)]
    if kinds:
        kind = F.col("kind")
        parsed = [F.when(kind == k, F.from_json("raw", KIND_SCHEMAS[k])).alias(k) for k in kinds]
        for r in cap.small.filter(kind.isin(*kinds)).select("kind", *parsed).collect():
            if r[r["kind"]] is not None:
                inp.journal.setdefault(r["kind"], []).append(r[r["kind"]].asDict(recursive=True))
    if cap.has("event"):
        w = F.floor((F.col("time") - F.lit(cap.t0)) / F.lit(cap.slice_seconds)).cast("long").alias("w")
        per = cap.df("event").groupBy("node", "slice", "channel", w)
        inp.events = [
            r.asDict() for r in per.agg(F.sum("tested").alias("tested"), F.count("*").alias("events")).collect()
        ]
    return inp


# -- SQL's aggregates over nullable values (rule 2) --------------------------------------------


def _present(xs: Iterable[Any]) -> list[Any]:
    return [x for x in xs if x is not None]


def _sum(xs: Iterable[Any]) -> Any:
    vals = _present(xs)
    return sum(vals) if vals else None


def _avg(xs: Iterable[float | None]) -> float | None:
    vals = _present(xs)
    return sum(vals) / len(vals) if vals else None


def _stddev_pop(xs: Iterable[float | None]) -> float | None:
    """Spark's ``stddev_pop``: the central moments updated one value at a time."""
    n, avg, m2 = 0.0, 0.0, 0.0
    for x in _present(xs):
        n += 1.0
        delta = x - avg
        delta_n = delta / n
        avg += delta_n
        m2 += delta * (delta - delta_n)
    return math.sqrt(m2 / n) if n else None


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _ratio(s: float | None, mean: float | None) -> float | None:
    """S/dc̄, defined while dc̄ > 0."""
    return s / mean if s is not None and mean is not None and mean > 0 else None


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _nulls_first(*key: Any) -> tuple[Any, ...]:
    return tuple(x for k in key for x in (k is not None, k if k is not None else 0))


# -- the tables ---------------------------------------------------------------------------------


def slice_table(inp: LoadInputs) -> list[Row]:
    """One row per slice number: every node's d and dc, dc̄, S, S/dc̄.

    The ``slice`` of a ``slice`` record is the monitor's count after closing it,
    so slice k is the same k on every node (each node's clock, started when it
    became ready).  ``complete`` says whether every node reported that slice;
    S is over the nodes that did.  Records of a node the header does not
    list are left out.
    """
    capacity = {n.id: n.capacity for n in inp.nodes}
    ids = [n.id for n in inp.nodes]
    by_slice: dict[Any, list[tuple[Row, float | None]]] = {}
    for r in inp.records("slice"):
        if r["node"] in capacity:
            by_slice.setdefault(r["slice"], []).append((r, _div(r["d"], capacity[r["node"]])))
    out = []
    for k in sorted(by_slice, key=_nulls_first):
        recs = by_slice[k]
        dcs = [dc for _, dc in recs]
        t_end = max(_present(r["time"] for r, _ in recs), default=None)
        row: Row = {
            "slice": k,
            "nodes": len(recs),
            "total_d": _sum(r["d"] for r, _ in recs),
            "mean_dc": _avg(dcs),
            "S": _stddev_pop(dcs),
            "t_start": min(_present(_sub(r["time"], r["slice_seconds"]) for r, _ in recs), default=None),
            "t_end": t_end,
        }
        for i in ids:  # each node's first record of the slice (one, unless a node reported it twice)
            mine = [(r, dc) for r, dc in recs if r["node"] == i]
            row[f"d_{i}"] = mine[0][0]["d"] if mine else None
            row[f"dc_{i}"] = mine[0][1] if mine else None
        row["S_over_mean"] = _ratio(row["S"], row["mean_dc"])
        row["complete"] = len(recs) == len(ids)
        row["t"] = _sub(t_end, inp.t0)
        out.append(row)
    return out


def window_table(inp: LoadInputs) -> tuple[list[Row], list[Row]]:
    """Recomputed loads per T-window from the owners' ``event`` records, in two
    scenarios: ``actual`` charges each event's tested count to the node that
    matched it; ``counterfactual`` to the node that owned its channel's space
    at the start.  SPEC §3 starts every run with the one channel EC on the
    initializer, and only migrations move space away, so without them every
    event is matched there.  The cost kept is the captured one (the tested
    count on the channel that really matched it).

    Returns (per scenario and window: mean_dc, S, S/dc̄, total d, events;
    per window and node, actual scenario: d, dc).  Every window from 0 to
    the last with an event has a row per node, zero where nothing was
    matched.
    """
    T = inp.slice_seconds
    tested: dict[tuple[Any, Any], list[Any]] = {}
    counts: dict[tuple[Any, Any], int] = {}
    for e in inp.events:
        key = (e["w"], e["node"])
        tested.setdefault(key, []).append(e["tested"])
        counts[key] = counts.get(key, 0) + e["events"]
    actual: dict[tuple[Any, Any], tuple[float | None, int]] = {}
    for key, ts in tested.items():
        total = _sum(ts)
        actual[key] = (None if total is None else float(total), counts[key])
    counter: dict[Any, tuple[float | None, int]] = {}
    for w in {w for w, _ in actual}:
        mine = [v for (x, _), v in actual.items() if x == w]
        counter[w] = (_sum(d for d, _ in mine), sum(n for _, n in mine))
    loads = {("actual", w, node): v for (w, node), v in actual.items()}
    loads.update({("counterfactual", w, inp.initializer): v for w, v in counter.items()})
    wmax = max(_present(w for w, _ in actual), default=None)
    # SQL's sequence(0, wmax): descending when every event is before the start.
    windows = [] if wmax is None else sorted(range(wmax + 1) if wmax >= 0 else range(wmax, 1))
    per_w: list[Row] = []
    per_node: list[Row] = []
    for scenario in ("actual", "counterfactual"):
        for w in windows:
            rows = []
            for n in inp.nodes:
                d, events = loads.get((scenario, w, n.id), (None, 0))
                d = 0.0 if d is None else d
                rows.append(
                    {
                        "w": w,
                        "node": n.id,
                        "capacity": n.capacity,
                        "d": d,
                        "events": events,
                        "dc": _div(d, n.capacity),
                        "t": (w + 1) * T,
                    }
                )
            if scenario == "actual":
                per_node += sorted(rows, key=lambda r: r["node"])
            dcs = [r["dc"] for r in rows]
            mean = _avg(dcs)
            s = _stddev_pop(dcs)
            per_w.append(
                {
                    "scenario": scenario,
                    "w": w,
                    "mean_dc": mean,
                    "S": s,
                    "total_d": _sum(r["d"] for r in rows),
                    "events": _sum(r["events"] for r in rows),
                    "S_over_mean": _ratio(s, mean),
                    "t": (w + 1) * T,
                }
            )
    return per_w, per_node


def migration_table(inp: LoadInputs, slices: Sequence[Row]) -> list[Row]:
    """Every migration and replication with S/dc̄ of the last complete slice that
    ended before it started and of the first that started after it finished
    (``slices``: ``slice_table``'s rows)."""
    migs = []
    for kind in _SESSIONS:
        for r in inp.records(kind):
            migs.append(
                {
                    "kind": kind,
                    "sender": r["node"],
                    "receiver": r["receiver"],
                    "start": _sub(r["time"], r["duration"]),
                    "done": r["time"],
                    "channels": " ".join(c for c in (r["channels"] or []) if c is not None),
                    "subscriptions": r["subscriptions"],
                    "bytes": r["bytes"],
                    "bw": r["bw"],
                    "mig_cost": r["mig_cost"],
                    "forced": r["forced"],
                    "duration": r["duration"],
                    "session": r["session"],
                }
            )
    done = [s for s in slices if s["complete"]]
    # Per session (sender, session): a session of both kinds counts as one.
    sessions: dict[tuple[Any, Any], list[Row]] = {}
    for m in migs:
        if m["sender"] is not None and m["session"] is not None:
            sessions.setdefault((m["sender"], m["session"]), []).append(m)
    before: dict[tuple[Any, Any], Row] = {}
    after: dict[tuple[Any, Any], Row] = {}
    for key, ms in sessions.items():
        pre = [
            s
            for m in ms
            for s in done
            if s["t_end"] is not None and m["start"] is not None and s["t_end"] <= m["start"]
        ]
        post = [
            s
            for m in ms
            for s in done
            if s["t_start"] is not None and m["done"] is not None and s["t_start"] >= m["done"]
        ]
        if pre:
            before[key] = max(pre, key=lambda s: s["t_end"])
        if post:
            after[key] = min(post, key=lambda s: s["t_start"])
    out = []
    for m in migs:
        b = before.get((m["sender"], m["session"]), {})
        a = after.get((m["sender"], m["session"]), {})
        out.append(
            {
                "kind": m["kind"],
                "sender": m["sender"],
                "receiver": m["receiver"],
                "t_start": _sub(m["start"], inp.t0),
                "t_done": _sub(m["done"], inp.t0),
                **{k: m[k] for k in ("channels", "subscriptions", "bytes", "bw", "mig_cost", "forced", "duration")},
                "S_before": b.get("S"),
                "ratio_before": b.get("S_over_mean"),
                "slice_before": b.get("slice"),
                "S_after": a.get("S"),
                "ratio_after": a.get("S_over_mean"),
                "slice_after": a.get("slice"),
            }
        )
    return sorted(out, key=lambda r: _nulls_first(r["t_start"]))


def slice_cost_check(inp: LoadInputs) -> tuple[list[Row], list[Row]]:
    """Each channel's reported slice load against the sum of its events' tested counts.

    An event made while the monitor's count was k is reported by the ``slice``
    record numbered k+1.  Slices in which the node split, merged, moved or
    dropped a channel are marked ``changed`` (their reported load may be
    lower: the departing channel took its slice-in-progress cost along), and
    the node's last, unclosed slice is left out.

    Returns (per node and slice: reported d, recomputed d, changed, mismatched
    channels; per node: totals).
    """
    sums: dict[tuple[Any, Any, Any], list[Any]] = {}
    for e in inp.events:
        if e["slice"] is not None:
            sums.setdefault((e["node"], e["slice"] + 1, e["channel"]), []).append(e["tested"])
    recomputed = {k: _sum(v) for k, v in sums.items()}
    slices = inp.records("slice")
    last: dict[Any, int] = {}
    for r in slices:
        if r["node"] is not None and r["slice"] is not None:
            last[r["node"]] = max(last.get(r["node"], r["slice"]), r["slice"])
    changed = {
        (r["node"], r["slice"] + 1)
        for kind in TABLE_CHANGES
        for r in inp.records(kind)
        if r["node"] is not None and r["slice"] is not None
    }
    # The reported channel loads, full outer joined with the recomputed ones.
    per_ch: list[tuple[Any, Any, float | None, float | None]] = []
    joined = set()
    for r in slices:
        for ch, load in (r["channels"] or {}).items():
            key = (r["node"], r["slice"], ch)
            got = recomputed.get(key) if None not in key else None
            if None not in key and key in recomputed:
                joined.add(key)
            per_ch.append((r["node"], r["slice"], load, got))
    per_ch += [(k[0], k[1], None, v) for k, v in recomputed.items() if k not in joined]
    per_slice_rows: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    for node, sl, reported, got in per_ch:
        if node in last and sl is not None and sl <= last[node]:
            rep = 0.0 if reported is None else float(reported)
            rec = 0.0 if got is None else float(got)
            per_slice_rows.setdefault((node, sl), []).append((rep, rec))
    slice_d: dict[tuple[Any, Any], list[Any]] = {}
    for r in slices:
        slice_d.setdefault((r["node"], r["slice"]), []).append(r["d"])
    per_slice = []
    for node, sl in sorted(per_slice_rows):
        chans = per_slice_rows[(node, sl)]
        for d in slice_d.get((node, sl), [None]):
            per_slice.append(
                {
                    "node": node,
                    "slice": sl,
                    "reported_d": sum(rep for rep, _ in chans),
                    "recomputed_d": sum(rec for _, rec in chans),
                    "changed": (node, sl) in changed,
                    "mismatched_channels": sum(1 for rep, rec in chans if rep != rec),
                    "slice_d": d,
                }
            )
    per_node: dict[Any, list[Row]] = {}
    for r in per_slice:
        per_node.setdefault(r["node"], []).append(r)
    totals = [
        {
            "node": node,
            "slices": len(rs),
            "reported_d": _sum(r["slice_d"] for r in rs),
            "recomputed_d": _sum(r["recomputed_d"] for r in rs),
            "changed_slices": sum(1 for r in rs if r["changed"]),
            "bad_slices": sum(1 for r in rs if r["mismatched_channels"] > 0 and not r["changed"]),
        }
        for node, rs in sorted(per_node.items())
    ]
    return per_slice, totals
