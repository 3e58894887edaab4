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

1. **Narrow rows, shuffled by event.**  Each record becomes small rows:
   its *own* row (a publish's or an owner's figures: time, tested count,
   key, rank, payload size) and one row per subscription id it names (an
   owner's matched conjuncts read as their subscriptions, a delivery's
   subscriptions and orphans, a drop's subscriptions); the re-matching's
   candidate pairs (``rematch.Matcher.pairs``, a broadcast join on the
   publish records) are id rows too.  No row carries another record's
   columns, and nothing is sorted by event.  A delivery's payload size
   rides on its id rows (``z``); it has an own row only when it names no
   subscription at all, so ``E`` aggregates about two rows per event (its
   publish and its owner's), not one more per access node it reached.
   The own rows, the id rows and the delivery rows of the rank order are
   three frames (``_rows``), each read from the cached capture with only
   the records it needs and shuffled by event on its own.
2. **Counts, not sets.**  After the shuffle the own rows are aggregated
   into one row per event (``E``: publish and match times, owner records,
   tested count, key and rank, payload figures; kept for the three uses
   below) and the id rows into one row per (event, subscription) pair
   (``P``: reported, delivered, orphaned, dropped and re-matched counts,
   the delivered payload sizes, the subscription's lifetime).  Both are
   partitioned by event, so ``P`` meets its event's row in a hash join
   without another shuffle; the pair's status (``rematch`` rule 4) needs
   the event's times.  Every finding is then a sum over those rows in one
   global aggregation: set differences become per-pair conditions
   (``lost``: expected and neither delivered, orphaned nor dropped;
   ``duplicates``: delivered or orphaned c > 1 times counts c − 1; …).
   No per-event list of ids is built unless a finding needs examples,
   which are computed again for the report only then; likewise the exact
   count of payload mismatches when an event's (or a pair's) delivered
   sizes are not all its published one.
3. **Rank order** is the same job: the delivery rows (which carry their
   record's node, number and time) meet their event's key and rank in
   ``E``, are repartitioned by (subscription, key) and ordered by the
   access node's record order.

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

from dataclasses import dataclass
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from overlay_spark.records import Capture, aggregate_row
from overlay_spark.rematch import ACTIVE, INACTIVE, OPEN, Matcher, base_id, status_code

__all__ = ["EXAMPLES", "audit"]

# Examples of each finding shown in the report.
EXAMPLES: Final = 5


# Row codes before the shuffle (rule 1): a record's own row, by kind, and
# the id rows (reported, delivered, orphaned, dropped, re-matched).
_OWN_PUB: Final = 1
_OWN_EV: Final = 2
_OWN_DL: Final = 3
_M: Final = 4
_D: Final = 5
_O: Final = 6
_X: Final = 7
_R: Final = 8


@dataclass
class _Rows:
    """Rule 1's rows, each frame partitioned by event: ``own`` (``event``,
    ``c`` its code, ``o`` the record's figures), ``ids`` (``event``, ``s`` a
    subscription id, ``c``, ``z`` a delivery's payload size) and
    ``delivered`` (``event``, ``s``, ``at``: the delivery record's node,
    number and time, for the rank order)."""

    own: DataFrame
    ids: DataFrame
    delivered: DataFrame


def _rows(cap: Capture, matcher: Matcher | None, partitions: int) -> _Rows:
    """Rule 1: every record's own row and id rows, and the candidate pairs.

    Each reader (the events' figures, the pairs, the rank order) has a
    frame of its own, read from the cached capture and shuffled by event:
    only the records it needs, and an array exploded only where its ids
    are wanted (one frame of every row, filtered by the readers, exploded
    every record's ids three times; keeping its shuffled rows instead cost
    16 s of CPU to cache 14M rows)."""
    k = F.col("kind")
    pub, ev, dl, dr = (k == x for x in ("publish", "event", "deliver", "drop"))
    none = F.array().cast("array<string>")
    subs, orphans = (F.coalesce(F.col(c), none) for c in ("subs", "orphans"))
    size = F.coalesce(F.col("payload_bytes"), F.lit(0))
    parsed = cap.parsed
    # A delivery has an own row only when it names no subscription: its size
    # travels on its id rows (``z``), which the pairs aggregate anyway.
    own = parsed.filter(pub | ev | (dl & (F.size(subs) + F.size(orphans) == 0))).select(
        "event",
        F.when(pub, _OWN_PUB).when(ev, _OWN_EV).otherwise(_OWN_DL).alias("c"),
        F.struct(
            F.col("time"),
            F.col("tested"),
            F.size("matched").alias("nmatched"),
            F.col("key"),
            F.col("rank"),
            size.alias("size"),
            F.size(subs).alias("n_subs"),
        ).alias("o"),
    )
    ids = F.when(ev, F.coalesce(F.col("matched"), none)).when(dl, F.concat(subs, orphans)).otherwise(subs)
    x = parsed.filter(ev | dl | dr).select(
        "event",
        k.alias("kind"),
        F.size(subs).alias("n_subs"),
        size.alias("size"),
        F.posexplode(ids).alias("pos", "id"),
    )
    kind = F.col("kind")
    is_ev, is_dl = kind == "event", kind == "deliver"
    orphan = is_dl & (F.col("pos") >= F.col("n_subs"))
    # Conjunct ids read as their subscription's (rematch rule 2): matched and
    # orphans; the regular expression only runs on an id that has a "/".
    sid = F.col("id")
    sub = F.when((is_ev | orphan) & (F.instr(sid, "/") > 0), base_id(sid)).otherwise(sid)
    code = F.when(is_ev, _M).when(orphan, _O).when(is_dl, _D).otherwise(_X)
    id_rows = x.select("event", sub.alias("s"), code.alias("c"), F.when(is_dl, F.col("size")).alias("z"))
    if matcher is not None:
        events = cap.df("publish").select(
            "event", *[F.col("values").getField(a["name"]).alias(f"v_{a['i']}") for a in matcher.attrs]
        )
        cands = matcher.pairs(events).select(
            "event", F.col("c_sub").alias("s"), F.lit(_R).alias("c"), F.lit(None).cast("bigint").alias("z")
        )
        id_rows = id_rows.unionByName(cands)
    delivered = parsed.filter(dl).select("event", F.struct("node", "n", "time").alias("at"), F.explode(subs).alias("s"))
    return _Rows(
        own.repartition(partitions, "event"),
        id_rows.repartition(partitions, "event"),
        delivered.repartition(partitions, "event"),
    )


def _events(own: DataFrame, tail_from: float) -> DataFrame:
    """Rule 2: ``E``, one row per event from its own rows."""
    c, o = F.col("c"), F.col("o")
    pub, ev, dl = c == _OWN_PUB, c == _OWN_EV, c == _OWN_DL
    return (
        own.groupBy("event")
        .agg(
            F.max(pub).alias("published"),
            F.min(F.when(pub, o["time"])).alias("t_pub"),
            F.min(F.when(ev, o["time"])).alias("t_match"),
            F.count(F.when(ev, 1)).alias("records"),
            F.min_by(F.when(ev, o["tested"]), F.when(ev, o["time"])).alias("tested"),
            F.min_by(F.when(ev, o["nmatched"]), F.when(ev, o["time"])).alias("nmatched"),
            # The owner's key and rank: the key's home assigns the rank (SPEC §10).
            F.coalesce(F.max(F.when(ev, o["key"])), F.max(F.when(pub, o["key"]))).alias("ekey"),
            F.coalesce(F.max(F.when(ev, o["rank"])), F.max(F.when(pub, o["rank"]))).alias("erank"),
            F.max(F.when(pub, o["size"])).alias("p_size"),
            F.sum(F.when(dl, o["size"] * o["n_subs"]).otherwise(0)).alias("bytes"),
            F.min(F.when(dl, o["size"])).alias("d_lo"),
            F.max(F.when(dl, o["size"])).alias("d_hi"),
        )
        .withColumn("tail", F.coalesce(F.col("t_pub") > F.lit(tail_from), F.lit(False)))
    )


def _pairs(ids: DataFrame, events: DataFrame, matcher: Matcher | None) -> DataFrame:
    """Rule 2: ``P``, per (event, subscription) the counts of each kind of
    id row, with its event's figures (a hash join within the partition) and
    the subscription's lifetime."""
    c = F.col("c")

    def count(code: int) -> Column:
        return F.sum((c == code).cast("int"))

    per = ids.groupBy("event", "s").agg(
        F.max((c == _M).cast("int")).alias("m"),
        count(_D).alias("d"),
        count(_O).alias("o"),
        count(_X).alias("x"),
        F.max((c == _R).cast("int")).alias("r"),
        # Payloads (rule 2): a delivery's size once per subscription notified, and the sizes seen.
        F.sum(F.when(c == _D, F.col("z"))).alias("z_bytes"),
        F.min("z").alias("z_lo"),
        F.max("z").alias("z_hi"),
    )
    if matcher is not None:  # (a broadcast table keeps the partitioning by event)
        life = matcher.lifetimes.withColumnRenamed("sub", "s")
        per = per.join(F.broadcast(life) if matcher.broadcast else life, "s", "left")
    else:
        per = per.select("*", *[F.lit(None).cast("double").alias(c) for c in ("t_sub", "t_ack", "t_unsub", "t_unack")])
    ev = events.select("event", "t_pub", "t_match", "records", "tail", "p_size").hint("shuffle_hash")
    j = per.join(ev, "event", "left")
    st = status_code(
        F.col("t_pub"), F.col("t_match"), F.col("t_sub"), F.col("t_ack"), F.col("t_unsub"), F.col("t_unack")
    )
    return j.select(
        "event",
        F.col("s").alias("sub"),
        "m",
        "d",
        "o",
        "x",
        "r",
        F.when(F.col("r") > 0, st).otherwise(0).alias("st"),
        F.coalesce(F.col("records"), F.lit(0)).alias("records"),
        F.coalesce(F.col("tail"), F.lit(False)).alias("tail"),
        "z_bytes",
        _suspect(F.col("p_size"), F.col("z_lo"), F.col("z_hi")).alias("z_suspect"),
    )


def _suspect(published: Column, lo: Column, hi: Column) -> Column:
    """Rule 2: some delivery's payload size (between ``lo`` and ``hi``) is not
    the published one: the exact count is computed again."""
    return published.isNotNull() & ((lo != published) | (hi != published))


def audit(cap: Capture, tail_from: float, matcher: Matcher | None, partitions: int = 8) -> dict[str, Any]:
    """Rules 1–3: the pairs' and events' findings, payloads, rank order and
    examples of each failed finding.  ``matcher`` is None when the capture
    has no subscriptions or no events: nothing is re-matched.  ``partitions``:
    the shuffle by event."""
    rows = _rows(cap, matcher, partitions)
    # Read three times (the pairs' join, the event totals, the rank order):
    # aggregated once.
    events = _events(rows.own, tail_from).persist(StorageLevel.MEMORY_AND_DISK)
    per = _pairs(rows.ids, events, matcher)
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
    ev_judged = ~F.col("tail")
    flags = {
        "unmatched": published & none & ev_judged & ~keyed,
        "unmatched_keyed": published & none & ev_judged & keyed,
        "unmatched_tail": published & none & F.col("tail"),
        "matched_twice": F.col("records") > 1,
        "cost": F.coalesce(F.col("tested") < F.col("nmatched"), F.lit(False)),
    }

    def total(c: Column) -> Column:
        return F.sum(F.coalesce(c.cast("long"), F.lit(0)))

    matched = F.col("records") > 0
    payload_published = F.when(published, F.coalesce("p_size", F.lit(0))).otherwise(0)
    # An event some delivery of which has another size than its publish:
    # the exact count of such deliveries is computed again only then.
    suspect = _suspect(F.col("p_size"), F.col("d_lo"), F.col("d_hi"))
    # One job for the totals and the rank order: all read the one shuffle.
    order_df = _order_rows(rows.delivered, events, partitions)
    ordered = order_df.agg(
        F.count("*").alias("order_deliveries"), F.sum(F.col("bad").cast("long")).alias("order_violations")
    )
    event_totals = events.agg(
        *[total(c).alias(k) for k, c in flags.items()],
        total(published).alias("published"),
        total(F.when(matched, F.col("tested"))).alias("tested"),
        total(F.when(matched, F.col("nmatched"))).alias("nmatched"),
        total(matched).alias("matched_events"),
        total(F.col("tail")).alias("tail_events"),
        total(keyed).alias("keyed"),
        F.countDistinct("ekey").alias("keys"),
        total(payload_published).alias("published_bytes"),
        total(payload_published > 0).alias("with_payload"),
        total(F.col("bytes")).alias("delivered_bytes"),
        total(suspect).alias("payload_suspect"),
    )
    totals = aggregate_row(
        per.agg(
            *[total(c).alias(k) for k, c in sets.items()],
            total(F.col("z_bytes")).alias("pair_bytes"),
            total(F.col("z_suspect")).alias("pair_suspect"),
        )
        .crossJoin(event_totals)
        .crossJoin(ordered)
    ).asDict()
    totals = {k: int(v or 0) for k, v in totals.items()}
    # Deliveries that named subscriptions came in their id rows (rule 1).
    totals["delivered_bytes"] += totals.pop("pair_bytes")
    totals["payload_suspect"] += totals.pop("pair_suspect")
    examples: dict[str, list[dict[str, Any]]] = {}
    findings = [k for k in ("lost", "missing", "extra", "unexpected", "duplicates", "inactive_matched") if totals[k]]
    if findings:  # only a failed audit pays for its examples (the pairs computed again)
        for k in findings:
            bad = per.filter(sets[k].cast("long") > 0)
            ex = bad.groupBy("event").agg(
                F.sum(sets[k].cast("long")).alias(k), F.array_sort(F.collect_list("sub")).alias(f"{k}_ids")
            )
            cols = ["event", k] + ([f"{k}_ids"] if k in ("lost", "missing", "extra", "unexpected") else [])
            examples[k] = [r.asDict() for r in ex.select(*cols).orderBy("event").limit(EXAMPLES).collect()]
    for k in ("unmatched", "unmatched_keyed", "matched_twice", "cost"):
        if totals[k]:
            examples[k] = [
                r.asDict()
                for r in events.filter(flags[k])
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
        "mismatched": 0,
    }
    if totals["payload_suspect"]:
        mism = _mismatched(cap)
        payloads["mismatched"] = mism.count()
        payloads["examples"] = [r.asDict() for r in mism.orderBy("event").limit(EXAMPLES).collect()]
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
    events.unpersist()
    return {"pairs": pairs, "events": evc, "order": order, "examples": examples, "payloads": payloads}


def _mismatched(cap: Capture) -> DataFrame:
    """Every delivery whose payload size differs from its event's publish:
    ``event``, ``published``, ``delivered`` (payloads, rule 2)."""
    size = F.coalesce(F.col("payload_bytes"), F.lit(0))
    published = cap.df("publish").groupBy("event").agg(F.max(size).alias("published"))
    delivered = cap.df("deliver").select("event", size.alias("delivered"))
    return delivered.join(published, "event").filter(F.col("delivered") != F.col("published"))


def _order_rows(delivered: DataFrame, events: DataFrame, partitions: int) -> DataFrame:
    """Rule 3: each delivery of a keyed event to a subscription, with the
    rank of the delivery before it for that (subscription, key) in the access
    node's record order; ``bad`` when its rank is not above that one (SPEC §10)."""
    ranks = events.filter(F.col("ekey").isNotNull()).select("event", "ekey", "erank").hint("shuffle_hash")
    d = delivered.join(ranks, "event").select(
        "event",
        F.col("ekey").alias("key"),
        F.col("erank").alias("rank"),
        F.col("at.node").alias("node"),
        F.col("at.n").alias("n"),
        F.col("at.time").alias("time"),
        F.col("s").alias("sub"),
    )
    # Repartitioned by hand: the adaptive plan would coalesce this shuffle to
    # a few partitions, an odd number of long tasks on two cores.
    d = d.repartition(partitions, "sub", "key")
    # (A record's time breaks ties of n: only hand-made captures have them.)
    w = Window.partitionBy("sub", "key").orderBy("node", "n", "time")
    d = d.withColumn("prev", F.lag("rank").over(w)).withColumn("prev_event", F.lag("event").over(w))
    return d.withColumn("bad", F.col("prev").isNotNull() & (F.col("rank") <= F.col("prev")))
