"""A node's client connections: their read loops and writers (``overlay.net.node`` rules 3, 5, 6).

Rules:

1. A client connection is a session of the core (``client_opened`` …
   ``ClientClosed`` through the inbox) with one ``ConnectionWriter`` whose
   task belongs to the node's TaskGroup; ``writers`` holds exactly the open
   ones.
2. The read loop hands each message to the dispatcher through the inbox,
   waiting for room when it is full (TCP backpressure), but for three: an Ack
   the core only counts (``NodeCore.client_ack``) is taken at once, a
   Publish that finds the inbox's normal level past ``choke_threshold`` is
   answered with Choke instead (SPEC §12), and the Publishes a read starts
   with, when the inbox is empty, go to the dispatcher's ``publishes_now``
   (``net.dispatch`` rule 6): handled at once, in order, a slice's worth at
   a time with a loop turn between (while the inbox stays empty), the rest
   of the read queued behind them.  (Their order against other sessions'
   and peers' messages arriving meanwhile is arrival order, as ever: only a
   session's own messages are ordered, and its next read waits.)
3. A Notify that finds its session's queue full is dropped (STYLE habit 7):
   counted (``slow_consumer_drops``), captured, the client told once per
   burst with a ``slow_consumer`` Error; control replies are never dropped.
   A dropped Notify with a delivery tag is a failed delivery: its
   ``(session, tag)`` waits in ``dropped`` until the node hands it to
   ``NodeCore.notify_dropped`` (a group's event goes to another instance at
   once, not after the ack timeout).  The node does that after the batch of
   actions it is carrying out, never from inside ``send``.
4. The read loop sorts its exceptions: a bad frame → a fatal Error, flushed,
   then close; ``OSError`` → the client is gone; anything else → logged with
   its traceback, that connection closed.  Cancellation propagates.
5. A bad frame that is a node-to-node message is a peer speaking on a
   client connection (SPEC §16): also refused as
   ``peer_message_on_client`` (counted, logged with the remote address).
6. Bounded (SPEC §16, ``[limits]``): past ``max_clients`` open connections a
   new one gets a fatal ``too_many_connections`` Error and is closed before
   it is a session (counted; logged once per run of refusals); a
   connection that has not sent a whole first frame (its Hello) within
   ``hello_timeout`` is closed (``hello_timeouts``), and so is one that has
   begun a frame and not finished it as long after its last whole frame
   (``frame_timeouts``; looked for with rule 7's stalled sessions): a fatal
   protocol error, written after what is queued for it.  Such a frame held
   up to ``max_frame_size`` bytes of the node for as long as the client
   liked (150 stalled connections: +277 MB).  A first frame longer than
   any Hello (``MAX_HELLO_FRAME``) is refused at its header, before its
   body is read: 200 strangers' 1 MiB frames took +223 MB within the
   hello_timeout.  Per client id limits
   are the core's (``node.clients`` rules L1–L4).
7. Every frame queued for a session counts in the node's queue budget
   (``overlay.limits.budget``; ``net.writer`` rule 5).  **Slow consumers**:
   a session whose connection took no data for ``slow_consumer_grace``
   while data waited (checked every ``SWEEP_SECONDS`` from the node's tick),
   or one of the largest holders when the budget is exceeded (checked as
   each frame is queued), is disconnected:
   a. what is queued for it is dropped; its Notifies are counted
      (``slow_consumer_dropped``) and captured as drops, like rule 3's;
   b. a fatal ``slow_consumer`` Error saying why is written after what the
      transport holds (the client reads it if it reads within
      ``net.writer.LINGER``), the connection is read no more, and it is
      reset once the linger is over (``net.writer`` rule 6);
   c. the core is told at once (``ClientClosed``): the session's
      subscriptions end as on any lost connection, and its tracked
      deliveries fail, so a group's events go to another instance
      (``node.notify``); Notifies the core sends it until then are
      dropped and counted alike;
   d. counted (``slow_consumer_disconnects``, and ``…_stalled`` or
      ``…_budget``) and logged once, at WARNING, with the reason.
8. One event's Notifies to several sessions (``actions.Notifies``) are
   encoded once: the event and payload once, and one frame per distinct
   ``sub_ids``, whose bytes go into each queue that lists them
   (``messages.codec`` rule 4).  Each session's Notify is queued, dropped
   (rule 3) or discarded (rule 7c) exactly as its own ``ToClient`` would
   be; the Notify message itself is made only for a drop's capture.  One
   message sent to several sessions in a row is encoded once too.
9. **Batched PubAcks.**  A session whose Hello said ``cm.BATCHED_ACKS``
   gets its PubAcks gathered into ``PubAcks`` frames (at most
   ``PUBACKS_BATCH`` each): they wait in ``_acks`` until the loop's next
   turn (``flush_acks``, scheduled by the first one), so the PubAcks of a
   batch of publishes cost one encode and one queued frame instead of one
   each.  Nothing overtakes: any other frame for that session sends its
   waiting PubAcks first, as does closing it; like every control reply they
   are never dropped.  A session that is cut or gone loses them with its
   connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Final

import msgspec

from overlay.actions import Action, CloseClient, Notifies, ToClient
from overlay.capture import CaptureBuffer
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.limits.budget import QueueBudget
from overlay.messages import client as cm
from overlay.messages.codec import HEADER, FrameReader, NotifyFrames, client_reader, encode_frame, is_peer_frame
from overlay.net.inbox import READ_CHUNK, ClientClosed, FromClient, Inbox
from overlay.net.writer import LINGER, ConnectionWriter, write_frames
from overlay.node import NodeCore
from overlay.security import Refusal

__all__ = ["CLIENT_MAGIC", "ClientConnections"]

log = logging.getLogger("overlay.net")

CLIENT_MAGIC: Final = b"OVC1"
# How long a client that sent a bad frame gets for the fatal Error to go out.
ERROR_FLUSH_SECONDS: Final = 1.0
# The Choke delay per choke_threshold of queued publishes (SPEC §12).
CHOKE_DELAY: Final = 0.01
# Rule 7: how often stalled sessions are looked for (at most; a quarter of
# the grace when that is shorter), so a stall is cut within 1.25 × grace.
SWEEP_SECONDS: Final = 1.0
# Rule 9: PubAcks per PubAcks frame — each entry is at most ~270 bytes (a seq
# and the longest event id), so a frame stays far under the 1 MiB frame cap.
PUBACKS_BATCH: Final = 1024

# Rule 7a: a queued frame is a Notify when its body (after the length
# prefix and a one-byte array header: every client message has under 16
# fields) starts with the tag "Notify" — told without decoding it.
_NOTIFY_TAG: Final = msgspec.msgpack.encode("Notify")
_TAG_AT: Final = HEADER.size + 1
assert encode_frame(cm.Notify("", {}, ()))[_TAG_AT : _TAG_AT + len(_NOTIFY_TAG)] == _NOTIFY_TAG


# The message classes the per-message paths tell apart, as this module's own
# constants: compiled, a ``Final`` is read from a C static, where ``cm.Publish``
# is a lookup of ``cm`` in the module's dict and of ``Publish`` on the module,
# ~30 ns each time (issue 19; overlay.build rule 5: no test lowers these).
_PUBLISH: Final = cm.Publish
_PUBACK: Final = cm.PubAck
_NOTIFY: Final = cm.Notify
_ACK: Final = cm.Ack
_TO_CLIENT: Final = ToClient
_NOTIFIES: Final = Notifies
_CLOSE_CLIENT: Final = CloseClient


def _is_notify(frame: bytes) -> bool:
    return frame.startswith(_NOTIFY_TAG, _TAG_AT)


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
Refuse = Callable[[Refusal, str, str], None]


class _Reading:
    """Rule 6: a session's frame reader, and the time by which the frame it
    holds begun (if any) had begun: its last whole frame, or its first byte."""

    __slots__ = ("frames", "late", "since")

    def __init__(self, frames: FrameReader[cm.ClientMessage], since: float) -> None:
        self.frames = frames
        self.since = since
        self.late = False  # past the limit at the last sweep


class ClientConnections:
    """The client side of one node's shell (rules 1–4).

    Invariant: ``writers`` holds exactly the sessions whose connection is
    open; ``dropped`` holds the tracked Notifies dropped since the node last
    took them.
    """

    def __init__(
        self,
        node_id: int,
        config: ClusterConfig,
        core: NodeCore,
        inbox: Inbox,
        *,
        execute: Callable[[list[Action]], None],
        spawn: Spawn,
        refuse: Refuse,
    ) -> None:
        self.node_id = node_id
        self.writers: dict[int, ConnectionWriter] = {}
        self.dropped: deque[tuple[int, int]] = deque()
        self._core = core
        self._stats = core.ctx.stats
        self._inbox = inbox
        self._execute = execute
        self._spawn = spawn
        self._refuse = refuse
        self._slow: set[int] = set()
        self._max_frame = config.cluster.max_frame_size
        self._queue_size = config.cluster.client_queue
        self._choke_at = config.cluster.choke_threshold
        # Rules 6 and 7.
        limits = config.limits
        self.budget = QueueBudget(limits.queue_budget, limits.slow_consumer_grace)
        self._max_clients = limits.max_clients
        self._hello_timeout = limits.hello_timeout
        self._sweep_every = min(SWEEP_SECONDS, limits.slow_consumer_grace / 4)
        self._swept = 0.0
        self._cut: set[int] = set()  # sessions disconnected as slow consumers, until their read loop ends
        self._reading: dict[int, _Reading] = {}  # rule 6: each open session's frames and their progress
        self.linger = LINGER  # rule 7b: how long a cut connection's last words may take to be read
        self._full_logged = False  # rule 6: a run of max_clients refusals is logged once
        # Rule 8: the last message encoded and its frame (held, so `is` cannot
        # meet a new object at a freed one's address).
        self._last_msg: cm.ClientMessage | None = None
        self._last_frame = b""
        # Rule 9: the sessions that take PubAcks, and the PubAcks waiting per session.
        self._batched: set[int] = set()
        self._acks: dict[int, tuple[list[int], list[str]]] = {}
        # Rule 2: the dispatcher's publishes_now, once the node has made it (None: every message queued).
        self.publishes_now: Callable[[int, list[cm.Publish]], int] | None = None

    # -- writing (rule 3) ----------------------------------------------------------------

    def carry_out(self, actions: list[Action], other: Callable[[Action], None]) -> None:
        """Rule 10: ``actions`` in order — those for clients here, every other
        one handed to ``other`` in its turn."""
        for act in actions:
            if type(act) is _TO_CLIENT:
                self.send(act.session, act.msg)
            elif type(act) is _NOTIFIES:
                self.send_notifies(act.msg, act.sessions, act.sub_ids)
            elif type(act) is _CLOSE_CLIENT:
                self.close(act.session, act.reason)
            else:
                other(act)

    def send(self, sid: int, msg: cm.ClientMessage) -> None:
        w = self.writers.get(sid)
        if w is None:
            if sid in self._cut and type(msg) is _NOTIFY:  # rule 7c
                self._discard(sid, msg)
            return
        if type(msg) is _PUBACK and sid in self._batched:  # rule 9
            acks = self._acks.get(sid)
            if acks is None:
                if not self._acks:
                    self._schedule_flush()
                acks = self._acks[sid] = ([], [])
            acks[0].append(msg.seq)
            acks[1].append(msg.event_id)
            return
        if self._acks and sid in self._acks:  # rule 9: nothing overtakes them
            self._queue_acks(w, *self._acks.pop(sid))
        if msg is self._last_msg:  # rule 8
            frame = self._last_frame
        else:
            frame = encode_frame(msg, self._max_frame)
            self._last_msg, self._last_frame = msg, frame
        if type(msg) is not _NOTIFY:
            w.queue.put_force(frame, False)
        elif w.queue.put_nowait(frame, False):
            if self._slow:
                self._slow.discard(sid)
        else:
            self._drop(sid, w, msg)
            return
        if self.budget.add(w.account, len(frame)):  # rule 7: past the budget
            self._over_budget()

    def send_notifies(self, msg: cm.Notify, sessions: list[int], sub_ids: list[tuple[str, ...]]) -> None:
        """Rule 8: ``msg`` to each session of ``sessions``, the i-th with
        ``sub_ids[i]`` (an ``actions.Notifies``), as ``send`` would one by one
        — the budget checked once, after the last (``limits.budget`` rule 4)."""
        frames = NotifyFrames(msg, self._max_frame)
        writers = self.writers
        budget = self.budget
        acks = self._acks
        last = msg.sub_ids
        frame = frames.frame(last)
        over = False
        for sid, ids in zip(sessions, sub_ids, strict=True):
            w = writers.get(sid)
            if w is None:
                if sid in self._cut:  # rule 7c
                    self._discard(sid, frames.notify(ids))
                continue
            if acks and sid in acks:  # rule 9: nothing overtakes them
                self._queue_acks(w, *acks.pop(sid))
            if ids is not last and ids != last:  # sessions with the same ids in a row share the frame
                last = ids
                frame = frames.frame(ids)
            if not w.queue.put_nowait(frame, False):
                self._drop(sid, w, frames.notify(ids))
                continue
            if self._slow:
                self._slow.discard(sid)
            over = budget.add(w.account, len(frame)) or over
        if over:  # rule 7: past the budget
            self._over_budget()

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a node driven by hand): at once, nothing to batch with
            self.flush_acks()
            return
        loop.call_soon(self.flush_acks)

    def flush_acks(self) -> None:
        """Rule 9: every session's waiting PubAcks into its queue."""
        acks, self._acks = self._acks, {}
        for sid, (seqs, ids) in acks.items():
            w = self.writers.get(sid)
            if w is not None:
                self._queue_acks(w, seqs, ids)

    def _queue_acks(self, w: ConnectionWriter, seqs: list[int], ids: list[str]) -> None:
        for i in range(0, len(seqs), PUBACKS_BATCH):
            j = i + PUBACKS_BATCH
            frame = encode_frame(cm.PubAcks(tuple(seqs[i:j]), tuple(ids[i:j])), self._max_frame)
            w.queue.put_force(frame, False)  # a control reply: never dropped
            if self.budget.add(w.account, len(frame)):  # rule 7: past the budget
                self._over_budget()

    def _drop(self, sid: int, w: ConnectionWriter, msg: cm.Notify) -> None:
        self._stats["slow_consumer_drops"] += 1
        capture = self._core.capture
        if capture is not None:
            self._capture_drop(capture, sid, msg)
        if msg.tag:
            self.dropped.append((sid, msg.tag))
        if sid not in self._slow:
            self._slow.add(sid)
            log.warning("node %d: client session %d is a slow consumer; dropping notifications", self.node_id, sid)
            error = encode_frame(
                cm.Error(-1, cm.ErrorCode.SLOW_CONSUMER, "notification queue full; notifications dropped")
            )
            w.queue.put_force(error, True)
            self.budget.add(w.account, len(error))

    def _discard(self, sid: int, msg: cm.Notify) -> None:
        """Rule 7c: a Notify for a session cut as a slow consumer, before the core knew."""
        self._stats["slow_consumer_dropped"] += 1
        capture = self._core.capture
        if capture is not None:
            self._capture_drop(capture, sid, msg)
        if msg.tag:
            self.dropped.append((sid, msg.tag))

    # -- slow consumers (rule 7) -----------------------------------------------------------

    def check(self, now: float) -> None:
        """Rule 7 on time (``now`` monotonic; from the node's tick): cut stalled sessions."""
        if now - self._swept < self._sweep_every:
            return
        self._swept = now
        self._stalled_frames(now)
        grace = self.budget.grace
        for acct in self.budget.stalled(now):
            self.cut(
                acct.sid,
                "stalled",
                f"your connection took no data for {now - acct.waiting_since:.1f}s while {_mib(acct.bytes)} "
                f"waited for it ([limits] slow_consumer_grace = {grace:g}s): read your connection, or subscribe to less",
            )

    def _over_budget(self) -> None:
        """Rule 7 when the budget is exceeded: the largest holders go, until the rest fit."""
        budget = self.budget
        share = budget.share()
        for acct in budget.over_share():
            held = acct.bytes
            self.cut(
                acct.sid,
                "budget",
                f"the notifications queued on node {self.node_id} reached its budget "
                f"([limits] queue_budget = {_mib(budget.limit)}) and your connection held {_mib(held)} of them, "
                f"more than its share ({_mib(share)}): read your connection faster, or subscribe to less",
            )

    def cut(self, sid: int, reason: str, why: str) -> None:
        """Rule 7a–d: disconnect session ``sid`` as a slow consumer (``reason``:
        ``stalled`` or ``budget``; ``why``: what the client is told)."""
        w = self.writers.pop(sid, None)
        if w is None:
            return
        self._acks.pop(sid, None)  # rule 9: lost with the connection
        self.budget.close(sid)
        self._cut.add(sid)
        self._slow.discard(sid)
        error = cm.Error(-1, cm.ErrorCode.SLOW_CONSUMER, f"disconnected as a slow consumer: {why}", fatal=True)
        dropped = w.cut(encode_frame(error), self.linger)
        notifies = [f for f in dropped if _is_notify(f)]
        stats = self._stats
        stats["slow_consumer_dropped"] += len(notifies)
        stats["slow_consumer_disconnects"] += 1
        stats[f"slow_consumer_disconnects_{reason}"] += 1
        capture = self._core.capture
        if capture is not None and notifies:
            frames = client_reader(self._max_frame)
            for msg in frames.feed(b"".join(notifies)):
                if type(msg) is cm.Notify:
                    self._capture_drop(capture, sid, msg)
        sess = self._core.session(sid)
        log.warning(
            "node %d: client %r (session %d) disconnected as a slow consumer (%d notifications dropped): %s",
            self.node_id,
            sess.client_id if sess is not None else "?",
            sid,
            len(notifies),
            why,
        )
        self._inbox.put_force(ClientClosed(sid), False)  # rule 7c: its subscriptions end now

    def _capture_drop(self, capture: CaptureBuffer, sid: int, msg: cm.Notify) -> None:
        """Rule 3, in the capture: the subscriptions whose notification was dropped."""
        sess = self._core.session(sid)
        subs = [sess.subs[lid][0] for lid in msg.sub_ids if lid in sess.subs] if sess is not None else []
        capture.drop(msg.event_id, sid, subs)

    def close(self, sid: int, reason: str) -> None:
        """Close a session's connection after what is queued for it (``CloseClient``)."""
        w = self.writers.get(sid)
        if w is not None:
            log.info("node %d: closing client session %d: %s", self.node_id, sid, reason)
            if sid in self._acks:  # rule 9: they go out before it closes
                self._queue_acks(w, *self._acks.pop(sid))
            w.close()

    # -- reading (rules 1, 2, 4, 6) ------------------------------------------------------

    def _refuse_full(self, writer: asyncio.StreamWriter) -> None:
        """Rule 6: the node holds ``max_clients`` connections already."""
        self._stats["rejected_too_many_connections"] += 1
        why = (
            f"node {self.node_id} has {len(self.writers)} client connections open, its limit "
            f"([limits] max_clients = {self._max_clients}): connect to another node, or retry later"
        )
        if not self._full_logged:
            self._full_logged = True
            log.warning(
                "node %d: client connection refused: %s (until one is accepted, only counted)", self.node_id, why
            )
        error = cm.Error(-1, cm.ErrorCode.TOO_MANY_CONNECTIONS, why, fatal=True)
        with contextlib.suppress(ConnectionResetError):  # net.writer rule 4: it may be gone already
            write_frames(writer, [CLIENT_MAGIC, encode_frame(error)])
        writer.close()

    def _stalled_frames(self, now: float) -> None:
        """Rule 6: close the sessions holding a frame begun ``hello_timeout`` ago and not finished."""
        limit = self._hello_timeout
        late = []
        for sid, r in self._reading.items():
            # Seen late twice, a sweep apart: after a loop held longer than the
            # limit, a read loop has not yet taken what arrived meanwhile.
            was, r.late = r.late, bool(r.frames.buffered) and now - r.since > limit
            if was and r.late:
                late.append(sid)
        for sid in late:
            del self._reading[sid]  # once: its read loop ends on the close
            w = self.writers.get(sid)
            if w is None:
                continue
            self._stats["frame_timeouts"] += 1
            why = f"a frame begun was not finished within {limit:g}s ([limits] hello_timeout)"
            log.info("node %d: client session %d: %s; closing", self.node_id, sid, why)
            self.send(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, why, fatal=True))
            w.close(self.linger)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str = "") -> None:
        """One client connection (from ``address``), from after its preamble to its end."""
        if self._max_clients and len(self.writers) >= self._max_clients:
            self._refuse_full(writer)
            return
        self._full_logged = False
        core = self._core
        sid = core.client_opened()
        out = ConnectionWriter(writer, self._queue_size, budget=self.budget, sid=sid)
        self.writers[sid] = out
        wtask = self._spawn(out.run(), f"client-{self.node_id}-{sid}")
        frames = client_reader(self._max_frame)
        inbox = self._inbox
        choke_at = self._choke_at
        put_nowait = inbox.put_nowait
        client_ack = core.client_ack
        clock = time.monotonic
        reading = self._reading[sid] = _Reading(frames, clock())  # rule 6
        # overlay.build rule 6: nothing below awaits in an except or finally
        # block — the error's flush and the cleanup come after the try, and an
        # exception that ends the session (a cancel) is raised again after them.
        flush = False
        failure: BaseException | None = None
        try:
            write_frames(writer, [CLIENT_MAGIC])
            msgs = await self._first_frames(reader, frames, sid)  # rule 6: the Hello in time
            first = msgs[0] if msgs else None
            if type(first) is cm.Hello and first.version >= cm.BATCHED_ACKS:  # rule 9
                self._batched.add(sid)
            while msgs:
                now_fn = self.publishes_now
                if now_fn is not None and type(msgs[0]) is _PUBLISH and not len(inbox):  # rule 2: at once
                    k = 1
                    while k < len(msgs) and type(msgs[k]) is _PUBLISH:
                        k += 1
                    run: list[cm.Publish] = msgs if k == len(msgs) else msgs[:k]  # type: ignore[assignment]  # Publishes
                    done = now_fn(sid, run)
                    msgs = msgs[done:] if done < len(msgs) else []
                    # A slice's worth: a loop turn (the writers), then on as the
                    # inbox allows.  None (a test taps or paces the dispatcher):
                    # all queued below — looping on, the read loop spun and
                    # queued nothing.
                    if 0 < done < k:
                        await asyncio.sleep(0)
                        continue
                for msg in msgs:
                    if type(msg) is _ACK and client_ack(sid, msg):
                        continue  # rule 2: counted, nothing to dispatch
                    if type(msg) is _PUBLISH and len(inbox.normal) >= choke_at:
                        self._stats["chokes"] += 1
                        self.send(sid, cm.Choke(msg.seq, CHOKE_DELAY * len(inbox.normal) / choke_at))
                        continue
                    item = FromClient(sid, msg)
                    if not put_nowait(item, False):  # full: wait for room (rule 2)
                        await inbox.put(item, False)
                # Acks client_ack batched (node.ordering rule 8); receipts are the dispatcher's.
                acts = core.end_batch(idle=False)
                if acts:
                    self._execute(acts)
                msgs = []
                reading.since = clock()  # rule 6: a frame left begun began by now
                while not msgs and (data := await reader.read(READ_CHUNK)):
                    if not frames.buffered:
                        reading.since = clock()
                    msgs = frames.feed(data)
        except RemoteProtocolError as exc:
            self._stats["rejected_client_protocol"] += 1
            if frames.bad is not None and is_peer_frame(frames.bad):  # rule 5
                self._refuse(Refusal.PEER_MESSAGE_ON_CLIENT, address, f"client session {sid} sent a peer message")
            log.info("node %d: client session %d sent a bad frame: %s", self.node_id, sid, exc)
            self.send(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, str(exc), fatal=True))
            flush = True
        except OSError:
            pass
        except Exception:  # rule 4: this connection only
            log.exception("node %d: client session %d failed", self.node_id, sid)
        except BaseException as exc:  # noqa: BLE001  # cancelled: raised again after the cleanup below
            failure = exc
        if flush:
            try:
                await out.flush(ERROR_FLUSH_SECONDS)
            except BaseException as exc:  # noqa: BLE001  # likewise
                failure = exc
        wtask.cancel()
        self.writers.pop(sid, None)
        self._reading.pop(sid, None)
        self._batched.discard(sid)
        self._acks.pop(sid, None)
        self._slow.discard(sid)
        self._cut.discard(sid)
        self.budget.close(sid)
        out.shut()  # net.writer rule 6: an unread buffer is released after the linger
        await inbox.put(ClientClosed(sid), False)
        if failure is not None:
            raise failure

    async def _first_frames(
        self, reader: asyncio.StreamReader, frames: FrameReader[cm.ClientMessage], sid: int
    ) -> list[cm.ClientMessage]:
        """Rule 6: the connection's first whole frames, read within ``hello_timeout``;
        [] when it sent none in time (counted) or ended first.  A first frame
        longer than any Hello is refused at its header (a protocol error)."""
        head = b""  # the first frame's header, as it arrives
        try:
            async with asyncio.timeout(self._hello_timeout):
                while data := await reader.read(READ_CHUNK):
                    if len(head) < HEADER.size:
                        head += data[: HEADER.size - len(head)]
                        if len(head) == HEADER.size and (length := HEADER.unpack(head)[0]) > cm.MAX_HELLO_FRAME:
                            raise RemoteProtocolError(
                                f"the first frame is {length} bytes, longer than any Hello "
                                f"({cm.MAX_HELLO_FRAME} bytes): say Hello first"
                            )
                    msgs = frames.feed(data)
                    if msgs:
                        return msgs
        except TimeoutError:
            self._stats["hello_timeouts"] += 1
            log.info(
                "node %d: client session %d sent no whole frame within %gs ([limits] hello_timeout); closing",
                self.node_id,
                sid,
                self._hello_timeout,
            )
        return []
