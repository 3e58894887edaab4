"""The report of ``bench/soak.py``: the audit's figures, the drain, the
nodes' counters and logs, the flatness of RSS and descriptors, and the
verdict on each target (item 5 and the targets of ``soak.py``'s docstring).

1. ``flatness``: per node process, the first sample ``--warmup`` minutes
   after it started is the baseline; every later one must stay within
   ``FLAT`` of it.
2. ``breakdown``: the lost and duplicated pairs, by receiver kind, keyed or
   not, re-sent or not, and whether their event was published during the
   drain/re-join window — where to look first.
3. ``report`` prints it all and returns whether every target was met.
"""

from __future__ import annotations

import math
from typing import Any, Final

from overlay.testing import Verdict
from soak_run import DRAINED, GROUP, MB, NODES, Soak, pct

FLAT: Final = 0.10  # RSS and descriptors within ±10 % of the baseline after warm-up


def show(measure: str, value: int) -> str:
    return f"{value / MB:.1f} MB" if measure == "rss" else str(value)


def flatness(soak: Soak, warmup: float) -> dict[str, list[str]]:
    """Per node process, per measure: the baseline (first sample ``warmup`` s
    after the process started) and the worst later deviation; failures named."""
    rows: dict[str, list[str]] = {"rss": [], "fds": [], "failed": []}
    for n, runs in sorted(soak.starts.items()):
        for k, (started, pid) in enumerate(runs):
            mine = [(s.t + soak.timeline.start, s.nodes[n]) for s in soak.samples if s.nodes[n] is not None]
            after = [x for t, x in mine if x is not None and x.pid == pid and t >= started + warmup]
            what = f"node {n}" + (f" (run {k + 1})" if len(runs) > 1 else "")
            if len(after) < 2:
                rows["rss"].append(f"{what}: fewer than 2 samples after warm-up")
                rows["fds"].append(f"{what}: fewer than 2 samples after warm-up")
                continue
            for measure in ("rss", "fds"):
                values_ = [getattr(x, measure) for x in after]
                base = values_[0]
                worst = max(values_, key=lambda v: abs(v - base))
                dev = (worst - base) / base if base else math.inf
                ok = abs(dev) <= FLAT
                rows[measure].append(
                    f"{what}: {show(measure, base)} → worst {show(measure, worst)} ({dev:+.1%}), "
                    f"last {show(measure, values_[-1])} "
                    f"over {len(values_)} samples {'ok' if ok else 'NOT FLAT'}"
                )
                if not ok:
                    rows["failed"].append(f"{what} {measure}")
    return rows


def breakdown(soak: Soak, verdict: Verdict) -> list[str]:
    """The lost and duplicated pairs by receiver kind, keyed or not, and by
    whether their event was published during the drain/re-join window."""
    tl = soak.timeline
    lo = tl.drain or math.inf
    hi = (tl.ready or tl.started or tl.stopped or tl.drained or lo) + 5.0
    out = []
    for kind, pairs in (("lost", verdict.lost_pairs), ("duplicated", verdict.duplicated_pairs)):
        counts: dict[str, int] = {}
        for receiver, qty in pairs:
            ev = soak.audit.events[qty]
            who = "group" if receiver == GROUP else "band" if receiver.startswith("band") else "churn"
            window = "in the drain/re-join window" if lo <= ev.started <= hi else "outside it"
            resent = "re-sent by the publisher's agent" if soak.attempts[qty] > 1 else "sent once"
            label = f"{who}, {'keyed' if ev.key else 'plain'} event {resent}, {window}"
            counts[label] = counts.get(label, 0) + 1
        out += [f"{kind}: {n} — {label}" for label, n in sorted(counts.items())]
    return out


