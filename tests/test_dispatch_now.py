"""``net.dispatch`` rule 6: a client's Publishes read while the inbox is empty
are handled at once from its read loop, in order, as the dispatcher would
handle them queued — and the rest of the read (another kind of message, or
what is past one slice) is queued behind them.

Against a loopback node, one read at a time (every frame of a step written in
one write); and ``Dispatcher.publishes_now`` on its own over a sans-IO core
(its slice, and the tests' taps and paces).  Rule 7 likewise for a peer's
messages (``Dispatcher.peers_now``): across a loopback cluster, and over a
sans-IO core against the dispatcher handling the same messages queued."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from authkit import auth, token
from conftest import LOCAL
from coreworld import World
from overlay.actions import Action, Notifies, ToClient, ToPeer
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import client_reader, encode_frame
from overlay.net.dispatch import DISPATCH_BATCH, Dispatcher, SlowLog
from overlay.net.inbox import FromPeer, Inbox
from overlay.net.node import CLIENT_MAGIC
from overlay.node import NodeCore
from overlay.testing import LoopbackCluster, wait_until
from overlay.testing.proxy import Proxy

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


class Wire:
    """A client connection whose steps each go out in one write."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = client_reader()
        self.got: list[cm.ClientMessage] = []

    @classmethod
    async def open(cls, addr: tuple[str, int], client_id: str, token: str = "") -> Wire:
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(client_id, token=token)))
        assert await reader.readexactly(4) == CLIENT_MAGIC
        wire = cls(reader, writer)
        await wire.until(lambda m: type(m) is cm.Welcome)
        return wire

    def write(self, *msgs: cm.ClientMessage) -> None:
        self.writer.write(b"".join(encode_frame(m) for m in msgs))

    async def until(self, done: Any) -> list[cm.ClientMessage]:
        """Read until a message ``done`` is true of arrived; everything read so far."""
        while not any(done(m) for m in self.got):
            data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
            assert data, "the node closed the connection"
            self.got.extend(self.frames.feed(data))
        return self.got

    def close(self) -> None:
        self.writer.close()


def _event(i: int) -> dict[str, Any]:
    return {"price": float(i), "sym": "NOW"}


async def test_publishes_read_while_idle_are_handled_at_once_in_order() -> None:
    async with LoopbackCluster(LOCAL, 1) as cl:
        node = cl.nodes[0]
        sub = await Wire.open(cl.addr(0), "sub")
        sub.write(cm.Subscribe(1, "s", 'sym = "NOW"'))
        await sub.until(lambda m: type(m) is cm.SubAck)
        pub = await Wire.open(cl.addr(0), "pub")
        before = node.dispatcher.publishes_inline
        pub.write(*(cm.Publish(10 + i, _event(i)) for i in range(20)))
        got = await pub.until(lambda m: type(m) is cm.PubAck and m.seq == 29)
        assert [m.seq for m in got if type(m) is cm.PubAck] == list(range(10, 30))
        notes = await sub.until(lambda m: type(m) is cm.Notify and m.event["price"] == 19.0)
        assert [m.event["price"] for m in notes if type(m) is cm.Notify] == [float(i) for i in range(20)]
        assert node.dispatcher.publishes_inline - before == 20  # none of them went through the inbox
        pub.close()
        sub.close()


async def test_the_rest_of_a_read_is_queued_behind_the_publishes_it_starts_with() -> None:
    async with LoopbackCluster(LOCAL, 1) as cl:
        node = cl.nodes[0]
        pub = await Wire.open(cl.addr(0), "pub")
        before = node.dispatcher.publishes_inline
        # A Publish, then a Subscribe and a Publish that must see it: one read.
        pub.write(
            cm.Publish(1, _event(1)),
            cm.Subscribe(2, "s", 'sym = "NOW"'),
            cm.Publish(3, _event(3)),
            cm.Publish(4, {"price": float("nan"), "sym": "NOW"}),  # refused as alone
        )
        got = await pub.until(lambda m: type(m) is cm.Error and m.seq == 4)
        replies = [(type(m).__name__, m.seq) for m in got if type(m) not in (cm.Notify, cm.Welcome)]
        assert replies == [("PubAck", 1), ("SubAck", 2), ("PubAck", 3), ("Error", 4)]
        (note,) = [m for m in got if type(m) is cm.Notify]
        assert note.event["price"] == 3.0  # the second one only: the first came before the subscription
        assert node.dispatcher.publishes_inline - before == 1
        # A read that starts with something else goes through the inbox whole.
        pub.write(cm.Unsubscribe(5, "s"), cm.Publish(6, _event(6)))
        await pub.until(lambda m: type(m) is cm.PubAck and m.seq == 6)
        assert node.dispatcher.publishes_inline - before == 1
        pub.close()


