"""Cluster configuration: one TOML file describes every node (SPEC §14).

Layout::

    [cluster]       name, initializer, slice_seconds (T), delta (δ), levels (L),
                    probability (p), omega/alpha/beta/gamma, limits …
    [[nodes]]       id, host, port, admin_port, capacity
    [bandwidth]     default, and [[bandwidth.links]] {a, b, bw} (symmetric)
    [schema]        the content model's schema (overlay.channels.schema)
    [agent]         the client's routing agent (``AgentSettings``; nodes only check it)
    [auth]          client tokens (``AuthSettings``, ``overlay.auth``)
    [tls]           certificates of nodes and clients, or insecure = true (``TlsSettings``)
    [limits]        bounds per client id and per node (``LimitSettings``, ``overlay.limits``)

Everything is checked when loaded; a bad file raises ``ConfigError`` naming
the offending key, in this order (``_from_doc``):

1. every table and key is a known one — an unknown name is refused with the
   closest known one (``[bandwith]``: did you mean ``[bandwidth]``?), since a
   misspelt key would otherwise silently leave its default in force;
2. every number is finite (TOML allows ``inf`` and ``nan``, which no setting
   means), and each setting lies within its bounds (the types below: a bound
   stops a typo such as ``capacity = 1e308`` before it skews every score);
3. node ids are unique, no node's ``host`` is empty (it listened on every
   interface, unsaid: ``"0.0.0.0"`` or ``"::"`` says so), and no two
   listening sockets of the file share a host and port (a node's ``port``
   and ``admin_port`` count; port 0, an ephemeral port, never clashes);
4. ``[auth]``: key paths are relative to the file's directory; a table
   without ``public_keys`` is refused (nodes would check nothing), and so is
   ``[cluster] admin_token`` beside it — one rule for admin rights: with
   ``[auth]``, they come from a token with the ``admin`` role;
5. a ``[tls]`` table says one thing: TLS with its CA, certificate and key,
   or ``insecure = true`` with the cluster secret, never a mix (``_check_tls``).
   A file without the table loads (cores, the simulator and the test harness
   need no certificates), but no node or client starts from it
   (``overlay.security.tls``).
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec

from overlay.channels.schema import Schema
from overlay.errors import ConfigError, OverlayError
from overlay.limits.settings import LimitSettings

__all__ = [
    "AgentSettings",
    "AuthSettings",
    "BandwidthLink",
    "ClusterConfig",
    "ClusterSettings",
    "GroupSettings",
    "LimitSettings",
    "NodeConfig",
    "SequencerSettings",
    "TlsSettings",
    "load_agent_settings",
    "load_config",
]

# Upper bounds of the settings.  None of them is a limit of the algorithms: each is
# orders of magnitude past any sensible value, so that what exceeds it is a
# typo (a unit mix-up, a missing decimal point) caught at load, not a cluster
# that silently never acts.
# Capacities are relative: past a million to one, the weaker node gets no work.
MAX_CAPACITY: Final = 1e6
# Bandwidths are relative too (SPEC §7, mig_cost): the same reasoning, wider.
MAX_BANDWIDTH: Final = 1e9
# Durations in seconds (slices, timeouts, TTLs): a week is longer than any run.
MAX_SECONDS: Final = 7 * 24 * 3600.0
# Queue lengths and sequencer sizes, in frames or entries held in memory.
MAX_ENTRIES: Final = 100_000_000
# slow_ms: a handler holding the loop a minute is a hung node, not a slow one.
MAX_SLOW_MS: Final = 60_000.0

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
Entries = Annotated[int, msgspec.Meta(ge=1, le=MAX_ENTRIES)]
Unit = Annotated[float, msgspec.Meta(ge=0, le=1)]
RelativeBandwidth = Annotated[float, msgspec.Meta(gt=0, le=MAX_BANDWIDTH)]


class NodeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    host: str = "127.0.0.1"
    port: Port = 0
    admin_port: Port = 0
    capacity: Annotated[float, msgspec.Meta(gt=0, le=MAX_CAPACITY)] = 1.0


class BandwidthLink(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    a: int
    b: int
    bw: RelativeBandwidth


class Bandwidth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    default: RelativeBandwidth = 100.0
    links: tuple[BandwidthLink, ...] = ()


class ClusterSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str = "overlay"
    initializer: int = 0
    # Load model and balancing (SPEC §5–§7).
    slice_seconds: Seconds = 2.0
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
    peer_queue: Entries = 10_000
    client_queue: Entries = 10_000
    choke_threshold: Entries = 8_000
    peer_timeout: Seconds = 5.0
    # Failures (SPEC §16, ``overlay.node.liveness``): a heartbeat to every peer
    # each ``heartbeat_interval``; a peer silent for ``suspect_timeout`` is
    # suspected, and declared dead when a majority of the configured nodes
    # suspect it.  A node that rejoins after being declared dead is given no
    # channel by balancing for ``rejoin_damping`` seconds, doubled for each
    # death within ``flap_window`` seconds (a flapping node causes no storm).
    heartbeat_interval: Annotated[float, msgspec.Meta(gt=0, le=60)] = 0.25
    suspect_timeout: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 1.5
    rejoin_damping: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 10.0
    flap_window: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 300.0
    # Nothing acknowledged is lost (``overlay.node.outbox``): an access node
    # keeps at most ``outbox_limit`` accepted events until they are matched
    # and their notifications arrived (past it a publish is answered Choke:
    # the client sends it again), re-sends one unconfirmed after ``resend_after`` seconds,
    # and gives up (an ``undeliverable`` error to the publisher) after
    # ``event_ttl``.  Access nodes drop a notification whose event id they saw
    # within ``dedup_window`` seconds (at most ``dedup_max`` ids).
    outbox_limit: Entries = 50_000
    # Payloads (``Publish.payload``): the largest one an event may carry (a
    # larger publish is refused ``payload_too_large``), at most half of
    # ``max_frame_size`` so an event travels in one frame with its attributes
    # and ids; and the payload bytes an access node keeps in its outbox (and
    # its keyed events waiting for their home) — past it a publish is answered
    # Choke, as past ``outbox_limit``: a few large payloads cannot exhaust memory.
    max_payload: Annotated[int, msgspec.Meta(ge=0, le=32 << 20)] = 64 * 1024
    outbox_bytes: Annotated[int, msgspec.Meta(ge=64 * 1024, le=1 << 40)] = 64 << 20
    resend_after: Annotated[float, msgspec.Meta(gt=0, le=600)] = 1.0
    event_ttl: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    dedup_window: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0
    dedup_max: Annotated[int, msgspec.Meta(ge=1000, le=100_000_000)] = 1_000_000
    capture_dir: str = ""
    # The capture records each event's payload size; true: its content too
    # (base64), for an audit that needs it (SPEC §13).  Off by default: a
    # capture is not meant to be a second copy of the data.
    capture_payload: bool = False
    # A handler (a message, a tick, an indexing step) that holds the node's loop
    # longer than this many ms is journalled as "slow" and logged; 0: off.
    slow_ms: Annotated[float, msgspec.Meta(ge=0, le=MAX_SLOW_MS)] = 5.0
    # Bearer token the admin HTTP endpoint asks of requests that change the
    # cluster (e.g. drain); empty: no auth.  OVERLAY_ADMIN_TOKEN overrides it.
    # The legacy rule: a cluster with [auth] takes admin rights from tokens.
    admin_token: str = ""


class SequencerSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[sequencer]``: ordered delivery per key (SPEC §10, ``overlay.seq``)."""

    policy: Literal["drop", "skip"] = "skip"  # on a held event's expiry: drop it, or skip the gap
    hold_ttl: Seconds = 5.0  # seconds an out-of-order event waits for the missing rank
    processing_ttl: Seconds = 10.0  # seconds a released event may wait for its acks
    key_ttl: Seconds = 300.0  # an idle key's context is forgotten after this
    max_keys: Entries = 100_000
    max_held: Entries = 10_000


class GroupSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[groups]``: subscriber groups (SPEC §11, ``overlay.channels.groups``)."""

    fault_period: Seconds = 5.0  # an instance that failed a delivery is skipped this long
    ack_timeout: Seconds = 2.0  # no client ack within this: the delivery failed
    throttle_lf: Unit = 0.9  # every instance above this LF: low-priority events are dropped
    low_priority: str = ""  # a subscription expression naming the low-priority events; "" = none


class AgentSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[agent]``: the client's routing agent (SPEC §12, ``overlay.client.routing``).

    Read by clients (``load_agent_settings``); a node checks the table when it
    loads the file, so a typo fails for nodes too, and otherwise ignores it."""

    window: Annotated[int, msgspec.Meta(ge=2, le=10_000)] = 16  # l: ack latencies per node in the RLS fit
    min_timeout: Annotated[float, msgspec.Meta(gt=0)] = 0.05  # s: floor of mean + 3σ
    max_timeout: Annotated[float, msgspec.Meta(gt=0)] = 5.0  # s: the timeout before 3 samples, and its ceiling
    probe_interval: Annotated[float, msgspec.Meta(ge=0)] = 0.25  # s without a sample before a probe; 0: off
    redundancy: Annotated[int, msgspec.Meta(ge=1, le=16)] = 2  # homes per (non-group) subscription
    dedup: Annotated[int, msgspec.Meta(ge=1)] = 65_536  # event ids remembered per subscription


class AuthSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[auth]``: clients present signed tokens (SPEC §16, ``overlay.auth``).

    Auth is on when ``public_keys`` lists at least one key (rule 4)."""

    # PEM Ed25519 public keys whose tokens the nodes accept; several during a
    # key rotation (each token names its key).  Nodes read nothing else.
    public_keys: tuple[str, ...] = ()
    # The PEM private key `overlay token create` signs with; nodes never read it.
    signing_key: str = ""
    # false: a session without a token may publish and subscribe, unscoped
    # (a roll-out step); a token presented is checked all the same, and admin
    # commands always need one with the admin role.
    required: bool = True
    # Seconds by which clocks may disagree on a token's exp and nbf.
    leeway: Annotated[float, msgspec.Meta(ge=0, le=300)] = 5.0
    # The longest ttl `overlay token create` issues (seconds).
    max_ttl: Annotated[float, msgspec.Meta(gt=0, le=366 * 24 * 3600)] = 30 * 24 * 3600.0

    @property
    def enabled(self) -> bool:
        return bool(self.public_keys)


class TlsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[tls]``: how nodes and clients talk (SPEC §16, ``overlay.security``).

    TLS on every listener: ``ca`` is the cluster's CA (peers and clients
    verify against it), ``cert``/``key`` a node's certificate and key, where
    ``{id}`` stands for the node id (one file for every node); paths are
    relative to the config file.  ``client_cert``/``client_key``: what
    clients reading this file (the CLI) present; ``verify_clients``: the
    nodes ask every client for a CA-signed certificate.  ``insecure = true``
    is plain TCP, for a trusted network only: peers then prove membership by
    a challenge on ``secret`` (``OVERLAY_CLUSTER_SECRET`` wins over it)."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    client_cert: str = ""
    client_key: str = ""
    verify_clients: bool = False
    insecure: bool = False
    secret: str = ""

    @property
    def configured(self) -> bool:
        """Whether the file says how to talk at all (rule 5)."""
        return self.insecure or bool(self.ca or self.cert or self.key)


class ClusterConfig(msgspec.Struct, frozen=True):
    cluster: ClusterSettings
    nodes: tuple[NodeConfig, ...]
    bandwidth: Bandwidth
    schema: Schema
    path: str = ""
    sequencer: SequencerSettings = msgspec.field(default_factory=SequencerSettings)
    groups: GroupSettings = msgspec.field(default_factory=GroupSettings)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    tls: TlsSettings = msgspec.field(default_factory=TlsSettings)
    limits: LimitSettings = msgspec.field(default_factory=LimitSettings)

    def node(self, node_id: int) -> NodeConfig:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ConfigError(f"node {node_id} is not in the cluster config (nodes: {[n.id for n in self.nodes]})")

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


# The keys of the tables that are not a Struct of this module.
SCHEMA_KEYS: Final = ("distinguishing", "attributes")
ATTRIBUTE_KEYS: Final = ("name", "type", "min", "max")
# Hosts that listen on every address of the machine: their ports clash with
# the same port on any host.
WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::"})


def _fields(struct: type[msgspec.Struct]) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(struct))


def _unknown(kind: str, name: str, where: str, known: tuple[str, ...]) -> ConfigError:
    # str(): a dict handed to config_from_dict may have a key of another type.
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return ConfigError(f"unknown {kind} {name!r}{' in ' + where if where else ''}; {hint}")


def _check_keys(table: object, where: str, known: tuple[str, ...]) -> None:
    """Rule 1 for one table (``where`` names it in messages)."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table")
    for key in table:
        if key not in known:
            raise _unknown("key", key, where, known)


