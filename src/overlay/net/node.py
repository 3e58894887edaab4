"""The asyncio shell of a node: sockets, queues and tasks around ``NodeCore``.

Rules this module keeps (SPEC §1.1, STYLE habits 6 and 7), with the module
that carries each out when it is not this one:

1. One ``asyncio.TaskGroup`` owns every task of the node: the listener's
   connection handlers and client writers, one outbound ``PeerLink`` per
   peer, the dispatcher, the indexer and the ticker.  ``stop()`` flushes and
   cancels it; nothing is fire-and-forget.  The admin HTTP endpoint
   (``overlay.net.admin``) is one more task of it, on its own port, bound
   before the node reports started.
2. A connection starts with a 4-byte preamble saying what it is: ``OVP1``
   for a peer link, ``OVC1`` for a client (``net.inbound`` serves both).  Each peer sends on its own
   outbound link (one per direction, FIFO; ``net.peer_link``) and only reads
   on inbound ones.
3. Inbound messages wait in one two-level queue of typed items
   (``net.inbox``); the single dispatcher (``net.dispatch``) takes
   high-priority ones first and hands each to the core, in batches, with a
   loop turn at least every ``DISPATCH_SLICE`` so replies go out during a
   burst.  A client's Publishes read while the inbox is empty are handed
   to the dispatcher at once instead (``net.dispatch`` rule 6: nothing is
   queued ahead of them), and so are a peer's messages (``net.dispatch``
   rule 7).  A peer's ``Batch`` frame goes in as its messages, one item
   each, in order (``net.peer_link`` rule 7).  Read loops block
   when it is full (TCP backpressure).  A publish that finds the normal level
   past ``choke_threshold`` is answered with Choke instead (SPEC §12).  A
   client's Ack of a notification only counts it: the read loop hands it to
   the core itself (``NodeCore.client_ack``) instead of queueing it
   (``net.clients``).
4. Each connection has one writer task, fed by bounded high/normal queues,
   writing batches with ``writelines`` then ``drain`` (``net.writer``).
5. A client's Notify that finds its queue full is dropped and counted as a
   slow-consumer drop, and the client is told once per burst; control replies
   are never dropped.  Dispatch never waits on a slow subscriber.  A dropped
   Notify the core tracks (a non-zero tag) is handed to
   ``NodeCore.notify_dropped`` once the actions being carried out are done,
   and what it returns is carried out too (``net.clients`` rule 3).  What is
   queued for clients is bounded by the node's queue budget, and a client
   that stops reading is disconnected after ``[limits] slow_consumer_grace``
   (``net.clients`` rule 7; the ticker looks for it).
6. Read loops sort their exceptions: protocol error → error reply and close;
   ``OSError`` → peer gone; cancellation → re-raise; anything else → log with
   the traceback and close that connection only (``net.inbound``,
   ``net.clients``).
7. One more task (``net.dispatch``) does the core's background work
   (``background_step``) with ``INDEX_PAUSE`` between steps: the split a migration session waits on, a
   bounded step at a time, and the subscriptions a split, merge or
   SubscriptionMove left unindexed, ``INDEX_STEP`` at a time (until then the
   channel tests them linearly, exactly).
8. Whatever holds the loop past ``slow_ms`` (one message's handling, a tick,
   an indexing step, a GC pass) is journalled as ``slow`` with what it was
   and for how long (``net.dispatch.SlowLog``): every event queued meanwhile
   waited that long.
9. A peer link opens with a hello each way: the caller's on connect, the
   callee's in answer, before anything queued goes out.  The answer carries
   the callee's incarnation; when it is not the one last seen, the peer
   restarted and what was queued for its previous run (table updates,
   notifications for its dead clients, session messages) is discarded, not
   replayed into the new run.  The same check runs when the peer's own hello
   reaches the dispatcher, whichever comes first.  The callee's side of the
   hello is ``net.inbound``'s.
10. While a link is down its queue keeps its bound: past it, frames are
    dropped and counted (``peer_frames_dropped``), logged once per outage.
    While it is up, a full queue is backpressure: the frame waits past the
    bound, counted (``peer_queue_overflow``).  A link down past the peer
    timeout is reported to the core once per outage (``peer_unreachable``).
11. No task dies of an unexpected error in a core call: the ticker, the
    indexer, the links and the drops of rule 5 log it with its traceback,
    count it (``shell_errors``) and go on.
12. ``execute`` carries out every kind of ``Action`` the core returns (those
    for client connections compiled, in ``net.clients`` rule 10); one it
    does not know is logged as an error and counted
    (``shell_unknown_actions``), never silently skipped.  ``AddPeer`` (a node
    joined) opens a link to the newcomer as a task of the TaskGroup and
    adopts the core's grown config, so the admin endpoint finds the
    newcomer's admin port.
13. What the HTTP side (``net.admin``, ``net.metrics``, ``net.membership``)
    may see of a node is ``net.view.NodeView``; ``Node`` is one, and those
    modules never import this one.
14. ``Rejoin`` (a majority declared this run dead while it was paused or cut
    off: its tables are stale) stops the node as ``stop()`` does, with
    ``rejoin_reason`` set; the runner (``overlay node``, the test harness)
    then starts a new run on the same ports, which joins empty.
15. Strangers (SPEC §16): both ports speak TLS unless the config says
    ``[tls] insecure = true`` (logged at WARNING at start, and shown on the
    admin page).  Connections are accepted and set up by ``net.listener``,
    and served by ``net.inbound``; a peer link is admitted by ``net.admission`` — a certificate or the secret
    naming the id its hello claims, this cluster, one live link per id —
    before anything of it reaches the inbox; every refusal is counted
    (``overlay.security.refusals``), logged at WARNING with the remote
    address — the first of each reason, then one per ``LOG_EVERY`` seconds
    saying how many were only counted (``RefusalLog``) —, answered with a
    PeerError and closed, and changes nothing.
16. A node in a process of its own (``freeze_gc``) keeps the cyclic GC's
    full passes short (``net.gc_freeze``): it freezes what exists once it
    has started, and again what survived a full pass that took
    ``FREEZE_AFTER`` of CPU or more, and passes over its young objects
    every ``YOUNG_THRESHOLD`` new ones; a run that ends unfreezes and puts
    the thresholds back.  Nodes sharing a
    process (tests) do none of this.
17. Client connections are bounded by the process's file descriptors too
    (``overlay.limits.descriptors``): ``overlay node`` raises its soft limit
    to the hard one at start, and a node whose limit is still below
    ``max_clients`` plus what peers, the admin endpoint and files need
    admits fewer clients, and says so at WARNING when it starts — else a
    stranger's connections (300 Hellos at a soft limit of 256) took every
    descriptor, and accept failed for peers and the admin endpoint too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, ParamSpec

import msgspec

from overlay.actions import Action, AddPeer, CloseClient, Notifies, Rejoin, ToClient, ToPeer
from overlay.auth.keys import verifier_for
from overlay.build import BUILD
from overlay.config import ClusterConfig, NodeConfig
from overlay.errors import PeerRefused
from overlay.limits.descriptors import client_cap, descriptor_limit, reserve_for
from overlay.net import membership
from overlay.net.admin import AdminServer, effective_admin_token
from overlay.net.admission import Admission
from overlay.net.capture_writer import CaptureWriter
from overlay.net.clients import CLIENT_MAGIC, ClientConnections
from overlay.net.dispatch import INDEX_PAUSE, INDEX_STEP, Dispatcher, SlowLog
from overlay.net.gc_freeze import YOUNG_THRESHOLD, FreezePolicy
from overlay.net.inbound import Inbound
from overlay.net.inbox import Inbox
from overlay.net.listener import Listener
from overlay.net.peer_link import PEER_MAGIC, PeerLink, Sent
from overlay.net.writer import ConnectionWriter
from overlay.node import NodeCore
from overlay.security import PEER_REFUSALS, TLS_REFUSALS, NodeSecurity, Refusal, RefusalLog, node_security, stats_key

__all__ = ["CLIENT_MAGIC", "INDEX_PAUSE", "INDEX_STEP", "PEER_MAGIC", "TICK_SECONDS", "Node", "new_incarnation"]

log = logging.getLogger("overlay.net")

P = ParamSpec("P")

TICK_SECONDS: Final = 0.05
# How long stop() lets what is queued (inbox, links, clients) go out, and how
# often it looks.
FLUSH_SECONDS: Final = 2.0
FLUSH_POLL: Final = 0.01

_last_incarnation = 0


def new_incarnation() -> int:
    """This run's incarnation (node.core rule 6): the start time in ms, and
    never the same twice in one process (tests restart nodes quickly)."""
    global _last_incarnation
    _last_incarnation = max(int(time.time() * 1000), _last_incarnation + 1)
    return _last_incarnation


def _fit_descriptors(config: ClusterConfig, node_id: int) -> ClusterConfig:
    """Rule 17: ``config`` for the client connections, ``max_clients`` lowered
    to what the process's descriptors allow (said at WARNING when it is)."""
    limits = config.limits
    descriptors = descriptor_limit()
    reserve = reserve_for(len(config.nodes), limits.http_max_connections)
    cap = client_cap(limits.max_clients, descriptors, reserve)
    if cap == limits.max_clients:
        return config
    log.warning(
        "node %d: this process may open %d files, so it admits %d client connections, not [limits] max_clients = %d "
        "(%d kept for peers, the admin endpoint and files): raise its limit (ulimit -n, LimitNOFILE=) to hold more",
        node_id,
        descriptors,
        cap,
        limits.max_clients,
        reserve,
    )
    return msgspec.structs.replace(config, limits=msgspec.structs.replace(limits, max_clients=cap))


