"""The delivery audit (SPEC §4, §10, §13): every (event, matching subscription)
delivered exactly once; per sequence key, delivered in rank order.

For each event, ``m`` is the set of subscriptions the owners reported
matching (from the ``event`` records), ``r`` the set the re-matching found —
split into ``active``, ``inactive`` and ``open`` (``rematch`` rule 4) — ``d``
those delivered to clients, ``o`` orphaned (the subscriber had left its
access node) and ``x`` dropped on a slow consumer.  A pair is **expected**
when the owner reported it and its subscription was not inactive, or the
re-matching says it must have matched.  Events published in the tail (the
last ``tail_guard`` seconds before the first node stopped) are not judged
for losses: they may have been in flight when the cluster shut down.

How it is computed (a 1M-event capture in a minute on two cores):

1. **One shuffle by event.**  The publish, event, deliver and drop records
   (narrow columns of the persisted capture) are partitioned by event id;
   a window over each event's records gives every row its event's figures
   (publish and match times, owner records, tested count, key and rank,
   payload size).  The re-matching joins the candidates there
   (``rematch.Matcher.candidates``: a broadcast table keeps the
   partitioning), so its pairs are never shuffled.
2. **Counts, not sets.**  Each row's subscription ids are exploded into
   (event, subscription) rows, aggregated (within the partition) into
   per-pair counts — reported, delivered, orphaned, dropped, re-matched and
   the pair's status — plus one row per event (subscription null) with the
   event's own figures.  Every finding is then a sum over those rows in one
   global aggregation: set differences of the old per-event arrays become
   per-pair conditions (``lost``: expected and neither delivered, orphaned
   nor dropped; ``duplicates``: delivered or orphaned c > 1 times counts
   c − 1; …).  No per-event list of ids is built unless a finding needs
   examples, which are computed again for the report only then.
3. **Rank order** is the same job: the keyed deliveries, repartitioned by
   (subscription, key) and ordered by the access node's record order.

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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from overlay_spark.records import Capture, aggregate_row
from overlay_spark.rematch import ACTIVE, CANDIDATE_COLUMNS, INACTIVE, OPEN, Matcher, base_id, status_code

__all__ = ["EXAMPLES", "audit"]

# Examples of each finding shown in the report.
EXAMPLES: Final = 5


_BULK: Final = ("publish", "event", "deliver", "drop")


def _rows(cap: Capture, matcher: Matcher | None, partitions: int) -> DataFrame:
    """Rules 1–2: the records of every event in one partition (one shuffle),
    each row with its event's figures; the re-matching's candidate rows
    joined there."""
    k = F.col("kind")
    pub, ev, dl, dr = (k == x for x in _BULK)
    attrs = matcher.attrs if matcher is not None else []
    values = [F.when(pub, F.col("values").getField(a["name"])).alias(f"v_{a['i']}") for a in attrs]
    u = (
        cap.parsed.filter(k.isin(*_BULK))
        .select(
            "event",
            "kind",
            "node",
            "n",
            "time",
            "key",
            "rank",
            F.coalesce(F.col("payload_bytes"), F.lit(0)).alias("size"),
            F.when(ev, F.col("tested")).alias("tested"),
            F.when(ev, F.col("matched")).alias("matched"),
            F.when(dl | dr, F.col("subs")).alias("subs"),
            F.when(dl, F.col("orphans")).alias("orphans"),
            *values,
        )
        .repartition(partitions, "event")
    )
    w = Window.partitionBy("event")
    u = u.select(
        *u.columns,
        F.max(pub).over(w).alias("published"),
        F.min(F.when(pub, F.col("time"))).over(w).alias("t_pub"),
        F.min(F.when(ev, F.col("time"))).over(w).alias("t_match"),
        F.count(F.when(ev, 1)).over(w).alias("records"),
        F.min_by(F.when(ev, F.col("tested")), F.when(ev, F.col("time"))).over(w).alias("e_tested"),
        F.min_by(F.when(ev, F.size("matched")), F.when(ev, F.col("time"))).over(w).alias("nmatched"),
        # The owner's key and rank: the key's home assigns the rank (SPEC §10).
        F.coalesce(F.max(F.when(ev, F.col("key"))).over(w), F.max(F.when(pub, F.col("key"))).over(w)).alias("ekey"),
        F.coalesce(F.max(F.when(ev, F.col("rank"))).over(w), F.max(F.when(pub, F.col("rank"))).over(w)).alias("erank"),
        F.max(F.when(pub, F.col("size"))).over(w).alias("p_size"),
    )
    if matcher is None:  # nothing to re-match: no candidate rows
        return u.select(
            "*", *[F.lit(None).cast("double" if c != "c_sub" else "string").alias(c) for c in CANDIDATE_COLUMNS]
        )
    return matcher.candidates(u, pub)


def _pairs(rows: DataFrame, tail_from: float) -> DataFrame:
    """Rule 2: per (event, subscription) the counts of each kind of record
    about the pair, and per event (subscription null) the event's figures.

    Each row's subscription ids — an owner's matched conjuncts (read as their
    subscriptions), a delivery's subscriptions then its orphans, a drop's
    subscriptions, a candidate's subscription — are exploded with their
    positions, then one null id for the row itself (which carries the
    delivery's payload figures); plain column expressions, no lambdas."""
    k = F.col("kind")
    cand = F.col("c_sub").isNotNull()
    none = F.array().cast("array<string>")
    subs, orphans, matched = (F.coalesce(F.col(c), none) for c in ("subs", "orphans", "matched"))
    ids = (
        F.when(cand, F.array(F.col("c_sub")))
        .when(k == "event", matched)
        .when(k == "deliver", F.concat(subs, orphans))
        .when(k == "drop", subs)
        .otherwise(none)
    )
    n_ids = F.size(ids)
    st = status_code(
        F.col("t_pub"), F.col("t_match"), F.col("c_t_sub"), F.col("c_t_ack"), F.col("c_t_unsub"), F.col("c_t_unack")
    )
    bad = (k == "deliver") & F.col("p_size").isNotNull() & (F.col("size") != F.col("p_size"))
    # The null id (the event's own group, rule 2) comes from every delivery
    # (its payload figures), the publish's own row, and an owner's or a
    # drop's row only for an event nobody published: each event gets it
    # once at least, and the aggregation is fed no more rows than that.
    published = F.coalesce(F.col("published"), F.lit(False))
    needs_own = ~cand & ((k == "deliver") | (k == "publish") | ~published)
    ex = rows.select(
        "event",
        "ekey",
        "published",
        "t_pub",
        "records",
        "e_tested",
        "nmatched",
        "p_size",
        k.alias("kind"),
        cand.alias("cand"),
        F.when(cand, st).otherwise(0).alias("st"),
        F.size(subs).alias("n_subs"),
        F.when(k == "deliver", F.col("size") * F.size(subs)).otherwise(0).alias("bytes"),
        bad.cast("long").alias("bad"),
        n_ids.alias("n_ids"),
        F.posexplode(F.when(needs_own, F.concat(ids, F.array(F.lit(None).cast("string")))).otherwise(ids)).alias(
            "pos", "id"
        ),
    )
    own = F.col("pos") == F.col("n_ids")
    kind = F.col("kind")
    # Conjunct ids read as their subscription's (rule 2 of rematch): matched and orphans.
    sub = (
        F.when(own, F.lit(None).cast("string"))
        .when((kind == "event") | ((kind == "deliver") & (F.col("pos") >= F.col("n_subs"))), base_id(F.col("id")))
        .otherwise(F.col("id"))
    )
    pair = ~own

    def flag(c: Column) -> Column:
        return (pair & c).cast("int")

    cand_c = F.col("cand")
    ex = ex.select(
        "*",
        sub.alias("sub"),
        flag(~cand_c & (kind == "event")).alias("m"),
        flag(~cand_c & (kind == "deliver") & (F.col("pos") < F.col("n_subs"))).alias("d"),
        flag(~cand_c & (kind == "deliver") & (F.col("pos") >= F.col("n_subs"))).alias("o"),
        flag(~cand_c & (kind == "drop")).alias("x"),
        flag(cand_c).alias("r"),
    )
    return (
        ex.groupBy("event", "sub", "ekey")
        .agg(
            F.max("m").alias("m"),
            F.sum("d").alias("d"),
            F.sum("o").alias("o"),
            F.sum("x").alias("x"),
            F.max("r").alias("r"),
            F.max(F.when(F.col("r") > 0, F.col("st")).otherwise(0)).alias("st"),
            F.sum(F.when(own, F.col("bytes")).otherwise(0)).alias("size"),
            F.sum(F.when(own, F.col("bad")).otherwise(0)).alias("bad"),
            F.max("published").alias("published"),
            F.max("t_pub").alias("t_pub"),
            F.max("records").alias("records"),
            F.max("e_tested").alias("tested"),
            F.max("nmatched").alias("nmatched"),
            F.max("p_size").alias("p_size"),
        )
        .withColumn("tail", F.coalesce(F.col("t_pub") > F.lit(tail_from), F.lit(False)))
    )


def audit(cap: Capture, tail_from: float, matcher: Matcher | None, partitions: int = 8) -> dict[str, Any]:
    """Rules 1–3: the pairs' and events' findings, payloads, rank order and
    examples of each failed finding.  ``matcher`` is None when the capture
    has no subscriptions or no events: nothing is re-matched.  ``partitions``:
    the shuffle by event."""
    rows = _rows(cap, matcher, partitions)
    per = _pairs(rows, tail_from)
    pair = F.col("sub").isNotNull()
    judged = ~F.col("tail")
    m, d, o, x, r, st = (F.col(c) for c in ("m", "d", "o", "x", "r", "st"))
    expected = ((m > 0) & (st != INACTIVE)) | (st == ACTIVE)
    sets = {
        "duplicates": F.greatest(d + o - 1, F.lit(0)),
        "lost": judged & expected & (d + o + x == 0),
        "unexpected": (d > 0) & (m == 0),
        "missing": judged & (F.col("records") > 0) & (st == ACTIVE) & (m == 0),
        "extra": (m > 0) & (r == 0),
        "inactive_matched": (m > 0) & (st == INACTIVE),
        "orphaned": o,
        "dropped": x,
        "rematched": r > 0,
        "reported": m > 0,
        "delivered": d,
        "expected": expected,
        "open": st == OPEN,
        "tail_pairs": F.col("tail") & expected,
    }
    published = F.coalesce(F.col("published"), F.lit(False))
    none = F.col("records") == 0
    keyed = F.col("ekey").isNotNull()
    flags = {
        "unmatched": published & none & judged & ~keyed,
        "unmatched_keyed": published & none & judged & keyed,
        "unmatched_tail": published & none & F.col("tail"),
        "matched_twice": F.col("records") > 1,
        "cost": F.coalesce(F.col("tested") < F.col("nmatched"), F.lit(False)),
    }

    def on_pairs(c: Column) -> Column:
        return F.sum(F.when(pair, c.cast("long")).otherwise(0))

    def on_events(c: Column) -> Column:
        return F.sum(F.when(~pair, c.cast("long")).otherwise(0))

    matched = F.col("records") > 0
    payload_published = F.when(published, F.coalesce("p_size", F.lit(0))).otherwise(0)
    # One job for the totals and the rank order: both read the one shuffle.
    order_df = _order_rows(rows)
    ordered = order_df.agg(
        F.count("*").alias("order_deliveries"), F.sum(F.col("bad").cast("long")).alias("order_violations")
    )
    totals = aggregate_row(
        per.agg(
            *[on_pairs(c).alias(k) for k, c in sets.items()],
            *[on_events(c).alias(k) for k, c in flags.items()],
            on_events(published).alias("published"),
            on_events(F.when(matched, F.col("tested"))).alias("tested"),
            on_events(F.when(matched, F.col("nmatched"))).alias("nmatched"),
            on_events(matched).alias("matched_events"),
            on_events(F.col("tail")).alias("tail_events"),
            on_events(keyed).alias("keyed"),
            F.countDistinct(F.when(~pair, F.col("ekey"))).alias("keys"),
            on_events(payload_published).alias("published_bytes"),
            on_events(payload_published > 0).alias("with_payload"),
            on_events(F.col("size")).alias("delivered_bytes"),
            on_events(F.col("bad")).alias("payload_mismatched"),
        ).crossJoin(ordered)
    ).asDict()
    totals = {k: int(v or 0) for k, v in totals.items()}
    examples: dict[str, list[dict[str, Any]]] = {}
    findings = [k for k in ("lost", "missing", "extra", "unexpected", "duplicates", "inactive_matched") if totals[k]]
    if findings:  # only a failed audit pays for its examples (the pairs computed again)
        for k in findings:
            bad = per.filter(pair & (sets[k].cast("long") > 0))
            ex = bad.groupBy("event").agg(
                F.sum(sets[k].cast("long")).alias(k), F.array_sort(F.collect_list("sub")).alias(f"{k}_ids")
            )
            cols = ["event", k] + ([f"{k}_ids"] if k in ("lost", "missing", "extra", "unexpected") else [])
            examples[k] = [r.asDict() for r in ex.select(*cols).orderBy("event").limit(EXAMPLES).collect()]
    for k in ("unmatched", "unmatched_keyed", "matched_twice", "cost"):
        if totals[k]:
            examples[k] = [
                r.asDict()
                for r in per.filter(~pair & flags[k])
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
            for r in rows.filter(
                (F.col("kind") == "deliver") & F.col("p_size").isNotNull() & (F.col("size") != F.col("p_size"))
            )
            .select("event", F.col("p_size").alias("published"), F.col("size").alias("delivered"))
            .orderBy("event")
            .limit(EXAMPLES)
            .collect()
        ]
    order = None
    if totals["keyed"]:
        order = {
            "deliveries": totals["order_deliveries"],
            "keys": totals["keys"],
            "violations": totals["order_violations"],
        }
        if order["violations"]:
            examples["order"] = [
                r.asDict()
                for r in order_df.filter("bad")
                .select("sub", "key", "prev_event", "prev", "event", "rank")
                .orderBy("sub", "key")
                .limit(EXAMPLES)
                .collect()
            ]
    return {"pairs": pairs, "events": evc, "order": order, "examples": examples, "payloads": payloads}


def _order_rows(rows: DataFrame) -> DataFrame:
    """Rule 3: each delivery of a keyed event to a subscription, with the
    rank of the delivery before it for that (subscription, key) in the access
    node's record order; ``bad`` when its rank is not above that one (SPEC §10)."""
    d = rows.filter((F.col("kind") == "deliver") & F.col("ekey").isNotNull()).select(
        "event",
        F.col("ekey").alias("key"),
        F.col("erank").alias("rank"),
        "node",
        "n",
        "time",
        F.explode("subs").alias("sub"),
    )
    # (A record's time breaks ties of n: only hand-made captures have them.)
    w = Window.partitionBy("sub", "key").orderBy("node", "n", "time")
    d = d.withColumn("prev", F.lag("rank").over(w)).withColumn("prev_event", F.lag("event").over(w))
    return d.withColumn("bad", F.col("prev").isNotNull() & (F.col("rank") <= F.col("prev")))
