"""Independent re-matching (SPEC §2.2, §13): the captured events against the
captured subscriptions, in Spark, compared with what the owners reported.

1. Events are the access nodes' ``publish`` records (what was asked), joined
   with the owners' ``event`` records (what was done: when, where, the
   tested count and the matched ids).  Values are cast per attribute kind
   from the header's schema: float → double, int and rfid → decimal(20,0)
   (rfid codes are unsigned 64-bit), string → string.
2. Subscriptions are the ``subscribe`` records with their lifetime: asked
   (``subscribe``), acknowledged (``subscribed``: every channel applied it),
   and if it ended, ``unsubscribe`` and ``unsubscribed``.  Their text is
   parsed on the executors (``filters.parse_filter``).
3. Candidates: each event is exploded into one key per attribute (an
   equality key for strings, a bucket of the domain for ordered kinds); each
   subscription into the keys of its access attribute; a hash join pairs
   them, and wide subscriptions are crossed with every event.  Each pair is
   then decided exactly: every predicate, in one column expression over the
   predicate's attribute, operator and typed arguments.
4. Whether a pair *must* have matched depends on time (SPEC §4 rule 4 of the
   node core: an event published after the SubAck is matched against the
   subscription).  A pair is ``active`` when the subscription was
   acknowledged before the event was published and not asked to end before
   the event was matched; ``inactive`` when the event was matched before the
   subscription was asked for or published after its end was acknowledged;
   ``open`` otherwise (in flight either way — not judged).

Comparisons: a re-matched active pair the owner did not report is *missing*;
a reported pair the filter does not match is *extra*; a reported pair whose
subscription was inactive is *inactive_matched*.  Costs: a node's cost is
what its index tested, so the checks are ``tested ≥ matches`` per event and
the per-slice sums (``loads.slice_cost_check``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from overlay_spark import filters
from overlay_spark.records import Capture
from overlay_spark.session import ship_code

__all__ = ["BUCKETS", "events_frame", "rematch_pairs", "reported_pairs", "schema_json", "subscriptions_frame"]

# Buckets per ordered attribute for the candidate join: with 128, a range
# subscription covering 5 % of the domain is looked up under ~7 keys.
BUCKETS: Final = 128

_TYPES: Final = {
    "float": "double",
    "numeric": "double",
    "int": "decimal(20,0)",
    "rfid": "decimal(20,0)",
    "string": "string",
}


def _num(text: str | None) -> int | float | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def schema_json(cap: Capture) -> str:
    """The header's schema as ``Schema.from_dict`` takes it (numbers as numbers)."""
    sch = cap.schema
    return json.dumps(
        {
            "distinguishing": list(sch["distinguishing"]),
            "attributes": [
                {"name": a["name"], "type": a["type"], "min": _num(a["min"]), "max": _num(a["max"])}
                for a in sch["attributes"]
            ],
        }
    )


def _attrs(cap: Capture) -> list[dict[str, Any]]:
    out = []
    for i, a in enumerate(cap.schema["attributes"]):
        kind = a["type"]
        out.append(
            {
                "i": i,
                "name": a["name"],
                "kind": kind,
                "type": _TYPES[kind],
                "ordered": kind != "string",
                "min": float(_num(a["min"]) or 0),
                "max": float(_num(a["max"]) or 0),
            }
        )
    return out


def _bucket(x: Column, a: dict[str, Any]) -> Column:
    span = a["max"] - a["min"]
    if span <= 0:
        return F.lit(0).cast("long")
    b = F.floor((x.cast("double") - F.lit(a["min"])) / F.lit(span) * F.lit(BUCKETS))
    return F.least(F.lit(BUCKETS - 1).cast("long"), F.greatest(F.lit(0).cast("long"), b))


def events_frame(cap: Capture, tail_from: float) -> DataFrame:
    """Rule 1: one row per published event, with typed values ``v_<i>``.

    ``records`` counts the owners' ``event`` records of the event (1 when all
    is well); ``tail`` marks events published after ``tail_from`` (left out
    of the loss checks: they may have been in flight at shutdown).
    """
    pub = cap.df("publish").select(
        "event", F.col("node").alias("access"), F.col("time").alias("t_pub"), "values", "key", "rank", "channel"
    )
    rec = (
        cap.df("event")
        .groupBy("event")
        .agg(
            F.count("*").alias("records"),
            F.min("time").alias("t_match"),
            F.min_by("node", "time").alias("owner"),
            F.min_by("tested", "time").alias("tested"),
            F.min_by(F.size("matched"), "time").alias("nmatched"),
            F.flatten(F.collect_list("matched")).alias("m"),
            # The owner's key and rank: the key's home assigns the rank (SPEC §10).
            F.max("key").alias("owner_key"),
            F.max("rank").alias("owner_rank"),
        )
    )
    ev = pub.join(rec, "event", "full_outer")
    typed = [F.col("values")[a["name"]].cast(a["type"]).alias(f"v_{a['i']}") for a in _attrs(cap)]
    return ev.select(
        "event",
        "access",
        "t_pub",
        F.coalesce("owner_key", "key").alias("key"),
        F.coalesce("owner_rank", "rank").alias("rank"),
        "channel",
        F.coalesce("records", F.lit(0)).alias("records"),
        "t_match",
        "owner",
        "tested",
        "nmatched",
        F.coalesce("m", F.array().cast("array<string>")).alias("m"),
        F.col("values").isNotNull().alias("published"),
        (F.col("t_pub") > F.lit(tail_from)).alias("tail"),
        *typed,
    )


