"""overlay.net.node.Node: real nodes in this process, on loopback, ephemeral ports.

Each test starts a small cluster (every node's socket bound to 127.0.0.1:0
first, the config rewritten with the real ports) and talks to it through
``overlay.client.Client`` or raw sockets.  SPEC §1.1 (priority queues), §3,
§4, §9 (bad frames → error and close), §12 (client reconnect).
"""

from __future__ import annotations

import asyncio
import functools
import random
import socket
import struct

import msgspec
import pytest

from conftest import LOCAL
from overlay.actions import ToPeer
from overlay.channels import ChannelId, parse_subscription
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, client_reader, encode_frame
from overlay.net.inbox import FromPeer, InboxItem
from overlay.net.node import CLIENT_MAGIC
from overlay.net.writer import ConnectionWriter
from overlay.testing import (
    WAIT,
    LoopbackCluster,
    accept_peer,
    bound_socket,
    dial_peer,
    override,
    wait_until,
)

pytestmark = pytest.mark.timeout(30)

# No balancer: channels move only when a test says so.
BASE = override(LOCAL, cluster={"balancing": False})
SCHEMA = BASE.schema
EC = ChannelId(0, 0)
# test_peer_queue_bound imports BASE, EC, WAIT and bound_socket from here, and
# test_cli the cluster of these tests by its old name.
Cluster = functools.partial(LoopbackCluster, BASE)
__all__ = ["BASE", "EC", "WAIT", "Cluster", "bound_socket"]


@pytest.fixture
async def cluster():
    async with LoopbackCluster(BASE) as c:
        yield c


async def assert_serving(cluster: LoopbackCluster, node: int = 0) -> None:
    """A well-behaved subscriber and publisher still get through ``node``."""
    sub_client = await cluster.client(node)
    pub_client = await cluster.client((node + 1) % len(cluster.nodes))
    sym = f"S{random.randrange(10**6)}"[:8]
    sub = await sub_client.subscribe(f'sym = "{sym}"')
    eid = await pub_client.publish({"price": 1.0, "sym": sym})
    note = await sub.next(WAIT)
    assert (note.event_id, note.sub_ids, note.event) == (eid, (sub.sub_id,), {"price": 1.0, "sym": sym})


# -- routing through channels spread over the nodes (SPEC §4) -----------------------------------------


SUBS = {
    0: ["price < 100", 'sym = "AB" and price >= 400', "qty > 90"],
    1: ["price >= 500", 'sym in {"CD", "X"}', 'price in [250, 750] and sym != "AB"'],
    2: ['sym prefix "A"', "price > 990", "price >= 0"],
}


