"""``LoopbackCluster``: real ``overlay.net.node.Node``s on 127.0.0.1, in this process.

Rules this module keeps:

1. Every node's peer socket (and, with ``admin=True``, its admin socket) is
   bound before any node exists, and the cluster config is rewritten with the
   real ports: each node finds its peers (and their admin endpoints,
   ``overlay.net.admin`` rule 5) exactly as with fixed ports, and no other
   process can take a port in between.
2. Overrides are checked as ``load_config`` checks a file: an unknown setting
   or an out-of-bounds value is refused before any socket is bound.
3. The nodes run as tasks of the test's event loop; ``stop()`` (or leaving
   ``async with``) closes every client the cluster connected, stops every
   node, awaits each task (bounded) and closes every socket, and then fails
   if a node ended with an error — unless the test already failed.
4. A node's counters outlive it: ``stat`` and ``journal`` read stopped nodes too.
5. The nodes speak plain TCP, proving the test cluster's secret to each
   other, unless ``tls=True``: then TLS with development certificates
   (``_loopback`` rule 3), and every client, raw client and admin request
   of the cluster's own goes over TLS with the CA (``client_ssl``,
   ``url``).  ``tls=None`` keeps the config's own ``[tls]`` table.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Protocol, Self

import msgspec

from overlay.client import AgentClient, AgentSettings, Client
from overlay.config import AuthSettings, ClusterConfig, ClusterSettings, NodeConfig, load_config
from overlay.net.node import Node
from overlay.security import client_ssl
from overlay.testing._loopback import HOST, WAIT, bound_socket, dev_tls, insecure_tls, nodes_quiet, wait_until
from overlay.testing._raw_client import RawClient

__all__ = ["HARNESS_SUSPECT_TIMEOUT", "LOADED_SUSPECT_TIMEOUT", "LoopbackCluster", "override"]

# ``[cluster] suspect_timeout`` of a LoopbackCluster whose config keeps the default (see __init__).
SUSPECT_DEFAULT: Final = ClusterSettings().suspect_timeout
HARNESS_SUSPECT_TIMEOUT: Final = 4.0
# ``suspect_timeout`` for a test that loads its nodes hard and is not about
# failure detection (``LoopbackCluster(..., suspect_timeout=LOADED_SUSPECT_TIMEOUT)``).
# A node's heartbeats are read in turn with everything its peers sent before
# them, and a node reads no more while its inbox is full: an overloaded node
# on a busy machine answers a heartbeat as late as its backlog takes to
# drain — seconds (a 2-core machine with other work saw its echo come past
# the 2.7 s lease of HARNESS_SUSPECT_TIMEOUT, and every publish refused
# no_quorum).  30 s (a 20 s lease) is past any backlog a test makes.
LOADED_SUSPECT_TIMEOUT: Final = 30.0


class _Closable(Protocol):
    async def close(self) -> None: ...


def override(
    config: ClusterConfig,
    *,
    cluster: Mapping[str, Any] | None = None,
    sequencer: Mapping[str, Any] | None = None,
    groups: Mapping[str, Any] | None = None,
    bandwidth: Mapping[str, Any] | None = None,
    auth: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
) -> ClusterConfig:
    """``config`` with the given fields of its ``[cluster]``, ``[sequencer]``,
    ``[groups]``, ``[bandwidth]``, ``[auth]`` and ``[limits]`` tables replaced, the others
    kept; each table is checked again (rule 2: ``msgspec.ValidationError``
    names the field).  ``[auth]`` key paths are taken as they are (absolute)."""
    changes: dict[str, Any] = {}
    tables = (
        ("cluster", cluster),
        ("sequencer", sequencer),
        ("groups", groups),
        ("bandwidth", bandwidth),
        ("auth", auth),
        ("limits", limits),
    )
    for name, given in tables:
        if given:
            current = getattr(config, name)
            changes[name] = msgspec.convert(msgspec.to_builtins(current) | dict(given), type(current))
    return msgspec.structs.replace(config, **changes)


class LoopbackCluster:
    """Nodes of one config on loopback, as tasks of the running loop.

    ``LoopbackCluster(config, n, **cluster_settings)``: ``n`` nodes with ids
    ``0 … n-1`` (default: the config's own ids), each on its own ephemeral
    port (rule 1); ``config`` is a ``ClusterConfig`` or the path of a TOML
    file.  Options:

    * ``capacities`` — one per node (default: the config's capacity for that
      id, else 1.0).  With the ports, that is every ``NodeConfig`` field.
    * ``admin`` — bind every admin HTTP socket first, so the config lists the
      real admin ports (a node's peers find its endpoint: ``/cluster``,
      drain).  Without it a node still serves HTTP, on a port only it knows.
    * ``capture`` — a directory every node captures to (SPEC §13).
    * ``sequencer``, ``groups``, ``bandwidth``, ``auth``, ``limits`` and keyword
      arguments (the ``[cluster]`` table) — overrides of the config's tables
      (``override``).  Without ``auth`` the nodes check no token (the
      config's own ``[auth]`` is dropped unless ``keep_auth``): tests that
      are not about authentication connect as they always did.
    * ``placeholders`` — ids in the config with a bound, non-listening
      socket (``socks[i]``) and no node: a peer that is down, or that the test
      plays itself by listening on that socket.
    * ``sndbuf`` — the send buffer of every node's sockets.
    * ``tls`` — TLS between everyone (rule 5); default plain TCP with a secret.
    * ``autostart`` — ``async with`` starts every node and waits until the
      cluster is ready; off, the test calls ``start``/``start_node`` itself.

    Invariant: ``config`` lists every node of ``nodes`` and every placeholder,
    at its real port; ``nodes[i]`` is the latest ``Node`` run for id ``i``
    (``restart_node`` replaces it) and ``tasks[i]`` its task once started.
    """

    def __init__(
        self,
        config: ClusterConfig | str | os.PathLike[str],
        n: int | None = None,
        *,
        capacities: Sequence[float] | None = None,
        admin: bool = False,
        capture: str | os.PathLike[str] | None = None,
        sequencer: Mapping[str, Any] | None = None,
        groups: Mapping[str, Any] | None = None,
        bandwidth: Mapping[str, Any] | None = None,
        auth: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
        keep_auth: bool = False,
        placeholders: Iterable[int] = (),
        sndbuf: int | None = None,
        autostart: bool = True,
        tls: bool | None = False,
        **cluster: Any,
    ) -> None:
        base = config if isinstance(config, ClusterConfig) else load_config(Path(config))
        # The nodes share this process's event loop: a stall (a loaded machine)
        # silences every heartbeat at once, and a lapsed lease has every node
        # refuse with no_quorum (node.liveness rule 4) — CI on a busy host saw
        # it.  So the failure detector is slower here unless a test says
        # otherwise; tests of detection set their own timeouts.
        if "suspect_timeout" not in cluster and base.cluster.suspect_timeout == SUSPECT_DEFAULT:
            cluster["suspect_timeout"] = HARNESS_SUSPECT_TIMEOUT
        if capture is not None:
            cluster["capture_dir"] = os.fspath(capture)
        if not keep_auth and auth is None:
            base = msgspec.structs.replace(base, auth=AuthSettings())
        base = override(
            base, cluster=cluster, sequencer=sequencer, groups=groups, bandwidth=bandwidth, auth=auth, limits=limits
        )
        ids = list(range(n)) if n is not None else base.node_ids
        if capacities is not None and len(capacities) != len(ids):
            raise ValueError(f"{len(capacities)} capacities for {len(ids)} nodes")
        fake = set(placeholders)
        self.autostart = autostart
        self._admin = admin
        self._sndbuf = sndbuf
        self.socks: dict[int, socket.socket] = {}
        self.admin_socks: dict[int, socket.socket] = {}
        self.ports: dict[int, int] = {}  # every node's and placeholder's peer port
        nodes = []
        try:
            for k, i in enumerate(ids):
                self.socks[i] = bound_socket(listen=i not in fake, sndbuf=sndbuf)
                self.ports[i] = self._port(self.socks[i])
                if admin and i not in fake:
                    self.admin_socks[i] = bound_socket()
                known = next((c.capacity for c in base.nodes if c.id == i), 1.0)
                capacity = capacities[k] if capacities is not None else known
                nodes.append(NodeConfig(i, HOST, self.ports[i], self._port(self.admin_socks.get(i)), capacity))
        except BaseException:
            self._close_sockets()
            raise
        self._dev_tls = bool(tls)
        if tls is not None:  # rule 5
            base = msgspec.structs.replace(base, tls=dev_tls(ids) if tls else insecure_tls())
        self.config: ClusterConfig = base.with_nodes(tuple(nodes))
        try:
            self.client_ssl: ssl.SSLContext | None = client_ssl(self.config)
            self.nodes: dict[int, Node] = {
                i: Node(self.config, i, sock=self.socks[i], admin_sock=self.admin_socks.get(i))
                for i in ids
                if i not in fake
            }
        except BaseException:  # e.g. an [auth] key or a certificate that cannot be read: no socket left open
            self._close_sockets()
            raise
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.clients: list[_Closable] = []

    @staticmethod
    def _port(sock: socket.socket | None) -> int:
        return 0 if sock is None else int(sock.getsockname()[1])

    # -- where things are -------------------------------------------------------------

    @property
    def ids(self) -> list[int]:
        """The ids of the nodes (not the placeholders), in order."""
        return list(self.nodes)

    @property
    def running(self) -> list[int]:
        """The nodes started and not ended."""
        return [i for i, t in self.tasks.items() if not t.done()]

    def addr(self, node: int) -> tuple[str, int]:
        return (HOST, self.ports[node])

    def url(self, node: int = 0) -> str:
        """The node's admin HTTP endpoint (once it has started): https with TLS (rule 5)."""
        return f"{self.nodes[node].security.scheme}://{HOST}:{self.nodes[node].admin_port}"

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self.autostart:
            await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop(check=kind is None)

    async def start(self, nodes: Iterable[int] | None = None, *, ready: bool = True, timeout: float = WAIT) -> Self:
        """Start ``nodes`` (default: every node) and wait until each listens;
        with ``ready``, until every running node holds the routing table and
        every link between running nodes is up.  On a failure, stop everything."""
        try:
            for i in self.ids if nodes is None else nodes:
                await self.start_node(i, timeout=timeout)
            if ready:
                await self.wait_ready(timeout)
        except BaseException:
            await self.stop(check=False)
            raise
        return self

    async def start_node(self, node: int, *, timeout: float = WAIT) -> Node:
        """Run node ``node`` (not running yet) and wait until it listens."""
        if node in self.tasks:
            raise ValueError(f"node {node} was started already: restart_node() runs it again")
        n = self.nodes[node]
        self.tasks[node] = asyncio.create_task(n.run(), name=f"node-{node}")
        await asyncio.wait_for(n.started.wait(), timeout)
        return n

    async def wait_ready(self, timeout: float = WAIT) -> None:
        up = set(self.running)

        def ready() -> bool:
            return all(
                self.nodes[i].core.ready
                and all(link.connected.is_set() for p, link in self.nodes[i].links.items() if p in up)
                for i in up
            )

        await wait_until(ready, timeout, f"nodes {sorted(up)} ready, their links up")

    async def stop_node(self, node: int, timeout: float = WAIT) -> None:
        """Stop ``node`` in order (it flushes its queues) and wait until it has."""
        self.nodes[node].stop()
        await asyncio.wait_for(self.tasks[node], timeout)

    async def crash_node(self, node: int, timeout: float = WAIT) -> None:
        """End ``node`` as a crash would, as far as one process can: its task
        is cancelled, nothing queued is flushed."""
        task = self.tasks[node]
        task.cancel()
        await asyncio.wait({task}, timeout=timeout)

    async def restart_node(self, node: int, *, timeout: float = WAIT) -> Node:
        """A new run of stopped ``node`` (a new ``Node``, so a new incarnation)
        on its old ports, started; it joins the running cluster."""
        old = self.nodes[node]
        if not self.tasks[node].done():
            raise ValueError(f"node {node} is still running: stop or crash it first")
        self.socks[node].close()  # closed already with its server: a new one takes the port
        self.socks[node] = bound_socket(self.ports[node], sndbuf=self._sndbuf)
        if node in self.admin_socks:
            self.admin_socks[node].close()
            self.admin_socks[node] = bound_socket(old.me.admin_port)
        self.nodes[node] = Node(old.config, node, sock=self.socks[node], admin_sock=self.admin_socks.get(node))
        del self.tasks[node]
        return await self.start_node(node, timeout=timeout)

    async def join(self, node: int | None = None, *, capacity: float = 1.0, timeout: float = WAIT) -> Node:
        """A new node (id ``node``, default the next free one) whose config
        lists the cluster's nodes and itself — theirs does not list it — and
        started: it says hello and joins (``overlay.node.membership``; the
        others open their link to it with ``Node.add_peer``)."""
        new_id = max([*self.socks, -1]) + 1 if node is None else node
        if new_id in self.socks:
            raise ValueError(f"node {new_id} is in the cluster already")
        self.socks[new_id] = bound_socket(sndbuf=self._sndbuf)
        self.ports[new_id] = self._port(self.socks[new_id])
        if self._admin:
            self.admin_socks[new_id] = bound_socket()
        me = NodeConfig(new_id, HOST, self.ports[new_id], self._port(self.admin_socks.get(new_id)), capacity)
        config = self.config.with_nodes((*self.config.nodes, me))
        if self._dev_tls:  # its certificate, from the same CA (rule 5)
            config = msgspec.structs.replace(config, tls=dev_tls([*self.socks]))
        self.nodes[new_id] = Node(config, new_id, sock=self.socks[new_id], admin_sock=self.admin_socks.get(new_id))
        return await self.start_node(new_id, timeout=timeout)

    async def stop(self, *, check: bool = True, timeout: float = 15.0) -> None:
        """Rule 3."""
        for c in self.clients:
            # A client of a stopped node may fail to close, or hang closing (a test
            # cancelled by its timeout mid-request): it is gone anyway.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), timeout)
        self.clients.clear()
        for i in self.running:
            self.nodes[i].stop()
        tasks = list(self.tasks.values())
        try:
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout)
        finally:
            self._close_sockets()
        if check:
            failed = {t.get_name(): t.exception() for t in tasks if not t.cancelled() and t.exception() is not None}
            assert not failed, f"nodes ended with an error: {failed}"

    def _close_sockets(self) -> None:
        for s in (*self.socks.values(), *self.admin_socks.values()):
            s.close()

    # -- clients ----------------------------------------------------------------------

    async def client(
        self, *nodes: int, client_id: str | None = None, reconnect: bool = False, **options: Any
    ) -> Client:
        """A connected ``Client`` of these nodes (its addresses in this order),
        closed by ``stop``.  It does not reconnect unless asked: a client whose
        node went away fails, instead of calling that node again and again."""
        options.setdefault("ssl", self.client_ssl)
        c = Client([self.addr(i) for i in nodes], client_id=client_id, reconnect=reconnect, **options)
        self.clients.append(c)
        return await c.connect()

    async def agent(self, *nodes: int, **settings: Any) -> AgentClient:
        """A connected ``AgentClient`` of these nodes, once it is connected to
        every one; ``settings`` are ``AgentSettings`` fields."""
        a = AgentClient(
            [self.addr(i) for i in nodes], settings=msgspec.convert(settings, AgentSettings), ssl=self.client_ssl
        )
        self.clients.append(a)
        await a.connect()
        await wait_until(lambda: len(a.connected) == len(nodes), WAIT, "agent connected everywhere")
        return a

    async def raw(self, node: int, **options: Any) -> RawClient:
        """A ``RawClient`` of ``node`` (the client protocol spoken directly)."""
        options.setdefault("ssl", self.client_ssl)
        c = RawClient(self.addr(node), **options)
        self.clients.append(c)
        return await c.connect()

    async def admin(self, node: int, command: str, /, **args: Any) -> Any:
        """An admin command through ``node`` (client protocol); its result."""
        async with Client([self.addr(node)], reconnect=False, ssl=self.client_ssl) as c:
            return await c.admin(command, **args)

    # -- what the nodes did -----------------------------------------------------------

    def stat(self, key: str) -> int:
        """A counter summed over every node (rule 4)."""
        return sum(int(n.core.stats.get(key, 0)) for n in self.nodes.values())

    def journal(self, kind: str, nodes: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """The journal entries of one kind of these nodes (default all), by time."""
        out = [
            e for i in (self.ids if nodes is None else nodes) for e in self.nodes[i].core.journal if e["kind"] == kind
        ]
        return sorted(out, key=lambda e: e["time"])

    def quiet(self, nodes: Collection[int] | None = None) -> bool:
        """``nodes_quiet`` for these nodes (default all), links among them only."""
        ids = self.ids if nodes is None else nodes
        return nodes_quiet((self.nodes[i] for i in ids), peers=ids)

    def settled(self, nodes: Collection[int] | None = None) -> bool:
        """``quiet``, and these nodes hold one routing table."""
        ids = list(self.ids if nodes is None else nodes)
        first = self.nodes[ids[0]].core.routing
        return self.quiet(ids) and all(self.nodes[i].core.routing == first for i in ids)

    async def wait_settled(
        self,
        nodes: Collection[int] | None = None,
        *,
        progress: Callable[[], object] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Wait until these nodes are ``settled`` and ``progress()`` (e.g. the
        notifications received so far) stopped changing between two polls
        0.1 s apart: every notification sent is in."""
        last: object = None

        def done() -> bool:
            nonlocal last
            if not self.settled(nodes):
                last = None
                return False
            if progress is None:
                return True
            seen, last = last, progress()
            return seen == last

        await wait_until(done, timeout, "the nodes settled, deliveries stopped", step=0.1)