def subscriptions_frame(spark: SparkSession, cap: Capture) -> DataFrame:
    """Rule 2: one row per subscription, with its lifetime and parsed text."""
    subs = (
        cap.df("subscribe")
        .groupBy("sub")
        .agg(
            F.min("time").alias("t_sub"),
            F.first("filter").alias("filter"),
            F.first("node").alias("access"),
            F.first("subscriber").alias("subscriber"),
        )
    )
    for kind, col in (("subscribed", "t_ack"), ("unsubscribe", "t_unsub"), ("unsubscribed", "t_unack")):
        if cap.has(kind):
            subs = subs.join(cap.df(kind).groupBy("sub").agg(F.min("time").alias(col)), "sub", "left")
        else:
            subs = subs.withColumn(col, F.lit(None).cast("double"))
    ship_code(spark)
    sj = schema_json(cap)
    parse = F.udf(lambda text: filters.parse_filter(text, sj), filters.PARSED_TYPE)
    return subs.withColumn("parsed", parse("filter"))


def _typed_preds(attrs: list[dict[str, Any]]) -> Column:
    """Each predicate with its arguments cast once: double, decimal and string forms."""
    return F.transform(
        F.col("parsed.preds"),
        lambda p: F.struct(
            p["attr"].alias("attr"),
            p["op"].alias("op"),
            p["args"][0].cast("double").alias("f0"),
            p["args"][1].cast("double").alias("f1"),
            F.transform(p["args"], lambda x: x.cast("double")).alias("farr"),
            p["args"][0].cast("decimal(20,0)").alias("i0"),
            p["args"][1].cast("decimal(20,0)").alias("i1"),
            F.transform(p["args"], lambda x: x.cast("decimal(20,0)")).alias("iarr"),
            p["args"][0].alias("s0"),
            p["args"].alias("sarr"),
        ),
    )


def _ordered(op: Column, v: Column, lo: Column, hi: Column, arr: Column) -> Column:
    return (
        F.when(op == "=", v == lo)
        .when(op == "!=", v != lo)
        .when(op == "<", v < lo)
        .when(op == "<=", v <= lo)
        .when(op == ">", v > lo)
        .when(op == ">=", v >= lo)
        .when(op == "in[]", (v >= lo) & (v <= hi))
        .when(op == "in{}", F.array_contains(arr, v))
    )


def _string(op: Column, v: Column, s0: Column, arr: Column) -> Column:
    return (
        F.when(op == "=", v == s0)
        .when(op == "!=", v != s0)
        .when(op == "prefix", v.startswith(s0))
        .when(op == "suffix", v.endswith(s0))
        .when(op == "contains", v.contains(s0))
        .when(op == "in{}", F.array_contains(arr, v))
    )


def _satisfied(p: Column, attrs: list[dict[str, Any]]) -> Column:
    """``a satisfies f`` (SPEC §2.2): same attribute and value in L(f); an
    event without the attribute satisfies nothing on it."""
    expr = None
    for a in attrs:
        v = F.col(f"v_{a['i']}")
        if a["kind"] == "string":
            test = _string(p["op"], v, p["s0"], p["sarr"])
        elif a["type"] == "double":
            test = _ordered(p["op"], v, p["f0"], p["f1"], p["farr"])
        else:
            test = _ordered(p["op"], v, p["i0"], p["i1"], p["iarr"])
        cond = p["attr"] == a["name"]
        expr = F.when(cond, test) if expr is None else expr.when(cond, test)
    return F.coalesce(expr, F.lit(False)) if expr is not None else F.lit(False)


def _event_keys(attrs: list[dict[str, Any]]) -> Column:
    keys = []
    for a in attrs:
        v = F.col(f"v_{a['i']}")
        if a["ordered"]:
            k = F.concat(F.lit(f"{a['i']}#"), _bucket(v, a).cast("string"))
        else:
            k = F.concat(F.lit(f"{a['i']}="), v)
        keys.append(F.when(v.isNotNull(), k))
    return F.filter(F.array(*keys), lambda k: k.isNotNull())


def _prefixed(pfx: Column, key: Callable[[Column], Column]) -> Callable[[Column], Column]:
    """``pfx`` + ``key(x)``, as the one-argument function ``F.transform`` takes."""
    return lambda x: F.concat(pfx, key(x))