def _events(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    prices = [0.0, 50.0, 99.5, 100.0, 250.0, 400.0, 499.0, 500.0, 500.5, 750.0, 991.0, 1000.0]
    out = []
    for _ in range(n):
        e = {"price": rng.choice(prices), "sym": rng.choice(["AB", "CD", "EF", "X", "ABC"])}
        if rng.random() < 0.3:
            e["qty"] = rng.randrange(0, 101)
        out.append(e)
    return out


async def test_subscribers_on_every_node_get_exactly_their_events(cluster):
    ops = await cluster.client(0)
    assert (await ops.admin("split", channel="0.0", attr="price", at=500.0))["update"]
    placed = await ops.admin("place", channel="0.2", node=2)
    assert placed["receiver"] == 2 and placed["channels"] == ["0.2"]
    await ops.admin("split", channel="0.1", attr="sym", values=["AB", "CD"])
    await ops.admin("place", channel="0.3", node=1)
    # Each node reports the channels it now owns.
    for i, owned in {0: ["0.4"], 1: ["0.3"], 2: ["0.2"]}.items():
        st = await (await cluster.client(i)).admin("status")
        assert [c["id"] for c in st["channels"]] == owned
    # Every node's table agrees.
    tables = [n.core.routing for n in cluster.nodes.values()]
    assert all(t == tables[0] for t in tables)

    subscribers = {i: await cluster.client(i) for i in range(3)}
    subs = {
        i: {(await subscribers[i].subscribe(expr, sub_id=f"n{i}s{k}")).sub_id: expr for k, expr in enumerate(exprs)}
        for i, exprs in SUBS.items()
    }
    publishers = [await cluster.client(i) for i in range(3)]
    events = _events(300, seed=3)

    async def publish_all(k: int) -> dict[str, dict]:
        return {await publishers[k].publish(e): e for e in events[k::3]}

    published: dict[str, dict] = {}
    for part in await asyncio.gather(*(publish_all(k) for k in range(3))):
        published.update(part)
    assert len(published) == 300

    # Brute force, from the content model alone.
    expected: dict[int, dict[str, frozenset[str]]] = {}
    for i, table in subs.items():
        filters = {sid: parse_subscription(expr, SCHEMA) for sid, expr in table.items()}
        expected[i] = {}
        for eid, e in published.items():
            hit = frozenset(sid for sid, f in filters.items() if f.matches(e))
            if hit:
                expected[i][eid] = hit
    total = sum(len(v) for v in expected.values())
    assert total > 300

    def received(i: int) -> int:
        return sum(s.queue.qsize() for s in subscribers[i].subscriptions.values())

    deliveries = {i: sum(map(len, expected[i].values())) for i in range(3)}
    await wait_until(lambda: all(received(i) >= deliveries[i] for i in range(3)), what="every notification")
    await wait_until(cluster.quiet, what="quiescence")
    # The nodes sent exactly one Notify per (subscriber, event): no extras in flight.
    assert cluster.stat("notifies_out") == total
    assert cluster.stat("events_matched") == 300
    for i in range(3):
        # Each subscription of the client got each of its events once, with
        # the Notify's list of the client's matching subscriptions.
        got: dict[str, frozenset[str]] = {}
        for sub in subscribers[i].subscriptions.values():
            seen: set[str] = set()
            while not sub.queue.empty():
                note = sub.queue.get_nowait()
                assert note.event_id not in seen, f"event {note.event_id} twice for {sub.sub_id} at node {i}"
                seen.add(note.event_id)
                assert note.event == published[note.event_id] and sub.sub_id in note.sub_ids
                assert got.setdefault(note.event_id, frozenset(note.sub_ids)) == frozenset(note.sub_ids)
            assert seen == {eid for eid, hit in expected[i].items() if sub.sub_id in hit}, sub.sub_id
        assert got == expected[i], i


# -- priority (SPEC §1.1) -------------------------------------------------------------------------------


async def test_high_priority_frame_overtakes_normal_ones_queued_for_a_peer():
    # Node 1 is a socket that refuses connections until we listen on it, so
    # node 0's link to it queues frames; then we accept and read the wire.
    c = LoopbackCluster(BASE, 2, placeholders=[1])
    await c.start(ready=False)
    try:
        node = c.nodes[0]
        link = node.links[1]
        assert not link.connected.is_set()
        normals = [
            pm.Event(f"e{i}", {"price": float(i), "sym": "A"}, 0, pm.DispatchSign.EVENT_DISPATCHED, EC)
            for i in range(50)
        ]
        high = pm.LIEM(0, "STABLE", 1.0, 1.0, 1.0, 7)
        node.execute([ToPeer(1, m) for m in normals] + [ToPeer(1, high)])
        # Only the LIEM is high: the initializer waits to hear from node 1
        # before it initialises (node.boot rule 2), so no RoutingTableInit yet
        # (a new run's KeyAsk, node.keyhome rule 6, is high too: not counted).
        high_queued = [f for f in link.queue.high if b"Heartbeat" not in f and b"KeyAsk" not in f]
        assert [len(high_queued), len(link.queue.normal)] == [1, 50]

        got: list[pm.PeerMessage] = []
        done = asyncio.Event()

        async def fake_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frames, first = await accept_peer(reader, writer, c.config, 1)  # as node 1 would (SPEC §16)
            got.extend(m for m in first if type(m) not in (pm.Heartbeat, pm.KeyAsk))
            answered = False
            # Heartbeats (high, sent every tick) interleave, and the KeyAsk of a
            # new run (high, node.keyhome rule 6): left out here.
            while True:
                if got and not answered:  # the link's hello wants one back (net.node rule 9)
                    writer.write(encode_frame(pm.PeerHello(1, c.config.cluster.name, incarnation=1)))
                    answered = True
                if len(got) >= 52 or not (data := await reader.read(65536)):
                    break
                got.extend(m for m in frames.feed(data) if type(m) not in (pm.Heartbeat, pm.KeyAsk))
            done.set()
            await reader.read()  # hold the link open until the node stops
            writer.close()

        server = await asyncio.start_server(fake_peer, sock=c.socks[1])
        async with server:
            await asyncio.wait_for(done.wait(), WAIT)
        assert [type(m) for m in got[:2]] == [pm.PeerHello, pm.LIEM]
        assert got[1] == high
        assert got[2:52] == normals  # FIFO within the normal level
    finally:
        await c.stop()


async def test_dispatcher_takes_a_high_priority_message_before_queued_normal_ones(cluster):
    # A fake peer writes 200 normal frames then one high one in a single burst;
    # the node's read loop queues them all, and its dispatcher must hand the
    # high one to the core before the normal ones still waiting.
    node = cluster.nodes[0]
    handled: list[str] = []
    waiting_at_high: list[int] = []

    def liem_queued() -> bool:
        return any(type(i) is FromPeer and type(i.msg) is pm.LIEM for i in node.inbox.high)

    async def hold() -> None:  # before each batch (net.dispatch rule 5): held until the LIEM is queued
        if waiting_at_high:
            return
        await wait_until(liem_queued, what="the LIEM queued")
        # The burst's Events, read before it on the same link, wait in the
        # normal queue: there is something to overtake.
        waiting_at_high.append(sum(1 for i in node.inbox.normal if type(i) is FromPeer and i.src == 9))
        handled.append("<LIEM queued>")

    def tap(item: InboxItem) -> None:  # what the core is handed, in order (net.dispatch rule 5)
        if type(item) is FromPeer and item.src == 9:
            handled.append(type(item.msg).__name__)

    node.dispatcher.pace(hold)
    node.dispatcher.intercept(tap)
    # A member the config does not list (node 1's own link is up: one live link per id, SPEC §16).
    _reader, writer = await dial_peer(cluster.config, 9, 0)
    normals = [
        pm.Event(f"x{i}", {"price": 1.0, "sym": "Z"}, 9, pm.DispatchSign.EVENT_DISPATCHED, EC) for i in range(200)
    ]
    burst = encode_frame(pm.PeerHello(9, "local", True))
    burst += b"".join(encode_frame(m) for m in normals) + encode_frame(pm.LIEM(9, "STABLE", 0.0, 0.0, 1.0))
    writer.write(burst)
    await writer.drain()
    try:
        await wait_until(lambda: handled.count("Event") == 200 and "LIEM" in handled, what="every frame handled")
        assert waiting_at_high == [200]  # every Event was waiting when the LIEM was queued
        queued = handled.index("<LIEM queued>")
        assert handled[:queued] == []  # nothing of the burst was handled before
        assert handled[queued + 1] == "LIEM"  # the very next message handled
        assert handled[queued + 2 :] == ["Event"] * 200
    finally:
        node.dispatcher.pace(None)
        node.dispatcher.intercept(None)
        writer.close()


# -- bad input from a client (SPEC §9) -------------------------------------------------------------------


def frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


async def read_until_closed(reader: asyncio.StreamReader) -> tuple[bytes, list[cm.ClientMessage]]:
    magic = await asyncio.wait_for(reader.readexactly(4), WAIT)
    frames = client_reader()
    out: list[cm.ClientMessage] = []
    while data := await asyncio.wait_for(reader.read(65536), WAIT):
        out += frames.feed(data)
    return magic, out


async def read_frames(reader: asyncio.StreamReader, frames, n: int) -> list[cm.ClientMessage]:
    out: list[cm.ClientMessage] = []
    while len(out) < n:
        data = await asyncio.wait_for(reader.read(65536), WAIT)
        assert data, f"closed after {out}"
        out += frames.feed(data)
    return out


FATAL_INPUTS = {
    "garbage bytes": b"\xde\xad\xbe\xef" * 8,
    "garbage in a frame": frame(b"\xc1\xc1\xc1"),
    "oversize frame": HEADER.pack(BASE.cluster.max_frame_size + 1) + b"\x00" * 64,
    "unknown tag": frame(msgspec.msgpack.encode(["Bogus", 1, "x"])),
    "peer message on a client link": encode_frame(pm.PeerHello(1, "local")),
    "wrong field types": frame(msgspec.msgpack.encode(["Publish", "one", 2])),
    "value out of bounds": frame(msgspec.msgpack.encode(["Subscribe", -5, "s", "price < 1"])),
    "deeply nested": frame(b"\x94\xa5Admin\x01\xa6status\x81\xa1a" + b"\x91" * 3000 + b"\x01"),
    "invalid utf-8": frame(b"\x92\xa5Hello\xa2\xc3\x28"),
}


@pytest.mark.parametrize("bad", FATAL_INPUTS.values(), ids=FATAL_INPUTS.keys())
async def test_bad_frame_gets_an_error_then_the_connection_closes(cluster, bad):
    reader, writer = await asyncio.open_connection(*cluster.addr(0))
    writer.write(CLIENT_MAGIC + encode_frame(cm.Hello("raw")))
    try:
        assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
        frames = client_reader()
        (welcome,) = await read_frames(reader, frames, 1)
        assert isinstance(welcome, cm.Welcome)
        writer.write(bad)
        msgs = []
        while data := await asyncio.wait_for(reader.read(65536), WAIT):
            msgs += frames.feed(data)
    finally:
        writer.close()
    (err,) = msgs
    assert isinstance(err, cm.Error) and err.code == cm.ErrorCode.PROTOCOL and err.fatal
    assert cluster.nodes[0].core.stats["rejected_client_protocol"] == 1
    await wait_until(
        lambda: (
            len(cluster.nodes[0].core.sessions) == 0
            or all(s.client_id != "raw" for s in cluster.nodes[0].core.sessions.values())
        ),
        what="session dropped",
    )
    await assert_serving(cluster, 0)


async def test_bad_frame_before_hello_is_refused_too(cluster):
    reader, writer = await asyncio.open_connection(*cluster.addr(1))
    writer.write(CLIENT_MAGIC + frame(b"\xc1"))
    try:
        _magic, msgs = await read_until_closed(reader)
    finally:
        writer.close()
    assert [type(m) for m in msgs] == [cm.Error] and msgs[0].fatal
    await assert_serving(cluster, 1)


async def test_first_frame_must_be_hello(cluster):
    reader, writer = await asyncio.open_connection(*cluster.addr(2))
    writer.write(CLIENT_MAGIC + encode_frame(cm.Publish(1, {"price": 1.0, "sym": "A"})))
    try:
        _, msgs = await read_until_closed(reader)
    finally:
        writer.close()
    assert len(msgs) == 1 and msgs[0].code == cm.ErrorCode.PROTOCOL and msgs[0].fatal
    await assert_serving(cluster, 2)


async def test_unknown_preamble_is_answered_and_closed(cluster):
    reader, writer = await asyncio.open_connection(*cluster.addr(0))
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    try:
        magic, msgs = await read_until_closed(reader)
    finally:
        writer.close()
    assert magic == CLIENT_MAGIC
    assert len(msgs) == 1 and msgs[0].code == cm.ErrorCode.PROTOCOL and msgs[0].fatal
    assert cluster.nodes[0].core.stats["rejected_bad_preamble"] == 1
    await assert_serving(cluster, 0)


async def test_bad_expression_and_bad_event_leave_the_connection_open(cluster):
    reader, writer = await asyncio.open_connection(*cluster.addr(1))
    frames = client_reader()
    try:
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello("raw")))
        assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
        assert isinstance((await read_frames(reader, frames, 1))[0], cm.Welcome)
        writer.write(encode_frame(cm.Subscribe(1, "s", "price >> 3")))
        (err,) = await read_frames(reader, frames, 1)
        assert (err.seq, err.code, err.position, err.fatal) == (1, cm.ErrorCode.BAD_EXPRESSION, 7, False)
        writer.write(encode_frame(cm.Publish(2, "{price: 10}")))
        (err,) = await read_frames(reader, frames, 1)
        assert (err.seq, err.code, err.position) == (2, cm.ErrorCode.BAD_EVENT, 10)
        assert "sym" in err.message
        writer.write(encode_frame(cm.Publish(3, {"price": 10.0})))
        (err,) = await read_frames(reader, frames, 1)
        assert (err.seq, err.code) == (3, cm.ErrorCode.BAD_EVENT) and "sym" in err.message
        # Still the same session: it subscribes and gets its notification.
        writer.write(encode_frame(cm.Subscribe(4, "s", 'sym = "RAW"')))
        (ack,) = await read_frames(reader, frames, 1)
        assert ack == cm.SubAck(4, "s", 1)
        writer.write(encode_frame(cm.Publish(5, '{price: 3, sym: "RAW"}')))
        msgs = await read_frames(reader, frames, 2)
        assert {type(m) for m in msgs} == {cm.PubAck, cm.Notify}
        (note,) = [m for m in msgs if isinstance(m, cm.Notify)]
        assert note.sub_ids == ("s",) and note.event == {"price": 3, "sym": "RAW"}
    finally:
        writer.close()
    await assert_serving(cluster, 1)


