"""The replay driver behind ``overlay replay RUN_DIR`` (its command line: ``overlay.cli.replay``).

Reads every node's capture of a run, runs the jobs of ``loads``,
``rematch`` and ``audit``, writes the report, and returns a ``ReplayResult``
whose exit code is 0 when every validation passed, 1 when one failed (each
failed one is named on stderr and in the report); a capture that cannot be
read raises ``records.CaptureError`` (the command exits 2).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

__all__ = ["ReplayResult", "run_replay"]

STEPS: Final = 5


@dataclass
class ReplayResult:
    exit_code: int
    failed: list[str]
    out: Path
    headline: dict[str, Any]
    checks: list[Any] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def run_replay(
    run_dir: str,
    *,
    master: str | None = None,
    out: str | None = None,
    tail_guard: float | None = None,
    partitions: int = 8,
    conf: dict[str, str] | None = None,
    quick_jvm: bool = False,
    spark: Any = None,
    stream: TextIO | None = sys.stderr,
) -> ReplayResult:
    from overlay_spark import audit as audit_mod
    from overlay_spark import loads, rematch
    from overlay_spark.records import load_capture
    from overlay_spark.report import Check, plot_loads, plot_spread, write_csv, write_markdown
    from overlay_spark.session import Progress, make_session

    t_start = time.monotonic()
    if spark is None:
        if stream:
            print(f"starting Spark ({master or 'local[*]'}) …", file=stream, flush=True)
        spark = make_session(master, partitions=partitions, quick_jvm=quick_jvm, conf=conf)
    master_url = spark.sparkContext.master
    out_dir = Path(out) if out else Path(run_dir) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)

    with Progress(spark, STEPS, out=stream) as prog:
        prog.step(f"reading the capture in {run_dir}")
        cap = load_capture(spark, run_dir)
        if stream and cap.kinds is not None and cap.kinds.warning:
            print(f"warning: {cap.kinds.warning}", file=stream, flush=True)
        nodes = [n.id for n in cap.nodes]
        guard = cap.slice_seconds if tail_guard is None else tail_guard
        end_times = [e["time"] for e in cap.ends.values()]
        last = cap.last
        t_end = min(end_times) if len(end_times) == len({h["node"] for h in cap.headers}) else (last or cap.t0)
        tail_from = t_end - guard

        # The re-matching and the audit are the long step (shuffles over
        # every record): they run in the background while the loads tables —
        # two small jobs and Python — are computed in front (session.Progress).
        def rematch_and_audit() -> tuple[Any, dict[str, Any]]:
            matcher = rematch.prepare(spark, cap) if cap.has("subscribe") and cap.has("publish") else None
            return matcher, audit_mod.audit(cap, tail_from, matcher, partitions=partitions)

        audit_job = prog.background(
            "re-matching and audit: subscriptions parsed on executors and keyed by the events' histogram; "
            "exactly-once delivery, losses, rank order (one shuffle by event)",
            rematch_and_audit,
            pool="audit",
        )

        # The loads tables: two small Spark jobs, then plain Python (loads rule 1).
        prog.step("loads per slice and per window (with and without migrations), migrations, reported slice costs")
        inputs = loads.gather(cap)
        slices = loads.slice_table(inputs)
        if cap.has("event"):
            both, per_node = loads.window_table(inputs)
            actual = [r for r in both if r["scenario"] == "actual"]
            counter = [r for r in both if r["scenario"] == "counterfactual"]
        else:
            actual, per_node, counter = [], [], []
        migs = loads.migration_table(inputs, slices)
        if cap.has("slice") and cap.has("event"):
            slice_costs, costs = loads.slice_cost_check(inputs)
        else:
            slice_costs, costs = [], []

        matcher, aud = prog.wait(audit_job)
        summary = matcher.summary if matcher is not None else rematch.EMPTY_SUMMARY

        prog.step("checks and headline figures")
        pc, ec = aud["pairs"], aud["events"]
        checks = _checks(cap, pc, ec, aud["order"], summary, costs, Check)
        pl = aud["payloads"]
        checks.append(
            Check(
                "audit.payload",
                pl["mismatched"] == 0,
                f"{pl['mismatched']} deliveries whose payload size differs from the one published; "
                f"{pl['with_payload']} events carried a payload, {pl['published_bytes']} bytes published, "
                f"{pl['delivered_bytes']} bytes delivered (once per subscription notified)",
            )
        )
        failed = [c.name for c in checks if c.ok is False]
        traffic = [r for r in actual if r["events"]]
        cf_by_w = {r["w"]: r for r in counter}
        half = traffic[len(traffic) // 2]["w"] if traffic else 0
        complete = [r for r in slices if r["complete"] and r["S_over_mean"] is not None]
        mig_only = [m for m in migs if m["kind"] == "migration"]
        headline = {
            "ratio_actual": _mean([r["S_over_mean"] for r in traffic]),
            "ratio_counterfactual": _mean([cf_by_w[r["w"]]["S_over_mean"] for r in traffic if r["w"] in cf_by_w]),
            "ratio_actual_late": _mean([r["S_over_mean"] for r in traffic if r["w"] >= half]),
            "ratio_counterfactual_late": _mean(
                [cf_by_w[r["w"]]["S_over_mean"] for r in traffic if r["w"] >= half and r["w"] in cf_by_w]
            ),
            "ratio_reported": _mean([r["S_over_mean"] for r in complete]),
            "mig_cost": sum(m["mig_cost"] or 0.0 for m in migs),
            "migrations": len(mig_only),
            "forced": sum(1 for m in mig_only if m["forced"]),
            "replications": len(migs) - len(mig_only),
            "subscriptions_moved": sum(m["subscriptions"] or 0 for m in migs),
            "bytes_moved": sum(m["bytes"] or 0 for m in migs),
            "splits": cap.counts.get("split", 0),
            "merges": cap.counts.get("merge", 0),
            "aborts": cap.counts.get("abort", 0),
            "published": ec.get("published", 0),
            "matched_events": ec.get("matched_events", 0),
            "deliveries": pc.get("delivered", 0),
            "duration": max(0.0, t_end - cap.t0),
        }

        prog.step(f"writing the report to {out_dir}")
        cf_cols = {r["w"]: r for r in counter}
        windows = [
            {
                "w": r["w"],
                "t": r["t"],
                "events": r["events"],
                "total_d": r["total_d"],
                "mean_dc": r["mean_dc"],
                "S": r["S"],
                "S_over_mean": r["S_over_mean"],
                "cf_mean_dc": cf_cols.get(r["w"], {}).get("mean_dc"),
                "cf_S": cf_cols.get(r["w"], {}).get("S"),
                "cf_S_over_mean": cf_cols.get(r["w"], {}).get("S_over_mean"),
            }
            for r in actual
        ]
        slice_cols = ["slice", "t", "t_start", "t_end", "nodes", "complete", "total_d", "mean_dc", "S", "S_over_mean"]
        slice_cols += [f"{x}_{n}" for n in nodes for x in ("d", "dc")]
        write_csv(out_dir / "slices.csv", slices, slice_cols)
        write_csv(
            out_dir / "windows.csv",
            windows,
            ["w", "t", "events", "total_d", "mean_dc", "S", "S_over_mean", "cf_mean_dc", "cf_S", "cf_S_over_mean"],
        )
        write_csv(out_dir / "node_loads.csv", per_node, ["w", "t", "node", "capacity", "events", "d", "dc"])
        mig_cols = [
            "kind",
            "sender",
            "receiver",
            "t_start",
            "t_done",
            "duration",
            "channels",
            "subscriptions",
            "bytes",
            "bw",
            "mig_cost",
            "forced",
            "slice_before",
            "S_before",
            "ratio_before",
            "slice_after",
            "S_after",
            "ratio_after",
        ]
        write_csv(out_dir / "migrations.csv", migs, mig_cols)
        write_csv(
            out_dir / "costs.csv",
            costs,
            ["node", "slices", "reported_d", "recomputed_d", "changed_slices", "bad_slices"],
        )
        write_csv(
            out_dir / "slice_costs.csv",
            slice_costs,
            ["node", "slice", "slice_d", "reported_d", "recomputed_d", "changed", "mismatched_channels"],
        )
        write_csv(
            out_dir / "validations.csv",
            [{"validation": c.name, "status": c.status, "detail": c.detail} for c in checks],
        )
        write_csv(out_dir / "headline.csv", [{"figure": k, "value": v} for k, v in headline.items()])
        title = f"run {cap.run}: {len(nodes)} nodes"
        plot_spread(out_dir / "s_over_mean.png", actual, counter, slices, migs, f"S/dc̄ — {title}")
        plot_loads(out_dir / "load_stacked.png", per_node, nodes, migs, cap.slice_seconds, f"per-node load — {title}")
        elapsed = time.monotonic() - t_start
        pairs_row = dict(pc)
        report = {
            "run": cap.run,
            "path": run_dir,
            "nodes": nodes,
            "slice_seconds": cap.slice_seconds,
            "initializer": cap.initializer,
            "master": master_url,
            "elapsed": elapsed,
            "failed": failed,
            "headline": headline,
            "checks": checks,
            "notes": cap.notes,
            "examples": aud["examples"],
            "migrations": migs,
            "slices": slices,
            "costs": costs,
            "rematch": summary,
            "pairs": pairs_row,
            "counts": cap.counts,
            "kinds": cap.kinds,
        }
        write_markdown(out_dir / "report.md", report)
        cap.unpersist()

    if stream:
        _summary(stream, out_dir, headline, checks, failed, cap.notes)
    return ReplayResult(
        1 if failed else 0,
        failed,
        out_dir,
        headline,
        checks,
        {
            "audit": aud,
            "rematch": summary,
            "slices": slices,
            "migrations": migs,
            "costs": costs,
            "windows": windows,
            "notes": cap.notes,
        },
    )


def _checks(
    cap: Any,
    pc: dict[str, int],
    ec: dict[str, int],
    order: dict[str, Any] | None,
    summary: dict[str, Any],
    costs: list[dict[str, Any]],
    Check: Any,
) -> list[Any]:
    dropped = sum(e.get("dropped") or 0 for e in cap.ends.values())
    no_end = [h["node"] for h in cap.headers if h["node"] not in cap.ends]
    checks = [
        Check(
            "capture.complete",
            not dropped and not no_end,
            f"{len(cap.headers)} files; records dropped by the writer: {dropped}; nodes without end record: {no_end or 'none'}",
        ),
        Check(
            "rematch.parse",
            summary["unparsed"] == 0,
            f"{summary['subscriptions']} subscriptions, {summary['unparsed']} whose text does not parse",
        ),
        Check(
            "rematch.missing",
            pc.get("missing", 0) == 0,
            f"{pc.get('missing', 0)} (event, subscription) pairs that must have matched and were not reported "
            f"({pc.get('open', 0)} pairs in flight at a (un)subscribe not judged)",
        ),
        Check(
            "rematch.extra",
            pc.get("extra", 0) == 0,
            f"{pc.get('extra', 0)} reported matches the subscription's filter does not match",
        ),
        Check(
            "rematch.inactive",
            pc.get("inactive_matched", 0) == 0,
            f"{pc.get('inactive_matched', 0)} matches of a subscription not yet asked for or already removed",
        ),
        Check(
            "rematch.cost",
            ec.get("cost", 0) == 0,
            f"{ec.get('cost', 0)} events whose tested count is below their matches; tested {ec.get('tested', 0)} "
            f"≥ matched {ec.get('nmatched', 0)} overall",
        ),
    ]
    bad = sum(c["bad_slices"] or 0 for c in costs)
    changed = sum(c["changed_slices"] or 0 for c in costs)
    checks.append(
        Check(
            "costs.slices",
            None if not costs else bad == 0,
            f"{bad} slices whose reported channel loads differ from the events' tested counts "
            f"({changed} slices with a table change not compared)"
            if costs
            else "no slice records",
        )
    )
    checks += [
        Check(
            "audit.duplicates",
            pc.get("duplicates", 0) == 0,
            f"{pc.get('duplicates', 0)} pairs delivered more than once",
        ),
        Check(
            "audit.lost",
            pc.get("lost", 0) == 0,
            f"{pc.get('lost', 0)} expected pairs never delivered (of {pc.get('expected', 0)}; "
            f"{pc.get('tail_pairs', 0)} in the last seconds not judged; {pc.get('orphaned', 0)} orphaned by an "
            f"unsubscribe, {pc.get('dropped', 0)} dropped on a slow consumer)",
        ),
        Check(
            "audit.unexpected",
            pc.get("unexpected", 0) == 0,
            f"{pc.get('unexpected', 0)} deliveries of a pair no owner reported matching",
        ),
        Check(
            "audit.unmatched",
            ec.get("unmatched", 0) == 0 and ec.get("unmatched_keyed", 0) <= ec.get("expired", 0),
            f"{ec.get('unmatched', 0)} published events no owner matched, and {ec.get('unmatched_keyed', 0)} keyed ones "
            f"against {ec.get('expired', 0)} the sequencers expired "
            f"({ec.get('unmatched_tail', 0)} more in the last seconds not judged)",
        ),
        Check(
            "audit.matched_twice",
            ec.get("matched_twice", 0) == 0,
            f"{ec.get('matched_twice', 0)} events matched more than once",
        ),
        Check(
            "audit.order",
            None if order is None else order["violations"] == 0,
            "no event carries a sequence key"
            if order is None
            else f"{order['violations']} out-of-rank deliveries over {order['keys']} keys, {order['deliveries']} deliveries",
        ),
    ]
    return checks


def _summary(
    stream: TextIO,
    out_dir: Path,
    h: dict[str, Any],
    checks: list[Any],
    failed: list[str],
    notes: list[str] | None = None,
) -> None:
    def f(v: Any) -> str:
        return "–" if v is None else f"{v:.3f}"

    print(f"\nreport: {out_dir / 'report.md'}", file=stream)
    print(
        f"S/dc̄ with balancing {f(h['ratio_actual'])} (second half {f(h['ratio_actual_late'])}), "
        f"without migrations {f(h['ratio_counterfactual'])}; nodes reported {f(h['ratio_reported'])}",
        file=stream,
    )
    print(
        f"Σ mig_cost {h['mig_cost']:.4f} over {h['migrations']} migrations ({h['forced']} forced) and "
        f"{h['replications']} replications, {h['subscriptions_moved']} subscriptions moved",
        file=stream,
    )
    for c in checks:
        print(f"  {c.status:<4} {c.name:<20} {c.detail}", file=stream)
    for note in notes or []:
        if note.startswith("warning: "):  # records of unknown kinds (overlay_spark.kinds rule 2)
            print(note, file=stream)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=stream)
    stream.flush()
