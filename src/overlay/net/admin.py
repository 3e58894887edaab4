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
4. Auth: every method but GET/HEAD needs ``Authorization: Bearer <token>``:
   with ``[auth]``, a signed token (``overlay.auth``) with the ``admin``
   role — 401 when missing, bad or expired, 403 without the role; without
   it, the legacy shared token when one is configured (``[cluster]
   admin_token``, or the ``OVERLAY_ADMIN_TOKEN`` environment variable, which
   wins so a token need not sit in a config file).  Neither: no auth.
5. The whole-cluster view (``/cluster``, ``/events`` and the page at ``/``)
   is this node's status plus each other node's, fetched over HTTP and
   cached for a moment (``overlay.net.cluster_view``, whose rules say why
   and how a node that does not answer is shown).
6. The metrics are collected at scrape time by ``NodeCollector`` into a
   registry of this node's own, so nodes sharing a process (tests) never mix.
7. It sees its node as a ``NodeView`` (``overlay.net.view``), reads the
   core through its public surface only, and never imports ``net.node``.
8. It speaks HTTPS with the node's certificate unless the cluster is
   insecure (``overlay.security.tls`` rule 1: no client certificate is
   asked, so a browser can open the page); ``/status`` says which
   (``security``) and warns when it is plain (the page shows the warning).
9. Bounded (SPEC §16, ``[limits]``), whatever aiohttp's own defaults:
   a. a connection with no request being handled — idle between requests,
      or a request whose head is still arriving — for
      ``http_idle_timeout`` seconds is closed (a watchdog looks every
      ``WATCH_SECONDS``; aiohttp's ``keepalive_timeout``, a little longer,
      backs it up);
   b. a request's body must arrive within ``http_body_timeout`` (408, the
      connection closed) and be at most ``http_max_body`` bytes (413); it
      is read only once the request passed rule 4;
   c. past ``http_max_connections`` open connections the longest idle are
      closed (at the next watch, or at once when a request needs room); a
      request that finds every connection busy is answered 503 and its
      connection closed;
   d. a request line or header field is at most ``MAX_LINE`` bytes, and a
      request has at most ``MAX_HEADERS`` fields (400 past them);
   e. over HTTPS, a connection's TLS handshake must end within
      ``hello_timeout`` (asyncio's default is 60 s), or it is closed.
   Every closing is counted (``http_timeouts``, ``http_refused``).
10. A request aiohttp cannot parse (not HTTP, a bad header, a line past
    ``MAX_LINE``) is answered 400 by aiohttp, counted (``http_bad_requests``)
    and logged in one INFO line: anyone can send such bytes, and a traceback
    of aiohttp's parser for each said nothing an operator could act on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from importlib import resources
from typing import Any, Final

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from overlay.auth.tokens import Role, Verifier
from overlay.channels.space import ExceptConstraint, RangeConstraint, SetConstraint
from overlay.config import ClusterConfig
from overlay.errors import ConfigError, TokenError
from overlay.net.admin_http import BoundedSite, HttpLog
from overlay.net.cluster_view import ClusterView, slice_history
from overlay.net.metrics import NodeCollector
from overlay.net.view import NodeView
from overlay.node.journal import latest
from overlay.security import NodeSecurity, RefusalLog

__all__ = [
    "INSECURE_WARNING",
    "TOKEN_ENV",
    "AdminServer",
    "NodeCollector",
    "effective_admin_token",
    "json_error",
    "json_response",
    "security_status",
]

log = logging.getLogger("overlay.admin")

TOKEN_ENV: Final = "OVERLAY_ADMIN_TOKEN"
# Server-sent events: one cluster snapshot per interval (the query may ask
# for another within these bounds), and the browser's reconnect delay.
PUSH_SECONDS: Final = 1.0
PUSH_BOUNDS: Final = (0.1, 10.0)
SSE_RETRY_MS: Final = 2000
BALANCING_DEFAULT: Final = 50
# Let open requests finish this long when the node stops.
SHUTDOWN_SECONDS: Final = 2.0
# Rule 9: the watchdog's period (at most; a quarter of the idle timeout when
# shorter), and the bounds of a request's head (aiohttp's defaults, stated).
WATCH_SECONDS: Final = 1.0
MAX_LINE: Final = 8190
MAX_HEADERS: Final = 128
# Journal kinds that are balancing decisions or moves (``/balancing``'s default).
MOVES: Final = ("decision", "split", "merge", "migration", "replication", "replicate", "abort", "state")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_encoder = msgspec.json.Encoder(enc_hook=str)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(data), status=status, content_type="application/json")


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    return json_response({"error": message, "status": status, **extra}, status)


