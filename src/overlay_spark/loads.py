"""Loads and spread (SPEC §5): per slice as the nodes reported them, per
T-window as the captured events say (with and without migrations), S around
each migration, and the nodes' reported costs against the events' costs.

Formulas (SPEC §5): ``dc_i = d_i / c_i``, ``dc̄ = (1/n) Σ dc_i``,
``S = sqrt((1/n) Σ (dc_i − dc̄)²)`` — ``stddev_pop`` over the nodes.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from overlay_spark.records import Capture

__all__ = ["TABLE_CHANGES", "migration_table", "slice_cost_check", "slice_table", "window_table"]

# Journal kinds after which a node's reported slice load legitimately differs
# from the sum of its events' costs: a channel split, merged, moved or
# dropped mid-slice takes its slice-in-progress cost with it.
TABLE_CHANGES = ("split", "merge", "migration", "replication", "replicate", "abort")


def _capacities(spark: SparkSession, cap: Capture) -> DataFrame:
    return spark.createDataFrame([(n.id, n.capacity) for n in cap.nodes], "node INT, capacity DOUBLE")


def slice_table(spark: SparkSession, cap: Capture) -> DataFrame:
    """One row per slice number: every node's d and dc, dc̄, S, S/dc̄.

    The ``slice`` of a ``slice`` record is the monitor's count after closing it,
    so slice k is the same k on every node (each node's clock, started when it
    became ready).  ``complete`` says whether every node reported that slice;
    S is over the nodes that did.
    """
    sl = cap.df("slice").join(F.broadcast(_capacities(spark, cap)), "node")
    sl = sl.withColumn("dcx", F.col("d") / F.col("capacity"))
    agg = sl.groupBy("slice").agg(
        F.count("*").alias("nodes"),
        F.sum("d").alias("total_d"),
        F.avg("dcx").alias("mean_dc"),
        F.stddev_pop("dcx").alias("S"),
        F.min(F.col("time") - F.col("slice_seconds")).alias("t_start"),
        F.max("time").alias("t_end"),
    )
    ids: list[bool | float | int | str] = [n.id for n in cap.nodes]  # (pivot's type for its values)
    wide = sl.groupBy("slice").pivot("node", ids).agg(F.first("d").alias("d"), F.first("dcx").alias("dc"))
    for i in ids:
        wide = wide.withColumnRenamed(f"{i}_d", f"d_{i}").withColumnRenamed(f"{i}_dc", f"dc_{i}")
    return (
        agg.join(wide, "slice")
        .withColumn("S_over_mean", F.when(F.col("mean_dc") > 0, F.col("S") / F.col("mean_dc")))
        .withColumn("complete", F.col("nodes") == F.lit(len(ids)))
        .withColumn("t", F.col("t_end") - F.lit(cap.t0))
        .orderBy("slice")
    )


def window_table(spark: SparkSession, cap: Capture) -> tuple[DataFrame, DataFrame]:
    """Recomputed loads per T-window from the owners' ``event`` records, in two
    scenarios: ``actual`` charges each event's tested count to the node that
    matched it; ``counterfactual`` to the node that owned its channel's space
    at the start.  SPEC §3 starts every run with the one channel EC on the
    initializer, and only migrations move space away, so without them every
    event is matched there.  The cost kept is the captured one (the tested
    count on the channel that really matched it).

    Returns (per scenario and window: mean_dc, S, S/dc̄, total d, events;
    per window and node, actual scenario: d, dc).
    """
    T = cap.slice_seconds
    ev = cap.df("event").select(
        F.floor((F.col("time") - F.lit(cap.t0)) / F.lit(T)).cast("long").alias("w"),
        "node",
        "tested",
    )
    # Small (windows × nodes), and read four times below: computed once.
    actual = (
        ev.groupBy("w", "node").agg(F.sum("tested").cast("double").alias("d"), F.count("*").alias("events")).persist()
    )
    loads = actual.withColumn("scenario", F.lit("actual")).unionByName(
        actual.groupBy("w")
        .agg(F.sum("d").alias("d"), F.sum("events").alias("events"))
        .withColumn("node", F.lit(cap.initializer))
        .withColumn("scenario", F.lit("counterfactual"))
    )
    # Every (scenario, window, node), zero where nothing was matched: the
    # window range comes from the data itself, not from a driver round trip.
    windows = actual.agg(F.max("w").alias("wmax")).select(
        F.explode(F.sequence(F.lit(0).cast("long"), "wmax")).alias("w")
    )
    scen = spark.createDataFrame([("actual",), ("counterfactual",)], "scenario STRING")
    grid = windows.crossJoin(F.broadcast(_capacities(spark, cap))).crossJoin(F.broadcast(scen))
    per_node = (
        grid.join(loads, ["scenario", "w", "node"], "left")
        .fillna({"d": 0.0, "events": 0})
        .withColumn("dc", F.col("d") / F.col("capacity"))
        .withColumn("t", (F.col("w") + 1) * F.lit(T))
    )
    per_w = (
        per_node.groupBy("scenario", "w")
        .agg(
            F.avg("dc").alias("mean_dc"),
            F.stddev_pop("dc").alias("S"),
            F.sum("d").alias("total_d"),
            F.sum("events").alias("events"),
        )
        .withColumn("S_over_mean", F.when(F.col("mean_dc") > 0, F.col("S") / F.col("mean_dc")))
        .withColumn("t", (F.col("w") + 1) * F.lit(T))
        .orderBy("scenario", "w")
    )
    return per_w, per_node.filter(F.col("scenario") == "actual").drop("scenario").orderBy("w", "node")


def migration_table(cap: Capture, slices: DataFrame) -> DataFrame:
    """Every migration and replication with S/dc̄ of the last complete slice that
    ended before it started and of the first that started after it finished."""
    cols = [
        "node",
        "time",
        "slice",
        "session",
        "receiver",
        "channels",
        "subscriptions",
        "bytes",
        "bw",
        "mig_cost",
        "forced",
        "duration",
    ]
    migs = None
    for kind in ("migration", "replication"):
        if cap.has(kind):
            df = cap.df(kind).select(*cols).withColumn("kind", F.lit(kind))
            migs = df if migs is None else migs.unionByName(df)
    if migs is None:
        return slices.sparkSession.createDataFrame(
            [],
            "kind STRING, sender INT, receiver INT, t_start DOUBLE, t_done DOUBLE, channels STRING, subscriptions LONG, "
            "bytes LONG, bw DOUBLE, mig_cost DOUBLE, forced BOOLEAN, duration DOUBLE, S_before DOUBLE, "
            "ratio_before DOUBLE, slice_before INT, S_after DOUBLE, ratio_after DOUBLE, slice_after INT",
        )
    migs = migs.select(
        "kind",
        F.col("node").alias("sender"),
        "receiver",
        (F.col("time") - F.col("duration")).alias("start"),
        F.col("time").alias("done"),
        F.concat_ws(" ", "channels").alias("channels"),
        "subscriptions",
        "bytes",
        "bw",
        "mig_cost",
        "forced",
        "duration",
        "session",
    )
    done = slices.filter("complete").select("slice", "t_start", "t_end", "S", "S_over_mean")
    pairs = migs.crossJoin(F.broadcast(done))
    key = ["sender", "session"]
    before = (
        pairs.filter(F.col("t_end") <= F.col("start"))
        .groupBy(*key)
        .agg(F.max_by(F.struct("S", "S_over_mean", "slice"), F.col("t_end")).alias("b"))
    )
    after = (
        pairs.filter(F.col("t_start") >= F.col("done"))
        .groupBy(*key)
        .agg(F.min_by(F.struct("S", "S_over_mean", "slice"), F.col("t_start")).alias("a"))
    )
    return (
        migs.join(before, key, "left")
        .join(after, key, "left")
        .select(
            "kind",
            "sender",
            "receiver",
            (F.col("start") - F.lit(cap.t0)).alias("t_start"),
            (F.col("done") - F.lit(cap.t0)).alias("t_done"),
            "channels",
            "subscriptions",
            "bytes",
            "bw",
            "mig_cost",
            "forced",
            "duration",
            F.col("b.S").alias("S_before"),
            F.col("b.S_over_mean").alias("ratio_before"),
            F.col("b.slice").alias("slice_before"),
            F.col("a.S").alias("S_after"),
            F.col("a.S_over_mean").alias("ratio_after"),
            F.col("a.slice").alias("slice_after"),
        )
        .orderBy("t_start")
    )


def slice_cost_check(cap: Capture) -> tuple[DataFrame, DataFrame]:
    """Each channel's reported slice load against the sum of its events' tested counts.

    An event made while the monitor's count was k is reported by the ``slice``
    record numbered k+1.  Slices in which the node split, merged, moved or
    dropped a channel are marked ``changed`` (their reported load may be
    lower: the departing channel took its slice-in-progress cost along), and
    the node's last, unclosed slice is left out.

    Returns (per node and slice: reported d, recomputed d, changed, mismatched
    channels; per node: totals).
    """
    # Small (slices × channels), and read by both results: computed once.
    ev = (
        cap.df("event")
        .groupBy("node", (F.col("slice") + 1).alias("slice"), "channel")
        .agg(F.sum("tested").cast("double").alias("recomputed"))
        .persist()
    )
    rep = cap.df("slice").select("node", "slice", F.explode("channels").alias("channel", "reported"))
    last = cap.df("slice").groupBy("node").agg(F.max("slice").alias("last"))
    changed = None
    for kind in TABLE_CHANGES:
        if cap.has(kind):
            df = cap.df(kind).select("node", (F.col("slice") + 1).alias("slice"))
            changed = df if changed is None else changed.unionByName(df)
    per_ch = (
        rep.join(ev, ["node", "slice", "channel"], "full_outer")
        .join(F.broadcast(last), "node")
        .filter(F.col("slice") <= F.col("last"))
        .fillna({"reported": 0.0, "recomputed": 0.0})
    )
    if changed is not None:
        per_ch = per_ch.join(
            F.broadcast(changed.distinct().withColumn("changed", F.lit(True))), ["node", "slice"], "left"
        )
    else:
        per_ch = per_ch.withColumn("changed", F.lit(None).cast("boolean"))
    per_ch = per_ch.fillna({"changed": False}).withColumn("mismatch", F.col("reported") != F.col("recomputed"))
    per_slice = per_ch.groupBy("node", "slice").agg(
        F.sum("reported").alias("reported_d"),
        F.sum("recomputed").alias("recomputed_d"),
        F.first("changed").alias("changed"),
        F.sum(F.col("mismatch").cast("int")).alias("mismatched_channels"),
    )
    d_rep = cap.df("slice").select("node", "slice", F.col("d").alias("slice_d"))
    per_slice = per_slice.join(d_rep, ["node", "slice"], "left").orderBy("node", "slice")
    return per_slice, per_slice.groupBy("node").agg(
        F.count("*").alias("slices"),
        F.sum("slice_d").alias("reported_d"),
        F.sum("recomputed_d").alias("recomputed_d"),
        F.sum(F.col("changed").cast("int")).alias("changed_slices"),
        F.sum(((F.col("mismatched_channels") > 0) & ~F.col("changed")).cast("int")).alias("bad_slices"),
    ).orderBy("node")


def rows(df: DataFrame) -> list[dict[str, Any]]:
    """Collect an aggregate (never raw events) as plain dicts."""
    return [r.asDict() for r in df.collect()]
