"""The whole-cluster view of the admin endpoint (``/cluster``, ``/events``, the page at ``/``; SPEC §14).

Rules (``overlay.net.admin`` rule 5):

1. The view is this node's status plus each other node's ``/status`` and
   ``/balancing``, fetched over HTTP from the admin address in the config,
   at most once per ``VIEW_TTL`` however many pages watch.  Why HTTP and not
   LIEMs: a LIEM carries a node's state and load only, while the page shows
   every node's channels, queue depths, counters and decision journal, which
   only that node holds.
2. A node whose admin endpoint does not answer within ``PEER_FETCH_TIMEOUT``
   still appears, from its last LIEM (state, d, dc), marked unreachable: the
   page never stalls on one slow or dead node.
3. The node list is what the cluster reports — the config, this node's
   peers, the nodes it hears LIEMs from and the owners in its routing table
   — so a node that joins or drains shows up without a change here.
4. This node's own part comes from its admin endpoint (``LocalEndpoint``),
   not over HTTP; the HTTP client lives from ``open`` to ``close`` (the
   endpoint's run).
5. With TLS the other endpoints are ``https://`` and verified against the
   cluster CA (``NodeSecurity.http``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any, Final, Protocol

import aiohttp

from overlay.net.view import NodeView

__all__ = ["NODE_COUNTERS", "VIEW_TTL", "ClusterView", "LocalEndpoint", "connect_host", "slice_history"]

# The whole-cluster view is rebuilt at most this often, however many pages
# watch: each rebuild costs two HTTP requests per other node.
VIEW_TTL: Final = 0.5
# A peer's admin endpoint that has not answered within this is shown from
# its LIEM: the page must not stall on one slow or dead node.
PEER_FETCH_TIMEOUT: Final = 1.0
# Journal entries per node fetched for the page's feed, and kept in the feed.
FEED_PER_NODE: Final = 20
FEED_SIZE: Final = 40
# S/dc̄ history on the page: the slices of the last ten minutes.
HISTORY_SECONDS: Final = 600.0
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


class LocalEndpoint(Protocol):
    """What the view takes from this node's own admin endpoint (rule 4)."""

    @property
    def port(self) -> int: ...

    def node_status(self) -> dict[str, Any]: ...

    def routing(self) -> dict[str, Any]: ...

    def balancing(
        self, n: int, kinds: Iterable[str] = ..., since: float | None = None, idle: bool = True
    ) -> list[dict[str, Any]]: ...


class ClusterView:
    """Rules 1–4 for one node's admin endpoint.

    Invariant: ``_view`` is at most ``VIEW_TTL`` old when ``get`` returns it.
    """

    def __init__(self, node: NodeView, local: LocalEndpoint) -> None:
        self.node = node
        self.local = local
        self._http: aiohttp.ClientSession | None = None
        self._view: dict[str, Any] | None = None
        self._view_at = 0.0
        self._lock = asyncio.Lock()

    def open(self) -> None:
        ssl_context = self.node.security.http
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=PEER_FETCH_TIMEOUT),
            connector=aiohttp.TCPConnector(ssl=ssl_context if ssl_context is not None else True),
        )

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    def known_nodes(self) -> list[int]:
        """Rule 3: every node the cluster reports."""
        core = self.node.core
        ids = {self.node.id, *core.peers, *core.config.node_ids, *(p.node for p in core.monitor.live())}
        ids.update(owner for _, entry in core.routing.items() for owner in entry.owners)
        return sorted(ids)

    def admin_url(self, node_id: int) -> str | None:
        scheme = self.node.security.scheme  # rule 5
        if node_id == self.node.id:
            return f"{scheme}://{connect_host(self.node.me.host)}:{self.local.port}"
        cfg = next((n for n in self.node.config.nodes if n.id == node_id), None)
        if cfg is None or not cfg.admin_port:
            return None
        return f"{scheme}://{connect_host(cfg.host)}:{cfg.admin_port}"

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

    async def get(self) -> dict[str, Any]:
        """The whole cluster as the page shows it, rebuilt at most every ``VIEW_TTL`` (rule 1)."""
        async with self._lock:
            now = time.monotonic()
            if self._view is not None and now - self._view_at < VIEW_TTL:
                return self._view
            self._view = await self._build()
            self._view_at = time.monotonic()
            return self._view

    async def _build(self) -> dict[str, Any]:
        core = self.node.core
        local = self.local
        ids = self.known_nodes()
        others = [i for i in ids if i != self.node.id]
        fetched = await asyncio.gather(*(self._fetch(i) for i in others))
        statuses: dict[int, dict[str, Any] | None] = {self.node.id: local.node_status()}
        journals: dict[int, list[dict[str, Any]]] = {self.node.id: local.balancing(FEED_PER_NODE, idle=False)}
        errors: dict[int, str] = {}
        for i, (st, journal, err) in zip(others, fetched):
            statuses[i], journals[i] = st, journal
            if err:
                errors[i] = err
        liems = {p.node: p for p in core.monitor.live()}
        nodes: list[dict[str, Any]] = []
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
            nodes.append(node_summary(st, self.admin_url(i)))
        mine = statuses[self.node.id]
        assert mine is not None
        routing = local.routing()
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
            # net.admin rule 8: the page warns while any node runs without TLS.
            "insecure_nodes": [n["node"] for n in nodes if n.get("insecure")],
            "da": routing["da"],
            "placement": routing["channels"],
            "history": slice_history(core.journal),
            "feed": feed,
            "totals": {k: sum(n["stats"].get(k, 0) for n in nodes) for k in NODE_COUNTERS},
        }


def slice_history(journal: Iterable[dict[str, Any]]) -> list[tuple[float, float]]:
    """``(time, S/dc̄)`` per slice in the last ``HISTORY_SECONDS`` of a node's
    journal (0 while nothing is loaded: no spread to lower)."""
    cutoff = time.time() - HISTORY_SECONDS
    out: list[tuple[float, float]] = []
    for e in journal:
        if e["kind"] == "slice" and e["time"] >= cutoff and e.get("mean") is not None and e.get("spread") is not None:
            out.append((e["time"], e["spread"] / e["mean"] if e["mean"] > 0 else 0.0))
    return out


def node_summary(st: dict[str, Any], admin: str | None) -> dict[str, Any]:
    stats = st.get("stats", {})
    return {
        "node": st["node"],
        "reachable": True,
        "admin": admin,
        "ready": st.get("ready"),
        "health": st.get("health"),
        "state": st.get("state"),
        "draining": bool(st.get("draining")),  # node.membership: shown as a badge on the page
        "insecure": not st.get("security", {}).get("tls", True),  # net.admin rule 8: the page warns
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


def connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
