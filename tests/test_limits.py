"""Bounded resources for every connection (SPEC §16, issue 17 item 4), on real nodes.

Per client id (``overlay.node.clients`` rules L1–L4): connections,
subscriptions, expression sizes, publish rate.  Per node
(``overlay.net.clients`` rules 6–7): connections, the Hello's deadline, the
budget of queued bytes and the slow-consumer policy.  The admin endpoint's
timeouts and bounds are in ``tests/test_admin_limits.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
from prometheus_client import generate_latest

from authkit import auth, token
from conftest import LOCAL
from overlay.client import Client
from overlay.errors import OverlayError, RequestError, SlowConsumerError
from overlay.messages import client as cm
from overlay.messages.codec import HEADER, client_reader, encode_frame
from overlay.net.node import CLIENT_MAGIC
from overlay.testing import WAIT, LoopbackCluster, wait_until

pytestmark = pytest.mark.timeout(90)


def ev(i: int, pad: int = 16) -> dict:
    return {"price": float(i % 1000), "sym": "FLOOD", "qty": i, "venue": "x" * pad}


async def raw_session(
    cl: LoopbackCluster, node: int, hello: str, *frames: cm.ClientMessage, rcvbuf: int = 0, tls: bool = False
):
    """A raw connection that says Hello (and sends ``frames``); its reader,
    writer and the first replies.  With ``rcvbuf``, tiny socket buffers and a
    reader that holds 1 kB: once it stops reading, the node's writer for it
    waits at once.  With ``tls``, over TLS (a cluster started with ``tls=True``)."""
    loop = asyncio.get_running_loop()
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.setblocking(False)
    await loop.sock_connect(raw, cl.addr(node))
    tls_args = {"ssl": cl.client_ssl, "server_hostname": cl.addr(node)[0]} if tls else {}
    reader, writer = await asyncio.open_connection(sock=raw, limit=1024 if rcvbuf else 1 << 16, **tls_args)
    writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(hello)) + b"".join(encode_frame(f) for f in frames))
    assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
    return reader, writer


async def read_until(reader: asyncio.StreamReader, n: int) -> list[cm.ClientMessage]:
    frames = client_reader()
    got: list[cm.ClientMessage] = []
    while len(got) < n:
        data = await asyncio.wait_for(reader.read(4096), WAIT)
        assert data, f"closed after {got}"
        got += frames.feed(data)
    return got


async def read_until_fatal(reader: asyncio.StreamReader) -> list[cm.ClientMessage]:
    """What the node still sends, up to its fatal Error (or the connection's end)."""
    frames = client_reader()
    got: list[cm.ClientMessage] = []
    with contextlib.suppress(ConnectionResetError):
        while not any(isinstance(m, cm.Error) and m.fatal for m in got[-4:]):
            data = await asyncio.wait_for(reader.read(1 << 16), WAIT)
            if not data:
                break
            got += frames.feed(data)
    return got


def session_of(cl: LoopbackCluster, node: int, client_id: str) -> int:
    (sid,) = [s for s, sess in cl.nodes[node].core.sessions.items() if sess.client_id == client_id]
    return sid


# -- per client id (node.clients rules L1–L4) ---------------------------------------------------


async def test_a_client_id_past_its_connections_is_refused_at_hello_and_welcome_again_once_one_closes() -> None:
    async with LoopbackCluster(LOCAL, 1, limits={"max_connections": 2}) as cl:
        first = await cl.client(0, client_id="many")
        await cl.client(0, client_id="many")
        await cl.client(0, client_id="other")  # another client id counts apart
        with pytest.raises(RequestError) as info:
            await Client([cl.addr(0)], client_id="many", reconnect=False).connect()
        assert info.value.code == cm.ErrorCode.TOO_MANY_CONNECTIONS
        assert "'many' has 2 connections open on node 0" in info.value.reason
        assert "[limits] max_connections = 2" in info.value.reason
        assert cl.stat("rejected_too_many_connections") == 1
        await first.close()
        await wait_until(lambda: cl.nodes[0].core.clients.quotas.connections("many") == 1, what="the close counted")
        await cl.client(0, client_id="many")


async def test_the_twenty_thousand_subscription_client_is_refused_past_its_limit() -> None:
    """The issue's client: 20,000 subscriptions from one anonymous connection,
    pipelined.  The first 10,000 (the default limit) are taken, every later one
    is refused with too_many_subscriptions; the session stays open, and an
    unsubscribe makes room again."""
    async with LoopbackCluster(LOCAL, 1, balancing=False) as cl:
        raw = await cl.raw(0)
        replies = await asyncio.wait_for(
            asyncio.gather(
                *(
                    raw.request_nowait(lambda seq, i=i: cm.Subscribe(seq, f"s{i}", f"price > {i % 1000} and qty = {i}"))
                    for i in range(20_000)
                )
            ),
            60,
        )
        acked = [r for r in replies if isinstance(r, cm.SubAck)]
        refused = [r for r in replies if isinstance(r, cm.Error)]
        assert len(acked) == 10_000 and len(refused) == 10_000
        assert {r.code for r in refused} == {cm.ErrorCode.TOO_MANY_SUBSCRIPTIONS}
        assert "holds 10000 subscriptions on node 0" in refused[0].message
        assert "[limits] max_subscriptions = 10000" in refused[0].message
        assert cl.stat("rejected_too_many_subscriptions") == 10_000
        assert sum(len(ch) for ch in cl.nodes[0].core.local) == 10_000  # nothing refused was stored
        assert isinstance(await raw.request(lambda seq: cm.Unsubscribe(seq, "s0")), cm.UnsubAck)
        assert isinstance(await raw.subscribe("price < 1", sub_id="again"), cm.SubAck)
        assert isinstance(await raw.publish(ev(1)), cm.PubAck)  # the session serves on


async def test_an_oversize_expression_is_refused_by_bytes_and_by_predicates() -> None:
    async with LoopbackCluster(LOCAL, 1, limits={"max_expression_bytes": 200, "max_predicates": 3}) as cl:
        c = await cl.client(0, client_id="wordy")
        long = 'sym in {"' + '", "'.join(f"S{i}" for i in range(40)) + '"}'
        with pytest.raises(RequestError) as info:
            await c.subscribe(long)
        assert info.value.code == cm.ErrorCode.EXPRESSION_TOO_LARGE
        assert "[limits] max_expression_bytes = 200" in info.value.reason
        with pytest.raises(RequestError) as info:
            await c.subscribe("price > 1 and price < 9 and qty > 1 and qty < 9")
        assert info.value.code == cm.ErrorCode.EXPRESSION_TOO_LARGE
        assert "4 predicates" in info.value.reason and "[limits] max_predicates = 3" in info.value.reason
        sub = await c.subscribe("price > 1 and price < 9 and qty > 1")  # at the limit: taken
        await c.publish({"price": 5.0, "sym": "A", "qty": 5})
        assert (await sub.next(WAIT)).event["qty"] == 5
        assert cl.stat("rejected_expression_too_large") == 2


async def test_a_publisher_over_its_rate_is_paced_by_choke_and_loses_nothing() -> None:
    rate, burst, n = 200.0, 20, 300
    async with LoopbackCluster(LOCAL, 1, limits={"publish_rate": rate, "publish_burst": burst}) as cl:
        sub = await (await cl.client(0, client_id="reader")).subscribe('sym = "FLOOD"', queue_size=n)
        pub = await cl.client(0, client_id="fast")
        t0 = time.monotonic()
        for i in range(n):
            await pub.publish_windowed(ev(i), window=4000)
        await pub.flush(timeout=30)
        elapsed = time.monotonic() - t0
        assert pub.publish_errors == 0 and pub.chokes > 0
        assert cl.stat("choked_rate_limited") > 0
        assert elapsed >= (n - burst) / rate * 0.9, elapsed  # paced at the rate (the burst goes at once)
        got = sorted([(await sub.next(WAIT)).event["qty"] for _ in range(n)])
        assert got == list(range(n))  # every one delivered, once
        # A plain publish waits its turn as well (the bucket refilled meanwhile: a burst goes first).
        t1 = time.monotonic()
        for i in range(n, n + 60):
            await pub.publish(ev(i))
        assert time.monotonic() - t1 >= (60 - burst) / rate * 0.8


async def test_past_max_clients_a_connection_is_refused_before_it_is_a_session() -> None:
    async with LoopbackCluster(LOCAL, 1, limits={"max_clients": 2}) as cl:
        await cl.client(0)
        await cl.client(0)
        with pytest.raises(RequestError) as info:
            await Client([cl.addr(0)], reconnect=False).connect()
        assert info.value.code == cm.ErrorCode.TOO_MANY_CONNECTIONS
        assert "[limits] max_clients = 2" in info.value.reason
        assert len(cl.nodes[0].core.sessions) == 2


async def test_the_subscriptions_a_node_holds_are_bounded_every_client_id_together() -> None:
    """node.clients rule L2, limits.quotas rule 3: client ids are free without
    [auth], so per client id limits did not bound a node's table (50,000
    subscriptions of 5 made-up ids took +65 MB in 34 s; nothing stopped 10,000
    ids at 10,000 each).  Past max_node_subscriptions every subscribe is refused."""
    async with LoopbackCluster(LOCAL, 1, limits={"max_node_subscriptions": 4}) as cl:
        first, second = await cl.raw(0), await cl.raw(0)
        for k in range(2):
            for c in (first, second):
                assert isinstance(await c.subscribe(f"price < {k + 1}"), cm.SubAck)
        third = await cl.raw(0)  # a client id of its own, holding nothing
        err = await third.subscribe("price < 9", sub_id="x")
        assert isinstance(err, cm.Error) and err.code == cm.ErrorCode.TOO_MANY_SUBSCRIPTIONS, err
        assert "[limits] max_node_subscriptions = 4" in err.message
        assert cl.stat("rejected_too_many_subscriptions") == 1
        await first.close()  # its subscriptions end with its session: room again
        await wait_until(
            lambda: cl.nodes[0].core.sessions.subscription_count() == 2, what="the closed session's subscriptions gone"
        )
        assert isinstance(await third.subscribe("price < 9", sub_id="x"), cm.SubAck)


async def test_a_connection_without_a_hello_is_closed_after_the_deadline() -> None:
    async with LoopbackCluster(LOCAL, 1, limits={"hello_timeout": 0.5}) as cl:
        reader, writer = await asyncio.open_connection(*cl.addr(0))
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello("half"))[:3])  # a frame begun, never finished
        assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
        assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed by the node
        writer.close()
        assert cl.stat("hello_timeouts") == 1
        await wait_until(lambda: not cl.nodes[0].core.sessions, what="the session gone")


