"""A node's inbound connections, once the listener has set them up
(``overlay.net.node`` rules 2, 6, 9 and 15; SPEC §16).

Rules this module keeps:

1. A connection's first 4 bytes say what it is: ``OVP1`` a peer's inbound
   link, ``OVC1`` a client (handed to ``net.clients``).  Anything else is
   answered with a fatal client Error, counted (``rejected_bad_preamble``)
   and closed.  A connection that sends nothing within the peer timeout is
   closed, and one that arrives once the node is stopping is closed unread.
2. With ``[tls] verify_clients``, a client without a certificate of the CA
   is refused (counted, logged, told why) before any of its frames is read.
   On an insecure node, a TLS client's ClientHello is read to its end and
   answered in plain bytes, so it fails at once instead of after its timeout.
3. A peer's inbound link is admitted by ``net.admission`` — a certificate,
   or the challenge on the secret, then its hello — before anything of it
   reaches the inbox, and all of it within ``peer_timeout`` of the
   preamble (``opening_timeout`` otherwise, refused as rule 5 says: a
   stranger cannot hold connections open by never finishing), in frames
   of at most ``MAX_OPENING_FRAME`` bytes (``messages.handshake`` rule 4;
   a longer one is a protocol error at its header).  The hello
   is answered at once with how many frames of the caller's run arrived on
   its earlier connections (``net.peer_link`` rule 6); that count goes on
   across connections of the run, and older runs of the node are forgotten.
4. After the hello, every frame goes to the inbox at its level (high or
   normal, ``messages.peer`` rule 2); a ``Batch`` goes in as its messages,
   one item each, in order (``net.peer_link`` rule 7) — but a frame read
   while the inbox is empty goes to the dispatcher's ``peers_now``
   (``net.dispatch`` rule 7): its messages handled at once, in order, a
   slice's worth at a time with a loop turn between (while the inbox stays
   empty), the rest queued as above.  Frames are
   acknowledged with a ``LinkAck`` every ``ACK_EVERY`` frames or
   ``ACK_SECONDS``.
5. The read loop sorts its exceptions: a refusal (``PeerRefused``) is
   counted, answered with a PeerError and closed; a protocol error is
   answered with a PeerError, counted (``rejected_peer_protocol``) and
   closed — logged at WARNING, before the hello within the node's
   ``RefusalLog`` bound, as a bad preamble (rule 1) is; ``OSError``: the peer is gone; anything else is logged with its
   traceback and closes this link only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

import msgspec

from overlay.config import ClusterConfig
from overlay.errors import PeerRefused, RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import encode_frame, peer_reader
from overlay.messages.handshake import MAX_OPENING_FRAME
from overlay.net.admission import Admission
from overlay.net.clients import CLIENT_MAGIC, ClientConnections
from overlay.net.inbox import READ_CHUNK, FromPeer, Inbox, PeerHelloIn
from overlay.net.listener import TLS_HANDSHAKE_RECORD, Refuse
from overlay.net.peer_link import ACK_EVERY, ACK_SECONDS, PEER_MAGIC
from overlay.net.writer import write_frames
from overlay.security import Identity, NodeSecurity, Refusal, RefusalLog

__all__ = ["Inbound"]

log = logging.getLogger("overlay.net")


class Inbound:
    """What serves the connections a node's listener accepted (rules 1–5).

    Invariant: ``received`` holds, per peer run (node, incarnation), the
    frames received from it over its connections so far, and no older run
    of a node that sent from a newer one.
    """

    def __init__(
        self,
        node_id: int,
        config: ClusterConfig,
        security: NodeSecurity,
        admission: Admission,
        inbox: Inbox,
        connections: ClientConnections,
        stats: Counter[str],
        *,
        hello: Callable[[], pm.PeerHello],
        refuse: Refuse,
        refusal_log: RefusalLog,
        stopping: asyncio.Event,
    ) -> None:
        self._id = node_id
        self._timeout = config.cluster.peer_timeout
        self._max_frame = config.cluster.max_frame_size
        self._security = security
        self._admission = admission
        self._inbox = inbox
        self._connections = connections
        self._stats = stats
        self._hello = hello
        self._refuse = refuse
        self._refusal_log = refusal_log  # rule 5: a stranger's bad preamble or frame, logged within the bound
        self._stopping = stopping
        # Frames received from each peer run, over its connections (net.peer_link rule 6).
        self.received: dict[tuple[int, int], int] = {}
        # Rule 4: the dispatcher's peers_now, once the node has made it (None: every message queued).
        self.peers_now: Callable[[int, list[pm.PeerMessage]], int] | None = None

    def received_from(self, key: tuple[int, int]) -> int:
        """Frames of run ``key`` (node, incarnation) received on earlier
        connections (net.peer_link rule 6); older runs of that node are forgotten."""
        node, inc = key
        for old in [k for k in self.received if k[0] == node and k[1] != inc]:
            del self.received[old]
        return self.received.get(key, 0)

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, identity: Identity, address: str
    ) -> None:
        """One connection the listener set up, until it closes (rules 1 and 2)."""
        if self._stopping.is_set():
            writer.close()
            return
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the
            # cancel of a stopping node when the read completes at that moment.
            async with asyncio.timeout(self._timeout):
                magic = await reader.readexactly(4)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            writer.close()
            return
        if magic == PEER_MAGIC:
            await self._serve_peer(reader, writer, identity, address)
        elif magic == CLIENT_MAGIC:
            if self._security.verify_clients and not identity.certified:
                self._refuse(Refusal.NO_CLIENT_CERTIFICATE, address, "[tls] verify_clients = true, and it showed none")
                text = "this node requires a client certificate of the cluster CA ([tls] verify_clients): give the client one"
                error = cm.Error(-1, cm.ErrorCode.PROTOCOL, text, fatal=True)
                with contextlib.suppress(ConnectionResetError):  # net.writer rule 4: it may be gone already
                    write_frames(writer, [CLIENT_MAGIC + encode_frame(error)])
                writer.close()
                return
            await self._connections.serve(reader, writer, address)
        elif self._security.insecure and magic[0] == TLS_HANDSHAKE_RECORD:
            await self._refuse_tls_client(reader, writer, magic, address)
        else:
            self._stats["rejected_bad_preamble"] += 1
            held = self._refusal_log.admit("bad_preamble", time.monotonic())
            if held is not None:
                more = RefusalLog.more(held)
                log.warning(
                    "node %d: connection from %s with unknown preamble %r closed%s", self._id, address, magic, more
                )
            error = cm.Error(-1, cm.ErrorCode.PROTOCOL, "unknown preamble: expected OVC1 or OVP1", fatal=True)
            with contextlib.suppress(ConnectionResetError):  # net.writer rule 4: it may be gone already
                write_frames(writer, [CLIENT_MAGIC + encode_frame(error)])
            writer.close()

    async def _refuse_tls_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, address: str
    ) -> None:
        """Rule 2: a TLS client on an insecure node's port.  Its ClientHello
        is read to its end (a close with unread bytes would be a reset, which
        tells it nothing), then plain bytes where its TLS layer wants a
        record: it fails at once ("wrong version number"), not after its timeout."""
        self._refuse(Refusal.TLS_ON_PLAIN_PORT, address, "a TLS client on a plain port ([tls] insecure = true)")
        with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError, OSError):
            async with asyncio.timeout(self._timeout):
                rest = await reader.readexactly(1)
                length = int.from_bytes(head[3:4] + rest, "big")  # the record's length: bytes 3-4 of its header
                await reader.readexactly(length)
            text = "this node speaks plain TCP ([tls] insecure = true): connect without TLS"
            write_frames(writer, [CLIENT_MAGIC + encode_frame(cm.Error(-1, cm.ErrorCode.PROTOCOL, text, fatal=True))])
        writer.close()

    async def _serve_peer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, identity: Identity, address: str
    ) -> None:
        """A peer's inbound link: admitted first (rule 3: a certificate, or
        the challenge on the secret, then its hello), the hello answered at
        once, with how many of its run's frames arrived before (net.node
        rule 9, net.peer_link rule 6), then its messages (rule 4),
        acknowledged every ``ACK_EVERY`` frames or ``ACK_SECONDS``."""
        frames = peer_reader(MAX_OPENING_FRAME)  # rule 3: until admitted, then max_frame_size
        inbox = self._inbox
        admission = self._admission
        src = -1
        key = (-1, 0)
        count = acked = 0
        acked_at = 0.0
        link = None
        # Rule 3: the opening (the challenge, the hello) within peer_timeout of
        # the preamble, as the caller bounds its own side of it
        # (net.peer_link rule 2): a real caller has given up by then anyway.
        opening = asyncio.timeout(self._timeout)
        try:
            auth = admission.opened(identity)
            proven = identity.node
            async with opening:
                while data := await reader.read(READ_CHUNK):
                    if link is not None:
                        link.last_seen = time.monotonic()
                    for msg in frames.feed(data):
                        if src >= 0:  # a handshake message now is the core's protocol error (node.peer_messages)
                            count += 1  # frames, a Batch one (net.peer_link rule 6)
                            batch = type(msg) is pm.Batch  # its messages one by one, in order (net.peer_link rule 7)
                            msgs: list[pm.PeerMessage] = list(msg.messages) if batch else [msg]  # type: ignore[attr-defined]
                            done = 0
                            now_fn = self.peers_now
                            while now_fn is not None and done < len(msgs) and not len(inbox):  # rule 4: at once
                                k = now_fn(src, msgs[done:] if done else msgs)
                                if not k:
                                    break
                                done += k
                                if done < len(msgs):  # a slice's worth: a loop turn, then on while the inbox is empty
                                    await asyncio.sleep(0)
                            if done == len(msgs):
                                continue
                            if batch:
                                for inner in msgs[done:]:
                                    item = FromPeer(src, inner)
                                    if not inbox.put_nowait(item, False):
                                        await inbox.put(item, False)
                            else:
                                await inbox.put(FromPeer(src, msg), pm.is_high(msg))
                            continue
                        if auth is not None and proven is None:  # rule 3 without TLS: the challenge first
                            reply = auth.receive(msg)
                            if reply is not None:
                                write_frames(writer, [encode_frame(reply)])
                            proven = auth.caller
                            continue
                        assert proven is not None
                        link = admission.admit(msg, proven, writer, address, time.monotonic())
                        opening.reschedule(None)  # admitted: the link lives as long as it carries frames
                        # The caller sends nothing behind its hello until answered (net.peer_link rule 2).
                        frames.max_size = self._max_frame
                        assert isinstance(msg, pm.PeerHello)
                        src = msg.node_id
                        key = (src, msg.incarnation)
                        count = acked = self.received_from(key)
                        answer = msgspec.structs.replace(self._hello(), received=count)
                        write_frames(writer, [encode_frame(answer)])  # net.node rule 9: the answering hello
                        await inbox.put(PeerHelloIn(src, msg), True)
                    if count > acked:
                        self.received[key] = count
                        now = time.monotonic()
                        if count - acked >= ACK_EVERY or now - acked_at >= ACK_SECONDS:
                            write_frames(writer, [encode_frame(pm.LinkAck(count))])
                            acked, acked_at = count, now
        except PeerRefused as exc:
            self._refuse(Refusal(exc.reason), address, exc.detail)
            with contextlib.suppress(ConnectionResetError):  # net.writer rule 4: it may be gone already
                write_frames(writer, [encode_frame(pm.PeerError(exc.reason, exc.detail))])
        except RemoteProtocolError as exc:
            self._stats["rejected_peer_protocol"] += 1
            # Before its hello (src < 0) the caller is anyone: a stranger's frames, logged within the bound.
            held = self._refusal_log.admit("peer_protocol", time.monotonic()) if src < 0 else 0
            if held is not None:
                more = RefusalLog.more(held)
                log.warning(
                    "node %d: peer %d (%s) misbehaved: %s; closing its link%s", self._id, src, address, exc, more
                )
            with contextlib.suppress(ConnectionResetError):  # net.writer rule 4: it may be gone already
                write_frames(writer, [encode_frame(pm.PeerError("protocol_error", str(exc)))])
        except TimeoutError:
            if opening.expired():  # else a socket's own timeout (an OSError): the peer is gone
                detail = (
                    f"the peer link did not finish its opening (the challenge, the hello) within "
                    f"{self._timeout:g}s of its preamble ([cluster] peer_timeout)"
                )
                self._refuse(Refusal.OPENING_TIMEOUT, address, detail)
                with contextlib.suppress(ConnectionResetError):  # net.writer rule 4: it may be gone already
                    write_frames(writer, [encode_frame(pm.PeerError(Refusal.OPENING_TIMEOUT, detail))])
        except OSError:
            pass
        except Exception:  # rule 5: this link only
            log.exception("node %d: peer %d link failed", self._id, src)
        finally:
            if link is not None:
                admission.closed(link)
            writer.close()
