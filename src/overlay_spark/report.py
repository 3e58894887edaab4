"""The replay's report: ``report.md``, CSV tables and PNG plots (matplotlib).

Everything here works on aggregates already collected by the jobs (rows
per slice, per window, per migration; counts; a few examples).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Check", "plot_loads", "plot_spread", "write_csv", "write_markdown"]


@dataclass
class Check:
    """One validation: ``ok`` is None when it does not apply to this capture."""

    name: str
    ok: bool | None
    detail: str

    @property
    def status(self) -> str:
        return "n/a" if self.ok is None else "PASS" if self.ok else "FAIL"


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return " ".join(map(str, v))
    return "" if v is None else v


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
    cols = list(columns or (rows[0].keys() if rows else []))
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            w.writerow([_fmt(r.get(c)) for c in cols])


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt: Any, fig: Any, ax: Any, path: Path, title: str) -> None:
    """Title, grid and legend (outside, right), then write the PNG and free the figure."""
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mark_migrations(ax: Any, migrations: Iterable[dict[str, Any]], *, label: bool) -> None:
    first = True
    for m in migrations:
        t = m["t_done"]
        ax.axvline(
            t, color="grey", linestyle="--", linewidth=0.8, alpha=0.7, label="migration" if first and label else None
        )
        if label:
            ax.annotate(
                f"{m['sender']}→{m['receiver']}",
                (t, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                rotation=90,
                va="top",
                ha="right",
                color="dimgrey",
            )
        first = False


def plot_spread(
    path: Path,
    actual: Sequence[dict[str, Any]],
    counter: Sequence[dict[str, Any]],
    slices: Sequence[dict[str, Any]],
    migrations: Sequence[dict[str, Any]],
    title: str,
) -> None:
    """S/dc̄ over time with balancing (recomputed and as reported) and without (counterfactual)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.plot(
        [r["t"] for r in counter],
        [r["S_over_mean"] for r in counter],
        color="tab:red",
        linewidth=1.5,
        label="without migrations (counterfactual)",
    )
    ax.plot(
        [r["t"] for r in actual],
        [r["S_over_mean"] for r in actual],
        color="tab:blue",
        linewidth=1.5,
        label="with balancing (recomputed from events)",
    )
    sl = [r for r in slices if r["complete"] and r["S_over_mean"] is not None]
    ax.scatter(
        [r["t"] for r in sl],
        [r["S_over_mean"] for r in sl],
        s=14,
        color="tab:green",
        zorder=3,
        label="with balancing (nodes' slice reports)",
    )
    _mark_migrations(ax, migrations, label=True)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("S / dc̄")
    ax.set_ylim(bottom=0)
    _finish(plt, fig, ax, path, title)