def test_the_largest_hello_fits_the_first_frames_bound() -> None:
    # Every character of the id and the token at 4 bytes of UTF-8: still a Hello the node reads.
    hello = cm.Hello("\U0001f600" * 256, cm.PROTOCOL_VERSION, "\U0001f600" * (16 * 1024))
    assert len(encode_frame(hello)) <= HEADER.size + cm.MAX_HELLO_FRAME


async def test_a_first_frame_longer_than_any_hello_is_refused_at_its_header() -> None:
    """net.clients rule 6 (found by the second outside audit): a stranger's
    first frame declaring 1 MiB was buffered whole, within hello_timeout —
    200 such connections took +223 MB of the node's memory for 10 s.  No Hello
    is that long: refused when its header arrives, before its body."""
    async with LoopbackCluster(LOCAL, 1, limits={"hello_timeout": 60.0}, max_payload=200_000) as cl:
        reader, writer = await asyncio.open_connection(*cl.addr(0))
        writer.write(CLIENT_MAGIC + HEADER.pack(1 << 20) + b"x" * 1000)
        assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
        got = await read_until_fatal(reader)  # well before hello_timeout: refused, not timed out
        writer.close()
        assert isinstance(got[-1], cm.Error) and got[-1].fatal, got
        assert f"longer than any Hello ({cm.MAX_HELLO_FRAME} bytes)" in got[-1].message, got
        assert cl.stat("rejected_client_protocol") == 1 and cl.stat("hello_timeouts") == 0
        await wait_until(lambda: not cl.nodes[0].core.sessions, what="the session gone")
        # A Hello with a big frame pipelined behind it in the same write is served.
        reader, writer = await asyncio.open_connection(*cl.addr(0))
        big = cm.Publish(1, {"price": 1.0, "sym": "A"}, payload=b"x" * (cm.MAX_HELLO_FRAME + 10))
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello("pipelined")) + encode_frame(big))
        assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
        assert [type(m) for m in await read_until(reader, 2)] == [cm.Welcome, cm.PubAck]
        writer.close()


