"""Independent re-matching (SPEC §2.2, §13): the captured events against the
captured subscriptions, in Spark, compared with what the owners reported.

1. Events are the access nodes' ``publish`` records (what was asked), with
   their values in typed columns ``v_<i>`` (``records.value_type``: float →
   double, int → long, rfid → decimal(20,0), string → string).
2. Subscriptions are the ``subscribe`` records with their lifetime: asked
   (``subscribe``), acknowledged (``subscribed``: every channel applied it),
   and if it ended, ``unsubscribe`` and ``unsubscribed``.  Their text is
   parsed on the executors (``filters.parse_filter``), which also picks each
   one's candidate keys from the events' histogram (``histogram``).  A
   subscription is one row per conjunct of its disjunctive normal form; a
   pair matched by several conjuncts of one subscription is one pair.  The
   owners name the conjuncts of a subscription of several ``<sub>/<j>`` in
   their ``event`` records (``node.sessions`` rule 7): ``base_ids`` reads
   those as ``<sub>``.
3. Candidates: each event carries one key per key family some subscription
   uses (``filters`` rule 4: a bucket of an ordered attribute at one level,
   a string value, or ``*``); each subscription its keys; a broadcast hash
   join pairs them (``Matcher.pairs``).  Keys travel as 64-bit hashes
   of family and bucket or value (a collision only adds a candidate).  No
   subscription is crossed with every event unless it constrains no
   attribute by equality or range (key ``*``).  Each pair is then decided
   exactly: every predicate, in one column expression over the predicate's
   attribute, operator and typed arguments (``satisfied`` — the one place
   that knows the filter language's operators), with attribute and
   operator as integer codes.
4. Whether a pair *must* have matched depends on time (SPEC §4 rule 4 of the
   node core: an event published after the SubAck is matched against the
   subscription).  A pair is ``active`` when the subscription was
   acknowledged before the event was published and not asked to end before
   the event was matched; ``inactive`` when the event was matched before the
   subscription was asked for or published after its end was acknowledged;
   ``open`` otherwise (in flight either way — not judged).  ``status`` is
   that rule as a column expression; the audit applies it once the event's
   match time is known.

Comparisons: a re-matched active pair the owner did not report is *missing*;
a reported pair the filter does not match is *extra*; a reported pair whose
subscription was inactive is *inactive_matched*.  Costs: a node's cost is
what its index tested, so the checks are ``tested ≥ matches`` per event and
the per-slice sums (``loads.slice_cost_check``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from overlay_spark import filters
from overlay_spark.records import Capture, value_type
from overlay_spark.session import ship_code

__all__ = [
    "ACTIVE",
    "BROADCAST_KEYS",
    "CANDIDATE_COLUMNS",
    "EMPTY_SUMMARY",
    "INACTIVE",
    "OPEN",
    "OP_CODES",
    "Matcher",
    "base_id",
    "base_ids",
    "events_frame",
    "histogram",
    "prepare",
    "satisfied",
    "schema_json",
    "status",
    "status_code",
    "subscriptions_frame",
]

# Subscription keys up to this many rows are broadcast to every task of the
# candidate join; more, and the join is a shuffle (bounded memory either way).
BROADCAST_KEYS: Final = 100_000
# A string value seen in fewer than 1/HEAVY of the events is not listed in
# the histogram; its count is bounded by that instead.
HEAVY: Final = 1024


def _num(text: Any) -> int | float | None:
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return text
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
                "type": value_type(a).simpleString(),
                "ordered": kind != "string",
                "range": cap.ranges.get(a["name"]),
            }
        )
    return out


# A conjunct's id: its subscription's id (ending in ``:<n>``), then ``/<j>``.
_CONJUNCT_ID: Final = r"^(.*:[0-9]+)/[0-9]+$"


def base_id(sid: Column) -> Column:
    """Rule 2: one subscription id, a conjunct's id read as its subscription's."""
    return F.regexp_replace(sid, _CONJUNCT_ID, "$1")


def base_ids(ids: Column) -> Column:
    """Rule 2: an array of subscription ids with every conjunct's id read as
    its subscription's."""
    return F.transform(ids, lambda x: F.regexp_replace(x, _CONJUNCT_ID, "$1"))


def _bucket(x: Column, lo: float, hi: float) -> Column:
    """``filters.bucket`` as a column: the same double operations in the same order."""
    span = hi - lo
    if not span > 0:
        return F.lit(0).cast("long")
    b = F.floor((x.cast("double") - F.lit(lo)) / F.lit(span) * F.lit(float(filters.FINEST)))
    return F.least(F.lit(filters.FINEST - 1).cast("long"), F.greatest(F.lit(0).cast("long"), b))