def _bucket_text(a: dict[str, Any]) -> Callable[[Column], Column]:
    return lambda x: _bucket(x.cast(a["type"]), a).cast("string")


def _sub_keys(attrs: list[dict[str, Any]]) -> Column:
    expr = F.when(F.lit(False), F.array().cast("array<string>"))
    for a in attrs:
        is_attr = F.col("parsed.key_attr") == a["name"]
        kk = F.col("parsed.key_kind")
        if a["ordered"]:
            pfx = F.lit(f"{a['i']}#")
            points = F.transform(F.col("parsed.key_vals"), _prefixed(pfx, _bucket_text(a)))
            rng = F.transform(
                F.sequence(
                    _bucket(F.col("parsed.key_lo").cast(a["type"]), a),
                    _bucket(F.col("parsed.key_hi").cast(a["type"]), a),
                ),
                _prefixed(pfx, lambda b: b.cast("string")),
            )
            expr = expr.when(is_attr & (kk == "points"), F.array_distinct(points)).when(is_attr & (kk == "range"), rng)
        else:
            pfx = F.lit(f"{a['i']}=")
            expr = expr.when(
                is_attr & (kk == "points"), F.transform(F.col("parsed.key_vals"), _prefixed(pfx, lambda x: x))
            )
    return expr


def rematch_pairs(
    spark: SparkSession, cap: Capture, events: DataFrame, subs: DataFrame
) -> tuple[DataFrame, dict[str, Any]]:
    """Rules 3–4: every (event, subscription) pair whose filter the event
    satisfies, with ``status`` active / inactive / open.  Also returns the
    subscription parse summary (counts by access-key kind, parse errors)."""
    attrs = _attrs(cap)
    sp = subs.select(
        "sub",
        "t_sub",
        "t_ack",
        "t_unsub",
        "t_unack",
        "parsed.ok",
        "parsed.error",
        "parsed.key_kind",
        _typed_preds(attrs).alias("preds"),
        _sub_keys(attrs).alias("keys"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    summary_rows = (
        sp.groupBy("ok", "key_kind")
        .agg(
            F.count("*").alias("n"),
            F.max(F.size("preds")).alias("k"),
            F.slice(F.collect_list(F.when(~F.col("ok"), F.struct("sub", "error"))), 1, 5).alias("bad"),
        )
        .collect()
    )
    bad = [b.asDict() for r in summary_rows for b in (r["bad"] or [])]
    k = max([r["k"] or 0 for r in summary_rows] + [0])
    summary = {
        "subscriptions": sum(r["n"] for r in summary_rows),
        "by_key": {f"{r['key_kind']}": r["n"] for r in summary_rows if r["ok"]},
        "unparsed": sum(r["n"] for r in summary_rows if not r["ok"]),
        "unparsed_examples": bad,
        "max_predicates": k,
    }
    good = sp.filter(F.col("ok"))
    # Pad the predicate list to k columns: the match test is then one flat,
    # code-generated expression instead of a lambda over an array per pair.
    pred_cols = [F.get(F.col("preds"), i).alias(f"p_{i}") for i in range(k)]
    life = ["sub", "t_sub", "t_ack", "t_unsub", "t_unack"]
    sub_preds = good.select(*life, *pred_cols)
    ev_cols = ["event", "t_pub", "t_match"] + [f"v_{a['i']}" for a in attrs]
    ev = events.filter("published").select(*ev_cols)

    keyed = good.filter(F.col("key_kind").isin("points", "range")).select("sub", F.explode("keys").alias("key"))
    ev_keys = ev.select(*ev_cols, F.explode(_event_keys(attrs)).alias("key"))
    cand = ev_keys.join(F.broadcast(keyed), "key").drop("key").join(F.broadcast(sub_preds), "sub")
    wide = good.filter(F.col("key_kind") == "wide").select(*life, *pred_cols)
    cand = cand.unionByName(ev.crossJoin(F.broadcast(wide)))

    test = F.lit(True)
    for i in range(k):
        p = F.col(f"p_{i}")
        test = test & (p.isNull() | _satisfied(p, attrs))
    t_done = F.coalesce("t_match", "t_pub")
    status = (
        F.when(
            F.col("t_ack").isNotNull()
            & (F.col("t_ack") <= F.col("t_pub"))
            & (F.col("t_unsub").isNull() | (F.col("t_unsub") >= t_done)),
            F.lit("active"),
        )
        .when(
            (t_done < F.col("t_sub")) | (F.col("t_unack").isNotNull() & (F.col("t_pub") > F.col("t_unack"))),
            F.lit("inactive"),
        )
        .otherwise(F.lit("open"))
    )
    pairs = cand.filter(test).select("event", "sub", status.alias("status"))
    return pairs, summary


def reported_pairs(cap: Capture) -> DataFrame:
    """(event, sub, owner) for every subscription an owner reported matched."""
    return cap.df("event").select("event", F.explode("matched").alias("sub"), F.col("node").alias("owner"))
