"""overlay.net.writer rule 4: a write to a connection the peer reset is an
``OSError``, under uvloop too (whose transports raise ``RuntimeError`` there):
one escaping a writer task ended the node's TaskGroup — a peer killed with
SIGKILL took a survivor down with it (tests/test_node_failures.py found it)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from overlay.net.queues import TwoLevelQueue
from overlay.net.writer import ConnectionWriter, write_batches, write_frames

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
