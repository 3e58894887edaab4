"""Reading a run's capture: every ``node-*.ndjson`` file, each record kind with
its own schema (``spark/SCHEMA.md``, schema version 1).

Rules:

1. Every line is parsed once, by Spark's JSON reader, with one flat schema
   (``bulk_schema``): the fields of the bulk kinds (``BULK_KINDS``:
   publish, event, deliver, drop — nearly every line of a big capture) as
   typed columns, an event's ``values`` as a struct of the header's
   attributes with their types (``value_type``: float → double, int →
   long, rfid → decimal(20,0)), and ``kind``/``node``/``n``/``time`` of
   every line.  Lines of the other kinds (found by their first key, with a
   JSON-path fallback) keep their text (``raw``) and are parsed with their
   own schema when a job asks for them (few lines).
2. The flat rows are persisted (memory, spilling to disk): one narrow frame
   every job after this reads instead of JSON.  The lines of the other
   kinds are persisted apart, in one partition (``small``), so reading one
   of them does not scan the events.
3. Only the headers and ends (one per node), and per-kind counts, last
   times and value ranges reach the driver.  Which kinds are parsed, which
   are skipped on purpose and what happens to unknown ones is
   ``overlay_spark.kinds``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from overlay_spark.kinds import BULK_KINDS, KIND_SCHEMAS, KindReport, classify

__all__ = [
    "BULK_KINDS",
    "KIND_SCHEMAS",
    "SUPPORTED_VERSIONS",
    "Capture",
    "CaptureError",
    "NodeInfo",
    "aggregate_row",
    "bulk_schema",
    "load_capture",
    "value_type",
]

SUPPORTED_VERSIONS: Final = frozenset({1})
# Signed 64-bit: an int attribute whose declared bounds fit is read as a long.
_LONG_MIN: Final = -(1 << 63)
_LONG_MAX: Final = (1 << 63) - 1
# The kinds whose last record time bounds the run when a node did not end cleanly.
_TIMED: Final = ("publish", "event", "deliver", "slice")


class CaptureError(Exception):
    """The run directory cannot be replayed (no files, no header, unknown schema version)."""


@dataclass(frozen=True)
class NodeInfo:
    id: int
    capacity: float


@dataclass
class Capture:
    """A run: its parsed records (persisted) and what the headers say.

    ``ranges`` is the observed ``(min, max)`` of every ordered attribute over
    the published events (absent when no event carries it); ``last`` the
    latest time of a publish, event, deliver or slice record.
    """

    run: str
    path: str
    parsed: DataFrame
    small: DataFrame
    nodes: list[NodeInfo]
    initializer: int
    slice_seconds: float
    schema: dict[str, Any]
    t0: float
    counts: dict[str, int]
    headers: list[dict[str, Any]]
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kinds: KindReport | None = None
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    last: float | None = None

    def df(self, kind: str) -> DataFrame:
        """The records of ``kind`` with their fields as columns (rule 1)."""
        if kind in BULK_KINDS:
            return self.parsed.filter(F.col("kind") == kind).select(*BULK_KINDS[kind])
        return (
            self.small.filter(F.col("kind") == kind)
            .select(F.from_json("raw", KIND_SCHEMAS[kind]).alias("r"))
            .select("r.*")
        )

    def has(self, kind: str) -> bool:
        return self.counts.get(kind, 0) > 0

    def unpersist(self) -> None:
        self.parsed.unpersist()
        self.small.unpersist()

    @property
    def capacity(self) -> dict[int, float]:
        return {n.id: n.capacity for n in self.nodes}


def aggregate_row(df: DataFrame) -> Row:
    """The one row of a global aggregate (``df.agg(…)`` without a grouping has
    exactly one row, even over no input)."""
    row = df.first()
    assert row is not None, "a global aggregate has one row"
    return row


def capture_pattern(run_dir: str) -> str:
    if "://" in run_dir:  # hdfs://, s3a://, file://: let Spark glob
        return run_dir.rstrip("/") + "/node-*.ndjson"
    p = Path(run_dir)
    if not p.is_dir():
        raise CaptureError(f"{run_dir} is not a directory")
    if not list(p.glob("node-*.ndjson")):
        raise CaptureError(f"{run_dir} holds no node-*.ndjson capture files")
    return str(p.resolve() / "node-*.ndjson")


def value_type(attr: dict[str, Any]) -> T.DataType:
    """Rule 1: the column type of one attribute's values."""
    kind = attr["type"]
    if kind in ("float", "numeric"):
        return T.DoubleType()
    if kind == "string":
        return T.StringType()
    if kind == "int":
        try:
            lo, hi = int(attr["min"]), int(attr["max"])
        except (TypeError, ValueError):
            lo, hi = _LONG_MIN - 1, 0
        if lo >= _LONG_MIN and hi <= _LONG_MAX:
            return T.LongType()
    return T.DecimalType(20, 0)  # rfid: unsigned 64-bit codes


