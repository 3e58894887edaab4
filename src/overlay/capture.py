"""Capture: what one node handled, as records for the Spark replay (SPEC §13).

Theory of operation:

1. ``CaptureBuffer`` is sans-IO: the core appends records to it and the
   asyncio shell (``overlay.net.capture_writer``) takes them in batches and
   writes them, off the hot path.  Nothing here reads a clock: whoever drives
   the core sets ``now`` before handing it a message (``NodeCore`` does it in
   its entry points), and every record carries that time.
2. A record is a ``msgspec.Struct`` tagged by ``kind`` (built in ~0.2 µs, no
   dict); the balancing journal's records (slice, state, decision, split,
   merge, migration, replication, replicate, abort) pass through as the
   dicts ``NodeCore.record`` builds.  Every record has ``node``, ``n`` (this
   node's record counter: the order records were made) and ``time``.
3. Per event the access node writes ``publish`` (id, key/rank, values, the
   channel it routed to), the owner writes ``event`` (tested count, matched
   subscription ids), and each subscriber's access node writes ``deliver``
   (subscriptions notified; ones whose subscriber left are ``orphans``).  The
   shell adds ``drop`` for a Notify it dropped on a slow consumer.
4. Bounded: while ``MAX_PENDING`` records wait for the writer, new ones are
   dropped and counted in ``dropped``; the writer reports the count in the
   ``end`` record, so an incomplete capture is never mistaken for a clean one.
5. The file format (newline-delimited JSON, one file per node per run, a
   ``header`` first and an ``end`` last) is documented, with every field, in
   ``spark/SCHEMA.md``; ``SCHEMA_VERSION`` changes when a field changes meaning
   or disappears (new optional fields do not bump it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from overlay.config import ClusterConfig

__all__ = [
    "SCHEMA_VERSION",
    "MAX_PENDING",
    "CaptureBuffer",
    "Header",
    "End",
    "Publish",
    "Matched",
    "Deliver",
    "Drop",
    "Subscribe",
    "Subscribed",
    "Unsubscribe",
    "Unsubscribed",
    "Liem",
    "header_for",
    "with_capture_dir",
    "capture_file_name",
]

SCHEMA_VERSION: Final = 1
# Records waiting for the writer before new ones are dropped (counted): about
# 200 MB of pending records at worst, several seconds of a node's full rate,
# so only a writer stuck on a dead disk ever reaches it.
MAX_PENDING: Final = 1_000_000


def capture_file_name(node_id: int) -> str:
    """One file per node per run, inside the run's directory."""
    return f"node-{node_id}.ndjson"


class Record(msgspec.Struct, tag_field="kind"):
    node: int
    n: int
    time: float


class Header(Record, tag="header"):
    """First line of every file: what the replay needs to interpret the rest."""

    schema_version: int
    run: str
    cluster: str
    initializer: int
    slice_seconds: float
    nodes: list[dict[str, Any]]
    bandwidth: dict[str, Any]
    schema: dict[str, Any]
    balancing: bool = True
    delta: float = 0.1


class End(Record, tag="end"):
    """Last line, written on clean shutdown."""

    records: int
    dropped: int


class Publish(Record, tag="publish"):
    event: str
    channel: str
    values: dict[str, Any]
    key: str | None = None
    rank: int | None = None


class Matched(Record, tag="event"):
    event: str
    access: int
    channel: str
    tested: int
    matched: list[str]
    slice: int
    key: str | None = None
    rank: int | None = None


class Deliver(Record, tag="deliver"):
    event: str
    subs: list[str]
    orphans: list[str]


class Drop(Record, tag="drop"):
    event: str
    session: int
    subs: list[str]


class Subscribe(Record, tag="subscribe"):
    sub: str
    local: str
    session: int
    subscriber: str
    filter: str


class Subscribed(Record, tag="subscribed"):
    sub: str


class Unsubscribe(Record, tag="unsubscribe"):
    sub: str
    reason: str


class Unsubscribed(Record, tag="unsubscribed"):
    sub: str


class Liem(Record, tag="liem"):
    src: int
    state: str
    d: float
    dc: float
    capacity: float
    slice: int


