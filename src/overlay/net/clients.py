"""A node's client connections: their read loops and writers (``overlay.net.node`` rules 3, 5, 6).

Rules:

1. A client connection is a session of the core (``client_opened`` …
   ``ClientClosed`` through the inbox) with one ``ConnectionWriter`` whose
   task belongs to the node's TaskGroup; ``writers`` holds exactly the open
   ones.
2. The read loop hands each message to the dispatcher through the inbox,
   waiting for room when it is full (TCP backpressure), but for two: an Ack
   the core only counts (``NodeCore.client_ack``) is taken at once, and a
   Publish that finds the inbox's normal level past ``choke_threshold`` is
   answered with Choke instead (SPEC §12).
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
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Final

from overlay.actions import Action
from overlay.capture import CaptureBuffer
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame, is_peer_frame
from overlay.net.inbox import READ_CHUNK, ClientClosed, FromClient, Inbox
from overlay.net.writer import ConnectionWriter, write_frames
from overlay.node import NodeCore
from overlay.security import Refusal

__all__ = ["CLIENT_MAGIC", "ClientConnections"]

log = logging.getLogger("overlay.net")

CLIENT_MAGIC: Final = b"OVC1"
# How long a client that sent a bad frame gets for the fatal Error to go out.
ERROR_FLUSH_SECONDS: Final = 1.0
# The Choke delay per choke_threshold of queued publishes (SPEC §12).
CHOKE_DELAY: Final = 0.01

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
Refuse = Callable[[Refusal, str, str], None]


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

    # -- writing (rule 3) ----------------------------------------------------------------

    def send(self, sid: int, msg: cm.ClientMessage) -> None:
        w = self.writers.get(sid)
        if w is None:
            return
        frame = encode_frame(msg, self._max_frame)
        if type(msg) is not cm.Notify:
            w.queue.put_force(frame, False)
        elif w.queue.put_nowait(frame, False):
            self._slow.discard(sid)
        else:
            self._drop(sid, w, msg)

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
            error = cm.Error(-1, cm.ErrorCode.SLOW_CONSUMER, "notification queue full; notifications dropped")
            w.queue.put_force(encode_frame(error), True)

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
            w.close()

    # -- reading (rules 1, 2, 4) ---------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str = "") -> None:
        """One client connection (from ``address``), from after its preamble to its end."""
        core = self._core
        sid = core.client_opened()
        out = ConnectionWriter(writer, self._queue_size)
        self.writers[sid] = out
        wtask = self._spawn(out.run(), f"client-{self.node_id}-{sid}")
        frames = client_reader(self._max_frame)
        inbox = self._inbox
        choke_at = self._choke_at
        put_nowait = inbox.put_nowait
        client_ack = core.client_ack
        try:
            write_frames(writer, [CLIENT_MAGIC])
            while data := await reader.read(READ_CHUNK):
                for msg in frames.feed(data):
                    if type(msg) is cm.Ack and client_ack(sid, msg):
                        continue  # rule 2: counted, nothing to dispatch
                    if type(msg) is cm.Publish and len(inbox.normal) >= choke_at:
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
        except RemoteProtocolError as exc:
            self._stats["rejected_client_protocol"] += 1
            if frames.bad is not None and is_peer_frame(frames.bad):  # rule 5
                self._refuse(Refusal.PEER_MESSAGE_ON_CLIENT, address, f"client session {sid} sent a peer message")
            log.info("node %d: client session %d sent a bad frame: %s", self.node_id, sid, exc)
            self.send(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, str(exc), fatal=True))
            await out.flush(ERROR_FLUSH_SECONDS)
        except OSError:
            pass
        except Exception:  # rule 4: this connection only
            log.exception("node %d: client session %d failed", self.node_id, sid)
        finally:
            wtask.cancel()
            self.writers.pop(sid, None)
            self._slow.discard(sid)
            writer.close()
            await inbox.put(ClientClosed(sid), False)
