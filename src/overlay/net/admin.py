"""The admin HTTP endpoint of a node (SPEC §14): health, state, routing,
balancing decisions, Prometheus metrics, and the live page of the cluster.

Rules this module keeps:

1. It reads the core, never changes it: every GET answers from the core's
   state at the moment of the request (``NodeCore.status``, ``journal``,
   ``stats``, the routing table) plus the shell's queue depths.  A route that
   changes the cluster (drain, later) is registered with ``add_action``.
2. It listens on its own socket (``admin_port`` of the node's config; 0 →
   ephemeral), bound synchronously by ``bind`` before the node reports
   started, so ``Node.admin_port`` is the real port from then on.  The aiohttp
   runner lives in one task of the node's TaskGroup (``run``); cancelling it
   ends the event streams, then cleans the runner up.
3. Every error is JSON, ``{"error": …, "status": …}``: an unknown path is a
   404, a wrong method a 405, a bad query a 400, a missing or wrong token a
   401 — never aiohttp's HTML pages.
4. Auth: every method but GET/HEAD needs ``Authorization: Bearer <token>``
   when a token is configured (``[cluster] admin_token``, or the
   ``OVERLAY_ADMIN_TOKEN`` environment variable, which wins so a token need
   not sit in a config file).  No token configured: no auth.
5. The whole-cluster view (``/cluster``, ``/events`` and the page at ``/``)
   is this node's status plus each other node's ``/status`` and
   ``/balancing``, fetched over HTTP from the admin address in the config,
   at most once per ``VIEW_TTL`` however many pages watch.  Why HTTP and not
   LIEMs: a LIEM carries a node's state and load only, while the page shows
   every node's channels, queue depths, counters and decision journal, which
   only that node holds.  A node whose admin endpoint does not answer still
   appears, from its last LIEM (state, d, dc), marked unreachable.  The node
   list is what the cluster reports — the config, this node's peers, the
   nodes it hears LIEMs from and the owners in its routing table — so a node
   that joins or drains shows up without a change here.
6. The metrics are collected at scrape time by ``NodeCollector`` into a
   registry of this node's own, so nodes sharing a process (tests) never mix.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from overlay.channels.space import ExceptConstraint, RangeConstraint, SetConstraint
from overlay.histograms import BucketCounts

if TYPE_CHECKING:
    from overlay.net.node import Node

__all__ = ["AdminServer", "NodeCollector", "TOKEN_ENV"]

log = logging.getLogger("overlay.admin")

TOKEN_ENV: Final = "OVERLAY_ADMIN_TOKEN"
# The whole-cluster view is rebuilt at most this often, however many pages
# watch: each rebuild costs two HTTP requests per other node.
VIEW_TTL: Final = 0.5
# A peer's admin endpoint that has not answered within this is shown from
# its LIEM: the page must not stall on one slow or dead node.
PEER_FETCH_TIMEOUT: Final = 1.0
# Server-sent events: one cluster snapshot per interval (the query may ask
# for another within these bounds), and the browser's reconnect delay.
PUSH_SECONDS: Final = 1.0
PUSH_BOUNDS: Final = (0.1, 10.0)
SSE_RETRY_MS: Final = 2000
# Journal entries per node fetched for the page's feed, and kept in the feed.
FEED_PER_NODE: Final = 20
FEED_SIZE: Final = 40
BALANCING_DEFAULT: Final = 50
# S/dc̄ history on the page: the slices of the last ten minutes.
HISTORY_SECONDS: Final = 600.0
# Let open requests finish this long when the node stops.
SHUTDOWN_SECONDS: Final = 2.0
# Journal kinds that are balancing decisions or moves (``/balancing``'s default).
MOVES: Final = ("decision", "split", "merge", "migration", "replication", "replicate", "abort", "state")
# Counters of the core that the page and ``overlay status`` show per node.
NODE_COUNTERS: Final = (
    "events_in", "events_matched", "notifications_out", "notifies_out", "migrations", "replications",
    "splits", "merges", "migrations_aborted", "reforwards", "subscriptions_moved", "migration_bytes",
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_encoder = msgspec.json.Encoder(enc_hook=str)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(data), status=status, content_type="application/json")


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    return json_response({"error": message, "status": status, **extra}, status)


class AdminServer:
    """The admin endpoint of one ``Node`` (module rules 1–5).

    Invariant: ``port`` is the bound port once ``bind`` returned; the runner
    exists only while ``run`` does.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self.core = node.core
        self.token = os.environ.get(TOKEN_ENV) or node.config.cluster.admin_token
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(node))
        self.app = web.Application(middlewares=[self._errors, self._auth])
        self._add_routes()
        self._sock: socket.socket | None = None
        self.port = 0
        self._closing = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self._view: dict[str, Any] | None = None
        self._view_at = 0.0
        self._view_lock = asyncio.Lock()
        self._web = resources.files("overlay") / "web"

    # -- lifecycle (rule 2) -------------------------------------------------------------

    def bind(self, sock: socket.socket | None = None) -> int:
        """Open the listening socket now (synchronously): the port is known
        before the node reports started."""
        if sock is None:
            me = self.node.me
            sock = socket.create_server((me.host, me.admin_port), reuse_port=False)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        return self.port

    async def run(self) -> None:
        """Serve until cancelled (by the node's TaskGroup at shutdown)."""
        assert self._sock is not None, "bind() first"
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
        await runner.setup()
        try:
            await web.SockSite(runner, self._sock).start()
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_FETCH_TIMEOUT))
            log.info("node %d: admin endpoint on http://%s:%d/", self.node.id, self.node.me.host, self.port)
            await asyncio.Event().wait()  # forever: the TaskGroup cancels us
        finally:
            self._closing.set()  # event streams end at their next wake-up
            await runner.cleanup()
            if self._http is not None:
                await self._http.close()
            self._sock.close()

    def add_action(self, path: str, handler: Handler, method: str = "POST") -> None:
        """Register a route that changes the cluster: token-checked (rule 4).
        Call it before the node runs: aiohttp freezes the routes at start."""
        self.app.router.add_route(method, path, handler)

    # -- middlewares (rules 3, 4) -----------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = {404: f"no such path: {request.path}", 405: f"{request.method} not allowed on {request.path}"}
            return json_error(exc.status, message.get(exc.status, exc.reason))

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in ("GET", "HEAD") or not self.token:
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return json_error(401, "this endpoint changes the cluster: send Authorization: Bearer <admin token>")
        return await handler(request)

    # -- routes -------------------------------------------------------------------------

    def _add_routes(self) -> None:
        r = self.app.router
        r.add_get("/", self._page)
        r.add_get("/static/{name}", self._static)
        r.add_get("/favicon.ico", self._favicon)
        r.add_get("/healthz", self._healthz)
        r.add_get("/status", self._status)
        r.add_get("/routing", self._routing)
        r.add_get("/balancing", self._balancing)
        r.add_get("/metrics", self._metrics)
        r.add_get("/cluster", self._cluster)
        r.add_get("/events", self._events)

    def health(self) -> tuple[bool, str]:
        node, core = self.node, self.core
        if node._stop.is_set():
            return False, "the node is stopping"
        if not node.started.is_set():
            return False, "the node is starting"
        if not core.has_table:
            return False, f"waiting for the routing table from the initializer (node {core.config.cluster.initializer})"
        if not core.ready:
            return False, f"waiting for ReplyRoutingTableInit from nodes {sorted(core._init_waiting)}"
        return True, "ready"

    async def _healthz(self, request: web.Request) -> web.Response:
        ready, why = self.health()
        links = self.node.links
        return json_response(
            {
                "node": self.node.id,
                "ready": ready,
                "why": why,
                "state": self.core.monitor.state.value,
                "links_up": sorted(p for p, l in links.items() if l.connected.is_set()),
                "links_down": sorted(p for p, l in links.items() if not l.connected.is_set()),
            },
            200 if ready else 503,
        )

    def node_status(self) -> dict[str, Any]:
        """``NodeCore.status`` plus what only the shell knows: queue depths,
        links, addresses (SPEC §14: peers and link queue depths)."""
        node, core = self.node, self.core
        st = core.status()
        mean, spread = st.get("mean_dc"), st.get("spread")
        writers = list(node.clients.values())
        st.update(
            cluster=core.config.cluster.name,
            address=f"{node.me.host}:{node.port}",
            admin_port=self.port,
            health=self.health()[1],
            spread_ratio=spread / mean if spread is not None and mean else None,
            delta=core.config.cluster.delta,
            subscriptions=sum(len(ch) for ch in core.local),
            links={
                str(p): {"connected": l.connected.is_set(), "high": len(l.queue.high), "normal": len(l.queue.normal), "connects": l.connects}
                for p, l in sorted(node.links.items())
            },
            inbox={"high": len(node.inbox.high), "normal": len(node.inbox.normal)},
            clients={
                "connections": len(writers),
                "high": sum(len(w.queue.high) for w in writers),
                "normal": sum(len(w.queue.normal) for w in writers),
                "max": max((len(w.queue) for w in writers), default=0),
            },
        )
        return st

    async def _status(self, request: web.Request) -> web.Response:
        return json_response(self.node_status())

    def routing(self) -> dict[str, Any]:
        core = self.core
        schema = core.schema
        return {
            "node": self.node.id,
            "da": [
                {"name": n, "kind": schema.attributes[n].kind.value, "min": schema.attributes[n].min, "max": schema.attributes[n].max}
                for n in schema.da
            ],
            "channels": [
                {"id": str(c), "owners": list(e.owners), "space": e.space.text(schema), "constraints": [_constraint(x) for x in e.space.constraints]}
                for c, e in sorted(core.routing.items())
            ],
        }

    async def _routing(self, request: web.Request) -> web.Response:
        return json_response(self.routing())

    def balancing(
        self, n: int, kinds: Iterable[str] = MOVES, since: float | None = None, idle: bool = True
    ) -> list[dict[str, Any]]:
        """The last ``n`` journal entries of ``kinds`` (after ``since``), oldest
        first; ``idle=False`` leaves out receiver rankings that found no
        candidate (an overloaded node with no underloaded peer logs one per slice)."""
        wanted = set(kinds)
        out: list[dict[str, Any]] = []
        for e in reversed(self.core.journal):
            if since is not None and e["time"] <= since:
                break
            if not idle and e["kind"] == "decision" and e.get("phase") == "receivers" and not e.get("candidates"):
                continue
            if e["kind"] in wanted:
                out.append(e)
                if len(out) >= n:
                    break
        out.reverse()
        return out

    async def _balancing(self, request: web.Request) -> web.Response:
        q = request.query
        try:
            n = int(q.get("n", BALANCING_DEFAULT))
            since = float(q["since"]) if "since" in q else None
        except ValueError:
            return json_error(400, "n must be an integer and since a number (seconds since the epoch)")
        if n < 1:
            return json_error(400, "n must be at least 1")
        kinds = [k for k in q.get("kinds", "").split(",") if k] or list(MOVES)
        idle = q.get("idle", "1") not in ("0", "false", "no")
        entries = self.balancing(n, kinds, since, idle)
        return json_response({"node": self.node.id, "kinds": kinds, "count": len(entries), "entries": entries})

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- the page and the cluster view (rule 5) -------------------------------------------

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(body=(self._web / "index.html").read_bytes(), content_type="text/html", charset="utf-8")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
        kind = next((t for ext, t in types.items() if name.endswith(ext)), None)
        f = self._web / name
        if kind is None or "/" in name or name.startswith(".") or not f.is_file():
            return json_error(404, f"no such path: {request.path}")
        return web.Response(body=f.read_bytes(), content_type=kind, charset="utf-8" if kind != "image/svg+xml" else None)

    async def _favicon(self, request: web.Request) -> web.Response:
        return web.Response(body=(self._web / "favicon.svg").read_bytes(), content_type="image/svg+xml")

    def known_nodes(self) -> list[int]:
        """Rule 5: every node the cluster reports."""
        core = self.core
        ids = {self.node.id, *core.peers, *core.config.node_ids, *(p.node for p in core.monitor.live())}
        for _, e in core.routing.items():
            ids.update(e.owners)
        return sorted(ids)

    def admin_url(self, node_id: int) -> str | None:
        if node_id == self.node.id:
            host = self.node.me.host
            return f"http://{_connect_host(host)}:{self.port}"
        cfg = next((n for n in self.node.config.nodes if n.id == node_id), None)
        if cfg is None or not cfg.admin_port:
            return None
        return f"http://{_connect_host(cfg.host)}:{cfg.admin_port}"

    async def _fetch(self, node_id: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
        url = self.admin_url(node_id)
        if url is None:
            return None, [], "no admin address in the config"
        if self._http is None or self._http.closed:
            return None, [], "the admin endpoint is stopping"
        try:
            async with self._http.get(f"{url}/status") as resp:
                resp.raise_for_status()
                status = await resp.json()
            async with self._http.get(f"{url}/balancing", params={"n": str(FEED_PER_NODE), "idle": "0"}) as resp:
                resp.raise_for_status()
                journal = (await resp.json())["entries"]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
            return None, [], f"admin endpoint {url} did not answer: {type(exc).__name__} {exc}".strip()
        return status, journal, ""

    async def cluster_view(self) -> dict[str, Any]:
        """The whole cluster as the page shows it, rebuilt at most every ``VIEW_TTL``."""
        async with self._view_lock:
            now = time.monotonic()
            if self._view is not None and now - self._view_at < VIEW_TTL:
                return self._view
            self._view = await self._build_view()
            self._view_at = time.monotonic()
            return self._view

    async def _build_view(self) -> dict[str, Any]:
        core = self.core
        ids = self.known_nodes()
        others = [i for i in ids if i != self.node.id]
        fetched = await asyncio.gather(*(self._fetch(i) for i in others))
        statuses: dict[int, dict[str, Any] | None] = {self.node.id: self.node_status()}
        journals: dict[int, list[dict[str, Any]]] = {self.node.id: self.balancing(FEED_PER_NODE, idle=False)}
        errors: dict[int, str] = {}
        for i, (st, journal, err) in zip(others, fetched):
            statuses[i], journals[i] = st, journal
            if err:
                errors[i] = err
        liems = {p.node: p for p in core.monitor.live()}
        nodes = []
        loads: dict[str, dict[str, Any]] = {}
        for i in ids:
            st = statuses.get(i)
            if st is None:
                p = liems.get(i)
                nodes.append(
                    {"node": i, "reachable": False, "why": errors.get(i, ""), "admin": self.admin_url(i),
                     "state": p.state.value if p else "UNKNOWN", "d": p.d if p else None, "dc": p.dc if p else None,
                     "capacity": p.capacity if p else None, "channels": [], "stats": {}}
                )
                continue
            for ch in st.get("channels", ()):
                loads[ch["id"]] = {"load": ch.get("load", 0), "last_load": ch.get("last_load", 0), "subscriptions": ch.get("subscriptions", 0)}
            nodes.append(_node_summary(st, self.admin_url(i)))
        mine = statuses[self.node.id]
        assert mine is not None
        routing = self.routing()
        for ch in routing["channels"]:
            ch.update(loads.get(ch["id"], {}))
        feed = sorted((e for j in journals.values() for e in j), key=lambda e: e["time"], reverse=True)[:FEED_SIZE]
        return {
            "time": time.time(),
            "cluster": core.config.cluster.name,
            "served_by": self.node.id,
            "delta": core.config.cluster.delta,
            "mean_dc": mine.get("mean_dc"),
            "spread": mine.get("spread"),
            "spread_ratio": mine.get("spread_ratio"),
            "nodes": nodes,
            "da": routing["da"],
            "placement": routing["channels"],
            "history": self.history(),
            "feed": feed,
            "totals": {k: sum(n["stats"].get(k, 0) for n in nodes) for k in NODE_COUNTERS},
        }

    def history(self) -> list[tuple[float, float]]:
        """``(time, S/dc̄)`` per slice of this node in the last ``HISTORY_SECONDS``
        (0 while nothing is loaded: no spread to lower)."""
        cutoff = time.time() - HISTORY_SECONDS
        out = []
        for e in self.core.journal:
            if e["kind"] == "slice" and e["time"] >= cutoff and e.get("mean") is not None and e.get("spread") is not None:
                out.append((e["time"], e["spread"] / e["mean"] if e["mean"] > 0 else 0.0))
        return out

    async def _cluster(self, request: web.Request) -> web.Response:
        return json_response(await self.cluster_view())

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: a ``cluster`` event with the whole view per interval."""
        try:
            interval = float(request.query.get("interval", PUSH_SECONDS))
        except ValueError:
            return json_error(400, "interval must be a number of seconds")
        interval = min(max(interval, PUSH_BOUNDS[0]), PUSH_BOUNDS[1])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        try:
            await resp.write(f"retry: {SSE_RETRY_MS}\n\n".encode())
            n = 0
            while not self._closing.is_set():
                view = await self.cluster_view()
                n += 1
                await resp.write(b"id: %d\nevent: cluster\ndata: " % n + _encoder.encode(view) + b"\n\n")
                try:
                    await asyncio.wait_for(self._closing.wait(), interval)
                except asyncio.TimeoutError:
                    pass
        except ConnectionResetError:
            pass  # the page went away
        return resp


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _constraint(c: Any) -> dict[str, Any]:
    if isinstance(c, RangeConstraint):
        iv = c.interval
        return {"attr": c.attr, "kind": "range", "lo": iv.lo, "hi": iv.hi, "lo_open": iv.lo_open, "hi_open": iv.hi_open}
    if isinstance(c, SetConstraint):
        return {"attr": c.attr, "kind": "set", "values": sorted(c.values)}
    assert isinstance(c, ExceptConstraint)
    return {"attr": c.attr, "kind": "except", "excluded": sorted(c.excluded)}


def _node_summary(st: dict[str, Any], admin: str | None) -> dict[str, Any]:
    stats = st.get("stats", {})
    return {
        "node": st["node"],
        "reachable": True,
        "admin": admin,
        "ready": st.get("ready"),
        "health": st.get("health"),
        "state": st.get("state"),
        "draining": bool(st.get("draining")),  # node_membership: shown as a badge on the page
        "d": st.get("d"),
        "dc": st.get("dc"),
        "capacity": st.get("capacity"),
        "mean_dc": st.get("mean_dc"),
        "spread_ratio": st.get("spread_ratio"),
        "slice": st.get("slice"),
        "slice_seconds": st.get("slice_seconds"),
        "subscriptions": st.get("subscriptions"),
        "sessions": st.get("sessions"),
        "channels": [c["id"] for c in st.get("channels", ())],
        "links": st.get("links", {}),
        "inbox": st.get("inbox", {}),
        "clients": st.get("clients", {}),
        "stats": {k: stats.get(k, 0) for k in NODE_COUNTERS},
    }


# -- metrics (rule 6) ------------------------------------------------------------------------

# Core counters exported under their own names: (family, help, stats key).
_COUNTERS: Final = (
    ("overlay_events_in", "Events accepted from publishers at this access node.", "events_in"),
    ("overlay_events_matched", "Events matched by a channel of this node.", "events_matched"),
    ("overlay_events_notified", "(event, subscription) matches sent towards subscribers' access nodes.", "notifications_out"),
    ("overlay_notifies_sent", "Notify frames queued for this node's clients.", "notifies_out"),
    ("overlay_events_rerouted", "Dispatched events re-routed by the current routing table (SPEC §4).", "events_rerouted"),
    ("overlay_subscriptions_in", "Subscriptions received from clients.", "subscriptions_in"),
    ("overlay_subscriptions_rerouted", "Dispatched (un)subscriptions re-routed (SPEC §4).", "subscriptions_rerouted"),
    ("overlay_client_acks", "Acks of notifications from clients.", "client_acks"),
    ("overlay_liems_in", "LIEMs received (SPEC §6).", "liems_in"),
    ("overlay_migrations", "Channel migrations this node completed as the sender (SPEC §8).", "migrations"),
    ("overlay_replications", "Channel replications this node completed as the sender (SPEC §8.3).", "replications"),
    ("overlay_migrations_aborted", "Migration sessions aborted or refused (SPEC §8.2).", "migrations_aborted"),
    ("overlay_splits", "Channel splits on this node (SPEC §8.3).", "splits"),
    ("overlay_merges", "Channel merges on this node (SPEC §8.4).", "merges"),
    ("overlay_migration_bytes", "Bytes of subscriptions moved by migrations and replications.", "migration_bytes"),
    ("overlay_subscriptions_moved", "Subscriptions moved by migrations and replications.", "subscriptions_moved"),
    ("overlay_chokes", "Publishes answered with Choke (SPEC §12).", "chokes"),
    ("overlay_peer_queue_overflow", "Peer frames queued past a full link queue (backpressure, not dropped).", "peer_queue_overflow"),
    # Ordered delivery (SPEC §10, overlay.node_ordering) and groups (SPEC §11, overlay.node_groups).
    ("overlay_ordered_released", "Keyed events released by this node's sequencer (it is their key's home).", "ordered_released"),
    ("overlay_ordered_completed", "Released keyed events delivered everywhere they matched.", "ordered_completed"),
    ("overlay_seq_gaps_skipped", "Missing ranks given up on by expiry (policy skip), per gap.", "seq_gaps_skipped"),
    ("overlay_seq_expired_dropped", "Held keyed events dropped by expiry (policy drop).", "seq_expired_dropped"),
    ("overlay_seq_processing_timeouts", "Released keyed events whose acks never all came (the key moved on).", "seq_processing_timeouts"),
    ("overlay_group_dispatched", "Events dispatched to one instance of a subscriber group.", "group_dispatched"),
    ("overlay_group_redispatched", "Group events moved to another instance after a failed delivery.", "group_redispatched"),
    ("overlay_group_throttled", "Low-priority group events dropped: every instance above the throttle LF.", "group_throttled"),
    ("overlay_group_undeliverable", "Group events no instance could take (the publisher is told).", "group_undeliverable"),
    ("overlay_delivery_ack_timeouts", "Tracked notifications whose client did not ack within ack_timeout.", "delivery_ack_timeouts"),
)
_DROPS: Final = (
    ("slow_consumer", "slow_consumer_drops"),
    ("orphaned_notification", "notifications_orphaned"),
    ("unroutable_event", "events_unroutable"),
    ("unroutable_subscription", "subscriptions_unroutable"),
)
_REJECTED_PREFIX: Final = "rejected_"


class NodeCollector:
    """Reads one node's core and shell at scrape time (module rule 6)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def describe(self) -> list[Metric]:
        return []  # families depend on the node's state; the registry is ours alone

    def collect(self) -> Iterator[Metric]:
        node, core = self.node, self.node.core
        stats = core.stats
        mon = core.monitor
        lab = ["node"]
        me = str(node.id)

        def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=lab)
            if value is not None:
                g.add_metric([me], value)
            return g

        yield gauge("overlay_ready", "1 when the node is ready (SPEC §3).", 1.0 if core.ready else 0.0)
        state = GaugeMetricFamily("overlay_state", "The node's balancing state, 1 for the current one (SPEC §5).", labels=["node", "state"])
        for s in type(mon.state):
            state.add_metric([me, s.value], 1.0 if s is mon.state else 0.0)
        yield state
        yield gauge("overlay_load_d", "Load d of the last slice: subscriptions tested (SPEC §5).", mon.d)
        yield gauge("overlay_load_dc", "Load level dc = d / c of the last slice (SPEC §5).", mon.dc)
        yield gauge("overlay_capacity", "Configured capacity c.", node.me.capacity)
        yield gauge("overlay_mean_dc", "Mean load level dc̄ as this node sees it (SPEC §5).", mon.mean)
        report = core.last_report
        spread = report.spread if report is not None else None
        yield gauge("overlay_spread", "Spread S of the load levels as this node sees it (SPEC §5).", spread)
        yield gauge(
            "overlay_spread_ratio", "S / dc̄ as this node sees it: what balancing lowers.",
            spread / mon.mean if spread is not None and mon.mean else None,
        )
        yield gauge("overlay_slice_seconds", "Current slice length T (anti-jitter may stretch it).", mon.slice_seconds)
        yield gauge("overlay_slice", "Slices this node has closed.", mon.slice_no)
        yield gauge("overlay_channels", "Channels in this node's localTable.", len(core.local))
        yield gauge("overlay_routing_channels", "Channels in this node's routingTable.", len(core.routing))
        yield gauge("overlay_subscriptions_stored", "Subscriptions stored in this node's channels.", sum(len(ch) for ch in core.local))
        yield gauge("overlay_client_sessions", "Client sessions open on this node.", len(core.sessions))
        peer_dc = GaugeMetricFamily("overlay_peer_dc", "Load level dc of a peer, from its last LIEM.", labels=["node", "peer"])
        for p in mon.live():
            peer_dc.add_metric([me, str(p.node)], p.dc)
        yield peer_dc

        depth = GaugeMetricFamily("overlay_link_queue_depth", "Frames waiting on the outbound link to a peer (SPEC §1.1).", labels=["node", "peer", "priority"])
        up = GaugeMetricFamily("overlay_link_connected", "1 while the outbound link to a peer is connected.", labels=["node", "peer"])
        for pid, link in sorted(node.links.items()):
            depth.add_metric([me, str(pid), "high"], len(link.queue.high))
            depth.add_metric([me, str(pid), "normal"], len(link.queue.normal))
            up.add_metric([me, str(pid)], 1.0 if link.connected.is_set() else 0.0)
        yield depth
        yield up
        inbox = GaugeMetricFamily("overlay_inbox_depth", "Inbound messages waiting for the dispatcher (SPEC §1.1).", labels=["node", "priority"])
        inbox.add_metric([me, "high"], len(node.inbox.high))
        inbox.add_metric([me, "normal"], len(node.inbox.normal))
        yield inbox
        writers = list(node.clients.values())
        cq = GaugeMetricFamily("overlay_client_queue_depth", "Frames waiting for this node's clients, summed over sessions.", labels=["node", "priority"])
        cq.add_metric([me, "high"], sum(len(w.queue.high) for w in writers))
        cq.add_metric([me, "normal"], sum(len(w.queue.normal) for w in writers))
        yield cq
        yield gauge("overlay_client_queue_max", "Frames waiting for the most backed-up client.", max((len(w.queue) for w in writers), default=0))

        known = set()
        for name, doc, key in _COUNTERS:
            known.add(key)
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric([me], stats.get(key, 0))
            yield c
        refw = CounterMetricFamily("overlay_reforwards", "Reforwarded messages (SPEC §8.2), out as the sender, in as the receiver.", labels=["node", "direction"])
        refw.add_metric([me, "out"], stats.get("reforwards", 0))
        refw.add_metric([me, "in"], stats.get("reforwards_in", 0))
        known.update(("reforwards", "reforwards_in"))
        yield refw
        rejected = CounterMetricFamily("overlay_rejected", "Inputs refused, by reason.", labels=["node", "reason"])
        for key in sorted(k for k in stats if k.startswith(_REJECTED_PREFIX)):
            rejected.add_metric([me, key[len(_REJECTED_PREFIX):]], stats[key])
            known.add(key)
        yield rejected
        drops = CounterMetricFamily("overlay_dropped", "Messages dropped, by reason (always counted, never silent).", labels=["node", "reason"])
        for reason, key in _DROPS:
            drops.add_metric([me, reason], stats.get(key, 0))
            known.add(key)
        yield drops
        # Every other counter of the core (sequencer, groups, journal records …)
        # under its own name, so a new counter is exported without a change here.
        other = CounterMetricFamily("overlay_node_events", "Every other counter of the node core, by name.", labels=["node", "name"])
        for key in sorted(k for k in stats if k not in known):
            other.add_metric([me, key], stats[key])
        yield other

        yield _histogram("overlay_tested_subscriptions", "Subscriptions tested per matched event (SPEC §5 event cost).", core.tested_hist, me)
        yield _histogram("overlay_publish_notify_latency_seconds", "Seconds from publish to the access node's Notify.", core.latency_hist, me)


def _histogram(name: str, doc: str, h: BucketCounts, node: str) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=["node"])
    fam.add_metric([node], [(floatToGoString(le), n) for le, n in h.cumulative()], h.sum)
    return fam