# -- client reconnect (SPEC §12, client rule 3) -------------------------------------------------------


async def test_client_reconnects_to_its_next_node_and_resubscribes(cluster):
    c = await cluster.client(0, 1, client_id="mover", reconnect=True)
    pub = await cluster.client(2)
    sub = await c.subscribe("price < 100", sub_id="s")
    e1 = await pub.publish({"price": 1.0, "sym": "A"})
    assert (await sub.next(WAIT)).event_id == e1
    n0, n1 = cluster.nodes[0], cluster.nodes[1]
    (sid,) = [s for s, sess in n0.core.sessions.items() if sess.client_id == "mover"]
    old_gid = n0.core.sessions[sid].subs["s"][0]
    assert old_gid in n0.core.local[EC]

    n0.clients[sid].writer.close()  # the node drops the connection

    def resubscribed() -> bool:
        sessions = [sess for sess in n1.core.sessions.values() if sess.client_id == "mover"]
        return (
            c.node_id == 1
            and len(sessions) == 1
            and "s" in sessions[0].subs
            and sessions[0].subs["s"][0] in n0.core.local[EC]  # applied at the owner
        )

    await wait_until(resubscribed, what="re-subscription through node 1")
    await wait_until(lambda: old_gid not in n0.core.local[EC], what="old subscription dropped")
    e2 = await pub.publish({"price": 2.0, "sym": "A"})
    e3 = await pub.publish({"price": 3.0, "sym": "A"})
    assert [(await sub.next(WAIT)).event_id for _ in range(2)] == [e2, e3]
    await wait_until(cluster.quiet, what="quiescence")
    assert sub.queue.empty()  # nothing twice
    assert c.subscriptions["s"] is sub and not sub.closed


