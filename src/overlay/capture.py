"""Capture: what one node handled, as records for the Spark replay (SPEC §13).

Theory of operation:

1. ``CaptureBuffer`` is sans-IO: the core appends records to it and the
   asyncio shell (``overlay.net.capture_writer``) takes the encoded batches
   and writes them, off the hot path.  Nothing here reads a clock: whoever
   drives the core sets ``now`` before handing it a message (``NodeCore`` does
   it in its entry points), and every record carries that time.
2. A record is a ``msgspec.Struct`` tagged by ``kind`` (built in ~0.2 µs, no
   dict); the balancing journal's records (slice, state, decision, split,
   merge, migration, replication, replicate, abort) pass through as the
   dicts ``NodeCore.record`` builds.  Every record has ``node``, ``n`` (this
   node's record counter: the order records were made) and ``time``.
3. Per event the access node writes ``publish`` (id, key/rank, values, the
   channel it routed to), the owner writes ``event`` (tested count, matched
   subscription ids), and each subscriber's access node writes ``deliver``
   (subscriptions notified; ones whose subscriber left are ``orphans``).  The
   shell adds ``drop`` for a Notify it dropped on a slow consumer.  An
   event's payload is recorded by its size (``payload_bytes`` on ``publish``
   and ``deliver``), not its content — unless ``capture_payload`` asks
   (``[cluster] capture_payload``, ``overlay node --capture-payload``): then
   ``publish`` holds it too (base64 in the JSON).
4. Every ``ENCODE_EVERY`` records the buffer encodes them into one bytes
   chunk (newline-delimited JSON, one ``encode_lines`` call) and lets the
   objects go: a node keeps a few hundred KB of bytes between writes instead
   of thousands of live objects, which made everything else on the node
   slower (measured on three cores: +8.7 µs per event holding 0.5 s of
   records as objects, ~+2 µs sealing every 256).  ``take()`` returns the chunks.
5. Bounded: while ``MAX_PENDING`` records wait for the writer, new ones are
   dropped and counted in ``dropped``; the writer reports the count in the
   ``end`` record, so an incomplete capture is never mistaken for a clean one.
6. The file format (newline-delimited JSON, one file per node per run, a
   ``header`` first and an ``end`` last) is documented, with every field, in
   ``spark/SCHEMA.md``; ``SCHEMA_VERSION`` changes when a field changes meaning
   or disappears (new optional fields do not bump it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Final

import msgspec

from overlay.config import ClusterConfig

__all__ = [
    "ENCODE_EVERY",
    "MAX_PENDING",
    "SCHEMA_VERSION",
    "CaptureBuffer",
    "Deliver",
    "Drop",
    "End",
    "Header",
    "Liem",
    "Matched",
    "Publish",
    "Subscribe",
    "Subscribed",
    "Unsubscribe",
    "Unsubscribed",
    "capture_file_name",
    "header_for",
    "with_capture_dir",
    "with_capture_payload",
]

SCHEMA_VERSION: Final = 1
# Records waiting for the writer before new ones are dropped (counted): about
# 600 MB of encoded records at worst, a minute of a node's full rate, so only
# a writer stuck on a dead disk ever reaches it.
MAX_PENDING: Final = 1_000_000
# Records encoded per chunk (rule 4): encoded while they are still in the CPU's
# caches (~0.1 ms, ~120 KB); 1024 measured 0.6 µs/event dearer, 64 no cheaper.
ENCODE_EVERY: Final = 256


def capture_file_name(node_id: int) -> str:
    """One file per node per run, inside the run's directory."""
    return f"node-{node_id}.ndjson"


class Record(msgspec.Struct, tag_field="kind", gc=False, omit_defaults=True):
    # gc=False: a record holds strings, numbers and the event's values, never
    # a cycle, so the cyclic GC need not track it.  omit_defaults: a field at
    # its default (no key, no orphans) is not written; readers take the default.
    node: int
    n: int
    time: float


class Header(Record, tag="header", omit_defaults=False):
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
    channel: str | None
    values: dict[str, Any]
    key: str | None = None
    rank: int | None = None
    payload_bytes: int = 0  # the payload's size (rule 3)
    payload: bytes | None = None  # its content, only when capture_payload asks


class Matched(Record, tag="event"):
    event: str
    access: int
    channel: str
    tested: int
    matched: tuple[str, ...]
    slice: int
    key: str | None = None
    rank: int | None = None


class Deliver(Record, tag="deliver"):
    event: str
    subs: tuple[str, ...]
    orphans: tuple[str, ...] = ()
    payload_bytes: int = 0  # the payload's size in the Notification that arrived


