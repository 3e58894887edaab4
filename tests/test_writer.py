"""overlay.net.writer rule 4: a write to a connection the peer reset is an
``OSError``, under uvloop too (whose transports raise ``RuntimeError`` there):
one escaping a writer task ended the node's TaskGroup — a peer killed with
SIGKILL took a survivor down with it (tests/test_node_failures.py found it).
Rule 5: over TLS a batch is one write of the frames joined (one TLS record
per write, not per frame), and arrives whole; plain TCP keeps ``writelines``;
the client's ``write_batch`` does the same."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from overlay.client.transport import write_batch
from overlay.net.queues import TwoLevelQueue
from overlay.net.writer import ConnectionWriter, write_batches, write_frames
from overlay.security import client_context
from overlay.testing import dev_tls

pytestmark = pytest.mark.timeout(30)

# SO_LINGER on, 0 s: close() sends a RST, as the kernel does for a killed process's socket.
RESET_ON_CLOSE = struct.pack("ii", 1, 0)


def on_uvloop(test: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> None:
    """Run ``test`` with a client connection whose server reset it, under uvloop."""

    async def main() -> None:
        async def reset(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
            writer.transport.abort()

        server = await asyncio.start_server(reset, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):  # until the transport saw the reset (no read of ours needed)
                if writer.is_closing():
                    break
                await asyncio.sleep(0.01)
            assert writer.is_closing(), "the reset never reached the transport"
            try:
                await test(writer)
            finally:
                writer.close()

    uvloop.run(main())


def test_a_write_to_a_reset_connection_raises_connection_reset() -> None:
    async def check(writer: asyncio.StreamWriter) -> None:
        with pytest.raises(ConnectionResetError):
            write_frames(writer, [b"frame"])

    on_uvloop(check)


def test_the_batch_writer_ends_with_an_os_error_on_a_reset_connection() -> None:
    async def check(writer: asyncio.StreamWriter) -> None:
        queue: TwoLevelQueue[bytes] = TwoLevelQueue(16)
        queue.put_nowait(b"frame", False)
        with pytest.raises(OSError):
            await asyncio.wait_for(write_batches(queue, writer), 5)

    on_uvloop(check)


def test_a_client_writer_ends_quietly_and_closes_without_raising() -> None:
    async def check(writer: asyncio.StreamWriter) -> None:
        out = ConnectionWriter(writer, 16)
        out.queue.put_nowait(b"frame", False)
        await asyncio.wait_for(out.run(), 5)  # rule 2: ends, does not raise
        out.queue.put_nowait(b"fatal error", False)
        out.close()  # the CloseClient path: nothing raised either

    on_uvloop(check)


class Recorder:
    """The writing half of a StreamWriter, recording its calls; over TLS when ``tls``."""

    def __init__(self, tls: bool) -> None:
        self.tls = tls
        self.calls: list[tuple[str, object]] = []

    def get_extra_info(self, name: str) -> object:
        return object() if self.tls and name == "ssl_object" else None

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, frames: object) -> None:
        self.calls.append(("writelines", list(frames)))  # type: ignore[call-overload]

    def is_closing(self) -> bool:
        return False


def test_over_tls_a_batch_is_one_write_of_the_frames_joined_and_plain_tcp_keeps_writelines() -> None:
    frames = [b"one", b"two", b"three"]
    for tls, expected in ((True, [("write", b"onetwothree")]), (False, [("writelines", frames)])):
        node, client = Recorder(tls), Recorder(tls)
        write_frames(node, frames)  # type: ignore[arg-type]
        write_batch(client, frames, tls=tls)  # type: ignore[arg-type]
        assert node.calls == expected and client.calls == expected


def test_a_batch_written_over_tls_arrives_whole() -> None:
    tls = dev_tls([0])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tls.cert.format(id=0), tls.key.format(id=0))
    frames = [i.to_bytes(4, "big") * 40 for i in range(600)]  # more than one TLS record's 16 KB

    async def main() -> bytes:
        got = bytearray()
        done = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while len(got) < sum(map(len, frames)) and (chunk := await reader.read(65536)):
                got.extend(chunk)
            done.set()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
        async with server:
            port = server.sockets[0].getsockname()[1]
            _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(tls.ca))
            write_frames(writer, frames)
            await writer.drain()
            await asyncio.wait_for(done.wait(), 10)
            writer.close()
        return bytes(got)

    assert uvloop.run(main()) == b"".join(frames)
