"""The asyncio shell of a node: sockets, queues and tasks around ``NodeCore``.

Rules this module keeps (SPEC §1.1, STYLE habits 6 and 7):

1. One ``asyncio.TaskGroup`` owns every task of the node: the listener's
   connection handlers, one outbound ``PeerLink`` per peer, the dispatcher,
   and the ticker.  ``stop()`` flushes and cancels it; nothing is
   fire-and-forget.  The admin HTTP endpoint (``overlay.net.admin``) is one
   more task of it, on its own port, bound before the node reports started.
2. A connection starts with a 4-byte preamble saying what it is: ``OVP1``
   for a peer link, ``OVC1`` for a client.  Each peer sends on its own
   outbound link (one per direction, FIFO) and only reads on inbound ones.
3. Inbound messages wait in one two-level queue; the single dispatcher takes
   high-priority ones first and hands each to the core, in batches, with a
   loop turn at least every ``DISPATCH_SLICE`` so replies go out during a
   burst.  Read loops block when it is full (TCP backpressure).  A publish
   that finds the normal level past ``choke_threshold`` is answered with
   Choke instead (SPEC §12).  A client's Ack of a notification only counts
   it: the read loop hands it to the core itself (``NodeCore.client_ack``)
   instead of queueing it.
4. Each connection has one writer task, fed by bounded high/normal queues,
   writing batches with ``writelines`` then ``drain``.
5. A client's Notify that finds its queue full is dropped and counted as a
   slow-consumer drop, and the client is told once per burst; control replies
   are never dropped.  Dispatch never waits on a slow subscriber.
6. Read loops sort their exceptions: protocol error → error reply and close;
   ``OSError`` → peer gone; cancellation → re-raise; anything else → log with
   the traceback and close that connection only.
7. One more task does the core's background work (``background_step``) with
   ``INDEX_PAUSE`` between steps: the split a migration session waits on, a
   bounded step at a time, and the subscriptions a split, merge or
   SubscriptionMove left unindexed, ``INDEX_STEP`` at a time (until then the
   channel tests them linearly, exactly).
8. Whatever holds the loop past ``slow_ms`` (one message's handling, a tick,
   an indexing step) is journalled as ``slow`` with what it was and for how
   long: every event queued meanwhile waited that long.
9. A peer link opens with a hello each way: the caller's on connect, the
   callee's in answer, before anything queued goes out.  The answer carries
   the callee's incarnation; when it is not the one last seen, the peer
   restarted and what was queued for its previous run (table updates,
   notifications for its dead clients, session messages) is discarded, not
   replayed into the new run.  The same check runs when the peer's own hello
   reaches the dispatcher, whichever comes first.
10. While a link is down its queue keeps its bound: past it, frames are
    dropped and counted (``peer_frames_dropped``), logged once per outage.
    While it is up, a full queue is backpressure: the frame waits past the
    bound, counted (``peer_queue_overflow``).
11. No task dies of an unexpected error in a core call: the ticker, the
    indexer and the links log it with its traceback, count it and go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, Final

from overlay.actions import AddPeer, CloseClient, ToClient, ToPeer
from overlay.config import ClusterConfig, NodeConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import client_reader, encode_frame, peer_reader
from overlay.net import membership
from overlay.net.admin import AdminServer, effective_admin_token
from overlay.net.capture_writer import CaptureWriter
from overlay.net.queues import TwoLevelQueue
from overlay.node import NodeCore

__all__ = ["CLIENT_MAGIC", "PEER_MAGIC", "Node"]

log = logging.getLogger("overlay.net")

PEER_MAGIC: Final = b"OVP1"
CLIENT_MAGIC: Final = b"OVC1"
# Frames per writelines(): enough to amortise the system call, small enough
# that one batch does not hold the loop for long.
MAX_BATCH: Final = 512
# Inbound messages the dispatcher takes per wake-up: the loop gets back to the
# sockets at least this often under a flood.
DISPATCH_BATCH: Final = 64
# Longest run of dispatching before a loop turn lets the writers send (rule 3).
DISPATCH_SLICE: Final = 0.001
# Subscriptions indexed per background step (Channel rule 5): ≈ 50 µs each for
# a range over many buckets (measured), so a step holds the loop for about
# 0.2 ms — an event arriving meanwhile waits no longer than that — and the
# pause keeps indexing to a sixth of the loop's time.
INDEX_STEP: Final = 4
INDEX_PAUSE: Final = 0.001
READ_CHUNK: Final = 256 * 1024
TICK_SECONDS: Final = 0.05
BACKOFF_MIN: Final = 0.05
BACKOFF_MAX: Final = 2.0
FLUSH_SECONDS: Final = 2.0

_last_incarnation = 0


def new_incarnation() -> int:
    """This run's incarnation (node.core rule 6): the start time in ms, and
    never the same twice in one process (tests restart nodes quickly)."""
    global _last_incarnation
    _last_incarnation = max(int(time.time() * 1000), _last_incarnation + 1)
    return _last_incarnation


class _Writer:
    """Rule 4 for one connection."""

    def __init__(self, writer: asyncio.StreamWriter, maxsize: int) -> None:
        self.writer = writer
        self.queue: TwoLevelQueue[bytes] = TwoLevelQueue(maxsize)

    async def run(self) -> None:
        q = self.queue
        w = self.writer
        try:
            while True:
                await q.wait()
                w.writelines(q.drain(MAX_BATCH))
                await w.drain()
        except OSError:
            # The connection is gone (rule 6): end this writer and close, so
            # the read loop cleans up.  Raising would end the node's TaskGroup.
            w.close()

    async def flush(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.queue) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def close(self) -> None:
        """Close after what is queued (e.g. the fatal Error just sent): the
        transport writes its buffer out before it closes."""
        self.writer.writelines(self.queue.drain(len(self.queue)))
        self.writer.close()


class PeerLink:
    """The outbound link to one peer, reconnecting with backoff (rule 2).

    Frames queued while disconnected wait (bounded) and go out on reconnect.
    """

    def __init__(self, node: Node, peer: NodeConfig) -> None:
        self.node = node
        self.peer = peer
        self.queue: TwoLevelQueue[bytes] = TwoLevelQueue(node.config.cluster.peer_queue)
        self.connected = asyncio.Event()
        self.connects = 0
        self.down_since: float | None = time.time()  # None while connected
        self.reported_down = False
        self.dropped = 0  # frames dropped during the current outage (rule 10)

    def send(self, msg: pm.PeerMessage) -> bool:
        return self.queue.put_nowait(encode_frame(msg, self.node.max_frame), pm.is_high(msg))

    async def _handshake(self, reader: asyncio.StreamReader) -> None:
        """Rule 9: the peer's answering hello, before anything queued goes out."""
        frames = peer_reader(self.node.max_frame)
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionResetError("peer closed the link during the hello")
            msgs = frames.feed(data)
            if msgs:
                hello = msgs[0]
                if not isinstance(hello, pm.PeerHello) or hello.node_id != self.peer.id:
                    raise RemoteProtocolError(f"node {self.peer.id} answered the hello with {hello!r}")
                self.node.peer_run(self.peer.id, hello.incarnation)
                return

    async def run(self) -> None:
        backoff = BACKOFF_MIN
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.peer.host, self.peer.port)
            except OSError as exc:
                log.debug("node %d: peer %d unreachable (%s); retry in %.2fs", self.node.id, self.peer.id, exc, backoff)
                self.node._guarded(
                    "peer_link", self.node.core.peer_link, self.peer.id, False, time.time()
                )  # key homes (node.ordering)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            try:
                writer.write(PEER_MAGIC + encode_frame(self.node.core.hello()))
                # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel
                # that meets the hello failing, and the link never stopped.
                async with asyncio.timeout(self.node.config.cluster.peer_timeout):
                    await self._handshake(reader)
            except (TimeoutError, OSError, RemoteProtocolError) as exc:
                log.info(
                    "node %d: peer %d did not answer the link's hello (%s); retry in %.2fs",
                    self.node.id,
                    self.peer.id,
                    exc or type(exc).__name__,
                    backoff,
                )
                writer.close()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            backoff = BACKOFF_MIN
            self.connects += 1
            self.down_since = None
            if self.dropped:
                log.warning(
                    "node %d: %d frames for peer %d were dropped while its link was down (queue bound %d)",
                    self.node.id,
                    self.dropped,
                    self.peer.id,
                    self.queue.maxsize,
                )
                self.dropped = 0
            if self.reported_down:
                self.reported_down = False
                self.node.core.peer_reachable(self.peer.id)
            try:
                self.connected.set()
                self.node._guarded("peer_link", self.node.core.peer_link, self.peer.id, True, time.time())
                log.info("node %d: link to peer %d up", self.node.id, self.peer.id)
                await self._pump(reader, writer)
            except _PeerClosed:  # an orderly close (the peer stopped): not a fault
                log.info("node %d: peer %d closed its link", self.node.id, self.peer.id)
            except OSError as exc:
                log.warning("node %d: link to peer %d lost: %s", self.node.id, self.peer.id, exc)
            finally:
                self.connected.clear()
                self.down_since = time.time()
                writer.close()
                self.node._guarded("peer_link", self.node.core.peer_link, self.peer.id, False, time.time())

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Write what is queued until the link fails, and raise what ended it.
        Its two halves are tasks of this call: whichever ends first ends the
        other, and both are awaited, so nothing outlives the link — also when
        the node stops it.  (Not a TaskGroup: Python 3.11's can turn a cancel
        that meets a child's error into that error alone, and the link would
        go on reconnecting through the node's stop.)"""
        name = f"link-{self.node.id}->{self.peer.id}"
        halves = (
            asyncio.create_task(self._watch_close(reader), name=f"{name}-watch"),
            asyncio.create_task(self._write(writer), name=f"{name}-write"),
        )
        try:
            done, _ = await asyncio.wait(halves, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for half in halves:
                half.cancel()
            await asyncio.wait(halves)
        for half in done:
            if not half.cancelled() and (exc := half.exception()) is not None:
                raise exc
        raise ConnectionResetError("link ended")  # neither half returns otherwise

    @staticmethod
    async def _watch_close(reader: asyncio.StreamReader) -> None:
        # The peer never writes on our outbound link; EOF means it went away.
        while await reader.read(READ_CHUNK):
            pass
        raise _PeerClosed("peer closed the link")

    async def _write(self, writer: asyncio.StreamWriter) -> None:
        q = self.queue
        while True:
            await q.wait()
            writer.writelines(q.drain(MAX_BATCH))
            await writer.drain()


class _PeerClosed(ConnectionResetError):
    """The peer closed our link in order (EOF): it stopped or restarts."""


class _Stop(Exception):
    """Raised inside the node's TaskGroup to end it cleanly."""


class Node:
    """A running node: ``await node.run()``; ``node.stop()`` ends it (rule 1)."""

    def __init__(
        self,
        config: ClusterConfig,
        node_id: int,
        *,
        sock: socket.socket | None = None,
        admin_sock: socket.socket | None = None,
        freeze_gc: bool = False,
    ) -> None:
        self.config = config
        self.id = node_id
        self.core = NodeCore(config, node_id, incarnation=new_incarnation(), admin_token=effective_admin_token(config))
        self.peer_runs: dict[int, int] = {}  # the incarnation last seen of each peer (rule 9)
        self._freeze_gc = freeze_gc
        self.capture: CaptureWriter | None = None  # SPEC §13: on when the config names a capture_dir
        if config.cluster.capture_dir:
            self.capture = CaptureWriter(config, node_id, config.cluster.capture_dir)
            self.core.capture = self.capture.buffer
        self.me = config.node(node_id)
        self.max_frame = config.cluster.max_frame_size
        self._sock = sock
        self.inbox: TwoLevelQueue[tuple[str, int, object]] = TwoLevelQueue(config.cluster.peer_queue)
        self.links: dict[int, PeerLink] = {p.id: PeerLink(self, p) for p in config.nodes if p.id != node_id}
        self.clients: dict[int, _Writer] = {}
        self._slow: set[int] = set()
        self._stop = asyncio.Event()
        self._index_wake = asyncio.Event()
        self._slow_s = config.cluster.slow_ms / 1000 or float("inf")
        self._gc_t0 = 0.0
        self._tg: asyncio.TaskGroup | None = None
        self.started = asyncio.Event()
        self.port = self.me.port
        # The admin HTTP endpoint (overlay.net.admin): bound in run(), served by a task of the TaskGroup.
        self.admin = AdminServer(self)
        self._admin_sock = admin_sock
        self.admin_port = self.me.admin_port
        membership.install(self)  # POST /drain (overlay.net.membership)

    # -- lifecycle -------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        if self._sock is not None:
            server = await asyncio.start_server(self._on_connect, sock=self._sock, limit=READ_CHUNK)
        else:
            server = await asyncio.start_server(
                self._on_connect, self.me.host, self.me.port, limit=READ_CHUNK, reuse_address=True
            )
        self.port = server.sockets[0].getsockname()[1]
        log.info("node %d: listening on %s:%d", self.id, self.me.host, self.port)
        try:
            self.admin_port = self.admin.bind(self._admin_sock)
        except OSError:
            server.close()
            raise
        if self.capture is not None:
            self.capture.open(time.time())
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                for link in self.links.values():
                    tg.create_task(link.run(), name=f"link-{self.id}->{link.peer.id}")
                tg.create_task(self._dispatch(), name=f"dispatch-{self.id}")
                tg.create_task(self._ticker(), name=f"tick-{self.id}")
                tg.create_task(self._indexer(), name=f"index-{self.id}")
                tg.create_task(self.admin.run(), name=f"admin-{self.id}")
                if self.capture is not None:
                    tg.create_task(self.capture.run(), name=f"capture-{self.id}")
                self._execute(self.core.boot(time.time()))
                if self._freeze_gc:
                    # A node process: what exists now (modules, classes, config,
                    # tables) lives as long as it does.  Keep it out of the cyclic
                    # GC, whose full passes over it took 25–40 ms each (measured),
                    # stalling every event behind; collect first so no garbage is
                    # frozen with it.  Not for nodes sharing a process (tests).
                    gc.collect()
                    gc.freeze()
                    gc.callbacks.append(self._gc_timer)
                self.started.set()
                await self._stop.wait()
                server.close()
                await self._flush()
                raise _Stop
        except* _Stop:
            pass
        finally:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._gc_timer)
            server.close()
            for w in self.clients.values():
                w.writer.close()
            if self.capture is not None:
                self.capture.close(time.time())
            log.info("node %d: stopped", self.id)

    async def _flush(self) -> None:
        deadline = time.monotonic() + FLUSH_SECONDS
        while time.monotonic() < deadline:
            if (
                not len(self.inbox)
                and all(not len(l.queue) for l in self.links.values() if l.connected.is_set())
                and all(not len(w.queue) for w in self.clients.values())
            ):
                return
            await asyncio.sleep(0.01)

    async def _ticker(self) -> None:
        limit = self.config.cluster.peer_timeout
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.time()
            for link in self.links.values():
                # A peer down longer than the timeout is reported once per outage
                # (migration rule 5: a sender past <2> then takes its channels back).
                if (
                    link.down_since is not None
                    and not link.reported_down
                    and now - link.down_since > limit
                    and link.connects
                ):
                    link.reported_down = True
                    log.warning("node %d: peer %d unreachable for %.1fs", self.id, link.peer.id, now - link.down_since)
                    self._guarded("peer_unreachable", self.core.peer_unreachable, link.peer.id, now)
            t0 = time.perf_counter()
            self._guarded("tick", self.core.tick, now)
            if time.perf_counter() - t0 > self._slow_s:
                self._held_loop("tick", "node", self.id, now, t0)

    def _guarded(self, what: str, call: Callable[..., list[Any]], *args: Any) -> None:
        """Rule 11: run a core call and carry out its actions; an unexpected
        error is logged with its traceback and counted, and the task goes on."""
        try:
            acts = call(*args)
        except Exception:
            self.core.stats["shell_errors"] += 1
            log.exception("node %d: %s failed; the node keeps serving", self.id, what)
            return
        if acts:
            self._execute(acts)

    def _gc_timer(self, phase: str, info: dict) -> None:
        """A collection holds the loop like a handler does (rule 8)."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif time.perf_counter() - self._gc_t0 > self._slow_s:
            self._held_loop(f"gc gen {info['generation']}", "node", self.id, time.time(), self._gc_t0)

    def peer_run(self, node: int, incarnation: int) -> None:
        """Rule 9: a new incarnation of ``node``: what was queued for its
        previous run is discarded."""
        if not incarnation:
            return
        known = self.peer_runs.get(node)
        self.peer_runs[node] = incarnation
        link = self.links.get(node)
        if known is not None and known != incarnation and link is not None:
            n = link.queue.clear()
            link.dropped = 0
            self.core.stats["peer_frames_discarded_restart"] += n
            log.info("node %d: node %d restarted; %d frames queued for its previous run discarded", self.id, node, n)

    def _held_loop(self, what: str, kind: str, src: int, now: float, t0: float) -> None:
        ms = (time.perf_counter() - t0) * 1000
        log.info("node %d: %s from %s %d held the loop %.1f ms", self.id, what, kind, src, ms)
        self.core.ctx.journal.record("slow", now, what=what, source=f"{kind} {src}", ms=round(ms, 3))

    # -- dispatch (rule 3) ------------------------------------------------------------

    async def _dispatch(self) -> None:
        core = self.core
        inbox = self.inbox
        slow = self._slow_s
        slice_end = time.perf_counter() + DISPATCH_SLICE
        while True:
            if not len(inbox):
                await inbox.wait()
                slice_end = time.perf_counter() + DISPATCH_SLICE
            elif time.perf_counter() > slice_end:
                # Still busy after a slice: one loop turn, so the writer tasks
                # send what this one produced.  Waiting for an empty inbox
                # instead held every reply and notification of a burst (a
                # split's backlog, a move's Reforwards) until its end.
                await asyncio.sleep(0)
                slice_end = time.perf_counter() + DISPATCH_SLICE
            # Take a batch, high first (queues rule 1).  Nothing below awaits, so
            # nothing is queued meanwhile: the order is exactly the one a get()
            # per message would give, without its per-message cost.
            for kind, src, msg in inbox.drain(DISPATCH_BATCH):
                now = time.time()
                t0 = time.perf_counter()
                try:
                    if kind == "client":
                        acts = core.handle_client(src, msg, now)  # type: ignore[arg-type]
                    elif kind == "peer":
                        acts = core.handle_peer(src, msg, now)  # type: ignore[arg-type]
                    elif kind == "closed":
                        acts = core.client_closed(src)
                    else:  # peer hello: a restarted peer's old frames go first (rule 9)
                        self.peer_run(src, msg.incarnation)  # type: ignore[attr-defined]
                        acts = core.peer_hello(src, msg, now)  # type: ignore[arg-type]
                except RemoteProtocolError as exc:
                    log.warning("node %d: protocol error from %s %d: %s", self.id, kind, src, exc)
                    if kind == "peer":
                        self._send_peer(src, pm.PeerError("protocol_error", str(exc)))
                    continue
                except Exception:
                    log.exception("node %d: failed handling %s from %s %d", self.id, type(msg).__name__, kind, src)
                    continue
                if acts:
                    self._execute(acts)
                if time.perf_counter() - t0 > slow:
                    self._held_loop(type(msg).__name__, kind, src, now, t0)
            acts = core.end_batch()  # notes collected over the batch (node.ordering rule 8)
            if acts:
                self._execute(acts)
            if core.index_wanted:
                self._index_wake.set()

    async def _indexer(self) -> None:
        """Background work, a step at a time between dispatch batches (rule 7):
        the split a session waits on (``node.balancing`` rule 3), then what
        splits, merges and SubscriptionMoves left to index (``Channel`` rule 5)."""
        core = self.core
        while True:
            await self._index_wake.wait()
            self._index_wake.clear()
            while True:
                t0 = time.perf_counter()
                try:
                    more, acts = core.background_step(INDEX_STEP, time.time())
                except Exception:  # rule 11
                    core.stats["shell_errors"] += 1
                    log.exception(
                        "node %d: background step (%s) failed; the node keeps serving", self.id, core.background_last
                    )
                    break
                if acts:
                    self._execute(acts)
                if time.perf_counter() - t0 > self._slow_s:
                    self._held_loop(core.background_last, "node", self.id, time.time(), t0)
                if not more:
                    break
                # A pause, not just a loop turn: a split or a move leaves tens of
                # ms of work, and done at once it takes a core the node's
                # peers need just then (they balance too); events meanwhile are
                # matched exactly, a little slower.
                await asyncio.sleep(INDEX_PAUSE)

    def _execute(self, acts: list) -> None:
        for act in acts:
            if type(act) is ToPeer:
                self._send_peer(act.node, act.msg)
            elif type(act) is ToClient:
                self._send_client(act.session, act.msg)
            elif type(act) is CloseClient:
                w = self.clients.get(act.session)
                if w is not None:
                    w.close()
            elif type(act) is AddPeer:  # a node joined: link to it first (overlay.net.membership)
                membership.add_peer(self, act)

    def _send_peer(self, node: int, msg: pm.PeerMessage) -> None:
        link = self.links.get(node)
        if link is None:
            log.error("node %d: no link to node %d for %s", self.id, node, type(msg).__name__)
            return
        if not link.send(msg):
            if not link.connected.is_set():  # rule 10: the bound holds while the peer is away
                self.core.stats["peer_frames_dropped"] += 1
                if not link.dropped:
                    log.warning(
                        "node %d: link to node %d is down and its queue is full (%d): dropping frames for it",
                        self.id,
                        node,
                        link.queue.maxsize,
                    )
                link.dropped += 1
                return
            # Backpressure without blocking the dispatcher: the frame waits past
            # the bound and the overflow is counted, never dropped.
            self.core.stats["peer_queue_overflow"] += 1
            link.queue.put_force(encode_frame(msg, self.max_frame), pm.is_high(msg))

    def _send_client(self, sid: int, msg: cm.ClientMessage) -> None:
        w = self.clients.get(sid)
        if w is None:
            return
        frame = encode_frame(msg, self.max_frame)
        if type(msg) is cm.Notify:
            if not w.queue.put_nowait(frame, False):
                self.core.stats["slow_consumer_drops"] += 1
                if self.capture is not None:
                    self._capture_drop(sid, msg)
                if sid not in self._slow:
                    self._slow.add(sid)
                    log.warning("node %d: client session %d is a slow consumer; dropping notifications", self.id, sid)
                    w.queue.put_force(
                        encode_frame(
                            cm.Error(-1, cm.ErrorCode.SLOW_CONSUMER, "notification queue full; notifications dropped")
                        ),
                        True,
                    )
                return
            self._slow.discard(sid)
        else:
            w.queue.put_force(frame, False)

    def _capture_drop(self, sid: int, msg: cm.Notify) -> None:
        """Rule 5, in the capture: the subscriptions whose notification was dropped."""
        assert self.capture is not None
        sess = self.core.sessions.get(sid)
        subs = [sess.subs[lid][0] for lid in msg.sub_ids if lid in sess.subs] if sess is not None else []
        self.capture.buffer.drop(msg.event_id, sid, subs)

    # -- connections --------------------------------------------------------------------

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._tg is None or self._stop.is_set():
            writer.close()
            return
        self._tg.create_task(self._serve(reader, writer))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            magic = await asyncio.wait_for(reader.readexactly(4), self.config.cluster.peer_timeout)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            writer.close()
            return
        if magic == PEER_MAGIC:
            await self._serve_peer(reader, writer)
        elif magic == CLIENT_MAGIC:
            await self._serve_client(reader, writer)
        else:
            log.warning("node %d: connection with unknown preamble %r closed", self.id, magic)
            self.core.stats["rejected_bad_preamble"] += 1
            writer.write(
                CLIENT_MAGIC
                + encode_frame(
                    cm.Error(-1, cm.ErrorCode.PROTOCOL, "unknown preamble: expected OVC1 or OVP1", fatal=True)
                )
            )
            writer.close()

    async def _serve_peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = peer_reader(self.max_frame)
        src = -1
        try:
            while data := await reader.read(READ_CHUNK):
                for msg in frames.feed(data):
                    if src < 0:
                        if not isinstance(msg, pm.PeerHello):
                            raise RemoteProtocolError(f"peer link opened with {type(msg).__name__}, not PeerHello")
                        src = msg.node_id
                        writer.write(encode_frame(self.core.hello()))  # rule 9: the answering hello
                        await self.inbox.put(("hello", src, msg), True)
                        continue
                    await self.inbox.put(("peer", src, msg), pm.is_high(msg))
        except RemoteProtocolError as exc:
            log.warning("node %d: peer %d misbehaved: %s; closing its link", self.id, src, exc)
            self.core.stats["rejected_peer_protocol"] += 1
            writer.write(encode_frame(pm.PeerError("protocol_error", str(exc))))
        except OSError:
            pass
        except Exception:
            log.exception("node %d: peer %d link failed", self.id, src)
        finally:
            writer.close()

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sid = self.core.client_opened()
        out = _Writer(writer, self.config.cluster.client_queue)
        self.clients[sid] = out
        assert self._tg is not None
        wtask = self._tg.create_task(out.run())
        frames = client_reader(self.max_frame)
        choke_at = self.config.cluster.choke_threshold
        put_nowait = self.inbox.put_nowait
        client_ack = self.core.client_ack
        try:
            writer.write(CLIENT_MAGIC)
            while data := await reader.read(READ_CHUNK):
                for msg in frames.feed(data):
                    if type(msg) is cm.Ack and client_ack(sid, msg):
                        continue  # rule 3: counted, nothing to dispatch
                    if type(msg) is cm.Publish and len(self.inbox.normal) >= choke_at:
                        self.core.stats["chokes"] += 1
                        delay = 0.001 * len(self.inbox.normal) / choke_at * 10
                        self._send_client(sid, cm.Choke(msg.seq, delay))
                        continue
                    item = ("client", sid, msg)
                    if not put_nowait(item, False):  # full: wait for room (rule 3)
                        await self.inbox.put(item, False)
                acts = self.core.end_batch()  # acks client_ack batched (node.ordering rule 8)
                if acts:
                    self._execute(acts)
        except RemoteProtocolError as exc:
            self.core.stats["rejected_client_protocol"] += 1
            log.info("node %d: client session %d sent a bad frame: %s", self.id, sid, exc)
            self._send_client(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, str(exc), fatal=True))
            await out.flush(1.0)
        except OSError:
            pass
        except Exception:
            log.exception("node %d: client session %d failed", self.id, sid)
        finally:
            wtask.cancel()
            self.clients.pop(sid, None)
            self._slow.discard(sid)
            writer.close()
            await self.inbox.put(("closed", sid, None), False)
