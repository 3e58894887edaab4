"""The delivery audit (SPEC §4, §10, §13): every (event, matching subscription)
delivered exactly once; per sequence key, delivered in rank order.

The audit works per event, on sets of subscription ids (one row per event,
no row per pair): ``m`` the owners reported matching (from the ``event``
records), ``r`` the re-matching found — split into ``active``, ``inactive``
and ``open`` (``rematch`` rule 4) — ``d`` delivered to clients, ``o``
orphaned (the subscriber had left its access node) and ``x`` dropped on a
slow consumer.  A pair is **expected** when the owner reported it and its
subscription was not inactive, or the re-matching says it must have matched.
Events published in the tail (the last ``tail_guard`` seconds before the
first node stopped) are not judged for losses: they may have been in flight
when the cluster shut down.

Findings (counts of pairs unless said otherwise):

* ``duplicates`` — a pair delivered (or delivered and orphaned) more than once;
* ``lost`` — an expected pair never delivered, orphaned or dropped;
* ``unexpected`` — a pair delivered that no owner reported matching;
* ``missing`` / ``extra`` / ``inactive_matched`` — re-matching disagreements:
  an active pair the owner did not report; a reported pair the filter does
  not match; a reported pair whose subscription was inactive;
* events: ``unmatched`` (published, no owner matched it), ``matched_twice``
  (several owner ``event`` records), ``cost`` (tested count below matches);
* ``order`` — a subscriber got two events of one key out of rank order
  (keys are optional: an event without ``key`` is not ordered).

Payloads (``payloads``): the payload bytes published (``publish.payload_bytes``)
and delivered (``deliver.payload_bytes`` once per subscription notified), and
``mismatched`` — deliveries whose payload size differs from the one
published (the payload did not arrive whole).  A capture written before
payloads existed has no ``payload_bytes``: every size is 0.
"""

from __future__ import annotations

from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from overlay_spark.records import Capture, aggregate_row

__all__ = ["EXAMPLES", "audit", "payloads"]

# Examples of each finding shown in the report.
EXAMPLES: Final = 5


def _empty() -> Column:
    return F.array().cast("array<string>")


def _ids(col: str) -> Column:
    return F.coalesce(F.col(col), _empty())


def _per_event(cap: Capture, rematched: DataFrame) -> DataFrame:
    d = (
        cap.df("deliver")
        .groupBy("event")
        .agg(F.flatten(F.collect_list("subs")).alias("d"), F.flatten(F.collect_list("orphans")).alias("o"))
    )
    parts = [d]
    if cap.has("drop"):
        parts.append(cap.df("drop").groupBy("event").agg(F.flatten(F.collect_list("subs")).alias("x")))
    r = rematched.groupBy("event").agg(
        F.collect_list("sub").alias("r"),
        F.collect_list(F.when(F.col("status") == "active", F.col("sub"))).alias("r_active"),
        F.collect_list(F.when(F.col("status") == "inactive", F.col("sub"))).alias("r_inactive"),
        F.collect_list(F.when(F.col("status") == "open", F.col("sub"))).alias("r_open"),
    )
    parts.append(r)
    out = parts[0]
    for p in parts[1:]:
        out = out.join(p, "event", "full_outer")
    return out