async def test_publishes_read_while_a_test_holds_the_dispatcher_are_queued() -> None:
    # publishes_now takes none while a test paces the dispatcher (rule 5): the
    # read loop queues them all, where the held dispatcher finds them.
    async with LoopbackCluster(LOCAL, 1) as cl:
        node = cl.nodes[0]
        pub = await Wire.open(cl.addr(0), "pub")
        held = asyncio.Event()

        async def hold() -> None:
            await held.wait()

        node.dispatcher.pace(hold)
        pub.write(*(cm.Publish(10 + i, _event(i)) for i in range(3)))
        await wait_until(lambda: len(node.inbox.normal) == 3, what="the read queued")
        node.dispatcher.pace(None)
        held.set()
        got = await pub.until(lambda m: type(m) is cm.PubAck and m.seq == 12)
        assert [m.seq for m in got if type(m) is cm.PubAck] == [10, 11, 12]
        assert node.dispatcher.publishes_inline == 0
        pub.close()


@pytest.mark.parametrize("at_once", [True, False], ids=["at-once", "queued"])
async def test_a_run_whose_handling_fails_whole_is_answered_message_by_message(
    at_once: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # A bug in what handle_publishes checks once for the whole run (rule 1):
    # the run fails as one, not a Publish of it (those publish_many answers
    # itself).  Unanswered, each publisher waited out its timeout.
    async with LoopbackCluster(LOCAL, 1, auth=auth()) as cl:
        node = cl.nodes[0]
        sub = await Wire.open(cl.addr(0), "sub", token("sub"))
        sub.write(cm.Subscribe(1, "s", 'sym = "NOW"'))
        await sub.until(lambda m: type(m) is cm.SubAck)
        pub = await Wire.open(cl.addr(0), "pub", token("pub"))
        (sess,) = [s for s in node.core.sessions.values() if s.client_id == "pub"]
        rights = sess.rights
        broken = [True]

        def expired(now: float) -> bool:  # from outside (proxy rule 2)
            if broken[0]:
                raise RuntimeError("a bug")
            return rights.expired(now)  # type: ignore[union-attr]

        sess.rights = Proxy(rights, expired=expired)  # type: ignore[assignment]
        held = asyncio.Event()
        if not at_once:  # the dispatcher held until the run is queued: rule 1's path, not rule 6's

            async def hold() -> None:
                await held.wait()

            node.dispatcher.pace(hold)
        before = node.dispatcher.publishes_inline
        pub.write(*(cm.Publish(10 + i, _event(i)) for i in range(5)))
        if not at_once:
            await wait_until(lambda: len(node.inbox.normal) >= 5, what="the run queued")
            node.dispatcher.pace(None)
            held.set()
        got = await pub.until(lambda m: getattr(m, "seq", None) == 14)
        answers = [m for m in got if type(m) is not cm.Welcome]
        assert [(type(m), m.seq) for m in answers] == [(cm.Error, 10 + i) for i in range(5)]
        assert all(m.code == cm.ErrorCode.INTERNAL and "RuntimeError: a bug" in m.message for m in answers)
        assert "failed handling Publish" in caplog.text
        assert node.dispatcher.publishes_inline - before == (5 if at_once else 0)
        # The connection and the node go on serving.
        broken[0] = False
        pub.write(cm.Publish(20, _event(20)))
        await pub.until(lambda m: type(m) is cm.PubAck and m.seq == 20)
        notes = await sub.until(lambda m: type(m) is cm.Notify)
        assert [m.event["price"] for m in notes if type(m) is cm.Notify] == [20.0]
        pub.close()
        sub.close()


def _dispatcher() -> tuple[Dispatcher, Inbox, World, int, list[Action]]:
    """A dispatcher over node 0's core of a one-node world, with session ``pub`` open."""
    w = World(1)
    sid = w.client(0, "pub")
    core = w.cores[0]
    executed: list[Action] = []
    inbox = Inbox(1000)
    d = Dispatcher(core, inbox, SlowLog(core, 0), execute=executed.extend, peer_run=lambda src, inc: None)
    return d, inbox, w, sid, executed


def _acked(executed: list[Action]) -> list[int]:
    return [a.msg.seq for a in executed if type(a) is ToClient and type(a.msg) is cm.PubAck]


async def test_one_slice_s_worth_is_handled_and_the_rest_left_to_the_caller() -> None:
    d, _, _, sid, executed = _dispatcher()
    d.slice = 0.0  # every run takes a whole slice
    msgs = [cm.Publish(100 + i, _event(i)) for i in range(3 * DISPATCH_BATCH)]
    done = d.publishes_now(sid, msgs)
    assert done == DISPATCH_BATCH and d.publishes_inline == DISPATCH_BATCH
    assert _acked(executed) == [m.seq for m in msgs[:DISPATCH_BATCH]]
    # The rest, handed over again, go on in order.
    d.slice = 1.0
    assert d.publishes_now(sid, msgs[done:]) == len(msgs) - done
    assert _acked(executed) == [m.seq for m in msgs]


async def test_nothing_is_handled_at_once_while_a_test_taps_or_paces_the_dispatcher() -> None:
    d, _, _, sid, executed = _dispatcher()

    async def hold() -> None:
        return None

    d.pace(hold)
    assert d.publishes_now(sid, [cm.Publish(1, _event(1))]) == 0
    d.pace(None)
    d.intercept(lambda item: None)
    assert d.publishes_now(sid, [cm.Publish(1, _event(1))]) == 0
    assert executed == [] and d.publishes_inline == 0
    d.intercept(None)
    assert d.publishes_now(sid, [cm.Publish(1, _event(1))]) == 1
    assert _acked(executed) == [1]


async def test_a_stopped_dispatcher_leaves_no_receipts_timer_behind() -> None:
    d, _inbox, _w, _sid, _executed = _dispatcher()
    fired: list[bool] = []
    timer = asyncio.get_running_loop().call_later(0.05, lambda: fired.append(True))
    d._receipts_timer = timer  # as publishes_now leaves it with receipts waiting
    task = asyncio.create_task(d.run())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert timer.cancelled() and d._receipts_timer is None
    await asyncio.sleep(0.1)
    assert not fired  # nothing runs on the stopped core


# -- net.dispatch rule 7: a peer's Batch read while the inbox is empty -------------------------------------


async def test_events_crossing_nodes_are_handled_at_once_by_the_nodes_they_reach_in_order() -> None:
    """Published on node 1, matched on node 0 (EC's owner), delivered by node
    2: the peers' Batches reach the dispatchers of nodes 0 and 2 at once."""
    async with LoopbackCluster(LOCAL, 3) as cl:
        sub = await Wire.open(cl.addr(2), "sub")
        sub.write(cm.Subscribe(1, "s", 'sym = "NOW"'))
        await sub.until(lambda m: type(m) is cm.SubAck)
        pub = await Wire.open(cl.addr(1), "pub")
        before = [n.dispatcher.peer_inline for n in cl.nodes.values()]
        for burst in range(5):
            pub.write(*(cm.Publish(100 + 20 * burst + i, _event(20 * burst + i)) for i in range(20)))
        got = await pub.until(lambda m: type(m) is cm.PubAck and m.seq == 199)
        assert [m.seq for m in got if type(m) is cm.PubAck] == list(range(100, 200))
        notes = await sub.until(lambda m: type(m) is cm.Notify and m.event["price"] == 99.0)
        assert [m.event["price"] for m in notes if type(m) is cm.Notify] == [float(i) for i in range(100)]
        after = [n.dispatcher.peer_inline for n in cl.nodes.values()]
        assert after[0] > before[0] and after[2] > before[2]  # some of them, at least, not through the inbox
        pub.close()
        sub.close()


def _events_for_node_0() -> tuple[list[pm.PeerMessage], int]:
    """The Events node 1 sends node 0 (EC's owner) for 3 × DISPATCH_BATCH
    publishes of a 2-node world, with a Heartbeat amid them; and node 1's id."""
    w = World(2)
    pub = w.client(1, "pub")
    w.net.pause(1, 0)
    for i in range(3 * DISPATCH_BATCH):
        w.publish(1, pub, _event(i))
    msgs = [m for _src, _dst, m in w.net.pending(1, 0) if type(m) is pm.Event]
    assert len(msgs) == 3 * DISPATCH_BATCH
    msgs.insert(DISPATCH_BATCH + 5, pm.Heartbeat(w.cores[1].hello().incarnation))  # not an Event: alone, in its place
    return msgs, 1


def _receiver() -> tuple[Dispatcher, Inbox, list[Action], NodeCore]:
    """A dispatcher over node 0's core of a fresh 2-node world with a subscriber there."""
    w = World(2)
    sub = w.client(0, "sub")
    w.subscribe(0, sub, "s", 'sym = "NOW"')
    core = w.cores[0]
    executed: list[Action] = []
    inbox = Inbox(10_000)
    d = Dispatcher(core, inbox, SlowLog(core, 0), execute=executed.extend, peer_run=lambda src, inc: None)
    return d, inbox, executed, core


def _notified(executed: list[Action]) -> list[Any]:
    return [a.msg.event["price"] for a in executed if type(a) is ToClient and type(a.msg) is cm.Notify] + [
        a.msg.event["price"] for a in executed if type(a) is Notifies
    ]


async def test_a_peer_s_messages_handled_at_once_do_what_the_dispatcher_does_with_them_queued() -> None:
    msgs, src = _events_for_node_0()
    now_d, _, now_done, now_core = _receiver()
    now_d.slice = 60.0  # one call for all, however slow the machine
    assert now_d.peers_now(src, msgs) == len(msgs) and now_d.peer_inline == len(msgs)
    queued_d, inbox, queued_done, queued_core = _receiver()
    for m in msgs:
        assert inbox.put_nowait(FromPeer(src, m), False)
    task = asyncio.create_task(queued_d.run())
    try:
        while len(inbox):
            await asyncio.sleep(0)
        await asyncio.sleep(0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    now_done += now_core.end_batch()  # the receipts still waiting to be due (node.outbox rule 5)
    queued_done += queued_core.end_batch()
    # The same actions, in the same order — but for the receipts batched
    # after each batch (node.outbox rule 5): one EventsMatched for the call,
    # one per batch the dispatcher took; the same events in the same order.
    assert _unreceipted(now_done) == _unreceipted(queued_done)
    assert _receipted(now_done) == _receipted(queued_done) == [e.event_id for e in msgs if type(e) is pm.Event]
    assert _notified(now_done) == [float(i) for i in range(3 * DISPATCH_BATCH)]


def _unreceipted(executed: list[Action]) -> list[Action]:
    return [a for a in executed if not (type(a) is ToPeer and type(a.msg) is pm.EventsMatched)]


def _receipted(executed: list[Action]) -> list[str]:
    return [e for a in executed if type(a) is ToPeer and type(a.msg) is pm.EventsMatched for e in a.msg.event_ids]


async def test_a_slice_s_worth_of_a_peer_s_messages_is_handled_and_the_rest_left_to_the_caller() -> None:
    msgs, src = _events_for_node_0()
    d, _, executed, _ = _receiver()
    d.slice = 0.0  # every run takes a whole slice
    done = d.peers_now(src, msgs)
    assert done == DISPATCH_BATCH  # one run of Events, at most a batch's worth
    d.slice = 60.0
    assert d.peers_now(src, msgs[done:]) == len(msgs) - done
    assert _notified(executed) == [float(i) for i in range(3 * DISPATCH_BATCH)]


async def test_no_peer_message_is_handled_at_once_while_a_test_taps_or_paces_the_dispatcher() -> None:
    msgs, src = _events_for_node_0()
    d, _, executed, _ = _receiver()

    async def hold() -> None:
        return None

    d.pace(hold)
    assert d.peers_now(src, msgs) == 0
    d.pace(None)
    d.intercept(lambda item: None)
    assert d.peers_now(src, msgs) == 0
    assert executed == [] and d.peer_inline == 0


async def test_a_peer_s_message_that_breaks_the_protocol_is_answered_and_the_rest_handled() -> None:
    msgs, src = _events_for_node_0()
    d, _, executed, _ = _receiver()
    bad = pm.LinkAck(1)  # the link's own, never the node's
    d.slice = 60.0
    assert d.peers_now(src, [bad, *msgs[:3]]) == 4
    errors = [a for a in executed if type(a) is ToPeer and type(a.msg) is pm.PeerError]
    assert [(a.node, a.msg.code) for a in errors] == [(src, "protocol_error")]
    assert _notified(executed) == [0.0, 1.0, 2.0]
