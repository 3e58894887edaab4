"""The sockets of one ``Client``: open a connection, read it, write it (asyncio).

Rules (``overlay.client.connection`` rule 1; STYLE habit 6):

1. Connections go to the access nodes of the list in turn, with backoff
   between failed attempts (``RECONNECT_MIN`` doubling to ``RECONNECT_MAX``).
   An attempt fails on a socket error, on a node that breaks the protocol in
   its hello, and — except for the first connection, where the caller hears
   of it — on a node refusing the session.  A refusal of the client's token
   (``unauthorized``) is final on a reconnect too when the token is a fixed
   string: every node would refuse it again.  A token function
   (``token_source``) is called before every hello, so the next attempt
   may carry a new token.
2. The hello is the protocol's (``ClientProtocol.connect`` and its Welcome);
   the messages that arrive with the Welcome are the reader's first.
3. Per connection, one reader task hands each message to ``on_message`` in
   order, and one writer task writes the frames given to ``send`` in
   batches (``writelines`` then ``drain``; over TLS one joined ``write``,
   ``write_batch``, as ``overlay.net.writer`` rule 8 says why); nothing else
   touches the socket.
   ``serve`` returns when either ends — the connection is lost — and the
   other is cancelled and awaited, the socket closed and the frames not
   written discarded (their session is gone).
4. The reader sorts its exceptions: a socket error is a lost connection; a
   protocol error of the node is logged and loses the connection;
   cancellation goes through; anything else is logged with its traceback and
   loses this connection only.
5. With a ``tls`` context every connection is TLS, the node's certificate
   verified against the context's CA and the address's host name (SPEC
   §16).  A TLS failure is a ``TlsError`` saying what to configure — a
   certificate the CA does not verify, a node that speaks plain TCP — final
   on the first connection (as a refusal is), logged and retried on later
   ones.  (A node that wants TLS, or a client certificate, says so in the
   protocol's own fatal Error: a ``RequestError``.)
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

from overlay.client.events import Event
from overlay.client.protocol import ClientProtocol, ConnState
from overlay.errors import RemoteProtocolError, RequestError, TlsError
from overlay.messages import client as cm

__all__ = ["AUTH_REFUSALS", "Conn", "TokenSource", "Transport", "write_batch"]

log = logging.getLogger("overlay.client")

RECONNECT_MIN: Final = 0.05
RECONNECT_MAX: Final = 2.0
# Bytes asked of the socket per read; frames per write batch (habit 6).
READ_SIZE: Final = 256 * 1024
WRITE_BATCH: Final = 512

# An open connection: its streams, and the messages that came with the Welcome.
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter, list[cm.ClientMessage]]
# A client's token: the string, or a function returning the current one (rule 1).
TokenSource = str | Callable[[], str]
# Refusals that no other node, and no retry, would answer otherwise (rule 1).
AUTH_REFUSALS: Final = frozenset({cm.ErrorCode.UNAUTHORIZED, cm.ErrorCode.TOKEN_EXPIRED})


def write_batch(writer: asyncio.StreamWriter, frames: list[bytes], *, tls: bool) -> None:
    """Rule 3: one batch of frames — joined over TLS, one record per write and
    not per frame (``overlay.net.writer`` rule 8)."""
    if tls:
        writer.write(b"".join(frames))
    else:
        writer.writelines(frames)


class Transport:
    """Rules 1–4 for one client.

    Invariant: the protocol is in HANDSHAKE only while ``_handshake`` runs,
    and OPEN only while the connection ``open`` returned is being served."""

    def __init__(
        self,
        protocol: ClientProtocol,
        addresses: Sequence[tuple[str, int]],
        owner: str,
        *,
        on_message: Callable[[cm.ClientMessage], None],
        on_events: Callable[[list[Event]], None],
        token_source: Callable[[], str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.protocol = protocol
        self.token_source = token_source
        self.tls = tls
        self.addresses = list(addresses)
        self.owner = owner
        self._on_message = on_message
        self._on_events = on_events
        self._index = 0  # the address tried next
        self._out: deque[bytes] = deque()  # frames for the writer
        self._out_ready = asyncio.Event()

    def send(self, frame: bytes) -> None:
        """Queue one frame for the connection's writer (dropped with the connection)."""
        self._out.append(frame)
        self._out_ready.set()

    def next_address(self) -> None:
        self._index += 1

    async def open(self, *, refusal_is_final: bool) -> Conn:
        """Rule 1: a connection to the first access node that takes it."""
        delay = RECONNECT_MIN
        while True:
            host, port = self.addresses[self._index % len(self.addresses)]
            try:
                return await self._handshake(host, port)
            except (RequestError, TlsError) as exc:
                token_refused = isinstance(exc, RequestError) and exc.code in AUTH_REFUSALS
                if refusal_is_final or (token_refused and self.token_source is None):
                    raise
                log.warning("%s: node at %s:%d refused the session: %s", self.owner, host, port, exc)
            except (OSError, asyncio.IncompleteReadError, RemoteProtocolError) as exc:
                log.debug("%s: cannot use %s:%d: %s", self.owner, host, port, exc)
            self._index += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX)

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Rule 5: the TCP connection, and TLS when asked."""
        where = f"node at {host}:{port}"
        try:
            return await asyncio.open_connection(host, port, ssl=self.tls)
        except ssl.SSLCertVerificationError as exc:
            raise TlsError(
                f"{where}: its certificate does not verify ({exc.verify_message or exc}): give the client the "
                "cluster's CA (Client(ssl=overlay.security.client_context(ca)), or [tls] ca of the config), "
                f"and reach the node by a name its certificate lists"
            ) from exc
        except ssl.SSLError as exc:
            reason = exc.reason or str(exc)
            if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
                raise TlsError(
                    f"{where} does not speak TLS ({reason}): its cluster runs with [tls] insecure = true — "
                    "connect without ssl"
                ) from exc
            raise TlsError(f"{where}: TLS failed: {reason}") from exc

    async def _handshake(self, host: str, port: int) -> Conn:
        """Rule 2."""
        if self.token_source is not None:  # rule 1: the current token, for this hello
            self.protocol.token = self.token_source()
        reader, writer = await self._connect(host, port)
        protocol = self.protocol
        msgs: list[cm.ClientMessage] = []
        try:
            writer.write(protocol.connect())
            while protocol.state is ConnState.HANDSHAKE:
                data = await reader.read(READ_SIZE)
                if not data:
                    raise ConnectionResetError("the node closed the connection during the hello")
                msgs = protocol.receive_data(data)
                while msgs and protocol.state is ConnState.HANDSHAKE:
                    self._on_events(protocol.receive(msgs.pop(0), time.monotonic(), time.time()))
        except BaseException:
            writer.close()
            if protocol.state is ConnState.HANDSHAKE:
                self._on_events(protocol.connection_lost())
            raise
        log.debug("%s: connected to node %s at %s:%d", self.owner, protocol.node_id, host, port)
        return reader, writer, msgs

    async def serve(self, conn: Conn) -> None:
        """Rule 3: one reader and one writer until either ends."""
        reader, writer, pending = conn
        read = asyncio.create_task(self._read(reader, pending), name=f"{self.owner}: reader")
        write = asyncio.create_task(self._write(writer), name=f"{self.owner}: writer")
        both = {read, write}
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in both:
                task.cancel()
            await asyncio.wait(both)
            writer.close()
            self._out.clear()  # frames for a session that is gone
        for task in both:  # rule 4: a bug costs this connection only
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("%s: %s failed; the connection is dropped", self.owner, task.get_name(), exc_info=exc)

    async def _read(self, reader: asyncio.StreamReader, pending: list[cm.ClientMessage]) -> None:
        try:
            for msg in pending:
                self._on_message(msg)
            while data := await reader.read(READ_SIZE):
                for msg in self.protocol.receive_data(data):
                    self._on_message(msg)
        except OSError as exc:
            log.debug("%s: read failed: %s", self.owner, exc)
        except RemoteProtocolError as exc:
            log.warning("%s: node %s broke the protocol: %s", self.owner, self.protocol.node_id, exc)

    async def _write(self, writer: asyncio.StreamWriter) -> None:
        out = self._out
        try:
            while True:
                while not out:
                    self._out_ready.clear()
                    await self._out_ready.wait()
                write_batch(
                    writer, [out.popleft() for _ in range(min(len(out), WRITE_BATCH))], tls=self.tls is not None
                )
                await writer.drain()
        except OSError as exc:
            log.debug("%s: write failed: %s", self.owner, exc)