def bulk_schema(schema: dict[str, Any]) -> T.StructType:
    """Rule 1: the one flat schema every line is parsed with."""
    values = T.StructType([T.StructField(a["name"], value_type(a)) for a in schema["attributes"]])
    strings = T.ArrayType(T.StringType())
    return T.StructType(
        [
            T.StructField("node", T.IntegerType()),
            T.StructField("n", T.LongType()),
            T.StructField("time", T.DoubleType()),
            T.StructField("event", T.StringType()),
            T.StructField("channel", T.StringType()),
            T.StructField("values", values),
            T.StructField("key", T.StringType()),
            T.StructField("rank", T.LongType()),
            T.StructField("access", T.IntegerType()),
            T.StructField("tested", T.LongType()),
            T.StructField("matched", strings),
            T.StructField("slice", T.IntegerType()),
            T.StructField("subs", strings),
            T.StructField("orphans", strings),
            T.StructField("session", T.IntegerType()),
            T.StructField("payload_bytes", T.LongType()),
        ]
    )


def _first_header(raw: DataFrame, run_dir: str) -> dict[str, Any]:
    """The first header line Spark finds (each file starts with one): the
    schema the values are typed with."""
    row = raw.filter(F.col("value").startswith('{"kind":"header"')).select("value").first()
    if row is None:  # a header whose kind is not the first key: the slow way
        row = raw.filter(F.get_json_object("value", "$.kind") == "header").select("value").first()
    if row is None:
        raise CaptureError(f"{run_dir}: no header record in any file")
    try:
        header = json.loads(row["value"])
        return {"schema": header["schema"], "attributes": list(header["schema"]["attributes"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise CaptureError(f"{run_dir}: a header record without a readable schema ({exc})") from None


def _range_aggs(schema: dict[str, Any]) -> list[Column]:
    out = []
    for a in schema["attributes"]:
        if a["type"] != "string":
            v = F.col("values").getField(a["name"]).cast("double")
            out += [F.min(v).alias(f"lo:{a['name']}"), F.max(v).alias(f"hi:{a['name']}")]
    return out


def load_capture(spark: SparkSession, run_dir: str) -> Capture:
    pattern = capture_pattern(run_dir)
    text = spark.read.text(pattern)
    schema = _first_header(text, run_dir)["schema"]
    # Spark's JSON reader parses straight into the flat columns (rule 1): no
    # intermediate text column, and ``kind`` wherever it is in the line.
    flat = T.StructType([T.StructField("kind", T.StringType()), *bulk_schema(schema).fields])
    parsed = spark.read.schema(flat).json(pattern).persist(StorageLevel.MEMORY_AND_DISK)
    per_kind = parsed.groupBy("kind").agg(
        F.count("*").alias("count"), F.max("time").alias("last"), *_range_aggs(schema)
    )
    stats = per_kind.collect()
    counts = {r["kind"] or "?": r["count"] for r in stats}
    lasts = [r["last"] for r in stats if r["kind"] in _TIMED and r["last"] is not None]
    ranges: dict[str, tuple[float, float]] = {}
    for r in stats:
        if r["kind"] == "publish":
            for a in schema["attributes"]:
                lo, hi = (r[f"lo:{a['name']}"], r[f"hi:{a['name']}"]) if a["type"] != "string" else (None, None)
                if lo is not None and hi is not None:
                    ranges[a["name"]] = (float(lo), float(hi))
    # The other kinds' lines keep their text (rule 1), found by their first
    # key (a bulk kind's line whose kind comes later is dropped by the kind).
    # One partition: a few thousand lines, read by many small jobs, each then
    # one task instead of one per split of the capture (a shuffle, so that
    # the filter still runs on every split in parallel).
    kind = F.coalesce(
        F.nullif(F.regexp_extract("value", r'^\{"kind":"([a-z_]+)"', 1), F.lit("")),
        F.get_json_object("value", "$.kind"),
    )
    bulk_line = None
    for k in BULK_KINDS:
        starts = F.col("value").startswith(f'{{"kind":"{k}"')
        bulk_line = starts if bulk_line is None else bulk_line | starts
    assert bulk_line is not None
    small = (
        text.filter(~bulk_line)
        .select(kind.alias("kind"), F.col("value").alias("raw"))
        .filter(F.col("kind").isNotNull() & ~F.col("kind").isin(*BULK_KINDS))
        .repartition(1)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    meta = (
        small.filter(F.col("kind").isin("header", "end"))
        .select(
            "kind",
            F.when(F.col("kind") == "header", F.from_json("raw", KIND_SCHEMAS["header"])).alias("header"),
            F.when(F.col("kind") == "end", F.from_json("raw", KIND_SCHEMAS["end"])).alias("end"),
        )
        .collect()
    )
    headers = [r["header"].asDict(recursive=True) for r in meta if r["kind"] == "header"]
    if not headers:
        raise CaptureError(f"{run_dir}: no header record in any file")
    for h in headers:
        if h["schema_version"] not in SUPPORTED_VERSIONS:
            raise CaptureError(
                f"{run_dir}: node {h['node']} wrote schema_version {h['schema_version']}; "
                f"this replay reads {sorted(SUPPORTED_VERSIONS)}"
            )
    first = min(headers, key=lambda h: h["time"])
    notes = []
    for h in headers:
        if h["cluster"] != first["cluster"] or h["run"] != first["run"]:
            notes.append(
                f"node {h['node']} header names cluster {h['cluster']!r} run {h['run']!r}, "
                f"not {first['cluster']!r} {first['run']!r}"
            )
    nodes = [NodeInfo(int(n["id"]), float(n["capacity"])) for n in first["nodes"]]
    seen = sorted({int(h["node"]) for h in headers})
    missing = sorted({n.id for n in nodes} - set(seen))
    if missing:
        notes.append(f"no capture file for node(s) {missing}: their records are absent")
    if len(seen) != len(headers):
        notes.append("several headers for one node: more than one run in this directory")
    ends = {int(r["end"]["node"]): r["end"].asDict() for r in meta if r["kind"] == "end"}
    for nid in seen:
        if nid not in ends:
            notes.append(
                f"node {nid}: no end record (the node did not shut down cleanly); its last records may be missing"
            )
        elif ends[nid]["dropped"]:
            notes.append(f"node {nid}: the capture dropped {ends[nid]['dropped']} records (writer too slow)")
    kinds = classify(counts)  # kinds rule 2: unknown kinds are warned about, never dropped silently
    if kinds.warning:
        notes.append("warning: " + kinds.warning)
    notes += kinds.notes([n.id for n in nodes])
    return Capture(
        run=first["run"],
        path=run_dir,
        parsed=parsed,
        small=small,
        nodes=nodes,
        initializer=int(first["initializer"]),
        slice_seconds=float(first["slice_seconds"]),
        schema=first["schema"],
        t0=min(h["time"] for h in headers),
        counts=counts,
        headers=headers,
        ends=ends,
        notes=notes,
        kinds=kinds,
        ranges=ranges,
        last=max(lasts) if lasts else None,
    )
