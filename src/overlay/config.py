"""Cluster configuration: one TOML file describes every node (SPEC §14).

Layout::

    [cluster]       name, initializer, slice_seconds (T), delta (δ), levels (L),
                    probability (p), omega/alpha/beta/gamma, limits …
    [[nodes]]       id, host, port, admin_port, capacity
    [bandwidth]     default, and [[bandwidth.links]] {a, b, bw} (symmetric)
    [schema]        the content model's schema (overlay.channels.schema)

Everything is checked when loaded; a bad file raises ``ConfigError`` naming
the offending key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from overlay.channels.schema import Schema
from overlay.errors import ConfigError, OverlayError

__all__ = [
    "ClusterConfig",
    "ClusterSettings",
    "NodeConfig",
    "BandwidthLink",
    "SequencerSettings",
    "GroupSettings",
    "load_config",
]

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
Unit = Annotated[float, msgspec.Meta(ge=0, le=1)]


class NodeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    host: str = "127.0.0.1"
    port: Port = 0
    admin_port: Port = 0
    capacity: Positive = 1.0


class BandwidthLink(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    a: int
    b: int
    bw: Positive


class Bandwidth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    default: Positive = 100.0
    links: tuple[BandwidthLink, ...] = ()


class ClusterSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str = "overlay"
    initializer: int = 0
    # Load model and balancing (SPEC §5–§7).
    slice_seconds: Positive = 2.0
    delta: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.1
    levels: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 10
    probability: Unit = 0.5
    omega: Unit = 0.5
    alpha: Unit = 0.6
    beta: Unit = 0.2
    gamma: Unit = 0.2
    balancing: bool = True
    # Below this load (subscriptions tested per slice T) a node is never
    # OVERLOADED, and a cluster whose every node is below it is idle: all
    # STABLE, no session (overlay.balance.monitor rule 5).
    min_load: Annotated[float, msgspec.Meta(ge=0, le=1e15)] = 100.0
    # Limits.
    max_frame_size: Annotated[int, msgspec.Meta(ge=1024, le=64 << 20)] = 1 << 20
    peer_queue: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    client_queue: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    choke_threshold: Annotated[int, msgspec.Meta(ge=1)] = 8_000
    peer_timeout: Positive = 5.0
    capture_dir: str = ""
    # A handler (a message, a tick, an indexing step) that holds the node's loop
    # longer than this many ms is journalled as "slow" and logged; 0: off.
    slow_ms: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # Bearer token the admin HTTP endpoint asks of requests that change the
    # cluster (e.g. drain); empty: no auth.  OVERLAY_ADMIN_TOKEN overrides it.
    admin_token: str = ""


class SequencerSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[sequencer]``: ordered delivery per key (SPEC §10, ``overlay.seq``)."""

    policy: Literal["drop", "skip"] = "skip"  # on a held event's expiry: drop it, or skip the gap
    hold_ttl: Positive = 5.0  # seconds an out-of-order event waits for the missing rank
    processing_ttl: Positive = 10.0  # seconds a released event may wait for its acks
    key_ttl: Positive = 300.0  # an idle key's context is forgotten after this
    max_keys: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    max_held: Annotated[int, msgspec.Meta(ge=1)] = 10_000


class GroupSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[groups]``: subscriber groups (SPEC §11, ``overlay.channels.groups``)."""

    fault_period: Positive = 5.0  # an instance that failed a delivery is skipped this long
    ack_timeout: Positive = 2.0  # no client ack within this: the delivery failed
    throttle_lf: Unit = 0.9  # every instance above this LF: low-priority events are dropped
    low_priority: str = ""  # a subscription expression naming the low-priority events; "" = none


class ClusterConfig(msgspec.Struct, frozen=True):
    cluster: ClusterSettings
    nodes: tuple[NodeConfig, ...]
    bandwidth: Bandwidth
    schema: Schema
    path: str = ""
    sequencer: SequencerSettings = msgspec.field(default_factory=SequencerSettings)
    groups: GroupSettings = msgspec.field(default_factory=GroupSettings)

    def node(self, node_id: int) -> NodeConfig:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ConfigError(
            f"node {node_id} is not in the cluster config (nodes: {[n.id for n in self.nodes]})"
        )

    @property
    def node_ids(self) -> list[int]:
        return [n.id for n in self.nodes]

    def bw(self, a: int, b: int) -> float:
        """``bw[a][b]``: configured bandwidth between two nodes (symmetric)."""
        for link in self.bandwidth.links:
            if {link.a, link.b} == {a, b}:
                return link.bw
        return self.bandwidth.default

    def with_nodes(self, nodes: tuple[NodeConfig, ...]) -> ClusterConfig:
        return msgspec.structs.replace(self, nodes=nodes)


def _from_doc(doc: dict[str, Any], path: str) -> ClusterConfig:
    try:
        settings = msgspec.convert(doc.get("cluster", {}), ClusterSettings)
        nodes = msgspec.convert(doc.get("nodes", []), tuple[NodeConfig, ...])
        bandwidth = msgspec.convert(doc.get("bandwidth", {}), Bandwidth)
        sequencer = msgspec.convert(doc.get("sequencer", {}), SequencerSettings)
        groups = msgspec.convert(doc.get("groups", {}), GroupSettings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not nodes:
        raise ConfigError(f"{path}: no [[nodes]] declared")
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: node ids repeat: {ids}")
    if settings.initializer not in ids:
        raise ConfigError(f"{path}: initializer {settings.initializer} is not a declared node")
    for link in bandwidth.links:
        if link.a not in ids or link.b not in ids:
            raise ConfigError(f"{path}: bandwidth link {link.a}-{link.b} names an unknown node")
    if "schema" not in doc:
        raise ConfigError(f"{path}: no [schema] table")
    schema = Schema.from_dict(doc["schema"])
    if groups.low_priority:
        from overlay.channels.expressions import parse_subscription  # the schema is needed first

        try:
            parse_subscription(groups.low_priority, schema)
        except OverlayError as exc:
            raise ConfigError(f"{path}: [groups] low_priority: {exc}") from exc
    return ClusterConfig(settings, nodes, bandwidth, schema, path, sequencer=sequencer, groups=groups)


def load_config(path: str | Path) -> ClusterConfig:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return _from_doc(doc, str(path))


def config_from_dict(doc: dict[str, Any], path: str = "<dict>") -> ClusterConfig:
    return _from_doc(doc, path)
