"""Reading a run's capture: every ``node-*.ndjson`` file, each record kind with
its own schema (``spark/SCHEMA.md``, schema version 1).

The files are read once: each line's ``kind`` is taken from its first key
(with a JSON-path fallback), the line is parsed with that kind's schema, and
the parsed rows are persisted, so every job after this reads memory, not JSON.
Only the headers (one per node) and per-kind counts reach the driver.  Which
kinds are parsed, which are skipped on purpose and what happens to unknown
ones is ``overlay_spark.kinds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from overlay_spark.kinds import KIND_SCHEMAS, KindReport, classify

__all__ = [
    "KIND_SCHEMAS",
    "SUPPORTED_VERSIONS",
    "Capture",
    "CaptureError",
    "NodeInfo",
    "aggregate_row",
    "load_capture",
]

SUPPORTED_VERSIONS: Final = frozenset({1})


class CaptureError(Exception):
    """The run directory cannot be replayed (no files, no header, unknown schema version)."""


@dataclass(frozen=True)
class NodeInfo:
    id: int
    capacity: float


@dataclass
class Capture:
    """A run: its parsed records (persisted) and what the headers say."""

    run: str
    path: str
    parsed: DataFrame
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

    def df(self, kind: str) -> DataFrame:
        return self.parsed.filter(F.col("kind") == kind).select(f"`{kind}`.*")

    def has(self, kind: str) -> bool:
        return self.counts.get(kind, 0) > 0

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


def load_capture(spark: SparkSession, run_dir: str) -> Capture:
    raw = spark.read.text(capture_pattern(run_dir))
    kind = F.coalesce(
        F.nullif(F.regexp_extract("value", r'^\{"kind":"([a-z_]+)"', 1), F.lit("")),
        F.get_json_object("value", "$.kind"),
    )
    raw = raw.select(kind.alias("kind"), "value")
    cols = [F.when(F.col("kind") == k, F.from_json("value", ddl)).alias(k) for k, ddl in KIND_SCHEMAS.items()]
    # Rows clustered by kind within each partition: the in-memory cache keeps
    # min/max per column batch, so ``df(kind)`` skips every batch of other kinds
    # instead of scanning all records each time.
    parsed = raw.select("kind", *cols).sortWithinPartitions("kind").persist(StorageLevel.MEMORY_AND_DISK)
    counts = {r["kind"] or "?": r["count"] for r in parsed.groupBy("kind").count().collect()}
    meta = parsed.filter(F.col("kind").isin("header", "end")).select("kind", "header", "end").collect()
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
    )