def _check_names(doc: Mapping[str, Any]) -> None:
    """Rule 1: every table and key of the file is one this module knows."""
    tables: dict[str, tuple[str, ...]] = {
        "cluster": _fields(ClusterSettings),
        "bandwidth": _fields(Bandwidth),
        "sequencer": _fields(SequencerSettings),
        "groups": _fields(GroupSettings),
        "schema": SCHEMA_KEYS,
        "nodes": _fields(NodeConfig),
        "agent": _fields(AgentSettings),
        "auth": _fields(AuthSettings),
        "tls": _fields(TlsSettings),
        "limits": _fields(LimitSettings),
    }
    for name in doc:
        if name not in tables:
            raise _unknown("table", name, "", tuple(tables))
    for name, known in tables.items():
        if name not in doc or name == "nodes":
            continue
        _check_keys(doc[name], f"[{name}]", known)
    nodes = doc.get("nodes", [])
    if not isinstance(nodes, list):
        raise ConfigError("nodes must be an array of tables: [[nodes]]")
    for i, node in enumerate(nodes):
        _check_keys(node, _node_where(i, node), tables["nodes"])
    links = doc.get("bandwidth", {}).get("links", [])
    for i, link in enumerate(links if isinstance(links, list) else []):
        _check_keys(link, f"[bandwidth] links #{i + 1}", _fields(BandwidthLink))
    attrs = doc.get("schema", {}).get("attributes", [])
    for i, attr in enumerate(attrs if isinstance(attrs, list) else []):
        if isinstance(attr, Mapping):  # Schema.from_dict explains other shapes
            _check_keys(attr, f"[schema] attributes #{i + 1}", ATTRIBUTE_KEYS)


def _node_where(index: int, raw: object) -> str:
    """``[[nodes]] #2 (id 1)``: the entry's place in the file, and its id when it has one."""
    node_id = raw.get("id") if isinstance(raw, Mapping) else None
    return f"[[nodes]] #{index + 1}" + (f" (id {node_id})" if isinstance(node_id, int) else "")


def _numbers(value: object, where: str) -> Iterator[tuple[str, float]]:
    """Every float in a TOML value, with where it is (``[cluster] peer_timeout``,
    ``[bandwidth] links #1 bw``)."""
    if isinstance(value, float):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(item, f"{where} {key}" if where else f"[{key}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{where} #{i + 1}")


def _check_finite(doc: Mapping[str, Any]) -> None:
    """Rule 2, first half: TOML's ``inf`` and ``nan`` mean nothing here."""
    for where, x in _numbers(doc, ""):
        if not math.isfinite(x):
            raise ConfigError(f"{where} = {x} is not a finite number")