async def test_a_frame_begun_and_never_finished_is_closed_and_a_whole_one_keeps_the_session() -> None:
    """net.clients rule 6: a session that says Hello, subscribes, then begins a
    big frame and stalls held its bytes for good; now it is closed, told why,
    while a session idle between whole frames stays."""
    limits = {"hello_timeout": 0.5, "slow_consumer_grace": 0.4}  # a sweep every 0.1 s
    async with LoopbackCluster(LOCAL, 1, limits=limits) as cl:
        idle_reader, idle_writer = await raw_session(cl, 0, "idle", cm.Subscribe(1, "s", "price < 5"))
        reader, writer = await raw_session(cl, 0, "stalled", cm.Subscribe(1, "s", "price < 5"))
        big = encode_frame(cm.Publish(2, {"price": 1.0, "sym": "A"}, payload=b"x" * 50_000))
        writer.write(big[: len(big) // 2])
        assert [type(m) for m in await read_until(reader, 2)] == [cm.Welcome, cm.SubAck]
        got = await read_until_fatal(reader)
        writer.close()
        assert isinstance(got[-1], cm.Error) and "not finished within 0.5s" in got[-1].message, got
        assert cl.stat("frame_timeouts") == 1
        await wait_until(lambda: len(cl.nodes[0].core.sessions) == 1, what="the stalled session gone")
        # The idle one, past several sweeps, is still served.
        assert [type(m) for m in await read_until(idle_reader, 2)] == [cm.Welcome, cm.SubAck]
        idle_writer.write(encode_frame(cm.Publish(2, {"price": 1.0, "sym": "A"})))
        assert {type(m) for m in await read_until(idle_reader, 2)} == {cm.PubAck, cm.Notify}
        idle_writer.close()


# -- slow consumers (net.clients rule 7) ----------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_subscriber_that_never_reads_is_disconnected_after_the_grace_and_the_others_keep_receiving(
    tls: bool,
) -> None:
    grace = 1.0
    async with LoopbackCluster(
        LOCAL, 1, balancing=False, sndbuf=4096, tls=tls, limits={"slow_consumer_grace": grace}
    ) as cl:
        node = cl.nodes[0]
        stuck_sub = cm.Subscribe(1, "s", 'sym = "FLOOD"')
        reader, writer = await raw_session(cl, 0, "stuck", stuck_sub, rcvbuf=2048, tls=tls)
        try:
            welcome, ack = await read_until(reader, 2)
            assert isinstance(welcome, cm.Welcome) and isinstance(ack, cm.SubAck)
            stuck = session_of(cl, 0, "stuck")
            live = [await cl.raw(0) for _ in range(2)]
            for r in live:
                await r.subscribe('sym = "FLOOD"')
            pub = await cl.raw(0)
            published = 0

            async def publish_until(cond) -> None:
                nonlocal published
                deadline = time.monotonic() + 30
                while not cond():
                    assert time.monotonic() < deadline, "timed out publishing"
                    acks = await asyncio.gather(*(pub.publish_nowait(ev(published + i)) for i in range(50)))
                    assert all(isinstance(a, cm.PubAck) for a in acks), acks
                    published += 50

            # Stuck: its writer waits on it while the others read everything.
            await publish_until(lambda: node.clients[stuck].account.waiting_since > 0)
            t_stuck = time.monotonic()
            await publish_until(lambda: node.core.stats["slow_consumer_disconnects"] > 0)
            assert time.monotonic() - t_stuck >= grace * 0.9  # not before its grace
            assert node.core.stats["slow_consumer_disconnects_stalled"] == 1
            assert stuck not in node.clients
            await wait_until(lambda: node.core.session(stuck) is None, what="its session closed in the core")
            assert node.connections.budget.total < node.config.limits.queue_budget
            assert sum(w.account.bytes for w in node.clients.values()) == node.connections.budget.total
            # The others got everything, and keep getting what comes next.
            before = published
            await publish_until(lambda: published >= before + 200)
            for r in live:
                await wait_until(lambda r=r: len(r.notes) == published, what="every event at a live subscriber")
                assert len({n.event_id for n in r.notes}) == published
            assert node.core.stats["slow_consumer_dropped"] > 0
            # Counted where an operator looks: /status and /metrics.
            status = node.admin.node_status()["clients"]
            assert status["slow_consumer_disconnects"] == 1 and status["queued_bytes"] < status["queue_budget"]
            metrics = generate_latest(node.admin.registry).decode()
            assert 'overlay_slow_consumer_disconnects_total{node="0",reason="stalled"} 1.0' in metrics
        finally:
            writer.close()


async def test_past_the_budget_the_largest_holder_is_disconnected_and_told_why() -> None:
    budget = 256 * 1024
    async with LoopbackCluster(
        LOCAL, 1, balancing=False, sndbuf=4096, limits={"queue_budget": budget, "slow_consumer_grace": 60.0}
    ) as cl:
        node = cl.nodes[0]
        node.connections.linger = 30.0  # time enough, on a loaded machine, to read its last words below
        reader, writer = await raw_session(cl, 0, "hoarder", cm.Subscribe(1, "s", 'sym = "FLOOD"'), rcvbuf=2048)
        try:
            await read_until(reader, 2)
            live = await cl.raw(0)
            await live.subscribe('sym = "FLOOD"')
            pub = await cl.raw(0)
            sent = 0
            deadline = time.monotonic() + 30
            while not node.core.stats["slow_consumer_disconnects"]:
                assert time.monotonic() < deadline, "the hoarder was never cut"
                acks = await asyncio.gather(*(pub.publish_nowait(ev(sent + i, pad=16)) for i in range(50)))
                assert all(isinstance(a, cm.PubAck) for a in acks)
                sent += 50
            assert node.core.stats["slow_consumer_disconnects_budget"] == 1
            assert node.connections.budget.total <= budget
            # It reads at last, within the linger: what the transport held, then the node's last word.
            tail = await read_until_fatal(reader)
            errors = [m for m in tail if isinstance(m, cm.Error)]
            assert errors and errors[-1].code == cm.ErrorCode.SLOW_CONSUMER and errors[-1].fatal, errors
            assert "[limits] queue_budget" in errors[-1].message and "more than its share" in errors[-1].message
            await wait_until(lambda: len(live.notes) == sent, what="every event at the live subscriber")
        finally:
            writer.close()


async def test_a_group_instance_cut_as_a_slow_consumer_has_its_events_go_to_another_instance() -> None:
    """What the cut session held is not lost to its group: the session's
    tracked deliveries fail with it, and the group's fault logic gives them
    to the live instance (node.notify), each event once."""
    async with LoopbackCluster(
        LOCAL,
        1,
        balancing=False,
        sndbuf=4096,
        limits={"slow_consumer_grace": 1.0},
        groups={"ack_timeout": 60.0, "fault_period": 60.0},
        # The stuck instance's failed deliveries reach the live one at once when it
        # is cut: a queue that holds them all, or the live instance overflows too and
        # they come back to the publisher as undeliverable (clients rule 3).
        client_queue=200_000,
    ) as cl:
        node = cl.nodes[0]
        reader, writer = await raw_session(
            cl, 0, "stuck-instance", cm.Subscribe(1, "s", 'sym = "FLOOD"', "g", 9.0), rcvbuf=2048
        )
        try:
            await read_until(reader, 2)
            live = await cl.raw(0)
            await live.subscribe('sym = "FLOOD"', group="g", weight=1.0)
            pub = await cl.raw(0)
            n = 0
            deadline = time.monotonic() + 30
            while not node.core.stats["slow_consumer_disconnects"]:
                assert time.monotonic() < deadline, "never cut"
                acks = await asyncio.gather(*(pub.publish_nowait(ev(n + i)) for i in range(50)))
                assert all(isinstance(a, cm.PubAck) for a in acks)
                n += 50
            # What the stuck instance was sent but never acked comes to the live one; what it
            # had read from its socket before it stopped may have been acked (the raw reader
            # acks nothing: none was) — so every event is at the live instance, once.
            await wait_until(lambda: len({x.event_id for x in live.notes}) == n, 30, "every event at the live instance")
            assert len(live.notes) == n
            assert node.core.stats["delivery_ack_timeouts"] == 0  # none waited for the 60 s timeout
        finally:
            writer.close()


async def test_the_client_library_reports_the_disconnection_and_reconnects() -> None:
    """A Client whose connection the node cuts (here: told so by a budget cut
    of its session) hands error_cb a SlowConsumerError with disconnected set,
    and subscribes again on its own."""
    async with LoopbackCluster(LOCAL, 1, balancing=False) as cl:
        seen: list[OverlayError] = []
        c = await cl.client(0, client_id="victim", reconnect=True, error_cb=seen.append)
        sub = await c.subscribe('sym = "FLOOD"')
        node = cl.nodes[0]
        sid = session_of(cl, 0, "victim")
        node.connections.cut(sid, "budget", "a test says so")
        await wait_until(
            lambda: any(isinstance(e, SlowConsumerError) and e.disconnected for e in seen), what="the report"
        )
        err = next(e for e in seen if isinstance(e, SlowConsumerError))
        assert "a test says so" in str(err) and err.node_id == 0
        await wait_until(lambda: len(node.core.sessions) == 1 and session_of(cl, 0, "victim") != sid, what="back")
        pub = await cl.client(0)
        await wait_until(lambda: c.connected, what="reconnected")
        await wait_until(lambda: sum(len(ch) for ch in node.core.local) == 1, what="re-subscribed")
        await pub.publish(ev(1))
        assert (await sub.next(WAIT)).event["qty"] == 1


async def test_a_token_limits_claim_overrides_the_cluster_limits_for_its_holder() -> None:
    async with LoopbackCluster(LOCAL, 1, auth=auth(), limits={"max_subscriptions": 2}) as cl:
        big = await cl.client(0, token=token("big", limits={"max_subscriptions": 4}))
        small = await cl.client(0, token=token("small"))
        for i in range(4):
            await big.subscribe(f"price > {i}")
        with pytest.raises(RequestError) as info:
            await big.subscribe("price > 9")
        assert "your token's limits claim max_subscriptions = 4" in info.value.reason
        for i in range(2):
            await small.subscribe(f"price > {i}")
        with pytest.raises(RequestError) as info:
            await small.subscribe("price > 9")
        assert "[limits] max_subscriptions = 2" in info.value.reason
