"""Reading a run's capture: every ``node-*.ndjson`` file, each record kind with
its own schema (``spark/SCHEMA.md``, schema version 1).

The files are read once: each line's ``kind`` is taken from its first key
(with a JSON-path fallback), the line is parsed with that kind's schema, and
the parsed rows are persisted, so every job after this reads memory, not JSON.
Only the headers (one per node) and per-kind counts reach the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["SUPPORTED_VERSIONS", "KIND_SCHEMAS", "Capture", "NodeInfo", "CaptureError", "load_capture"]

SUPPORTED_VERSIONS: Final = frozenset({1})

_BASE: Final = "node INT, n LONG, time DOUBLE"
_JOURNAL: Final = _BASE + ", slice INT"

# One DDL schema per record kind (SCHEMA.md documents each field).  Event
# values are read as map<string,string>: a JSON number keeps its exact text,
# and the re-matching casts it by the attribute's kind from the header.
KIND_SCHEMAS: Final[dict[str, str]] = {
    "header": _BASE + ", schema_version INT, run STRING, cluster STRING, initializer INT, slice_seconds DOUBLE, "
    "nodes ARRAY<STRUCT<id: INT, capacity: DOUBLE>>, "
    "bandwidth STRUCT<default: DOUBLE, links: ARRAY<STRUCT<a: INT, b: INT, bw: DOUBLE>>>, "
    "schema STRUCT<distinguishing: ARRAY<STRING>, attributes: ARRAY<STRUCT<name: STRING, type: STRING, min: STRING, max: STRING>>>, "
    "balancing BOOLEAN, delta DOUBLE",
    "end": _BASE + ", records LONG, dropped LONG",
    "publish": _BASE + ", event STRING, channel STRING, values MAP<STRING, STRING>, key STRING, rank LONG",
    "event": _BASE + ", event STRING, access INT, channel STRING, tested LONG, matched ARRAY<STRING>, slice INT, key STRING, rank LONG",
    "deliver": _BASE + ", event STRING, subs ARRAY<STRING>, orphans ARRAY<STRING>",
    "drop": _BASE + ", event STRING, session INT, subs ARRAY<STRING>",
    "subscribe": _BASE + ", sub STRING, local STRING, session INT, subscriber STRING, filter STRING",
    "subscribed": _BASE + ", sub STRING",
    "unsubscribe": _BASE + ", sub STRING, reason STRING",
    "unsubscribed": _BASE + ", sub STRING",
    "liem": _BASE + ", src INT, state STRING, d DOUBLE, dc DOUBLE, capacity DOUBLE, slice INT",
    "slice": _JOURNAL + ", d DOUBLE, dc DOUBLE, mean DOUBLE, spread DOUBLE, state STRING, "
    "channels MAP<STRING, DOUBLE>, slice_seconds DOUBLE, elapsed DOUBLE, d_slice DOUBLE",
    "state": _JOURNAL + ", old STRING, new STRING",
    "decision": _JOURNAL + ", phase STRING, session INT, receiver INT, phi DOUBLE, transfer ARRAY<STRING>, "
    "split STRING, reason STRING, candidates ARRAY<STRUCT<node: INT, rank1: DOUBLE, f2: DOUBLE, f3: DOUBLE>>, "
    "channels ARRAY<STRUCT<id: STRING, load: DOUBLE, subscriptions: LONG, f1: DOUBLE, f3: DOUBLE, f4: DOUBLE, rank2: DOUBLE>>",
    "migration": _JOURNAL + ", session INT, receiver INT, channels ARRAY<STRING>, subscriptions LONG, bytes LONG, "
    "bw DOUBLE, mig_cost DOUBLE, forced BOOLEAN, duration DOUBLE",
    "replication": _JOURNAL + ", session INT, receiver INT, channels ARRAY<STRING>, subscriptions LONG, bytes LONG, "
    "bw DOUBLE, mig_cost DOUBLE, forced BOOLEAN, duration DOUBLE",
    "replicate": _JOURNAL + ", channel STRING, receiver INT, load DOUBLE",
    "split": _JOURNAL + ", parent STRING, attr STRING, children ARRAY<STRUCT<id: STRING, space: STRING, subscriptions: LONG>>",
    "merge": _JOURNAL + ", parts ARRAY<STRING>, merged STRING, space STRING, subscriptions LONG",
    "abort": _JOURNAL + ", session INT, receiver INT, reason STRING",
    "sequencer": _JOURNAL + ", held LONG, released LONG, expired_dropped LONG, gaps_skipped LONG, ranks_skipped LONG",
}


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

    def df(self, kind: str) -> DataFrame:
        return self.parsed.filter(F.col("kind") == kind).select(f"`{kind}`.*")

    def has(self, kind: str) -> bool:
        return self.counts.get(kind, 0) > 0

    @property
    def capacity(self) -> dict[int, float]:
        return {n.id: n.capacity for n in self.nodes}


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
            notes.append(f"node {h['node']} header names cluster {h['cluster']!r} run {h['run']!r}, "
                         f"not {first['cluster']!r} {first['run']!r}")
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
            notes.append(f"node {nid}: no end record (the node did not shut down cleanly); its last records may be missing")
        elif ends[nid]["dropped"]:
            notes.append(f"node {nid}: the capture dropped {ends[nid]['dropped']} records (writer too slow)")
    unknown = sorted(k for k in counts if k not in KIND_SCHEMAS)
    if unknown:
        notes.append(f"records of unknown kinds ignored: {', '.join(f'{k} ({counts[k]})' for k in unknown)}")
    return Capture(
        run=first["run"], path=run_dir, parsed=parsed, nodes=nodes, initializer=int(first["initializer"]),
        slice_seconds=float(first["slice_seconds"]), schema=first["schema"], t0=min(h["time"] for h in headers),
        counts=counts, headers=headers, ends=ends, notes=notes,
    )