def plot_loads(
    path: Path,
    per_node: Sequence[dict[str, Any]],
    nodes: Sequence[int],
    migrations: Sequence[dict[str, Any]],
    window: float,
    title: str,
) -> None:
    """Per-node load d (events' tested counts per window), stacked, migrations marked."""
    plt = _plt()
    ts = sorted({r["t"] for r in per_node})
    idx = {t: i for i, t in enumerate(ts)}
    series = {n: [0.0] * len(ts) for n in nodes}
    for r in per_node:
        if r["node"] in series:
            series[r["node"]][idx[r["t"]]] = r["d"] / window
    fig, ax = plt.subplots(figsize=(12, 4.5))
    if ts:
        ax.stackplot(ts, *[series[n] for n in nodes], labels=[f"node {n}" for n in nodes], alpha=0.85, step="pre")
    _mark_migrations(ax, migrations, label=True)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("load d per second (subscriptions tested)")
    _finish(plt, fig, ax, path, title)


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[str], limit: int | None = None) -> list[str]:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:limit] if limit else rows:
        out.append("| " + " | ".join(str(_fmt(r.get(c))) for c in cols) + " |")
    if limit and len(rows) > limit:
        out.append(f"| … {len(rows) - limit} more rows in the CSV |" + " |" * (len(cols) - 1))
    return out


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def write_markdown(path: Path, r: dict[str, Any]) -> None:
    h = r["headline"]
    lines = [
        f"# Replay of run `{r['run']}`",
        "",
        (
            f"Capture: `{r['path']}` — {len(r['nodes'])} nodes, slice T = {r['slice_seconds']} s, "
            f"{h['duration']:.1f} s of records, initializer node {r['initializer']}. "
            f"Replayed on Spark `{r['master']}` in {r['elapsed']:.1f} s."
        ),
        "",
        f"**Result: {'all validations passed' if not r['failed'] else 'FAILED: ' + ', '.join(r['failed'])}**",
        "",
        "## Headline",
        "",
        "| figure | value |",
        "|---|---|",
        f"| S/dc̄ with balancing, mean over windows with traffic (recomputed from events) | {_num(h['ratio_actual'])} |",
        f"| S/dc̄ without migrations (counterfactual), same windows | {_num(h['ratio_counterfactual'])} |",
        f"| S/dc̄ with balancing, second half of the run | {_num(h['ratio_actual_late'])} |",
        f"| S/dc̄ without migrations, second half of the run | {_num(h['ratio_counterfactual_late'])} |",
        f"| S/dc̄ as the nodes reported it, mean over complete slices | {_num(h['ratio_reported'])} |",
        f"| Σ mig_cost (subscriptions / bw, SPEC §5) | {_num(h['mig_cost'], 4)} |",
        f"| migrations (of which forced) / replications | {h['migrations']} ({h['forced']}) / {h['replications']} |",
        f"| subscriptions moved / bytes moved | {h['subscriptions_moved']} / {h['bytes_moved']} |",
        f"| splits / merges / aborted sessions | {h['splits']} / {h['merges']} / {h['aborts']} |",
        f"| events published / matched / deliveries | {h['published']} / {h['matched_events']} / {h['deliveries']} |",
        "",
        "## Validations",
        "",
        "| validation | status | detail |",
        "|---|---|---|",
    ]
    for c in r["checks"]:
        lines.append(f"| `{c.name}` | {c.status} | {c.detail} |")
    if r["notes"]:
        lines += ["", "Notes:", ""] + [f"* {n}" for n in r["notes"]]
    if r["examples"]:
        lines += ["", "### Examples of failed findings", ""]
        for k, ex in r["examples"].items():
            lines.append(f"* **{k}**: " + "; ".join(", ".join(f"{a}={b}" for a, b in e.items()) for e in ex))
    lines += [
        "",
        "## S/dc̄ over time",
        "",
        "![S/dc̄ with and without balancing](s_over_mean.png)",
        "",
        (
            f"Windows of T = {r['slice_seconds']} s from the first header; each event's tested count is charged to "
            "the node that matched it (blue) or, in the counterfactual, to the node that owned its space at the "
            "start — the initializer, since only migrations move space (red).  Green dots: the nodes' own slice "
            "reports (slice records, slices every node reported)."
        ),
        "",
        "![per-node load](load_stacked.png)",
        "",
        "## Migrations",
        "",
        (
            "S/dc̄ of the last complete slice that ended before the session started and of the first that "
            "started after it finished (`migrations.csv`)."
        ),
        "",
    ]
    lines += _table(
        r["migrations"],
        [
            "kind",
            "sender",
            "receiver",
            "t_start",
            "duration",
            "channels",
            "subscriptions",
            "bw",
            "mig_cost",
            "forced",
            "ratio_before",
            "ratio_after",
        ],
        limit=40,
    )
    lines += ["", "## Per slice (as the nodes reported)", "", "`slices.csv` has every node's d and dc.", ""]
    lines += _table(r["slices"], ["slice", "t", "nodes", "total_d", "mean_dc", "S", "S_over_mean"], limit=30)
    lines += [
        "",
        "## Costs: reported against recomputed",
        "",
        (
            "Per node, the slice loads the node reported and the sum of the tested counts of the events it "
            "matched (`costs.csv`, per slice in `slice_costs.csv`).  Slices in which the node split, merged "
            "or moved a channel are `changed`: the departing channel took its slice-in-progress cost along."
        ),
        "",
    ]
    lines += _table(r["costs"], ["node", "slices", "reported_d", "recomputed_d", "changed_slices", "bad_slices"])
    lines += ["", "## Re-matching", ""]
    rm = r["rematch"]
    lines += [
        f"{rm['subscriptions']} subscriptions parsed from their text ({rm['unparsed']} unparsed); access keys: "
        + ", ".join(f"{k} {v}" for k, v in sorted(rm["by_key"].items()))
        + ".",
        "",
    ]
    pc = r["pairs"]
    lines += _table(
        [pc],
        [
            "rematched",
            "reported",
            "delivered",
            "expected",
            "open",
            "missing",
            "extra",
            "inactive_matched",
            "duplicates",
            "lost",
            "orphaned",
            "dropped",
            "tail_pairs",
        ],
    )
    lines += ["", "## Records", ""]
    use = r["kinds"].use if r.get("kinds") is not None else (lambda k: "")
    lines += _table(
        [{"kind": k, "records": v, "replay": use(k)} for k, v in sorted(r["counts"].items())],
        ["kind", "records", "replay"],
    )
    lines.append("")
    path.write_text("\n".join(lines))
