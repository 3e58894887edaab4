"""A node's peer/client port: accept, TLS, then the streams (``overlay.net.node`` rule 2; SPEC §16).

Rules:

1. The node accepts connections itself (``sock_accept``) and sets each one
   up as a task of its TaskGroup, so a failed TLS handshake reaches this
   module — counted, logged at WARNING with the remote address — instead of
   vanishing inside the event loop, as it does behind
   ``start_server(ssl=…)``.
2. With TLS, the first bytes are peeked (not read) before the handshake: a
   plain client's preamble (``OVC1``/``OVP1``) is answered in plain text
   with a fatal Error saying the node requires TLS, and refused as
   ``not_tls``.  Then ``connect_accepted_socket`` runs the handshake, at most
   ``handshake_timeout``; a certificate the CA does not verify is
   ``bad_certificate``, any other failure ``tls_handshake``.
3. The verified certificate's identity (``overlay.security.identity``) goes
   with the streams to ``serve``: a peer link is admitted on it
   (``overlay.net.admission``).  Without TLS the identity is empty.
4. A connection that sends nothing within ``handshake_timeout`` is closed,
   as before TLS (the preamble's timeout), and not counted: it never tried.
5. ``close`` stops accepting at once; connections already set up go on
   until the node's TaskGroup ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

from overlay.messages import client as cm
from overlay.messages.codec import encode_frame
from overlay.net.inbox import READ_CHUNK
from overlay.security import Identity, NodeSecurity, Refusal, identity_of

__all__ = ["PLAIN_PREAMBLES", "Listener", "address_of"]

log = logging.getLogger("overlay.net")

# What a plain client or peer sends first (``net.clients``, ``net.peer_link``).
PLAIN_PREAMBLES: Final = (b"OVC1", b"OVP1")
# A TLS record starts with its content type (22: handshake) — what a plain node sees of a TLS client.
TLS_HANDSHAKE_RECORD: Final = 0x16

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Identity, str], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
Refuse = Callable[[Refusal, str, str], None]


def address_of(addr: Any) -> str:
    """``host:port`` of a socket address (IPv4 or IPv6), for logs."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class Listener:
    """Rules 1–5 for one node's listening socket.

    Invariant: every accepted socket is either handed to ``serve`` wrapped
    in streams, or closed.
    """

    def __init__(
        self,
        node_id: int,
        sock: socket.socket,
        security: NodeSecurity,
        *,
        handshake_timeout: float,
        serve: Serve,
        spawn: Spawn,
        refuse: Refuse,
    ) -> None:
        self.node_id = node_id
        self.sock = sock
        self.security = security
        self.handshake_timeout = handshake_timeout
        self._serve = serve
        self._spawn = spawn
        self._refuse = refuse
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def run(self) -> None:
        """Accept until ``close`` (or the TaskGroup's cancel)."""
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.sock.setblocking(False)
        n = 0
        while not self._closed:
            try:
                conn, addr = await loop.sock_accept(self.sock)
            except OSError as exc:  # out of descriptors, a closed socket: say so, breathe, go on
                if self._closed:
                    return
                log.warning("node %d: accepting a connection failed: %s", self.node_id, exc)
                await asyncio.sleep(0.1)
                continue
            n += 1
            conn.setblocking(False)
            # Small frames go out at once (as uvloop's transports do anyway): the
            # standard loop sets it only on sockets created with IPPROTO_TCP, and
            # without it a TLS hello waited ~40 ms for a delayed ACK.
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._closed:
                conn.close()
                return
            coro = self._open(conn, address_of(addr))
            try:
                self._spawn(coro, f"conn-{self.node_id}-{n}")
            except RuntimeError:  # the node's TaskGroup is shutting down: this one came too late
                coro.close()
                conn.close()
                return

    def close(self) -> None:
        """Rule 5."""
        self._closed = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    async def _open(self, conn: socket.socket, address: str) -> None:
        loop = asyncio.get_running_loop()
        ctx = self.security.server
        try:
            if ctx is not None and not await self._looks_like_tls(conn, address):
                return
            reader = asyncio.StreamReader(limit=READ_CHUNK)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol,
                conn,
                ssl=ctx,
                ssl_handshake_timeout=self.handshake_timeout if ctx is not None else None,
            )
        except ssl.SSLCertVerificationError as exc:
            self._refuse(Refusal.BAD_CERTIFICATE, address, exc.verify_message or str(exc))
            conn.close()
            return
        except (ssl.SSLError, TimeoutError, ConnectionError) as exc:
            self._refuse(Refusal.TLS_HANDSHAKE, address, _handshake_failure(exc))
            conn.close()
            return
        except OSError:
            conn.close()
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        ssl_object = writer.get_extra_info("ssl_object")
        identity = identity_of(ssl_object.getpeercert()) if ssl_object is not None else Identity()
        await self._serve(reader, writer, identity, address)

    async def _looks_like_tls(self, conn: socket.socket, address: str) -> bool:
        """Rule 2's peek (rule 4 when nothing comes); False: the connection is dealt with."""
        try:
            head = await _peek(conn, len(PLAIN_PREAMBLES[0]), self.handshake_timeout)
        except (TimeoutError, OSError):
            conn.close()
            return False
        if not head:  # closed without a word (a port probe): nothing tried, nothing to count (rule 4)
            conn.close()
            return False
        if head[0] == TLS_HANDSHAKE_RECORD:
            return True
        if head in PLAIN_PREAMBLES:
            self._refuse(Refusal.NOT_TLS, address, f"plain {head!r} on a TLS port")
        else:
            self._refuse(Refusal.NOT_TLS, address, f"neither TLS nor the overlay protocol: {head!r}")
        if head == PLAIN_PREAMBLES[0]:  # a plain client: tell it why, in words it can read
            error = cm.Error(
                -1,
                cm.ErrorCode.PROTOCOL,
                "this node requires TLS: connect with TLS and the cluster's CA "
                "(the [tls] table of the cluster config; Client(ssl=...))",
                fatal=True,
            )
            with contextlib.suppress(OSError):
                conn.send(PLAIN_PREAMBLES[0] + encode_frame(error))
        conn.close()
        return False


async def _peek(conn: socket.socket, n: int, timeout: float) -> bytes:
    """The first ``n`` bytes (or fewer, once some came) of ``conn``, left unread for the TLS layer."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, readable)
    try:
        async with asyncio.timeout(timeout):
            await ready
    finally:
        loop.remove_reader(fd)
    return conn.recv(n, socket.MSG_PEEK)


def _handshake_failure(exc: BaseException) -> str:
    """What a failed handshake means, in words an operator can act on."""
    reason = getattr(exc, "reason", None) or ""
    if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
        return f"the client does not trust this node's certificate ({reason}): does it have the cluster's CA?"
    if "CERTIFICATE_REQUIRED" in reason or "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reason:
        return "no client certificate, and [tls] verify_clients = true asks for one"
    if isinstance(exc, TimeoutError) or "taking longer" in str(exc):
        return f"the TLS handshake did not finish within the timeout ({exc})"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")