# -- a vanishing slow consumer (STYLE habit 7) ----------------------------------------------------------


async def test_slow_subscriber_that_resets_its_connection_does_not_stop_the_node():
    # Small socket buffers on both ends, so the node's writer for this client
    # blocks in drain() with notifications still queued; then the client
    # resets the connection.  The node drops that client only.
    c = await LoopbackCluster(BASE, sndbuf=4096).start()
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        raw.setblocking(False)
        await asyncio.get_running_loop().sock_connect(raw, c.addr(0))
        reader, writer = await asyncio.open_connection(sock=raw)
        writer.write(
            CLIENT_MAGIC + encode_frame(cm.Hello("slow")) + encode_frame(cm.Subscribe(1, "s", 'sym = "FLOOD"'))
        )
        assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
        frames = client_reader()
        welcome, ack = await read_frames(reader, frames, 2)
        assert isinstance(welcome, cm.Welcome) and isinstance(ack, cm.SubAck)
        node = c.nodes[0]
        (sid,) = [s for s, sess in node.core.sessions.items() if sess.client_id == "slow"]
        out = node.clients[sid]
        pub = await c.client(1)
        # Stop reading; publish until the node's writer for "slow" is stuck.
        for _i in range(20000):
            await pub.publish({"price": 1.0, "sym": "FLOOD", "venue": "x" * 16})
            if len(out.queue) > 10:
                break
        assert len(out.queue) > 10 and out.writer.transport.get_write_buffer_size() > 0
        # Reset (not a clean close): SO_LINGER 0.
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        await wait_until(lambda: sid not in node.clients, what="the slow client dropped")
        assert not any(t.done() for t in c.tasks.values()), "a node stopped"
        await assert_serving(c, 0)
    finally:
        await c.stop()


async def test_a_client_writer_whose_connection_was_reset_ends_quietly():
    # The writer task lives in the node's TaskGroup: an OSError escaping it
    # would stop the whole node, so it must end that connection only.
    async def reset_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    server = await asyncio.start_server(reset_at_once, "127.0.0.1", 0)
    async with server:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(10), WAIT)
        out = ConnectionWriter(writer, 10)
        out.queue.put_nowait(encode_frame(cm.Ack("e")), False)
        await asyncio.wait_for(out.run(), WAIT)  # returns instead of raising
        assert writer.is_closing()
