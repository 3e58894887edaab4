"""``net.dispatch`` rule 6: a client's Publishes read while the inbox is empty
are handled at once from its read loop, in order, as the dispatcher would
handle them queued — and the rest of the read (another kind of message, or
what is past one slice) is queued behind them.

Against a loopback node, one read at a time (every frame of a step written in
one write); and ``Dispatcher.publishes_now`` on its own with a scripted core
(its slice, its errors, the receipts it leaves)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from conftest import LOCAL
from overlay.actions import Action
from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame
from overlay.net.dispatch import DISPATCH_BATCH, Dispatcher, SlowLog
from overlay.net.inbox import ClientClosed, Inbox
from overlay.net.node import CLIENT_MAGIC
from overlay.testing import LoopbackCluster, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


class Wire:
    """A client connection whose steps each go out in one write."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = client_reader()
        self.got: list[cm.ClientMessage] = []

    @classmethod
    async def open(cls, addr: tuple[str, int], client_id: str) -> Wire:
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(client_id)))
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


class _Core:
    """What ``publishes_now`` asks of a NodeCore, scripted: each run's actions,
    a failing Publish (seq 13), receipts left waiting when told."""

    id = 7

    def __init__(self) -> None:
        self.runs: list[list[int]] = []
        self.receipts_wait: float | None = None
        self.ended: list[bool] = []
        self.index_wanted = False

    def handle_publishes(self, sid: int, msgs: list[cm.Publish], now: float) -> list[Action]:
        seqs = [m.seq for m in msgs]
        self.runs.append(seqs)
        if 13 in seqs:
            raise RuntimeError("a bug")
        return [("acted", sid, s) for s in seqs]  # type: ignore[misc]

    def end_batch(self, *, idle: bool = True) -> list[Action]:
        self.ended.append(idle)
        if idle and self.receipts_wait is not None:
            self.receipts_wait = None
            return [("receipts",)]  # type: ignore[list-item]
        return []

    def receipts_due_in(self, now: float) -> float | None:
        return self.receipts_wait


def _dispatcher(core: _Core, executed: list[Any]) -> tuple[Dispatcher, Inbox]:
    inbox = Inbox(1000)
    slow = SlowLog(core, 0)  # type: ignore[arg-type]
    d = Dispatcher(core, inbox, slow, execute=executed.extend, peer_run=lambda src, inc: None)  # type: ignore[arg-type]
    return d, inbox


async def test_one_slice_s_worth_is_handled_and_the_rest_left_to_the_caller() -> None:
    core, executed = _Core(), []
    d, _ = _dispatcher(core, executed)
    d.slice = 0.0  # every run takes a whole slice
    msgs = [cm.Publish(100 + i, _event(i)) for i in range(3 * DISPATCH_BATCH)]
    done = d.publishes_now(4, msgs)
    assert done == DISPATCH_BATCH and core.runs == [[m.seq for m in msgs[:DISPATCH_BATCH]]]
    assert executed == [("acted", 4, m.seq) for m in msgs[:DISPATCH_BATCH]]
    assert core.ended == [False] and d.publishes_inline == DISPATCH_BATCH


async def test_a_run_that_fails_is_its_own_failure(caplog: pytest.LogCaptureFixture) -> None:
    core, executed = _Core(), []
    d, _ = _dispatcher(core, executed)
    msgs = [cm.Publish(i, _event(i)) for i in range(2 * DISPATCH_BATCH)]
    with caplog.at_level(logging.ERROR, logger="overlay.net"):
        assert d.publishes_now(4, msgs) == len(msgs)
    assert "failed handling Publish from client 4" in caplog.text
    # The run holding seq 13 produced nothing; the next one was handled.
    assert executed == [("acted", 4, m.seq) for m in msgs[DISPATCH_BATCH:]]


async def test_receipts_left_waiting_go_out_when_due() -> None:
    core, executed = _Core(), []
    d, inbox = _dispatcher(core, executed)
    core.receipts_wait = 0.001
    d.publishes_now(4, [cm.Publish(1, _event(1))])
    await wait_until(lambda: ("receipts",) in executed, 5, "the receipts' timer")
    assert core.ended == [False, True]
    # Not while the dispatcher is busy: it sends them itself once due (rule 1).
    core.receipts_wait = 0.001
    inbox.put_nowait(ClientClosed(9), False)
    d.publishes_now(4, [cm.Publish(2, _event(2))])
    await wait_until(lambda: d._receipts_timer is None, 5, "the receipts' timer")
    assert executed.count(("receipts",)) == 1


async def test_nothing_is_handled_at_once_while_a_test_taps_or_paces_the_dispatcher() -> None:
    core, executed = _Core(), []
    d, _ = _dispatcher(core, executed)

    async def hold() -> None:
        return None

    d.pace(hold)
    assert d.publishes_now(4, [cm.Publish(1, _event(1))]) == 0
    d.pace(None)
    d.intercept(lambda item: None)
    assert d.publishes_now(4, [cm.Publish(1, _event(1))]) == 0
    assert core.runs == [] and executed == [] and d.publishes_inline == 0
    d.intercept(None)
    assert d.publishes_now(4, [cm.Publish(1, _event(1))]) == 1
