"""overlay.net.node.PeerLink: the outbound link to a peer ends cleanly — when
the peer goes away (reconnect, nothing left behind) and when the node stops
it (even when the stop meets the link failing, as 3.11's TaskGroup loses that
cancel: gh-116720)."""

from __future__ import annotations

import asyncio

import pytest

from conftest import LOCAL
from overlay.actions import Action, ToPeer
from overlay.channels.channel import ChannelId
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, encode_frame, peer_reader
from overlay.net.inbox import FromPeer, InboxItem
from overlay.net.peer_link import BATCH_ITEMS, PeerLink
from overlay.testing import WAIT, LoopbackCluster, accept_peer, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


def link_tasks(prefix: str) -> set[str]:
    return {t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(prefix) and not t.done()}


async def _accepting(cl: LoopbackCluster, peer: int, on_connect) -> asyncio.Server:
    return await asyncio.start_server(on_connect, sock=cl.socks[peer])


async def _answer_hello(
    cl: LoopbackCluster, peer: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """The fake peer's side of the link's opening (net.node rules 9 and 15)."""
    await accept_peer(reader, writer, cl.config, peer)
    writer.write(encode_frame(pm.PeerHello(peer, cl.config.cluster.name, incarnation=1)))


async def test_a_peer_closing_the_link_is_reconnected_and_the_old_link_leaves_no_task() -> None:
    cl = LoopbackCluster(LOCAL, 2, placeholders=[1], balancing=False)
    await cl.start(ready=False)
    try:
        link = cl.nodes[0].links[1]
        hellos = 0

        async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal hellos
            await _answer_hello(cl, 1, reader, writer)
            hellos += 1
            if hellos == 1:
                writer.close()  # gone: the node must notice (EOF) and call again
                return
            await reader.read()

        async with await _accepting(cl, 1, close_at_once):
            await wait_until(lambda: hellos == 2 and link.connected.is_set(), WAIT, "a second connection")
            # The first connection's halves ended with it; only the live one's remain.
            assert link_tasks("link-0->1-") == {"link-0->1-watch", "link-0->1-write"}
            assert link.connects == 2
    finally:
        await cl.stop()
    assert asyncio.all_tasks() == {asyncio.current_task()}, "a task outlived the node"


async def test_a_stop_that_meets_the_link_failing_still_stops_the_link() -> None:
    cl = LoopbackCluster(LOCAL, 2, placeholders=[1], balancing=False)
    await cl.start(ready=False)
    fail = asyncio.Event()
    try:
        link = cl.nodes[0].links[1]

        async def watch_then_fail(reader: asyncio.StreamReader) -> None:
            await fail.wait()
            raise ConnectionResetError("peer closed the link")

        link._watch_close = watch_then_fail  # type: ignore[method-assign]

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _answer_hello(cl, 1, reader, writer)
            await reader.read()

        async with await _accepting(cl, 1, hold):
            await wait_until(link.connected.is_set, WAIT, "the link up")
            (task,) = (t for t in asyncio.all_tasks() if t.get_name() == "link-0->1")
            # In one step: the link fails and the node cancels it (a stop).
            fail.set()
            task.cancel()
            await asyncio.wait_for(asyncio.wait({task}), WAIT)
            assert task.cancelled(), "the link swallowed its cancel and went on reconnecting"
    finally:
        await cl.stop()


async def test_frames_a_broken_connection_lost_are_sent_again_once_and_in_order() -> None:
    # net.peer_link rule 6: the link to node 1 is aborted again and again while
    # node 0 sends; node 1's core sees every event once, in the order sent.
    async with LoopbackCluster(LOCAL, 2, balancing=False) as cl:
        got: list[str] = []

        def tap(item: InboxItem) -> list[Action] | None:  # net.dispatch rule 5: seen, not handled
            if type(item) is FromPeer and type(item.msg) is pm.Event and item.msg.event_id.startswith("x"):
                got.append(item.msg.event_id)
                return []
            return None

        cl.nodes[1].dispatcher.intercept(tap)
        link = cl.nodes[0].links[1]
        sent = [f"x{i}" for i in range(6000)]
        ec = cl.nodes[0].core.routing.lookup_event({"price": 1.0, "sym": "A"})
        for k in range(0, len(sent), 500):
            cl.nodes[0].execute(
                [
                    ToPeer(1, pm.Event(eid, {"price": 1.0, "sym": "A"}, 0, pm.DispatchSign.EVENT_DISPATCHED, ec))
                    for eid in sent[k : k + 500]
                ]
            )
            await asyncio.sleep(0)  # the writer takes a batch
            if k % 1000 == 0:
                link.abort()
                await wait_until(link.connected.is_set, WAIT, "the link back up")
        await wait_until(lambda: len(got) >= len(sent), WAIT, "every event at node 1")
        assert got == sent
        assert link.resent > 0  # something was in flight when the connection broke


# -- rule 7: the hot path's messages share frames ---------------------------------------------


def _unbatched(msgs: list[pm.PeerMessage]) -> list[pm.PeerMessage]:
    return [inner for m in msgs for inner in (m.messages if type(m) is pm.Batch else (m,))]


async def test_events_sent_in_one_turn_go_as_batch_frames_in_order_around_other_messages() -> None:
    cl = LoopbackCluster(LOCAL, 2, placeholders=[1], balancing=False)
    await cl.start(ready=False)
    frames_got: list[pm.PeerMessage] = []
    try:
        node = cl.nodes[0]
        link = node.links[1]

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frames, _first = await accept_peer(reader, writer, cl.config, 1)
            writer.write(encode_frame(pm.PeerHello(1, cl.config.cluster.name, incarnation=1)))
            while data := await reader.read(65536):
                frames_got.extend(m for m in frames.feed(data) if type(m) not in (pm.Heartbeat, pm.KeyAsk))

        async with await _accepting(cl, 1, peer):
            await wait_until(link.connected.is_set, WAIT, "the link up")
            ec = ChannelId(0, 0)

            def ev(i: int) -> pm.Event:
                return pm.Event(f"b{i}", {"price": 1.0, "sym": "A"}, 0, pm.DispatchSign.EVENT_DISPATCHED, ec)

            rebuild = pm.Rebuild(ec, ())  # normal, never batched: the batch before it goes first
            sent: list[pm.PeerMessage] = [ev(i) for i in range(300)]
            sent[200:200] = [rebuild]
            node.execute([ToPeer(1, m) for m in sent])
            assert len(link.queue.normal) < len(sent)  # batched, not a frame each
            await wait_until(
                lambda: [m for m in _unbatched(frames_got) if type(m) is not pm.PeerHello] == sent,
                WAIT,
                "every message at the peer, in order",
            )
        batches = [m for m in frames_got if type(m) is pm.Batch]
        assert batches and all(len(b.messages) <= BATCH_ITEMS for b in batches)
        assert len(frames_got) < len(sent) // 10
    finally:
        await cl.stop()


async def test_a_batch_too_large_for_one_frame_is_split_until_each_part_fits() -> None:
    max_frame = 64 * 1024
    link = PeerLink(
        0,
        LOCAL.node(1),
        queue_size=100,
        max_frame=max_frame,
        hello_timeout=1.0,
        hello=lambda: pm.PeerHello(0, "local"),
        answered=lambda node, inc: None,
        changed=lambda node, up: None,
        connect=None,  # type: ignore[arg-type]  # never connects here
        refused=lambda exc: None,
    )
    ec = ChannelId(0, 0)
    msgs: list[pm.PeerMessage] = [
        pm.Event(f"e{i}", {"price": 1.0, "sym": "A"}, 0, pm.DispatchSign.EVENT_DISPATCHED, ec, payload=bytes(9000))
        for i in range(40)
    ]
    frames = link._frames_of(msgs)
    assert 1 < len(frames) < 40
    assert all(len(f) - HEADER.size <= max_frame for f in frames)
    assert _unbatched([m for f in frames for m in peer_reader(max_frame).feed(f)]) == msgs
    # One message over the cap is dropped, counted, and the others still go.
    msgs.insert(3, pm.Event("big", {}, 0, pm.DispatchSign.EVENT_DISPATCHED, ec, payload=bytes(max_frame)))
    frames = link._frames_of(msgs)
    assert link.oversize == 1
    assert [m.event_id for f in frames for m in _unbatched(peer_reader(max_frame).feed(f))] == [  # type: ignore[attr-defined]
        m.event_id  # type: ignore[attr-defined]
        for m in msgs
        if m.event_id != "big"  # type: ignore[attr-defined]
    ]