class _Stop(Exception):
    """Raised inside the node's TaskGroup to end it cleanly."""


class Node:
    """A running node: ``await node.run()``; ``node.stop()`` ends it (rule 1).

    Invariant: ``links`` has one ``PeerLink`` per peer the node knows, each
    run by a task of the TaskGroup while the node runs; ``clients`` holds the
    writer of every open client connection.
    """

    def __init__(
        self,
        config: ClusterConfig,
        node_id: int,
        *,
        sock: socket.socket | None = None,
        admin_sock: socket.socket | None = None,
        freeze_gc: bool = False,
        security: NodeSecurity | None = None,
    ) -> None:
        self.config = config
        self.id = node_id
        # Rule 15; a ConfigError (a missing certificate …) before anything is bound.
        self.security = security if security is not None else node_security(config, node_id)
        self.core = NodeCore(
            config,
            node_id,
            incarnation=new_incarnation(),
            admin_token=effective_admin_token(config),
            verifier=verifier_for(config),  # reads [auth] public_keys: a bad key stops the node here
        )
        self._stats = self.core.ctx.stats  # the shell's counters sit with the core's (SPEC §14)
        self.peer_runs: dict[int, int] = {}  # the incarnation last seen of each peer (rule 9)
        self._freeze_gc = freeze_gc
        self.gc_policy = FreezePolicy()  # rule 16, with freeze_gc
        self._stats["gc_freezes"] += 0  # exported at 0 until it happens
        self.capture: CaptureWriter | None = None  # SPEC §13: on when the config names a capture_dir
        if config.cluster.capture_dir:
            self.capture = CaptureWriter(config, node_id, config.cluster.capture_dir)
            self.core.capture = self.capture.buffer
        self.me = config.node(node_id)
        self.max_frame = config.cluster.max_frame_size
        self._sock = sock
        self.inbox: Inbox = Inbox(config.cluster.peer_queue)
        self.admission = Admission(
            node_id,
            config.cluster.name,
            self.security,
            live_within=config.cluster.suspect_timeout,
            max_frame=self.max_frame,
        )
        for reason in (*TLS_REFUSALS, *PEER_REFUSALS):  # every reason exported, at 0 until it happens
            self._stats[stats_key(reason)] += 0
        self.listener: Listener | None = None
        self.links: dict[int, PeerLink] = {p.id: self._new_link(p) for p in config.nodes if p.id != node_id}
        self.connections = ClientConnections(
            node_id,
            _fit_descriptors(config, node_id),
            self.core,
            self.inbox,
            execute=self.execute,
            spawn=self._spawn,
            refuse=self.refuse,
        )
        self.clients: dict[int, ConnectionWriter] = self.connections.writers
        self.slow_log = SlowLog(self.core, config.cluster.slow_ms)
        self.dispatcher = Dispatcher(self.core, self.inbox, self.slow_log, execute=self.execute, peer_run=self.peer_run)
        self.connections.publishes_now = self.dispatcher.publishes_now  # net.dispatch rule 6
        self._stop = asyncio.Event()
        # The connections the listener accepts (rules 2, 6, 9, 15: net.inbound).
        self.refusal_log = RefusalLog()  # rule 15: strangers' refusals logged within a bound
        self.inbound = Inbound(
            node_id,
            config,
            self.security,
            self.admission,
            self.inbox,
            self.connections,
            self._stats,
            hello=self.core.hello,
            refuse=self.refuse,
            refusal_log=self.refusal_log,
            stopping=self._stop,
        )
        self.inbound.peers_now = self.dispatcher.peers_now  # net.dispatch rule 7
        self.rejoin_reason = ""  # rule 14: set when a majority declared this run dead
        self._gc_t0 = 0.0
        self._gc_cpu0 = 0.0
        self._tg: asyncio.TaskGroup | None = None
        self.started = asyncio.Event()
        self.port = self.me.port
        # The admin HTTP endpoint (overlay.net.admin): bound in run(), served by a task of the TaskGroup.
        self.admin = AdminServer(self)
        self._admin_sock = admin_sock
        self.admin_port = self.me.admin_port
        membership.install(self.admin, self)  # POST /drain (overlay.net.membership)

    # -- what the HTTP side and the tests use (rules 12, 13) ---------------------------------

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """True from ``stop()`` on."""
        return self._stop.is_set()

    async def wait_stop(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for ``stop()``; whether it came."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._stop.wait()
        return self._stop.is_set()

    def execute(self, actions: list[Action]) -> None:
        """Carry out what the core returned (rule 12), then fail the tracked
        Notifies dropped meanwhile at once, carrying out what that returns
        too (rule 5) — in this loop, not by calling back into it."""
        self._carry_out(actions)
        dropped = self.connections.dropped
        while dropped:
            sid, tag = dropped.popleft()
            self._carry_out(self._call("notify_dropped", self.core.notify_dropped, sid, tag))

    def refuse(self, reason: Refusal, address: str, detail: str) -> None:
        """Rule 15: a connection refused before it reached the core — counted, and logged within the bound."""
        self._stats[stats_key(reason)] += 1
        held = self.refusal_log.admit(reason.value, time.monotonic())
        if held is not None:
            more = RefusalLog.more(held)
            log.warning("node %d: refused %s from %s: %s%s", self.id, reason.value, address, detail, more)

    def rejoin(self, reason: str) -> None:
        """Rule 14: this run was declared dead by a majority; it stops (its
        clients are closed and go elsewhere), and whoever runs the node
        starts a new run: ``rejoin_reason`` says so."""
        if self.rejoin_reason:
            return
        self.rejoin_reason = reason
        log.error("node %d: %s; stopping this run so a new, empty one rejoins the cluster", self.id, reason)
        self.stop()

    def add_peer(self, peer: NodeConfig) -> None:
        """Rule 12: a link to a node that joined, run by a task of the TaskGroup."""
        self.config = self.core.config
        if peer.id in self.links or self._tg is None:
            return
        link = self._new_link(peer)
        self.links[peer.id] = link
        self._tg.create_task(link.run(), name=link.name)
        log.info("node %d: link to joined node %d at %s:%d", self.id, peer.id, peer.host, peer.port)

    def peer_run(self, node: int, incarnation: int) -> None:
        """Rule 9: a new incarnation of ``node``: what was queued for its
        previous run is discarded."""
        if not incarnation:
            return
        known = self.peer_runs.get(node)
        self.peer_runs[node] = incarnation
        link = self.links.get(node)
        if known is not None and known != incarnation and link is not None:
            n = link.discard()
            self._stats["peer_frames_discarded_restart"] += n
            log.info("node %d: node %d restarted; %d frames queued for its previous run discarded", self.id, node, n)

    # -- lifecycle (rule 1) ---------------------------------------------------------------

    async def run(self) -> None:
        gc_thresholds: tuple[int, int, int] | None = None  # rule 16: the process's, while this run set its own
        sock = self._sock
        if sock is None:
            sock = socket.create_server((self.me.host, self.me.port))  # SO_REUSEADDR, as start_server set it
        self.port = sock.getsockname()[1]
        tls = "TLS" if not self.security.insecure else "plain TCP"
        log.info("node %d: listening on %s:%d (%s; %s)", self.id, self.me.host, self.port, tls, BUILD)
        if self.security.insecure:
            log.warning(
                "node %d: [tls] insecure = true: plain TCP, nothing encrypted — peers prove the cluster secret, "
                "clients nothing; for a network you trust only",
                self.id,
            )
        try:
            self.admin_port = self.admin.bind(self._admin_sock)
        except OSError:
            sock.close()
            raise
        listener = self.listener = Listener(
            self.id,
            sock,
            self.security,
            handshake_timeout=self.config.cluster.peer_timeout,
            serve=self.inbound.serve,
            spawn=self._spawn,
            refuse=self.refuse,
        )
        if self.capture is not None:
            self.capture.open(time.time())
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(listener.run(), name=f"listen-{self.id}")
                for link in self.links.values():
                    tg.create_task(link.run(), name=link.name)
                tg.create_task(self.dispatcher.run(), name=f"dispatch-{self.id}")
                tg.create_task(self._ticker(), name=f"tick-{self.id}")
                tg.create_task(self.dispatcher.index(), name=f"index-{self.id}")
                tg.create_task(self.admin.run(), name=f"admin-{self.id}")
                if self.capture is not None:
                    tg.create_task(self.capture.run(), name=f"capture-{self.id}")
                self.execute(self.core.boot(time.time()))
                if self._freeze_gc:
                    # A node process (rule 16, net.gc_freeze rule 1): what exists
                    # now (modules, classes, config, tables) lives as long as it
                    # does.  Keep it out of the cyclic GC, whose full passes over it
                    # took 25–40 ms each (measured), stalling every event behind;
                    # collect first so no garbage is frozen with it.  Not for nodes
                    # sharing a process (tests).
                    gc.collect()
                    gc.freeze()
                    gc_thresholds = gc.get_threshold()  # put back when the run ends (net.gc_freeze rule 6)
                    gc.set_threshold(YOUNG_THRESHOLD, *gc_thresholds[1:])
                    gc.callbacks.append(self._gc_timer)
                self.started.set()
                await self._stop.wait()
                listener.close()
                if not self.rejoin_reason:  # a run declared dead sends nothing more (rule 14)
                    await self._flush()
                raise _Stop
        except* _Stop:
            pass
        finally:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._gc_timer)
            if self._freeze_gc:
                gc.unfreeze()  # net.gc_freeze rule 4: what this run leaves is collectable
                if gc_thresholds is not None:
                    gc.set_threshold(*gc_thresholds)
            sock.close()
            for w in self.clients.values():
                w.writer.close()
            if self.capture is not None:
                self.capture.close(time.time())
            log.info("node %d: stopped", self.id)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        assert self._tg is not None, "the node is not running"
        return self._tg.create_task(coro, name=name)

    def _new_link(self, peer: NodeConfig) -> PeerLink:
        cluster = self.config.cluster
        return PeerLink(
            self.id,
            peer,
            queue_size=cluster.peer_queue,
            max_frame=self.max_frame,
            hello_timeout=cluster.peer_timeout,
            hello=self.core.hello,
            answered=self.peer_run,
            changed=self._link_changed,
            connect=self.admission.dial,
            refused=self._refused_link,
        )

    def _refused_link(self, exc: PeerRefused) -> None:
        """A link of ours that this node refused to complete (net.peer_link rule 2): counted (and logged there)."""
        self._stats[stats_key(Refusal(exc.reason))] += 1

    async def _flush(self) -> None:
        """What is queued goes out before the stop, within ``FLUSH_SECONDS``:
        a poll, as it waits on every queue of the node at once (the dispatcher
        refills the writers' queues while it empties the inbox)."""
        deadline = time.monotonic() + FLUSH_SECONDS
        while time.monotonic() < deadline:
            if (
                not len(self.inbox)
                and all(not link.backlog for link in self.links.values() if link.connected.is_set())
                and all(not len(w.queue) for w in self.clients.values())
            ):
                return
            await asyncio.sleep(FLUSH_POLL)

    # -- core calls from the shell's own tasks (rules 8, 11) ----------------------------------

    def _call(self, what: str, call: Callable[P, list[Action]], *args: P.args, **kwargs: P.kwargs) -> list[Action]:
        """Rule 11: a core call whose unexpected error is logged with its
        traceback and counted; then there is nothing to carry out."""
        try:
            return call(*args, **kwargs)
        except Exception:  # rule 11: the task goes on
            self._stats["shell_errors"] += 1
            log.exception("node %d: %s failed; the node keeps serving", self.id, what)
            return []

    def _guarded(self, what: str, call: Callable[P, list[Action]], *args: P.args, **kwargs: P.kwargs) -> None:
        """Rule 11: run a core call and carry out its actions."""
        acts = self._call(what, call, *args, **kwargs)
        if acts:
            self.execute(acts)

    def _link_changed(self, peer: int, up: bool) -> None:
        """A link's report (``net.peer_link`` rule 4): key homes move at once (node.ordering)."""
        link = self.links.get(peer)
        if up and link is not None and link.back():
            self.core.peer_reachable(peer)
        self._guarded("peer_link", self.core.peer_link, peer, up, time.time())

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.time()
            limit = self.config.cluster.peer_timeout
            for link in list(self.links.values()):  # a tick's actions may add a link
                # A peer down longer than the timeout is reported once per outage
                # (migration rule 5: a sender past <2> then takes its channels back).
                if link.overdue(now, limit):
                    assert link.down_since is not None
                    log.warning("node %d: peer %d unreachable for %.1fs", self.id, link.peer.id, now - link.down_since)
                    self._guarded("peer_unreachable", self.core.peer_unreachable, link.peer.id, now)
            t0 = time.perf_counter()
            self._guarded("tick", self.core.tick, now)
            try:
                self.connections.check(time.monotonic())  # slow consumers (rule 5, net.clients rule 7)
            except Exception:  # rule 11: the ticker goes on
                self._stats["shell_errors"] += 1
                log.exception("node %d: the slow-consumer check failed; the node keeps serving", self.id)
            self.slow_log.check("tick", f"node {self.id}", now, t0)

    def _gc_timer(self, phase: str, info: dict[str, Any]) -> None:
        """A collection holds the loop like a handler does (rule 8); after a
        long full pass, what survived it is frozen (rule 16)."""
        # Every young pass calls this twice (one per few dozen events under
        # load): the thread's CPU clock (a system call, ~0.5 us) is read for
        # full passes only, and the slow log's strings are made only when it
        # notes one.
        generation = info["generation"]
        if phase == "start":
            self._gc_t0 = time.perf_counter()
            if generation == 2:
                self._gc_cpu0 = time.thread_time()
            return
        if time.perf_counter() - self._gc_t0 > self.slow_log.threshold:
            self.slow_log.note(f"gc gen {generation}", f"node {self.id}", time.time(), self._gc_t0)
        if generation != 2:
            return
        # The CPU the pass took, not the wall time the slow log reports: on a
        # busy machine a small pass can wait long for a core, and freezing
        # then would keep nothing a pass needs to skip (net.gc_freeze rule 2).
        cpu = time.thread_time() - self._gc_cpu0
        # Never for nodes sharing a process (rule 16).
        if self._freeze_gc and self.gc_policy.after_full_pass(cpu):
            # Now, in the pass's own callback: it has just found everything
            # unreachable, so nothing frozen here is garbage (net.gc_freeze rule 2).
            gc.freeze()
            self._stats["gc_freezes"] += 1
            log.info(
                "node %d: a full GC pass took %.0f ms of CPU; what survived it is frozen (%d of %d freezes this run)",
                self.id,
                cpu * 1000,
                self.gc_policy.freezes,
                self.gc_policy.limit,
            )

    # -- carrying out actions (rules 5, 10, 12) --------------------------------------------------

    def _carry_out(self, actions: list[Action]) -> None:
        conns = self.connections
        if type(conns) is ClientConnections:
            # The client actions are the connections' (net.clients rule 10); the rest come back to _carry_other.
            conns.carry_out(actions, self._carry_other)
            return
        # A test's Proxy in front of the connections (overlay.testing.proxy):
        # each action through its methods, which the test may have replaced.
        for act in actions:
            if type(act) is ToClient:
                conns.send(act.session, act.msg)
            elif type(act) is Notifies:
                conns.send_notifies(act.msg, act.sessions, act.sub_ids)
            elif type(act) is CloseClient:
                conns.close(act.session, act.reason)
            else:
                self._carry_other(act)

    def _carry_other(self, act: Action) -> None:
        """Rule 12 for the actions that are not for a client connection."""
        if type(act) is ToPeer:  # one or more per event crossing nodes: no call more than needed
            link = self.links.get(act.node)
            if link is None:
                log.error("node %d: no link to node %d for %s", self.id, act.node, type(act.msg).__name__)
                return
            sent = link.send(act.msg)
            if sent is Sent.QUEUED:
                return
            if sent is Sent.DROPPED:  # rule 10: the bound holds while the peer is away
                self._stats["peer_frames_dropped"] += 1
            elif sent is Sent.OVERFLOW:  # backpressure without blocking the dispatcher
                self._stats["peer_queue_overflow"] += 1
        elif type(act) is AddPeer:  # a node joined: link to it first
            self.add_peer(act.peer)
        elif type(act) is Rejoin:  # rule 14: declared dead; a new run takes over
            self.rejoin(act.reason)
        else:
            self._stats["shell_unknown_actions"] += 1
            log.error("node %d: the core returned an action the shell does not know: %r", self.id, act)