class CaptureBuffer:
    """The records one node made and the writer has not taken yet (rules 1–4).

    Invariant: ``n`` counts every record offered, kept or dropped, so the
    ``n`` values in a file are increasing and a gap means a drop.
    """

    __slots__ = ("node", "now", "n", "records", "dropped", "max_pending")

    def __init__(self, node: int, *, max_pending: int = MAX_PENDING) -> None:
        self.node = node
        self.now = 0.0
        self.n = 0
        self.records: list[Any] = []
        self.dropped = 0
        self.max_pending = max_pending

    def __repr__(self) -> str:
        return f"CaptureBuffer(node={self.node}, pending={len(self.records)}, dropped={self.dropped})"

    def take(self) -> list[Any]:
        """Hand the pending records to the writer (a new list takes their place)."""
        out, self.records = self.records, []
        return out

    def _room(self) -> bool:
        self.n += 1
        if len(self.records) < self.max_pending:
            return True
        self.dropped += 1
        return False

    # -- events -------------------------------------------------------------------

    def publish(self, event_id: str, channel: object, values: dict[str, Any], key: str | None = None, rank: int | None = None) -> None:
        if self._room():
            self.records.append(Publish(self.node, self.n, self.now, event_id, str(channel), values, key, rank))

    def event(
        self, event_id: str, access: int, channel: object, tested: int, matched: Iterable[Any], slice_no: int,
        key: str | None = None, rank: int | None = None,
    ) -> None:
        """``matched``: the matcher's subscriptions (anything with ``.id``)."""
        if self._room():
            self.records.append(
                Matched(self.node, self.n, self.now, event_id, access, str(channel), tested, [s.id for s in matched], slice_no, key, rank)
            )

    def deliver(self, event_id: str, sub_ids: Sequence[str], owners: Mapping[str, Any]) -> None:
        """A Notification reached this (the subscribers') access node; ``owners``
        maps the subscriptions it still serves to their sessions."""
        if self._room():
            subs = [g for g in sub_ids if g in owners]
            orphans = [g for g in sub_ids if g not in owners] if len(subs) != len(sub_ids) else []
            self.records.append(Deliver(self.node, self.n, self.now, event_id, subs, orphans))

    def drop(self, event_id: str, session: int, sub_ids: list[str]) -> None:
        if self._room():
            self.records.append(Drop(self.node, self.n, self.now, event_id, session, sub_ids))

    # -- subscriptions ----------------------------------------------------------------

    def subscribe(self, sub: str, local: str, session: int, subscriber: str, text: str) -> None:
        if self._room():
            self.records.append(Subscribe(self.node, self.n, self.now, sub, local, session, subscriber, text))

    def unsubscribe(self, sub: str, reason: str) -> None:
        if self._room():
            self.records.append(Unsubscribe(self.node, self.n, self.now, sub, reason))

    def applied(self, sub: str, subscribe: bool) -> None:
        """Every channel applied the (un)subscription: the client got its ack."""
        if self._room():
            cls = Subscribed if subscribe else Unsubscribed
            self.records.append(cls(self.node, self.n, self.now, sub))

    # -- balancing -------------------------------------------------------------------

    def liem(self, src: int, state: str, d: float, dc: float, capacity: float, slice_no: int) -> None:
        if self._room():
            self.records.append(Liem(self.node, self.n, self.now, src, state, d, dc, capacity, slice_no))

    def journal(self, entry: dict[str, Any]) -> None:
        """A balancing-journal record (already JSON-ready, with kind/node/time)."""
        if self._room():
            self.records.append({**entry, "n": self.n})


def _schema_doc(config: ClusterConfig) -> dict[str, Any]:
    schema = config.schema
    return {
        "distinguishing": list(schema.da),
        "attributes": [
            {"name": a.name, "type": a.kind.value, "min": a.min, "max": a.max} for a in schema.attributes.values()
        ],
    }


def header_for(config: ClusterConfig, node_id: int, run: str, now: float) -> Header:
    cl = config.cluster
    return Header(
        node_id, 0, now, SCHEMA_VERSION, run, cl.name, cl.initializer, cl.slice_seconds,
        [{"id": n.id, "capacity": n.capacity} for n in config.nodes],
        {"default": config.bandwidth.default, "links": [{"a": l.a, "b": l.b, "bw": l.bw} for l in config.bandwidth.links]},
        _schema_doc(config), cl.balancing, cl.delta,
    )


def with_capture_dir(config: ClusterConfig, directory: str) -> ClusterConfig:
    """The config with ``cluster.capture_dir`` set (the CLI's ``--capture``)."""
    return msgspec.structs.replace(config, cluster=msgspec.structs.replace(config.cluster, capture_dir=directory))
