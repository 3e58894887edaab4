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

Payloads (``payloads`` of the result): the payload bytes published (``publish.payload_bytes``)
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
from overlay_spark.rematch import base_ids, status

__all__ = ["EXAMPLES", "audit"]

# Examples of each finding shown in the report.
EXAMPLES: Final = 5


def _empty() -> Column:
    return F.array().cast("array<string>")


def _ids(col: str) -> Column:
    return F.coalesce(F.col(col), _empty())


def _per_event(cap: Capture, rematched: DataFrame) -> DataFrame:
    """Rule 1: every record about an event, grouped in one shuffle: the
    publish, the owners' ``event`` records, the deliveries, drops and the
    re-matched pairs (with their subscriptions' lifetimes)."""
    parts = [
        cap.df("publish").select(
            "event",
            F.lit(True).alias("pub"),
            F.col("node").alias("access"),
            F.col("time").alias("t_pub"),
            F.col("key").alias("p_key"),
            F.col("rank").alias("p_rank"),
            F.coalesce(F.col("payload_bytes"), F.lit(0)).alias("p_size"),
        ),
        cap.df("event").select(
            "event",
            F.col("node").alias("e_node"),
            F.col("time").alias("e_time"),
            "tested",
            "matched",
            F.col("key").alias("e_key"),
            F.col("rank").alias("e_rank"),
        ),
        cap.df("deliver").select(
            "event",
            F.struct(
                F.col("node"),
                F.col("n"),
                F.col("time"),
                F.col("subs"),
                F.coalesce(F.col("payload_bytes"), F.lit(0)).alias("size"),
            ).alias("dl"),
            "orphans",
        ),
        rematched.select("event", F.struct("sub", "t_sub", "t_ack", "t_unsub", "t_unack").alias("rr")),
    ]
    if cap.has("drop"):
        parts.append(cap.df("drop").select("event", F.col("subs").alias("x_subs")))
    u = parts[0]
    for p in parts[1:]:
        u = u.unionByName(p, allowMissingColumns=True)
    if not cap.has("drop"):
        u = u.withColumn("x_subs", F.lit(None).cast("array<string>"))
    return u.groupBy("event").agg(
        F.max("pub").alias("published"),
        F.max("access").alias("access"),
        F.min("t_pub").alias("t_pub"),
        F.max("p_key").alias("p_key"),
        F.max("p_rank").alias("p_rank"),
        F.max("p_size").alias("p_size"),
        F.count("e_node").alias("records"),
        F.min("e_time").alias("t_match"),
        F.min_by("tested", "e_time").alias("tested"),
        F.min_by(F.size("matched"), "e_time").alias("nmatched"),
        base_ids(F.flatten(F.collect_list("matched"))).alias("m"),  # conjuncts read as subscriptions
        # The owner's key and rank: the key's home assigns the rank (SPEC §10).
        F.max("e_key").alias("e_key"),
        F.max("e_rank").alias("e_rank"),
        base_ids(F.flatten(F.collect_list("orphans"))).alias("o"),
        F.collect_list("dl").alias("dl"),
        F.flatten(F.collect_list("x_subs")).alias("x"),
        F.collect_list("rr").alias("rr"),
    )


def _subs(col: Column, state: str | None = None) -> Column:
    """The subscription ids of the re-matched pairs, all or those in ``state``."""
    picked = col if state is None else F.filter(col, lambda x: x["st"] == state)
    return F.transform(picked, lambda x: x["sub"])


