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
from collections.abc import Awaitable, Callable, Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from overlay.channels.space import ExceptConstraint, RangeConstraint, SetConstraint
from overlay.config import ClusterConfig

if TYPE_CHECKING:
    from overlay.net.node import Node

__all__ = ["TOKEN_ENV", "AdminServer", "NodeCollector"]

from overlay.net.metrics import NodeCollector

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
    "events_in",
    "events_matched",
    "notifications_out",
    "notifies_out",
    "migrations",
    "replications",
    "splits",
    "merges",
    "migrations_aborted",
    "reforwards",
    "subscriptions_moved",
    "migration_bytes",
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_encoder = msgspec.json.Encoder(enc_hook=str)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(data), status=status, content_type="application/json")


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    return json_response({"error": message, "status": status, **extra}, status)


def effective_admin_token(config: ClusterConfig) -> str:
    """The node's admin token: ``OVERLAY_ADMIN_TOKEN`` wins over ``[cluster] admin_token``."""
    return os.environ.get(TOKEN_ENV) or config.cluster.admin_token


class AdminServer:
    """The admin endpoint of one ``Node`` (module rules 1–5).

    Invariant: ``port`` is the bound port once ``bind`` returned; the runner
    exists only while ``run`` does.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self.core = node.core
        self.token = node.core.admin_token  # one token for HTTP and the client protocol
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
            if core.is_initializer:
                missing = sorted(set(core.peers) - set(core.startup.state.heard))
                return (
                    False,
                    f"waiting to hear from nodes {missing} whether the cluster runs already (node.boot rule 2)",
                )
            return (
                False,
                "waiting for the routing table from a node that holds it (the initializer, or any node once the cluster runs)",
            )
        if not core.ready:
            return False, f"waiting for ReplyRoutingTableInit from nodes {core.startup.waiting_for()}"
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
                str(p): {
                    "connected": l.connected.is_set(),
                    "high": len(l.queue.high),
                    "normal": len(l.queue.normal),
                    "connects": l.connects,
                }
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
                {
                    "name": n,
                    "kind": schema.attributes[n].kind.value,
                    "min": schema.attributes[n].min,
                    "max": schema.attributes[n].max,
                }
                for n in schema.da
            ],
            "channels": [
                {
                    "id": str(c),
                    "owners": list(e.owners),
                    "space": e.space.text(schema),
                    "constraints": [_constraint(x) for x in e.space.constraints],
                }
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
        return web.Response(
            body=f.read_bytes(), content_type=kind, charset="utf-8" if kind != "image/svg+xml" else None
        )

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
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError) as exc:
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
                    {
                        "node": i,
                        "reachable": False,
                        "why": errors.get(i, ""),
                        "admin": self.admin_url(i),
                        "state": p.state.value if p else "UNKNOWN",
                        "d": p.d if p else None,
                        "dc": p.dc if p else None,
                        "capacity": p.capacity if p else None,
                        "channels": [],
                        "stats": {},
                    }
                )
                continue
            for ch in st.get("channels", ()):
                loads[ch["id"]] = {
                    "load": ch.get("load", 0),
                    "last_load": ch.get("last_load", 0),
                    "subscriptions": ch.get("subscriptions", 0),
                }
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
            if (
                e["kind"] == "slice"
                and e["time"] >= cutoff
                and e.get("mean") is not None
                and e.get("spread") is not None
            ):
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
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
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
                except TimeoutError:
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
        "draining": bool(st.get("draining")),  # node.membership: shown as a badge on the page
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