def _convert(raw: object, kind: Any, where: str) -> Any:
    """Rule 2, second half: msgspec checks types and bounds; its message names
    the key as ``$.key``, which becomes ``[table] key``."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        text, _, at = str(exc).partition(" - at `$")
        key = at.rstrip("`").lstrip(".")
        raise ConfigError(f"{where}{' ' + key if key else ''}: {text}") from exc


def _listeners(nodes: tuple[NodeConfig, ...]) -> Iterator[tuple[str, int, str]]:
    for n in nodes:
        yield n.host, n.port, f"node {n.id}'s port"
        yield n.host, n.admin_port, f"node {n.id}'s admin_port"


def _check_ports(nodes: tuple[NodeConfig, ...]) -> None:
    """Rule 3: two listening sockets of one file on one host:port cannot both bind."""
    seen: dict[int, list[tuple[str, str]]] = {}
    for host, port, what in _listeners(nodes):
        if port == 0:  # ephemeral: the system picks a free one
            continue
        for other_host, other in seen.get(port, []):
            if host == other_host or host in WILDCARD_HOSTS or other_host in WILDCARD_HOSTS:
                raise ConfigError(f"{what} {host}:{port} is {other} too: two sockets cannot listen on one port")
        seen.setdefault(port, []).append((host, what))


def _check_tls(tls: TlsSettings) -> None:
    """Rule 5, for a file with a ``[tls]`` table."""
    if tls.insecure:
        mixed = [k for k in ("ca", "cert", "key", "client_cert", "client_key") if getattr(tls, k)]
        if tls.verify_clients:
            mixed.append("verify_clients")
        if mixed:
            raise ConfigError(
                f"[tls] insecure = true turns TLS off, but {', '.join(mixed)} {'is' if len(mixed) == 1 else 'are'} "
                "set too: remove them, or insecure"
            )
        return
    missing = [k for k in ("ca", "cert", "key") if not getattr(tls, k)]
    if missing:
        raise ConfigError(
            f"[tls] needs ca, cert and key (missing: {', '.join(missing)}); `overlay certs dev DIR --config F` "
            "makes development ones — or set insecure = true for plain TCP on a network you trust"
        )
    if tls.secret:
        raise ConfigError(
            "[tls] secret is for insecure = true (peers prove membership by it without TLS); "
            "with TLS their certificates do: remove it"
        )
    if bool(tls.client_cert) != bool(tls.client_key):
        raise ConfigError("[tls] client_cert and client_key go together: set both, or neither")


def _from_doc(doc: dict[str, Any], path: str) -> ClusterConfig:
    try:
        _check_names(doc)
        _check_finite(doc)
        settings = _convert(doc.get("cluster", {}), ClusterSettings, "[cluster]")
        nodes = tuple(_convert(raw, NodeConfig, _node_where(i, raw)) for i, raw in enumerate(doc.get("nodes", [])))
        bandwidth = _convert(doc.get("bandwidth", {}), Bandwidth, "[bandwidth]")
        sequencer = _convert(doc.get("sequencer", {}), SequencerSettings, "[sequencer]")
        groups = _convert(doc.get("groups", {}), GroupSettings, "[groups]")
        if "agent" in doc:  # read by clients; checked here so a typo fails for nodes too
            _convert(doc["agent"], AgentSettings, "[agent]")
        auth = _auth(doc, path, settings)
        tls = _convert(doc.get("tls", {}), TlsSettings, "[tls]")
        if "tls" in doc:
            _check_tls(tls)
        limits = _convert(doc.get("limits", {}), LimitSettings, "[limits]")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except RecursionError:  # _numbers walks nested arrays; TOML allows any depth
        raise ConfigError(f"{path}: a value is nested too deeply") from None
    if not nodes:
        raise ConfigError(f"{path}: no [[nodes]] declared")
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: node ids repeat: {ids}")
    for i, n in enumerate(nodes):
        if not n.host.strip():  # rule 3
            raise ConfigError(
                f"{path}: [[nodes]] #{i + 1} (id {n.id}) host is empty: give the address the other nodes and "
                'clients reach it at; "0.0.0.0" (or "::") listens on every interface, if that is what you mean'
            )
    try:
        _check_ports(nodes)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if settings.suspect_timeout < 2 * settings.heartbeat_interval:
        raise ConfigError(
            f"{path}: [cluster] suspect_timeout = {settings.suspect_timeout} must be at least twice "
            f"heartbeat_interval = {settings.heartbeat_interval}, or one late heartbeat makes a peer suspect"
        )
    if settings.resend_after >= settings.event_ttl or settings.dedup_window < settings.event_ttl:
        raise ConfigError(
            f"{path}: [cluster] needs resend_after < event_ttl <= dedup_window "
            f"(got {settings.resend_after}, {settings.event_ttl}, {settings.dedup_window}): an event is re-sent "
            "only while it lives, and its duplicates are recognised as long as it may be re-sent"
        )
    if settings.max_payload > settings.max_frame_size // 2:
        raise ConfigError(
            f"{path}: [cluster] max_payload = {settings.max_payload} must be at most half of max_frame_size = "
            f"{settings.max_frame_size} (so {settings.max_frame_size // 2}): an event's payload travels in one frame "
            "with its attributes and ids; raise max_frame_size or lower max_payload"
        )
    if settings.initializer not in ids:
        raise ConfigError(f"{path}: initializer {settings.initializer} is not a declared node")
    for link in bandwidth.links:
        if link.a not in ids or link.b not in ids:
            raise ConfigError(f"{path}: bandwidth link {link.a}-{link.b} names an unknown node")
    if "schema" not in doc:
        raise ConfigError(f"{path}: no [schema] table")
    try:
        schema = Schema.from_dict(doc["schema"])
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if groups.low_priority:
        from overlay.channels.expressions import parse_subscription  # the schema is needed first

        try:
            parse_subscription(groups.low_priority, schema)
        except OverlayError as exc:
            raise ConfigError(f"{path}: [groups] low_priority: {exc}") from exc
    return ClusterConfig(
        settings,
        nodes,
        bandwidth,
        schema,
        path,
        sequencer=sequencer,
        groups=groups,
        auth=auth,
        tls=tls,
        limits=limits,
    )


def _auth(doc: Mapping[str, Any], path: str, settings: ClusterSettings) -> AuthSettings:
    """Rule 4: ``[auth]`` with its key paths made relative to the file's directory."""
    if "auth" not in doc:
        return AuthSettings()
    auth: AuthSettings = _convert(doc["auth"], AuthSettings, "[auth]")
    if not auth.public_keys:
        raise ConfigError(
            "[auth] public_keys: list at least one PEM public key (`overlay token keys DIR` makes a pair); "
            "without one no node checks a token"
        )
    if settings.admin_token:
        raise ConfigError(
            "[cluster] admin_token and [auth] cannot both be set: with [auth], admin rights come from a token "
            "with the admin role (`overlay token create --role admin`); remove admin_token"
        )
    base = Path(path).parent if path and not path.startswith("<") else Path()

    def resolve(p: str) -> str:
        return str(base / Path(p).expanduser()) if p else p

    return msgspec.structs.replace(
        auth, public_keys=tuple(resolve(p) for p in auth.public_keys), signing_key=resolve(auth.signing_key)
    )


def load_config(path: str | Path) -> ClusterConfig:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"{path}: a value is nested too deeply") from None
    except UnicodeDecodeError as exc:  # tomllib decodes the file itself
        raise ConfigError(f"{path} is not UTF-8 text: {exc}") from None
    return _from_doc(doc, str(path))


def config_from_dict(doc: dict[str, Any], path: str = "<dict>") -> ClusterConfig:
    return _from_doc(doc, path)


def load_agent_settings(path: str | Path) -> AgentSettings:
    """The ``[agent]`` table of a cluster config, for a client (the rest of the file is not read)."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
        return msgspec.convert(doc.get("agent", {}), AgentSettings)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{path}: a value is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text: {exc}") from None
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: [agent]: {exc}") from exc