class Drop(Record, tag="drop"):
    event: str
    session: int
    subs: tuple[str, ...]


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
    """The records one node made and the writer has not taken yet (rules 1–5).

    Invariants: ``n`` counts every record offered, kept or dropped, so the
    ``n`` values in a file are increasing and a gap means a drop; ``records``
    (not yet encoded) never holds more than ``ENCODE_EVERY``; ``sealed``
    counts the records in ``chunks``.
    """

    __slots__ = (
        "_enc",
        "_names",
        "chunks",
        "dropped",
        "max_pending",
        "n",
        "node",
        "now",
        "payloads",
        "records",
        "sealed",
    )

    def __init__(self, node: int, *, max_pending: int = MAX_PENDING, payloads: bool = False) -> None:
        self.node = node
        self.payloads = payloads  # rule 3: record payloads' content, not only their size
        self.now = 0.0
        self.n = 0
        self.records: list[Any] = []
        self.chunks: list[bytes] = []
        self.sealed = 0
        self.dropped = 0
        self.max_pending = max_pending
        self._enc = msgspec.json.Encoder()
        self._names: dict[Any, str] = {}  # channel id -> its text, made once

    def __repr__(self) -> str:
        return f"CaptureBuffer(node={self.node}, pending={self.pending}, dropped={self.dropped})"

    @property
    def pending(self) -> int:
        return self.sealed + len(self.records)

    def take(self) -> list[bytes]:
        """Hand everything pending to the writer, encoded: newline-terminated
        JSON lines in chunks (rule 4)."""
        if self.records:
            self._seal()
        out, self.chunks, self.sealed = self.chunks, [], 0
        return out

    def _seal(self) -> None:
        recs = self.records
        self.records = []
        self.chunks.append(self._enc.encode_lines(recs))
        self.sealed += len(recs)

    def _room(self) -> bool:
        """The slow half of the room check each record method makes inline:
        the unsealed records are full, so seal them — or drop when the writer
        is that far behind (rule 5)."""
        if self.sealed >= self.max_pending:
            self.dropped += 1
            return False
        self._seal()
        return True

    def _name(self, channel: object) -> str:
        name = self._names[channel] = str(channel)
        return name

    # -- events -------------------------------------------------------------------

    # Each method below is on a node's hot path: the room check is inline
    # (``_room`` only when ENCODE_EVERY records wait), channel names are cached.

    def publish(
        self,
        event_id: str,
        channel: object,
        values: dict[str, Any],
        key: str | None = None,
        rank: int | None = None,
        payload: bytes = b"",
    ) -> None:
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            ch = (self._names.get(channel) or self._name(channel)) if channel is not None else None
            content = payload if payload and self.payloads else None
            self.records.append(
                Publish(self.node, self.n, self.now, event_id, ch, values, key, rank, len(payload), content)
            )

    def event(
        self,
        event_id: str,
        access: int,
        channel: object,
        tested: int,
        matched: Iterable[Any],
        slice_no: int,
        key: str | None = None,
        rank: int | None = None,
    ) -> None:
        """``matched``: the matcher's subscriptions (anything with ``.id``)."""
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            ch = self._names.get(channel) or self._name(channel)
            self.records.append(
                Matched(
                    self.node,
                    self.n,
                    self.now,
                    event_id,
                    access,
                    ch,
                    tested,
                    tuple(map(_ID, matched)),
                    slice_no,
                    key,
                    rank,
                )
            )

    def deliver(self, event_id: str, sub_ids: Sequence[str], owners: Mapping[str, Any], payload_bytes: int = 0) -> None:
        """A Notification reached this (the subscribers') access node; ``owners``
        maps the subscriptions it still serves to their sessions; ``payload_bytes``
        is the size of the payload it carried."""
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            subs: tuple[str, ...]
            orphans: tuple[str, ...]
            if all(map(owners.__contains__, sub_ids)):  # the common case, at C speed
                subs, orphans = (sub_ids if type(sub_ids) is tuple else tuple(sub_ids)), ()
            else:
                subs = tuple([g for g in sub_ids if g in owners])
                orphans = tuple([g for g in sub_ids if g not in owners])
            self.records.append(Deliver(self.node, self.n, self.now, event_id, subs, orphans, payload_bytes))

    def drop(self, event_id: str, session: int, sub_ids: Sequence[str]) -> None:
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            self.records.append(Drop(self.node, self.n, self.now, event_id, session, tuple(sub_ids)))

    # -- subscriptions ----------------------------------------------------------------

    def subscribe(self, sub: str, local: str, session: int, subscriber: str, text: str) -> None:
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            self.records.append(Subscribe(self.node, self.n, self.now, sub, local, session, subscriber, text))

    def unsubscribe(self, sub: str, reason: str) -> None:
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            self.records.append(Unsubscribe(self.node, self.n, self.now, sub, reason))

    def applied(self, sub: str, subscribe: bool) -> None:
        """Every channel applied the (un)subscription: the client got its ack."""
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            cls = Subscribed if subscribe else Unsubscribed
            self.records.append(cls(self.node, self.n, self.now, sub))

    # -- balancing -------------------------------------------------------------------

    def liem(self, src: int, state: str, d: float, dc: float, capacity: float, slice_no: int) -> None:
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            self.records.append(Liem(self.node, self.n, self.now, src, state, d, dc, capacity, slice_no))

    def journal(self, entry: dict[str, Any]) -> None:
        """A balancing-journal record (already JSON-ready, with kind/node/time)."""
        self.n += 1
        if len(self.records) < ENCODE_EVERY or self._room():
            self.records.append({**entry, "n": self.n})


_ID: Final = attrgetter("id")


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
        node_id,
        0,
        now,
        SCHEMA_VERSION,
        run,
        cl.name,
        cl.initializer,
        cl.slice_seconds,
        [{"id": n.id, "capacity": n.capacity} for n in config.nodes],
        {
            "default": config.bandwidth.default,
            "links": [{"a": link.a, "b": link.b, "bw": link.bw} for link in config.bandwidth.links],
        },
        _schema_doc(config),
        cl.balancing,
        cl.delta,
    )


def with_capture_dir(config: ClusterConfig, directory: str) -> ClusterConfig:
    """The config with ``cluster.capture_dir`` set (the CLI's ``--capture``)."""
    return msgspec.structs.replace(config, cluster=msgspec.structs.replace(config.cluster, capture_dir=directory))


def with_capture_payload(config: ClusterConfig) -> ClusterConfig:
    """The config with ``cluster.capture_payload`` on (the CLI's ``--capture-payload``)."""
    return msgspec.structs.replace(config, cluster=msgspec.structs.replace(config.cluster, capture_payload=True))