def events_frame(cap: Capture) -> DataFrame:
    """Rule 1: one row per publish record, its values typed in ``v_<i>``."""
    typed = [F.col("values").getField(a["name"]).alias(f"v_{a['i']}") for a in _attrs(cap)]
    return cap.df("publish").select("event", F.col("node").alias("access"), F.col("time").alias("t_pub"), *typed)


def histogram(cap: Capture, events: DataFrame) -> dict[str, Any]:
    """The events' histogram ``filters.choose_key`` costs keys with: per ordered
    attribute the count per finest bucket (as prefix sums), per string
    attribute the count of each value seen in at least 1/``HEAVY`` of the
    events.  At most ``FINEST`` numbers per ordered attribute and ``HEAVY``
    values per string one reach the driver."""
    attrs = _attrs(cap)
    n_events = cap.counts.get("publish", 0)
    parts = []
    for a in attrs:
        v = F.col(f"v_{a['i']}")
        if a["ordered"] and a["range"] is not None:
            parts.append(
                F.when(
                    v.isNotNull(),
                    F.struct(
                        F.lit(a["i"]).alias("i"),
                        _bucket(v, *a["range"]).alias("b"),
                        F.lit(None).cast("string").alias("s"),
                    ),
                )
            )
        elif not a["ordered"]:
            parts.append(
                F.when(
                    v.isNotNull(), F.struct(F.lit(a["i"]).alias("i"), F.lit(None).cast("long").alias("b"), v.alias("s"))
                )
            )
    stats: dict[str, Any] = {
        "events": n_events,
        # filters rule 2: all subscriptions' range keys together stay under BROADCAST_KEYS.
        "key_budget": BROADCAST_KEYS // max(1, cap.counts.get("subscribe", 0)),
        "index": {a["name"]: a["i"] for a in attrs},
        "attrs": {},
    }
    if not parts:
        return stats
    thr = max(1, n_events // HEAVY)
    rows = (
        events.select(F.explode(F.array(*parts)).alias("k"))
        .filter(F.col("k").isNotNull())
        .groupBy("k.i", "k.b", "k.s")
        .count()
        .filter(F.col("b").isNotNull() | (F.col("count") >= thr))
        .collect()
    )
    by_attr: dict[int, list[Any]] = {}
    for r in rows:
        by_attr.setdefault(r["i"], []).append(r)
    for a in attrs:
        got = by_attr.get(a["i"], [])
        if a["ordered"]:
            if a["range"] is None:
                continue
            counts = [0] * filters.FINEST
            for r in got:
                counts[int(r["b"])] += int(r["count"])
            prefix = [0]
            for c in counts:
                prefix.append(prefix[-1] + c)
            lo, hi = a["range"]
            stats["attrs"][a["name"]] = {"lo": lo, "hi": hi, "prefix": prefix}
        else:
            stats["attrs"][a["name"]] = {"counts": {r["s"]: int(r["count"]) for r in got}, "rest": thr}
    return stats


def subscriptions_frame(spark: SparkSession, cap: Capture, stats: dict[str, Any]) -> DataFrame:
    """Rule 2: one row per subscription, with its lifetime, parsed text and keys."""
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
    sj, st = schema_json(cap), json.dumps(stats)
    parse = F.udf(lambda text: filters.parse_filter(text, sj, st), filters.PARSED_TYPE)
    # One row per conjunct (rule 2), each with the fields of one parsed filter.
    c = F.col("c")
    fields = ("preds", "key_kind", "key_attr", "key_group", "keys", "cost")
    return (
        subs.withColumn("p", parse("filter"))
        .select(
            *subs.columns,
            F.col("p.ok").alias("ok"),
            F.col("p.error").alias("error"),
            F.explode("p.conjuncts").alias("c"),
        )
        .select(*subs.columns, F.struct("ok", "error", *(c[f].alias(f) for f in fields)).alias("parsed"))
    )


def _forms(attrs: list[dict[str, Any]]) -> list[str]:
    """The Spark types the attributes' values have (one typed form of each argument per type)."""
    return sorted({a["type"] for a in attrs})


def _form(t: str) -> str:
    return t.replace("(", "_").replace(",", "_").replace(")", "")


def _typed_preds(attrs: list[dict[str, Any]]) -> Column:
    """Each predicate with its attribute as its index in the schema, its
    operator as its code in ``OP_CODES`` (integer comparisons in the match
    test, not string ones), and its arguments cast once to every value type
    of the schema."""

    def caster(t: str) -> Callable[[Column], Column]:
        return lambda x: x.cast(t)

    by_name = F.create_map(*[x for a in attrs for x in (F.lit(a["name"]), F.lit(a["i"]))])
    by_op = F.create_map(*[x for op, c in OP_CODES.items() for x in (F.lit(op), F.lit(c))])

    def typed(p: Column) -> Column:
        fields = [by_name[p["attr"]].alias("a"), by_op[p["op"]].alias("o")]
        for t in _forms(attrs):
            f = _form(t)
            fields += [
                p["args"][0].cast(t).alias(f"{f}0"),
                p["args"][1].cast(t).alias(f"{f}1"),
                F.transform(p["args"], caster(t)).alias(f"{f}arr"),
            ]
        return F.struct(*fields)

    return F.transform(F.col("parsed.preds"), typed)


# The operators the match test knows, each with the code ``_typed_preds``
# gives it (an operator not listed gets no code and matches nothing, which
# the parse check would show as extra pairs, never as silence).
OP_CODES: Final = {
    op: i
    for i, op in enumerate(
        (
            "exists",
            "not exists",
            "=",
            "!=",
            "<",
            "<=",
            ">",
            ">=",
            "in[]",
            "not in[]",
            "in{}",
            "not in{}",
            "prefix",
            "suffix",
            "contains",
            "not prefix",
            "not suffix",
            "not contains",
            "ieq",
            "not ieq",
            "iprefix",
            "not iprefix",
            "isuffix",
            "not isuffix",
            "like",
            "not like",
        )
    )
}


def _ordered(v: Column, lo: Column, hi: Column, arr: Column) -> dict[str, Column]:
    """The test of each operator of an ordered attribute (``v`` its value)."""
    return {
        "=": v == lo,
        "!=": v != lo,
        "<": v < lo,
        "<=": v <= lo,
        ">": v > lo,
        ">=": v >= lo,
        "in[]": (v >= lo) & (v <= hi),
        "not in[]": (v < lo) | (v > hi),
        "in{}": F.array_contains(arr, v),
    }


def _string(v: Column, s0: Column, arr: Column) -> dict[str, Column]:
    """The test of each operator of a string attribute (``v`` its value)."""
    return {
        "=": v == s0,
        "!=": v != s0,
        "prefix": v.startswith(s0),
        "suffix": v.endswith(s0),
        "contains": v.contains(s0),
        "in{}": F.array_contains(arr, v),
        "not in{}": ~F.array_contains(arr, v),
        "not prefix": ~v.startswith(s0),
        "not suffix": ~v.endswith(s0),
        "not contains": ~v.contains(s0),
        # A case-insensitive operator's pattern comes lowercased (filters._args).
        "ieq": F.lower(v) == s0,
        "not ieq": F.lower(v) != s0,
        "iprefix": F.lower(v).startswith(s0),
        "not iprefix": ~F.lower(v).startswith(s0),
        "isuffix": F.lower(v).endswith(s0),
        "not isuffix": ~F.lower(v).endswith(s0),
        # A like pattern's second argument is its Java regular expression.
        "like": F.regexp_like(v, arr[1]),
        "not like": ~F.regexp_like(v, arr[1]),
    }


def satisfied(p: Column, attrs: list[dict[str, Any]], used: frozenset[tuple[int, int]] | None = None) -> Column:
    """``a satisfies f`` (SPEC §2.2) for one predicate ``p`` of ``_typed_preds``
    against the event's ``v_<i>`` columns: same attribute and value in L(f);
    an event without the attribute satisfies nothing on it but ``not
    exists`` (a negated operator needs the attribute too: anything-but).
    The filter language's operators are known here and nowhere else in the
    replay.

    ``used``: the (attribute index, operator code) pairs the predicates
    have (``Matcher``); the test knows only those.  A test of every pair
    the language allows is a condition of hundreds of branches per
    predicate: a generated method the JIT compiler leaves interpreted
    (~3 µs per candidate pair of a 1M-event replay), where the few pairs
    subscriptions use make a short one."""
    expr = None
    for a in attrs:
        v = F.col(f"v_{a['i']}")
        f = _form(a["type"])
        if a["kind"] == "string":
            tests = _string(v, p[f"{f}0"], p[f"{f}arr"])
        else:
            tests = _ordered(v, p[f"{f}0"], p[f"{f}1"], p[f"{f}arr"])
        tests = {"exists": v.isNotNull(), "not exists": v.isNull(), **tests}
        for op, test in tests.items():
            code = OP_CODES[op]
            if used is not None and (a["i"], code) not in used:
                continue
            cond = (p["a"] == F.lit(a["i"])) & (p["o"] == F.lit(code))
            expr = F.when(cond, test) if expr is None else expr.when(cond, test)
    # An operator the attribute's kind does not have matches nothing.
    return F.coalesce(expr, F.lit(False)) if expr is not None else F.lit(False)


def status(t_pub: Column, t_match: Column, t_sub: Column, t_ack: Column, t_unsub: Column, t_unack: Column) -> Column:
    """Rule 4: ``active``, ``inactive`` or ``open`` for one (event, subscription) pair."""
    return _status(t_pub, t_match, t_sub, t_ack, t_unsub, t_unack, F.lit("active"), F.lit("inactive"), F.lit("open"))


# Rule 4's statuses as the integers ``status_code`` gives (0: not re-matched).
OPEN: Final = 1
INACTIVE: Final = 2
ACTIVE: Final = 3


def status_code(
    t_pub: Column, t_match: Column, t_sub: Column, t_ack: Column, t_unsub: Column, t_unack: Column
) -> Column:
    """``status`` as ``ACTIVE``, ``INACTIVE`` or ``OPEN`` (an integer: cheaper per pair than text)."""
    return _status(t_pub, t_match, t_sub, t_ack, t_unsub, t_unack, F.lit(ACTIVE), F.lit(INACTIVE), F.lit(OPEN))


def _status(
    t_pub: Column,
    t_match: Column,
    t_sub: Column,
    t_ack: Column,
    t_unsub: Column,
    t_unack: Column,
    active: Column,
    inactive: Column,
    open_: Column,
) -> Column:
    t_done = F.coalesce(t_match, t_pub)
    return (
        F.when(t_ack.isNotNull() & (t_ack <= t_pub) & (t_unsub.isNull() | (t_unsub >= t_done)), active)
        .when((t_done < t_sub) | (t_unack.isNotNull() & (t_pub > t_unack)), inactive)
        .otherwise(open_)
    )


def _event_keys(attrs: list[dict[str, Any]], groups: list[str]) -> Column:
    """Rule 3: an event's key of every family in ``groups`` (``filters`` rule 4),
    each as ``_key_hash`` of its family and bucket or value."""
    by_i = {a["i"]: a for a in attrs}
    keys = []
    for g in sorted(groups):
        if g == filters.WIDE:
            keys.append(F.xxhash64(F.lit(filters.WIDE)))
        elif g.endswith("="):
            v = F.col(f"v_{int(g[:-1])}")
            keys.append(F.when(v.isNotNull(), F.xxhash64(F.lit(g), v.cast("string"))))
        else:
            i, level = (int(x) for x in g.split("@"))
            a = by_i[i]
            if a["range"] is None:
                continue  # no event carries the attribute
            v = F.col(f"v_{i}")
            shift = 3 * (len(filters.LEVELS) - 1 - level)
            b = F.shiftright(_bucket(v, *a["range"]), shift)
            keys.append(F.when(v.isNotNull(), F.xxhash64(F.lit(g), b)))
    return F.array(*keys) if keys else F.array().cast("array<long>")


def _key_hash(key: Column, group: Column) -> Column:
    """A subscription's key (``filters`` rule 4) as the long an event carries
    for it (``_event_keys``): the hash of its family and its bucket (a long)
    or value (text).  Two keys whose hashes collide only add a candidate;
    the match test decides every pair."""
    value = F.expr("substring(key, length(key_group) + 2)")  # after "<group>:"
    point = F.expr("substring(key, length(key_group) + 1)")  # after "<i>="
    return (
        F.when(group == F.lit(filters.WIDE), F.xxhash64(F.lit(filters.WIDE)))
        .when(group.endswith("="), F.xxhash64(group, point))
        .otherwise(F.xxhash64(group, value.cast("long")))
    )


# The summary of a capture without subscriptions or events (nothing re-matched).
EMPTY_SUMMARY: Final[dict[str, Any]] = {
    "subscriptions": 0,
    "by_key": {},
    "unparsed": 0,
    "unparsed_examples": [],
    "max_predicates": 0,
}


# The columns of a candidate pair (``Matcher.pairs``): the conjunct's
# subscription and its lifetime (rule 4).
CANDIDATE_COLUMNS: Final = ("c_sub", "c_t_sub", "c_t_ack", "c_t_unsub", "c_t_unack")


@dataclass
class Matcher:
    """The parsed subscriptions, one row per (conjunct, key), ready to be
    joined with events (rule 3), and their summary (counts by key kind,
    parse errors, keys)."""

    attrs: list[dict[str, Any]]
    keyed: DataFrame
    k: int
    groups: list[str]
    broadcast: bool
    summary: dict[str, Any]
    used: frozenset[tuple[int, int]]
    lifetimes: DataFrame

    def pairs(self, events: DataFrame) -> DataFrame:
        """One row per (event, conjunct) the event satisfies (rule 3):
        ``event`` and ``CANDIDATE_COLUMNS``, from ``events`` (``event`` and
        the ``v_<i>`` columns).  A subscription matched by several conjuncts
        comes once per conjunct (the caller counts pairs).  With a broadcast
        table the rows keep their partitioning."""
        vs = [f"v_{a['i']}" for a in self.attrs]
        ex = events.select("event", *vs, F.explode(_event_keys(self.attrs, self.groups)).alias("_key"))
        keyed = F.broadcast(self.keyed) if self.broadcast else self.keyed
        test = F.lit(True)
        for i in range(self.k):
            p = F.col(f"_p_{i}")
            test = test & (p.isNull() | satisfied(p, self.attrs, self.used))
        return ex.join(keyed, ex["_key"] == keyed["_ckey"]).filter(test).select("event", *CANDIDATE_COLUMNS)


def prepare(spark: SparkSession, cap: Capture) -> Matcher:
    """Rules 1–3: the events' histogram, every subscription parsed and keyed."""
    events = events_frame(cap)
    stats = histogram(cap, events)
    subs = subscriptions_frame(spark, cap, stats)
    return _matcher(cap, subs)


def _matcher(cap: Capture, subs: DataFrame) -> Matcher:
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
        "parsed.key_group",
        "parsed.keys",
        "parsed.cost",
        _typed_preds(attrs).alias("preds"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    summary_rows = (
        sp.groupBy("ok", "key_kind")
        .agg(
            F.count("*").alias("n"),
            F.max(F.size("preds")).alias("k"),
            F.sum(F.size("keys")).alias("keys"),
            F.sum("cost").alias("cost"),
            F.collect_set("key_group").alias("groups"),
            F.slice(F.collect_list(F.when(~F.col("ok"), F.struct("sub", "error"))), 1, 5).alias("bad"),
            # The (attribute, operator) pairs the predicates use (``satisfied``).
            F.flatten(
                F.collect_set(F.transform("preds", lambda p: F.struct(p["a"].alias("a"), p["o"].alias("o"))))
            ).alias("used"),
        )
        .collect()
    )
    bad = [b.asDict() for r in summary_rows for b in (r["bad"] or [])]
    k = max([r["k"] or 0 for r in summary_rows] + [0])
    n_keys = sum(r["keys"] or 0 for r in summary_rows if r["ok"])
    groups = sorted({g for r in summary_rows if r["ok"] for g in (r["groups"] or [])})
    used = frozenset((u["a"], u["o"]) for r in summary_rows if r["ok"] for u in (r["used"] or []))
    summary = {
        # Rows are conjuncts (rule 2): subscriptions are counted by id.
        "subscriptions": sp.select("sub").distinct().count(),
        "by_key": {f"{r['key_kind']}": r["n"] for r in summary_rows if r["ok"]},
        "unparsed": sum(r["n"] for r in summary_rows if not r["ok"]),
        "unparsed_examples": bad,
        "max_predicates": k,
        "keys": n_keys,
        "key_families": groups,
        "estimated_candidates": int(sum(r["cost"] or 0 for r in summary_rows if r["ok"])),
    }
    # Pad the predicate list to k columns: the match test is then one flat,
    # code-generated expression instead of a lambda over an array per pair.
    pred_cols = [F.get(F.col("preds"), i).alias(f"_p_{i}") for i in range(k)]
    life = [F.col(c).alias(f"c_{c}") for c in ("sub", "t_sub", "t_ack", "t_unsub", "t_unack")]
    keyed = sp.filter(F.col("ok")).select(*life, *pred_cols, "key_group", F.explode("keys").alias("key"))
    keyed = keyed.select(
        *CANDIDATE_COLUMNS, *[f"_p_{i}" for i in range(k)], _key_hash(F.col("key"), F.col("key_group")).alias("_ckey")
    )
    # Rule 4's times per subscription (one row each), for the pairs found.
    lifetimes = sp.select("sub", "t_sub", "t_ack", "t_unsub", "t_unack").distinct()
    return Matcher(attrs, keyed, k, groups, n_keys <= BROADCAST_KEYS, summary, used, lifetimes)