def audit(cap: Capture, events: DataFrame, rematched: DataFrame) -> dict[str, Any]:
    ev = events.select("event", "tail", "published", "records", "tested", "nmatched", "m", "key")
    per = ev.join(_per_event(cap, rematched), "event", "full_outer").fillna(
        {"tail": False, "records": 0, "published": False}
    )
    m = F.array_distinct(_ids("m"))
    d, o, x = _ids("d"), _ids("o"), _ids("x") if cap.has("drop") else _empty()
    r, r_active, r_inactive, r_open = _ids("r"), _ids("r_active"), _ids("r_inactive"), _ids("r_open")
    handled = F.concat(d, o)
    expected = F.array_union(F.array_except(m, r_inactive), r_active)
    judged = ~F.col("tail")
    sets = {
        "duplicates": F.size(handled) - F.size(F.array_distinct(handled)),
        "lost": F.when(judged, F.size(F.array_except(expected, F.concat(handled, x)))).otherwise(0),
        "unexpected": F.size(F.array_except(F.array_distinct(d), m)),
        "missing": F.when(judged & (F.col("records") > 0), F.size(F.array_except(r_active, m))).otherwise(0),
        "extra": F.size(F.array_except(m, r)),
        "inactive_matched": F.size(F.array_intersect(m, r_inactive)),
        "orphaned": F.size(o),
        "dropped": F.size(x),
        "rematched": F.size(r),
        "reported": F.size(m),
        "delivered": F.size(d),
        "expected": F.size(expected),
        "open": F.size(r_open),
        "tail_pairs": F.when(F.col("tail"), F.size(expected)).otherwise(0),
    }
    flags = {
        "unmatched": F.col("published") & (F.col("records") == 0) & judged & F.col("key").isNull(),
        "unmatched_keyed": F.col("published") & (F.col("records") == 0) & judged & F.col("key").isNotNull(),
        "unmatched_tail": F.col("published") & (F.col("records") == 0) & F.col("tail"),
        "matched_twice": F.col("records") > 1,
        "cost": F.coalesce(F.col("tested") < F.col("nmatched"), F.lit(False)),
    }
    per = per.select(
        "event",
        "tail",
        "published",
        "records",
        "tested",
        "nmatched",
        "key",
        *[c.alias(k) for k, c in sets.items()],
        *[c.alias(k) for k, c in flags.items()],
        # The offending ids, for the report's examples.
        F.array_except(expected, F.concat(handled, x)).alias("lost_ids"),
        F.array_except(r_active, m).alias("missing_ids"),
        F.array_except(m, r).alias("extra_ids"),
        F.array_except(F.array_distinct(d), m).alias("unexpected_ids"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    totals = aggregate_row(
        per.agg(
            *[F.sum(k).alias(k) for k in sets],
            *[F.sum(F.col(k).cast("long")).alias(k) for k in flags],
            F.sum(F.col("published").cast("long")).alias("published"),
            F.sum(F.when(F.col("records") > 0, F.col("tested"))).alias("tested"),
            F.sum(F.when(F.col("records") > 0, F.col("nmatched"))).alias("nmatched"),
            F.sum((F.col("records") > 0).cast("long")).alias("matched_events"),
            F.sum(F.col("tail").cast("long")).alias("tail_events"),
            F.sum(F.col("key").isNotNull().cast("long")).alias("keyed"),
        )
    ).asDict()
    totals = {k: int(v or 0) for k, v in totals.items()}
    examples: dict[str, list[dict[str, Any]]] = {}
    for k, ids in (
        ("lost", "lost_ids"),
        ("missing", "missing_ids"),
        ("extra", "extra_ids"),
        ("unexpected", "unexpected_ids"),
        ("duplicates", None),
        ("inactive_matched", None),
    ):
        if totals[k]:
            cols = ["event", k] + ([ids] if ids else [])
            examples[k] = [
                r.asDict() for r in per.filter(F.col(k) > 0).select(*cols).orderBy("event").limit(EXAMPLES).collect()
            ]
    for k in ("unmatched", "unmatched_keyed", "matched_twice", "cost"):
        if totals[k]:
            examples[k] = [
                r.asDict()
                for r in per.filter(F.col(k))
                .select("event", "records", "tested", "nmatched")
                .orderBy("event")
                .limit(EXAMPLES)
                .collect()
            ]
    per.unpersist()
    pairs = {k: totals[k] for k in sets}
    evc = {
        k: totals[k]
        for k in (
            "published",
            "matched_events",
            "unmatched",
            "unmatched_keyed",
            "unmatched_tail",
            "matched_twice",
            "cost",
            "tail_events",
            "tested",
            "nmatched",
            "keyed",
        )
    }
    # A keyed event the sequencer expired never reaches an owner (SPEC §10):
    # the nodes count those, and the capture has the counts, not the ids.
    evc["expired"] = 0
    if cap.has("sequencer"):
        row = aggregate_row(
            cap.df("sequencer").groupBy("node").agg(F.max("expired_dropped").alias("x")).agg(F.sum("x"))
        )
        evc["expired"] = int(row[0] or 0)
    order = _order(cap, events) if totals["keyed"] else None
    if order is not None:
        ex = order.pop("examples")
        if ex:
            examples["order"] = ex
    return {"pairs": pairs, "events": evc, "order": order, "examples": examples}


def _order(cap: Capture, events: DataFrame) -> dict[str, Any]:
    """Per (subscription, key), deliveries in the access node's record order
    must carry increasing ranks (SPEC §10)."""
    delivered = cap.df("deliver").select("event", F.explode("subs").alias("sub"), "node", "n")
    keyed = events.filter(F.col("key").isNotNull()).select("event", "key", "rank")
    d = delivered.join(keyed, "event")
    w = Window.partitionBy("sub", "key").orderBy("node", "n")
    d = d.withColumn("prev", F.lag("rank").over(w)).withColumn("prev_event", F.lag("event").over(w))
    d = d.withColumn("bad", F.col("prev").isNotNull() & (F.col("rank") <= F.col("prev"))).persist()
    res = aggregate_row(
        d.agg(
            F.count("*").alias("deliveries"),
            F.countDistinct("key").alias("keys"),
            F.sum(F.col("bad").cast("long")).alias("violations"),
        )
    ).asDict()
    violations = int(res["violations"] or 0)
    ex = (
        [
            r.asDict()
            for r in d.filter("bad")
            .select("sub", "key", "prev_event", "prev", "event", "rank")
            .orderBy("sub", "key")
            .limit(EXAMPLES)
            .collect()
        ]
        if violations
        else []
    )
    d.unpersist()
    return {
        "deliveries": int(res["deliveries"] or 0),
        "keys": int(res["keys"] or 0),
        "violations": violations,
        "examples": ex,
    }


def payloads(cap: Capture) -> dict[str, Any]:
    """Payload bytes published and delivered, and the deliveries whose payload
    size differs from the publish's (see the module docstring)."""
    out: dict[str, Any] = {"published_bytes": 0, "with_payload": 0, "delivered_bytes": 0, "mismatched": 0}
    if not cap.has("publish"):
        return out
    pub = cap.df("publish").select("event", F.coalesce(F.col("payload_bytes"), F.lit(0)).alias("size"))
    row = aggregate_row(pub.agg(F.sum("size").alias("b"), F.sum((F.col("size") > 0).cast("long")).alias("n")))
    out["published_bytes"], out["with_payload"] = int(row["b"] or 0), int(row["n"] or 0)
    if not cap.has("deliver"):
        return out
    dl = cap.df("deliver").select(
        "event", F.coalesce(F.col("payload_bytes"), F.lit(0)).alias("got"), F.size(_ids("subs")).alias("subs")
    )
    joined = dl.join(pub.dropDuplicates(["event"]), "event", "left")
    row = aggregate_row(
        joined.agg(
            F.sum(F.col("got") * F.col("subs")).alias("b"),
            F.sum((F.col("size").isNotNull() & (F.col("got") != F.col("size"))).cast("long")).alias("bad"),
        )
    )
    out["delivered_bytes"], out["mismatched"] = int(row["b"] or 0), int(row["bad"] or 0)
    if out["mismatched"]:
        out["examples"] = [
            r.asDict()
            for r in joined.filter(F.col("size").isNotNull() & (F.col("got") != F.col("size")))
            .select("event", F.col("size").alias("published"), F.col("got").alias("delivered"))
            .orderBy("event")
            .limit(EXAMPLES)
            .collect()
        ]
    return out