def report(soak: Soak, verdict: Verdict, stats: dict[int, dict[str, Any]]) -> bool:
    args = soak.args
    audit = soak.audit
    tl = soak.timeline
    events = audit.events.values()
    acked = sum(1 for e in events if e.acked < math.inf)
    keyed = sum(1 for e in events if e.key)
    keyed_acked = sum(1 for e in events if e.key and e.acked < math.inf)
    owed = audit.owed()
    by_kind: dict[str, int] = {}
    for receiver, _ in owed:
        kind = "group" if receiver == GROUP else "bands" if receiver.startswith("band") else "churn"
        by_kind[kind] = by_kind.get(kind, 0) + 1
    lat = [x for _, x in audit.latencies]
    print()
    print("audit:")
    print(
        f"  events published {len(audit.events):,} ({keyed:,} keyed), PubAck'ed {acked:,} ({keyed_acked:,} keyed), "
        f"failed {len(audit.failed):,}"
    )
    print(
        f"  acknowledged pairs {verdict.expected:,} (bands {by_kind.get('bands', 0):,}, group "
        f"{by_kind.get('group', 0):,}, churn {by_kind.get('churn', 0):,}), delivered {verdict.delivered:,}; "
        f"{len(audit.deliveries):,} deliveries in all"
    )
    print(f"  churned subscriptions {soak.churned} ({len(soak.churn_failures)} subscribes failed)")
    resent = sum(1 for n in soak.attempts.values() if n > 1)
    print(f"  events the publishers' agents sent more than once (a PubAck late: AgentClient rule 3): {resent:,}")
    errors = ", ".join(f"{code} ×{n}" for code, n in soak.client_errors.most_common()) or "none"
    print(f"  errors the clients were told (error_cb): {errors}")
    print(
        "  p50/p99/max publish→delivery over the run: "
        + "/".join(
            "—" if x is None else f"{x * 1000:.1f}" for x in (pct(lat, 50), pct(lat, 99), max(lat, default=None))
        )
        + " ms"
    )
    for line in str(verdict).splitlines():
        print(f"  {line[:600]}")
    for line in breakdown(soak, verdict):
        print(f"  {line}")
    for why in sorted(set(audit.failed.values()))[:5]:
        print(f"  a publish failed: {why[:200]}")
    for why in soak.churn_failures[:5]:
        print(f"  a churn subscribe failed: {why[:200]}")
    for why in soak.lane_errors:
        print(f"  {why}")
    if tl.drain:
        d = tl.summary
        print(
            f"drain of node {DRAINED}: "
            + (
                f"FAILED ({tl.failure})"
                if tl.failure
                else f"{(tl.drained or 0) - tl.drain:.1f}s, {d.get('channels_moved')} channels and "
                f"{d.get('subscriptions_moved')} subscriptions moved; down {args.down:g}s; ready again "
                f"{(tl.ready or 0) - (tl.started or 0):.1f}s after its start"
            )
        )
    interesting = (
        "slow_consumer",
        "choke",
        "unroutable",
        "undeliverable",
        "resen",
        "seq_",
        "group_",
        "rejected",
        "dropped",
    )
    for n, st in sorted(stats.items()):
        picked = {k: v for k, v in sorted(st.items()) if v and any(w in k for w in interesting)}
        print(f"node {n} counters: " + (", ".join(f"{k}={v}" for k, v in picked.items()) or "—"))
    for n in range(NODES):
        log = soak.procs.log(n)
        tracebacks, error_lines = log.count("Traceback"), sum(1 for x in log.splitlines() if " ERROR " in x)
        if tracebacks or error_lines:
            print(f"node {n} logged {tracebacks} tracebacks and {error_lines} ERROR lines (see --logs)")
    warm = args.warmup * 60.0
    flat = flatness(soak, warm)
    print()
    print(f"RSS and descriptors after warm-up ({args.warmup:g} min from each process's start), baseline → worst:")
    for line in flat["rss"]:
        print(f"  RSS {line}")
    for line in flat["fds"]:
        print(f"  fds {line}")
    print()
    loss = not verdict.lost
    dup = not verdict.duplicated
    order = not verdict.disordered
    other = not (verdict.wrong or verdict.unknown or verdict.ended) and not tl.failure and not soak.lane_errors
    rss_ok = not any(f.endswith("rss") for f in flat["failed"]) and bool(flat["rss"])
    fds_ok = not any(f.endswith("fds") for f in flat["failed"]) and bool(flat["fds"])
    rows = [
        ("no loss (acknowledged pairs)", loss, f"{len(verdict.lost)} lost"),
        ("no duplicate", dup, f"{len(verdict.duplicated)} duplicated"),
        ("per-key order", order, f"{len(verdict.disordered)} out of order"),
        ("nothing else wrong", other, "wrong/unknown/ended, the drain, the lanes"),
        (
            f"RSS flat within {FLAT:.0%} after warm-up",
            rss_ok,
            ", ".join(f for f in flat["failed"] if f.endswith("rss")),
        ),
        (
            f"descriptors flat within {FLAT:.0%} after warm-up",
            fds_ok,
            ", ".join(f for f in flat["failed"] if f.endswith("fds")),
        ),
    ]
    print("targets:")
    for name, ok, detail in rows:
        print(f"  {name:<42} {'met' if ok else 'NOT MET'}   {detail}")
    return all(ok for _, ok, _ in rows)