def audit(cap: Capture, tail_from: float, rematched: DataFrame) -> dict[str, Any]:
    per = _per_event(cap, rematched)
    rs = F.transform(
        F.col("rr"),
        lambda x: F.struct(
            x["sub"].alias("sub"),
            status(F.col("t_pub"), F.col("t_match"), x["t_sub"], x["t_ack"], x["t_unsub"], x["t_unack"]).alias("st"),
        ),
    )
    per = per.select(
        "event",
        F.coalesce(F.col("published"), F.lit(False)).alias("published"),
        "records",
        "tested",
        "nmatched",
        "m",
        F.flatten(F.transform("dl", lambda x: x["subs"])).alias("d"),
        "o",
        "x",
        F.coalesce(F.col("t_pub") > F.lit(tail_from), F.lit(False)).alias("tail"),
        F.coalesce("e_key", "p_key").alias("key"),
        F.coalesce("e_rank", "p_rank").alias("rank"),
        "dl",
        "p_size",
        rs.alias("rs"),
    ).select(
        "*",
        _subs(F.col("rs")).alias("r"),
        _subs(F.col("rs"), "active").alias("r_active"),
        _subs(F.col("rs"), "inactive").alias("r_inactive"),
        _subs(F.col("rs"), "open").alias("r_open"),
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
        "rank",
        *[c.alias(k) for k, c in sets.items()],
        *[c.alias(k) for k, c in flags.items()],
        # The offending ids, for the report's examples (null when none: the
        # persisted frame stays narrow).
        *[
            F.when(F.size(ids) > 0, ids).alias(name)
            for name, ids in (
                ("lost_ids", F.array_except(expected, F.concat(handled, x))),
                ("missing_ids", F.array_except(r_active, m)),
                ("extra_ids", F.array_except(m, r)),
                ("unexpected_ids", F.array_except(F.array_distinct(d), m)),
            )
        ],
        # The deliveries of a keyed event, for the rank-order check.
        F.when(F.col("key").isNotNull(), F.col("dl")).alias("dl"),
        # Payloads: bytes published, delivered (once per subscription
        # notified), and the delivery sizes that differ from the publish's.
        F.when(F.col("published"), F.coalesce("p_size", F.lit(0))).otherwise(0).alias("payload_published"),
        F.aggregate(
            F.col("dl"), F.lit(0).cast("long"), lambda acc, x: acc + x["size"] * F.size(F.coalesce(x["subs"], _empty()))
        ).alias("payload_delivered"),
        F.when(F.col("p_size").isNull(), F.array().cast("array<long>"))
        .otherwise(F.transform(F.filter("dl", lambda x: x["size"] != F.col("p_size")), lambda x: x["size"]))
        .alias("payload_bad"),
        "p_size",
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
            F.sum("payload_published").alias("published_bytes"),
            F.sum((F.col("payload_published") > 0).cast("long")).alias("with_payload"),
            F.sum("payload_delivered").alias("delivered_bytes"),
            F.sum(F.size("payload_bad")).alias("payload_mismatched"),
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
    payloads: dict[str, Any] = {
        "published_bytes": totals["published_bytes"],
        "with_payload": totals["with_payload"],
        "delivered_bytes": totals["delivered_bytes"],
        "mismatched": totals["payload_mismatched"],
    }
    if payloads["mismatched"]:
        payloads["examples"] = [
            r.asDict()
            for r in per.filter(F.size("payload_bad") > 0)
            .select("event", F.col("p_size").alias("published"), F.col("payload_bad")[0].alias("delivered"))
            .orderBy("event")
            .limit(EXAMPLES)
            .collect()
        ]
    order = _order(per) if totals["keyed"] else None
    if order is not None:
        ex = order.pop("examples")
        if ex:
            examples["order"] = ex
    per.unpersist()
    return {"pairs": pairs, "events": evc, "order": order, "examples": examples, "payloads": payloads}


def _order(per: DataFrame) -> dict[str, Any]:
    """Per (subscription, key), deliveries in the access node's record order
    must carry increasing ranks (SPEC §10)."""
    d = (
        per.filter(F.col("key").isNotNull())
        .select("event", "key", "rank", F.explode("dl").alias("dl"))
        .select("event", "key", "rank", "dl.node", "dl.n", "dl.time", F.explode("dl.subs").alias("sub"))
    )
    # (A record's time breaks ties of n: only hand-made captures have them.)
    w = Window.partitionBy("sub", "key").orderBy("node", "n", "time")
    d = d.withColumn("prev", F.lag("rank").over(w)).withColumn("prev_event", F.lag("event").over(w))
    d = d.withColumn("bad", F.col("prev").isNotNull() & (F.col("rank") <= F.col("prev")))
    res = aggregate_row(
        d.agg(
            F.count("*").alias("deliveries"),
            F.sum(F.col("bad").cast("long")).alias("violations"),
        )
    ).asDict()
    keys = aggregate_row(per.filter(F.col("key").isNotNull()).agg(F.countDistinct("key")))[0]
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
    return {
        "deliveries": int(res["deliveries"] or 0),
        "keys": int(keys or 0),
        "violations": violations,
        "examples": ex,
    }
