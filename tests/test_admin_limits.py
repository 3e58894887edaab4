"""The admin endpoint is bounded (``overlay.net.admin`` rule 8, issue 17 item 4):
idle and half-sent requests time out, a body is bounded in time and size,
and the connections it keeps open are capped — spoken over raw sockets, as
a hostile client would."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from conftest import LOCAL
from overlay.testing import WAIT, LoopbackCluster, wait_until

pytestmark = pytest.mark.timeout(60)

IDLE = 1.0
LIMITS = {"http_idle_timeout": IDLE, "http_body_timeout": IDLE, "http_max_body": 4096}


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (``TimeoutError`` past
    ``timeout``), and how long that took: a lower bound only means something
    — a loaded machine makes every close later, never earlier."""
    t0 = time.monotonic()
    data = b""
    async with asyncio.timeout(timeout):
        try:
            while chunk := await reader.read(4096):
                data += chunk
        except ConnectionResetError:
            pass
    return data, time.monotonic() - t0


async def connect(cl: LoopbackCluster) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", cl.nodes[0].admin_port)


async def test_a_request_whose_head_never_ends_is_closed_after_the_idle_timeout() -> None:
    async with LoopbackCluster(LOCAL, 1, admin=True, limits=LIMITS) as cl:
        reader, writer = await connect(cl)
        writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # headers trickled, never finished
        data, took = await closed_within(reader, WAIT)
        writer.close()
        # Never before the idle timeout; when after it is the machine's (a
        # connection never closed would run into WAIT).
        assert data == b"" and took >= IDLE * 0.9, took
        assert cl.stat("http_timeouts") >= 1


async def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not() -> None:
    async with LoopbackCluster(LOCAL, 1, admin=True, limits=LIMITS) as cl:
        reader, writer = await connect(cl)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 200")  # HTTP/1.1: the connection stays open
        # The server-sent events stream is a request being handled: it outlives the idle timeout.
        sse_reader, sse_writer = await connect(cl)
        sse_writer.write(b"GET /events?interval=0.2 HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(sse_reader.readuntil(b"\r\n\r\n"), WAIT)
        await closed_within(reader, WAIT)  # the idle one goes (within WAIT, or TimeoutError)
        t0 = time.monotonic()
        while time.monotonic() - t0 < IDLE * 2:
            assert await asyncio.wait_for(sse_reader.readuntil(b"\n\n"), WAIT)  # events keep coming
        writer.close()
        sse_writer.close()


async def test_a_trickled_body_is_answered_408_and_closed() -> None:
    async with LoopbackCluster(LOCAL, 1, admin=True, limits=LIMITS) as cl:
        reader, writer = await connect(cl)
        writer.write(b"POST /drain HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"{" * 10)
        data, took = await closed_within(reader, WAIT)
        writer.close()
        assert data.startswith(b"HTTP/1.1 408"), data[:200]
        assert b"took longer than 1s" in data and took >= IDLE * 0.9, took
        assert not cl.nodes[0].core.draining  # nothing was done


async def test_a_body_over_the_limit_is_answered_413() -> None:
    async with LoopbackCluster(LOCAL, 1, admin=True, limits=LIMITS) as cl:
        reader, writer = await connect(cl)
        body = b"x" * 5000
        writer.write(b"POST /drain HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        data, _ = await closed_within(reader, WAIT)
        writer.close()
        assert data.startswith(b"HTTP/1.1 413"), data[:200]
        assert b'"status":413' in data.replace(b" ", b"")
        assert not cl.nodes[0].core.draining


async def test_past_the_connection_limit_the_longest_idle_make_room() -> None:
    limits = {**LIMITS, "http_idle_timeout": 30.0, "http_max_connections": 3}
    async with LoopbackCluster(LOCAL, 1, admin=True, limits=limits) as cl:
        idle = [await connect(cl) for _ in range(5)]
        await wait_until(lambda: cl.stat("http_refused") >= 2, WAIT, "the two oldest idle connections closed")
        # A real request still gets an answer: room is made for it.
        reader, writer = await connect(cl)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data, _ = await closed_within(reader, WAIT)
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        for _, w in [*idle, (reader, writer)]:
            w.close()


@pytest.mark.parametrize(
    "request_",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"GET /status?" + b"x" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_a_request_that_is_not_http_is_a_400_counted_and_one_log_line(
    request_: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule 10: aiohttp logged each of these as an ERROR with its parser's traceback."""
    caplog.set_level(logging.INFO, logger="overlay.admin")
    async with LoopbackCluster(LOCAL, 1, admin=True, limits=LIMITS) as cl:
        reader, writer = await connect(cl)
        writer.write(request_)
        data, _ = await closed_within(reader, WAIT)
        writer.close()
        assert data.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")), data[:200]
        assert cl.stat("http_bad_requests") == 1
        assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
        assert any("bad HTTP request from 127.0.0.1 (400)" in r.getMessage() for r in caplog.records)
        reader, writer = await connect(cl)  # the endpoint still serves
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data, _ = await closed_within(reader, WAIT)
        assert data.startswith(b"HTTP/1.1 200"), data[:200]


async def test_a_tls_handshake_never_finished_is_closed_after_the_hello_timeout() -> None:
    """Rule 9e: over HTTPS, a stranger that opens connections and never
    finishes the handshake held each for asyncio's default (60 s) — before
    any request, where rule 9a's watchdog does not see it."""
    async with LoopbackCluster(LOCAL, 1, tls=True, admin=True, limits={"hello_timeout": IDLE}) as cl:
        assert cl.nodes[0].security.scheme == "https"
        reader, writer = await connect(cl)
        writer.write(b"\x16\x03\x01")  # a TLS record begun, never finished
        data, took = await closed_within(reader, WAIT)
        writer.close()
        assert data == b"" and took >= IDLE * 0.9, took  # never before the timeout