def effective_admin_token(config: ClusterConfig) -> str:
    """The node's legacy admin token: ``OVERLAY_ADMIN_TOKEN`` wins over
    ``[cluster] admin_token``.  With ``[auth]`` there is none (one rule:
    admin rights come from tokens), and the variable set is an error."""
    if config.auth.enabled:
        if os.environ.get(TOKEN_ENV):
            raise ConfigError(
                f"{TOKEN_ENV} is set, but {config.path or 'the config'} has [auth]: admin rights come from a token "
                f"with the admin role; unset {TOKEN_ENV}"
            )
        return ""
    return os.environ.get(TOKEN_ENV) or config.cluster.admin_token


class AdminServer:
    """The admin endpoint of one ``Node`` (module rules 1–5).

    Invariant: ``port`` is the bound port once ``bind`` returned; the runner
    exists only while ``run`` does.
    """

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.core = node.core
        self.token = node.core.admin_token  # one token for HTTP and the client protocol
        self._refusals = RefusalLog()  # rule 4: a refused request is a stranger's as often as not
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(node))
        self.limits = limits = node.config.limits
        self.app = web.Application(
            middlewares=[self._errors, self._guard, self._auth, self._body], client_max_size=limits.http_max_body
        )
        # Rule 9: requests being handled per connection, and since when each idle one is idle.
        self._busy: dict[web.RequestHandler, int] = {}
        self._idle_since: dict[web.RequestHandler, float] = {}
        self._server: web.Server | None = None
        self._watch_period = min(WATCH_SECONDS, limits.http_idle_timeout / 4)
        self._add_routes()
        self._sock: socket.socket | None = None
        self.port = 0
        self._closing = asyncio.Event()
        self.view = ClusterView(node, self)  # rule 5
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
        runner = web.AppRunner(
            self.app,
            access_log=None,
            logger=HttpLog(self.node.id, self.core.stats),  # rule 10
            shutdown_timeout=SHUTDOWN_SECONDS,
            keepalive_timeout=self.limits.http_idle_timeout + 2 * self._watch_period,  # ours acts first
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            max_headers=MAX_HEADERS,
        )
        await runner.setup()
        try:
            security = self.node.security
            site = BoundedSite(runner, self._sock, ssl_context=security.admin, handshake=self.limits.hello_timeout)
            await site.start()
            self._server = runner.server
            self.view.open()
            log.info(
                "node %d: admin endpoint on %s://%s:%d/", self.node.id, security.scheme, self.node.me.host, self.port
            )
            await self._watch()  # forever: the TaskGroup cancels us
        finally:
            self._closing.set()  # event streams end at their next wake-up
            await runner.cleanup()
            await self.view.close()
            self._sock.close()

    def add_action(self, path: str, handler: Handler, method: str = "POST") -> None:
        """Register a route that changes the cluster: token-checked (rule 4).
        Call it before the node runs: aiohttp freezes the routes at start."""
        self.app.router.add_route(method, path, handler)

    # -- bounds (rule 9) ----------------------------------------------------------------

    async def _watch(self) -> None:
        """Rule 9a and 9c, every ``WATCH_SECONDS``, until cancelled."""
        while True:
            await asyncio.sleep(self._watch_period)
            self.watch(time.monotonic())

    def watch(self, now: float) -> None:
        """Rule 9a, 9c: close the connections idle too long, and the longest
        idle past the connection limit."""
        server = self._server
        if server is None:
            return
        live = server.connections
        idle_since = self._idle_since
        alive = set(live)
        for gone in [h for h in idle_since if h not in alive]:
            del idle_since[gone]
        limit = self.limits.http_idle_timeout
        for h in live:
            if not self._busy.get(h) and now - idle_since.setdefault(h, now) >= limit:
                self.core.stats["http_timeouts"] += 1
                self._close(h)
        self._make_room(now)

    def _make_room(self, now: float, keep: web.RequestHandler | None = None) -> bool:
        """Rule 9c: close the longest idle connections (never ``keep``) until at
        most ``http_max_connections`` are open; whether there is room."""
        server = self._server
        if server is None:
            return True
        live = [h for h in server.connections if h.transport is not None]  # closed ones are on their way out
        excess = len(live) - self.limits.http_max_connections
        if excess <= 0:
            return True
        idle = sorted(
            (self._idle_since.setdefault(h, now), id(h), h) for h in live if h is not keep and not self._busy.get(h)
        )
        for _, _, h in idle[:excess]:
            self.core.stats["http_refused"] += 1
            self._close(h)
        return len(idle) >= excess

    def _close(self, h: web.RequestHandler) -> None:
        self._idle_since.pop(h, None)
        h.force_close()

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Rule 9a, 9c: the connection is busy while its request is handled;
        past the connection limit the longest idle make room, or it is refused."""
        conn = request.protocol
        if not self._make_room(time.monotonic(), keep=conn):
            self.core.stats["http_refused"] += 1
            cap = self.limits.http_max_connections
            resp = json_error(503, f"too many connections to this endpoint ([limits] http_max_connections = {cap})")
            resp.force_close()
            return resp
        self._busy[conn] = self._busy.get(conn, 0) + 1
        try:
            return await handler(request)
        finally:
            n = self._busy.pop(conn, 1) - 1
            if n:
                self._busy[conn] = n
            self._idle_since[conn] = time.monotonic()

    @web.middleware
    async def _body(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Rule 9b: the whole body, in time and within its bound, before the handler."""
        if request.can_read_body:
            try:
                async with asyncio.timeout(self.limits.http_body_timeout):
                    await request.read()  # cached: the handler's json() reads it from memory
            except TimeoutError:
                self.core.stats["http_timeouts"] += 1
                resp = json_error(408, f"the request's body took longer than {self.limits.http_body_timeout:g}s")
                resp.force_close()
                return resp
        return await handler(request)

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
        if request.method in ("GET", "HEAD"):
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        given = given.strip() if scheme.lower() == "bearer" else ""
        verifier = self.core.verifier
        if verifier is not None:
            refused = self._token_refusal(verifier, given, request)
            if refused is not None:
                return refused
        elif self.token and not hmac.compare_digest(given.encode(), self.token.encode()):
            return json_error(401, "this endpoint changes the cluster: send Authorization: Bearer <admin token>")
        return await handler(request)

    def _token_refusal(self, verifier: Verifier, token: str, request: web.Request) -> web.Response | None:
        """Rule 4 with ``[auth]``: a valid token with the admin role, as on the
        client protocol (``node.admin``); 401 without one, 403 without the role.
        Counted with the client protocol's refusals, logged within the bound
        of ``security.refusals.RefusalLog`` (HTTP has no session to log once
        per, and anyone may send such requests as fast as it likes)."""
        stats = self.core.stats
        what = f"{request.method} {request.path}"
        try:
            rights = verifier.verify(token, time.time())
        except TokenError as exc:
            stats["rejected_unauthorized"] += 1
            now = time.monotonic()
            self._refusals.warn(
                log, "unauthorized", now, "node %d: admin request %s refused: %s", self.node.id, what, exc
            )
            hint = "send Authorization: Bearer <token with the admin role>"
            return json_error(401, f"{exc} ({hint})" if token else f"{what} changes the cluster: {hint}")
        if Role.ADMIN not in rights.roles:
            stats["rejected_forbidden"] += 1
            text = "node %d: admin request %s refused: %s has no admin role"
            self._refusals.warn(log, "forbidden", time.monotonic(), text, self.node.id, what, rights.describe())
            return json_error(
                403, f"{what} changes the cluster and needs a token with the admin role; yours has {rights.describe()}"
            )
        return None

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
        if node.stopping:
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
                "links_up": sorted(p for p, link in links.items() if link.connected.is_set()),
                "links_down": sorted(p for p, link in links.items() if not link.connected.is_set()),
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
            security=security_status(node.security),
            spread_ratio=spread / mean if spread is not None and mean else None,
            delta=core.config.cluster.delta,
            subscriptions=sum(len(ch) for ch in core.local),
            links={
                str(p): {
                    "connected": link.connected.is_set(),
                    "high": len(link.queue.high),
                    "normal": len(link.queue.normal),
                    "connects": link.connects,
                }
                for p, link in sorted(node.links.items())
            },
            inbox={"high": len(node.inbox.high), "normal": len(node.inbox.normal)},
            clients={
                "connections": len(writers),
                "high": sum(len(w.queue.high) for w in writers),
                "normal": sum(len(w.queue.normal) for w in writers),
                "max": max((len(w.queue) for w in writers), default=0),
                # The queue budget and the slow-consumer policy (net.clients rule 7).
                "queued_bytes": sum(w.account.bytes for w in writers),
                "max_queued_bytes": max((w.account.bytes for w in writers), default=0),
                "queue_budget": self.limits.queue_budget,
                "slow_consumer_disconnects": core.stats.get("slow_consumer_disconnects", 0),
            },
            limits=msgspec.to_builtins(self.limits),
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
        first by time (``overlay.node.journal.latest``)."""
        return latest(self.core.journal, n, kinds, since, idle)

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

    def history(self) -> list[tuple[float, float]]:
        """``(time, S/dc̄)`` per slice of this node in the last ten minutes (the page's chart)."""
        return slice_history(self.core.journal)

    async def _cluster(self, request: web.Request) -> web.Response:
        return json_response(await self.view.get())

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: a ``cluster`` event with the whole view per interval."""
        try:
            interval = float(request.query.get("interval", PUSH_SECONDS))
        except ValueError:
            interval = math.nan
        if not math.isfinite(interval):  # NaN passes min/max and fails the loop's timer after the first event
            return json_error(400, "interval must be a finite number of seconds")
        interval = min(max(interval, PUSH_BOUNDS[0]), PUSH_BOUNDS[1])
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await resp.prepare(request)
        try:
            await resp.write(f"retry: {SSE_RETRY_MS}\n\n".encode())
            n = 0
            while not self._closing.is_set():
                view = await self.view.get()
                n += 1
                await resp.write(b"id: %d\nevent: cluster\ndata: " % n + _encoder.encode(view) + b"\n\n")
                with contextlib.suppress(TimeoutError):  # the interval is over: the next snapshot
                    await asyncio.wait_for(self._closing.wait(), interval)
        except ConnectionResetError:
            pass  # the page went away
        return resp


# What /status and the page say of a node that runs without TLS (rule 8).
INSECURE_WARNING: Final = (
    "[tls] insecure = true: plain TCP, nothing encrypted; peers prove the cluster secret, clients nothing. "
    "For a network you trust only."
)


def security_status(security: NodeSecurity) -> dict[str, Any]:
    """Rule 8, for ``/status``."""
    if security.insecure:
        return {"tls": False, "peers": "cluster secret", "warning": INSECURE_WARNING}
    verify = "required" if security.verify_clients else "optional"
    return {"tls": True, "peers": "mutual TLS", "client_certificates": verify, "warning": ""}


def _constraint(c: Any) -> dict[str, Any]:
    if isinstance(c, RangeConstraint):
        iv = c.interval
        return {"attr": c.attr, "kind": "range", "lo": iv.lo, "hi": iv.hi, "lo_open": iv.lo_open, "hi_open": iv.hi_open}
    if isinstance(c, SetConstraint):
        return {"attr": c.attr, "kind": "set", "values": sorted(c.values)}
    assert isinstance(c, ExceptConstraint)
    return {"attr": c.attr, "kind": "except", "excluded": sorted(c.excluded)}
