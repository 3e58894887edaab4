"""overlay.net.node.Node carrying out the core's actions (net.node rule 12):
real nodes in this process on loopback, as in test_node, whose cluster
settings (BASE) these tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import pytest

from overlay.actions import CloseClient, Notifies, ToClient, ToPeer
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import encode_frame
from overlay.net.node import Node
from overlay.net.writer import ConnectionWriter
from overlay.testing import (
    WAIT,
    LoopbackCluster,
    insecure_tls,
    wait_until,
)
from overlay.testing.proxy import Proxy
from test_node import BASE

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def cluster():
    async with LoopbackCluster(BASE) as c:
        yield c


# -- carrying out the core's actions (net.node rule 12) ---------------------------------------------------


async def test_an_action_the_shell_does_not_know_is_logged_and_counted_not_skipped(caplog):
    node = Node(msgspec.structs.replace(BASE, tls=insecure_tls()), 0)  # not running: nothing is sent anywhere
    caplog.set_level(logging.ERROR, logger="overlay.net")
    node.execute([ToClient(99, cm.Ack("e")), ("Teleport", 1)])  # type: ignore[list-item]
    assert node.core.stats["shell_unknown_actions"] == 1
    assert "an action the shell does not know: ('Teleport', 1)" in caplog.text


async def test_the_connections_carry_out_the_actions_in_order_handing_back_those_not_for_a_client():
    """net.clients rule 10: ToClient, Notifies and CloseClient are carried out
    by the connections; every other action goes back to the node, in its
    turn — after what came before it was queued, before what comes after."""
    node = Node(msgspec.structs.replace(BASE, tls=insecure_tls()), 0)  # not running: frames only queue
    conns = node.connections
    conns.writers[1] = ConnectionWriter(None, 10, budget=conns.budget, sid=1)  # type: ignore[arg-type]
    queue = conns.writers[1].queue
    a, b = cm.Notify("e1", {"price": 1.0}, ("s1",)), cm.Notify("e2", {"price": 2.0}, ("s1",))
    seen: list[tuple[object, int]] = []
    acts = [ToClient(1, a), ("Teleport", 1), Notifies(b, [1], [("s1",)]), ToPeer(2, pm.LinkAck(1))]
    conns.carry_out(acts, lambda act: seen.append((act, len(queue))))  # type: ignore[arg-type]
    assert seen == [(("Teleport", 1), 1), (ToPeer(2, pm.LinkAck(1)), 2)]
    assert list(queue.normal) == [encode_frame(a), encode_frame(b)]


async def test_a_proxy_in_front_of_the_connections_sees_every_action_for_a_client():
    """overlay.testing.proxy: a test that puts a Proxy where the node looks its
    connections up sees each ToClient, Notifies and CloseClient through it,
    as before the compiled connections carried them out themselves."""
    node = Node(msgspec.structs.replace(BASE, tls=insecure_tls()), 0)  # not running: nothing is sent anywhere
    seen: list[tuple[str, object]] = []
    node.connections = Proxy(  # type: ignore[assignment]
        node.connections,
        send=lambda sid, msg: seen.append(("send", sid)),
        send_notifies=lambda msg, sessions, sub_ids: seen.append(("send_notifies", tuple(sessions))),
        close=lambda sid, reason: seen.append(("close", sid)),
    )
    note = cm.Notify("e1", {"price": 1.0}, ("s1",))
    node.execute([ToClient(1, note), Notifies(note, [2, 3], [("s1",), ("s1",)]), CloseClient(1, "bye")])
    assert seen == [("send", 1), ("send_notifies", (2, 3)), ("close", 1)]


async def test_a_connection_writer_s_flush_returns_once_what_was_queued_went_out():
    received = bytearray()
    got_all = asyncio.Event()
    frames = [encode_frame(cm.Ack(f"e{i}")) for i in range(20)]

    async def read_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            received.extend(data)
            if len(received) == sum(map(len, frames)):
                got_all.set()
        writer.close()

    server = await asyncio.start_server(read_all, "127.0.0.1", 0)
    async with server:
        _reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        out = ConnectionWriter(writer, 100)
        for f in frames:
            out.queue.put_nowait(f, False)
        task = asyncio.create_task(out.run())
        try:
            await asyncio.wait_for(out.flush(WAIT), WAIT)
            assert not len(out.queue)
            await asyncio.wait_for(got_all.wait(), WAIT)
            assert bytes(received) == b"".join(frames)
            await asyncio.wait_for(out.flush(WAIT), WAIT)  # nothing queued: at once
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            writer.close()


async def test_one_notify_for_several_sessions_is_encoded_once():
    """net.clients rule 8: the same message object to several sessions in a
    row goes out as the same frame bytes, encoded once."""
    node = Node(msgspec.structs.replace(BASE, tls=insecure_tls()), 0)  # not running: frames only queue
    conns = node.connections
    for sid in (1, 2, 3):
        conns.writers[sid] = ConnectionWriter(None, 10, budget=conns.budget, sid=sid)  # type: ignore[arg-type]
    note = cm.Notify("e1", {"price": 1.0}, ("s1",), payload=b"x" * 100)
    other = cm.Notify("e1", {"price": 1.0}, ("s2",), payload=b"x" * 100)
    node.execute([ToClient(1, note), ToClient(2, note), ToClient(3, other)])
    (f1,), (f2,), (f3,) = (list(conns.writers[sid].queue.normal) for sid in (1, 2, 3))
    assert f1 is f2 and f1 == encode_frame(note)
    assert f3 == encode_frame(other)


async def test_one_event_s_notifies_go_to_each_session_as_its_own_notify_would():
    """net.clients rule 8: a Notifies action queues, for each session, the
    frame of that session's own Notify — one frame object per distinct
    sub_ids; a full queue drops it (rule 3) and a cut session discards it
    (rule 7c), each counted as its own ToClient's would be."""
    node = Node(msgspec.structs.replace(BASE, tls=insecure_tls()), 0)  # not running: frames only queue
    conns = node.connections
    for sid in (1, 2, 3, 4):
        conns.writers[sid] = ConnectionWriter(None, 1, budget=conns.budget, sid=sid)  # type: ignore[arg-type]
    conns.writers[4].queue.put_nowait(b"held", False)  # full: its Notify is dropped
    conns._cut.add(5)  # cut as a slow consumer, before the core knew
    note = cm.Notify("e1", {"price": 1.0}, ("s1",), 2.0, payload=b"x" * 100)
    ids = [("s1",), ("s1",), ("s2", "s3"), ("s1",), ("s9",), ("s1",)]
    node.execute([Notifies(note, [1, 2, 3, 4, 5, 6], ids)])  # 6: no such session
    (f1,), (f2,), (f3,) = (list(conns.writers[sid].queue.normal) for sid in (1, 2, 3))
    assert f1 is f2 and f1 == encode_frame(note)
    assert f3 == encode_frame(msgspec.structs.replace(note, sub_ids=("s2", "s3")))
    assert list(conns.writers[4].queue.normal) == [b"held"]
    stats = node.core.ctx.stats
    assert stats["slow_consumer_drops"] == 1 and stats["slow_consumer_dropped"] == 1
    assert conns.writers[4].queue.high  # the slow_consumer Error, once
    assert [(a.session, a.msg.sub_ids) for a in Notifies(note, [1, 3], [("s1",), ("s2",)]).each()] == [
        (1, ("s1",)),
        (3, ("s2",)),
    ]


async def test_a_client_that_takes_pubacks_gets_a_burst_s_pubacks_in_few_frames(cluster):
    """net.clients rule 9: a Hello of version BATCHED_ACKS gets PubAcks frames,
    each publish answered once, in order; an older client a PubAck each."""
    sub = await cluster.raw(1, version=cm.BATCHED_ACKS)  # its subscription lives across the nodes
    await sub.subscribe('sym = "PA"')
    new = await cluster.raw(0, version=cm.BATCHED_ACKS)
    old = await cluster.raw(0)
    for client, n in ((new, 300), (old, 50)):
        futs = [client.publish_nowait({"price": float(i), "sym": "PA"}) for i in range(n)]
        acks = await asyncio.wait_for(asyncio.gather(*futs), WAIT)
        assert all(isinstance(a, cm.PubAck) for a in acks)
        assert len({a.event_id for a in acks}) == n  # type: ignore[attr-defined]
    assert 1 <= new.pubacks_frames < 300
    assert old.pubacks_frames == 0
    await wait_until(lambda: len(sub.notes) == 350)
    for c in (sub, new, old):
        await c.close()
