"""overlay.client.connection: the asyncio driver, against a scripted node on loopback.

The node here is a few lines of asyncio speaking the client protocol (``FakeNode``):
it answers every request and sends the notifications a test asks for, so the
driver's own rules are tested without a cluster — slow consumers reported to
the error callback, every task ended by ``close()``, what a lost connection
does with and without reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from overlay.client import Client, SlowConsumerError
from overlay.client.limits import CLIENT_MAGIC
from overlay.errors import ConnectionLost, LocalProtocolError, OverlayError, RequestError
from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame
from overlay.testing import wait_until

pytestmark = pytest.mark.timeout(60)

EVENT = {"price": 1.0, "sym": "A"}


class FakeNode:
    """Node ``node_id`` as one client sees it: a Welcome, an answer to each
    request (``refuse`` maps a sub_id to the error code its Subscribe gets),
    and ``notify`` on demand."""

    def __init__(self, node_id: int = 1) -> None:
        self.node_id = node_id
        self.received: list[cm.ClientMessage] = []
        self.refuse: dict[str, str] = {}
        self.silent = False  # publishes go unanswered
        self.sessions = 0
        self._writer: asyncio.StreamWriter | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._events = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        """Close every session (each handler then reads its end) and wait for the handlers."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5.0)
        await self._server.wait_closed()

    def send(self, *msgs: cm.ClientMessage) -> None:
        assert self._writer is not None
        self._writer.write(b"".join(encode_frame(m) for m in msgs))

    def notify(self, sub_ids: tuple[str, ...], tag: int = 0) -> str:
        self._events += 1
        eid = f"{self.node_id}-{self._events}"
        self.send(cm.Notify(eid, EVENT, sub_ids, tag=tag))
        return eid

    def drop(self) -> None:
        """Close the session from the node's side."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def of(self, kind: type[cm.ClientMessage]) -> list[cm.ClientMessage]:
        return [m for m in self.received if isinstance(m, kind)]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            assert await reader.readexactly(4) == CLIENT_MAGIC
            writer.write(CLIENT_MAGIC)
            self.sessions += 1
            self._writer = writer
            frames = client_reader()
            while data := await reader.read(65536):
                for msg in frames.feed(data):
                    self.received.append(msg)
                    if writer is self._writer:
                        self._answer(msg)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)
            self._handlers.discard(task)

    def _answer(self, msg: cm.ClientMessage) -> None:
        match msg:
            case cm.Hello():
                self.send(cm.Welcome(self.node_id, self.sessions, True, "fake", 2.0))
            case cm.Subscribe(seq=seq, sub_id=sid) if sid in self.refuse:
                self.send(cm.Error(seq, self.refuse[sid], f"{sid} refused"))
            case cm.Subscribe(seq=seq, sub_id=sid):
                self.send(cm.SubAck(seq, sid))
            case cm.Unsubscribe(seq=seq, sub_id=sid):
                self.send(cm.UnsubAck(seq, sid))
            case cm.Publish(seq=seq) if not self.silent:
                self._events += 1
                self.send(cm.PubAck(seq, f"{self.node_id}-{self._events}"))
            case cm.Admin(seq=seq):
                self.send(cm.AdminReply(seq, {"ok": True}))


@pytest.fixture
async def node() -> AsyncIterator[FakeNode]:
    n = FakeNode()
    await n.start()
    yield n
    await n.stop()


def client_tasks(client_id: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(f"{client_id}: ")]


async def connected(node: FakeNode, **kwargs: object) -> Client:
    assert node._server is not None
    address = node._server.sockets[0].getsockname()[:2]
    return await Client([address], client_id="c", **kwargs).connect(timeout=5.0)  # type: ignore[arg-type]


# -- slow consumers reach the application ----------------------------------------------------


async def test_notifications_dropped_for_a_full_queue_reach_the_error_callback(node: FakeNode) -> None:
    errors: list[OverlayError] = []
    client = await connected(node, error_cb=errors.append)
    sub = await client.subscribe("price < 10", sub_id="slow", queue_size=2)
    eids = [node.notify(("slow",), tag=i + 1) for i in range(5)]  # tracked: each is answered
    await wait_until(lambda: sum(getattr(e, "dropped", 0) for e in errors) == 3, 5.0, "3 drops reported")
    assert all(isinstance(e, SlowConsumerError) for e in errors)
    first = errors[0]
    assert isinstance(first, SlowConsumerError)
    assert (first.subscriber, first.queued, first.limit, first.event_id) == ("slow", 2, 2, eids[2])
    assert (sub.received, sub.dropped) == (2, 3)
    # Each dropped notification is declined to the node (a group's event goes elsewhere).
    await wait_until(lambda: len(node.of(cm.Ack)) == 3, 5.0, "3 declines")
    assert {(a.event_id, a.declined) for a in node.of(cm.Ack)} == {(e, True) for e in eids[2:]}  # type: ignore[attr-defined]
    assert [n.event_id for n in [await sub.next(1.0), await sub.next(1.0)]] == eids[:2]
    await wait_until(lambda: len(node.of(cm.Ack)) == 5, 5.0, "the two taken acked too")
    await client.close()


async def test_an_untagged_notification_is_not_answered(node: FakeNode) -> None:
    """The node tracks nothing of an untagged Notify: taken or dropped, no Ack goes back."""
    errors: list[OverlayError] = []
    client = await connected(node, error_cb=errors.append)
    sub = await client.subscribe("price < 10", sub_id="plain", queue_size=2)
    eids = [node.notify(("plain",)) for _ in range(4)]
    await wait_until(lambda: sum(getattr(e, "dropped", 0) for e in errors) == 2, 5.0, "2 drops reported")
    assert [n.event_id for n in [await sub.next(1.0), await sub.next(1.0)]] == eids[:2]
    tagged = node.notify(("plain",), tag=7)  # after the plain ones: its Ack comes last on the link
    assert (await sub.next(1.0)).event_id == tagged
    await wait_until(lambda: len(node.of(cm.Ack)) == 1, 5.0, "the tagged one acked")
    assert node.of(cm.Ack) == [cm.Ack(tagged, 0.0, 7)]  # the lf: this subscription's, 0 when idle
    await client.close()


async def test_a_coroutine_callback_is_awaited_and_one_that_raises_is_logged(
    node: FakeNode, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[OverlayError] = []

    async def error_cb(error: OverlayError) -> None:
        await asyncio.sleep(0)
        seen.append(error)
        if len(seen) == 1:
            raise RuntimeError("the application's bug")

    caplog.set_level(logging.ERROR, logger="overlay.client")  # the simulator's tests silence "overlay"
    client = await connected(node, error_cb=error_cb)
    await client.subscribe("price < 10", sub_id="a", queue_size=1)
    await client.subscribe("price < 10", sub_id="b", queue_size=1)
    node.notify(("a", "b"))
    node.notify(("a",))
    await wait_until(lambda: len(seen) == 1, 5.0, "the first report")
    node.notify(("b",))
    await wait_until(lambda: {getattr(e, "subscriber", None) for e in seen} == {"a", "b"}, 5.0, "both reports")
    assert "the error callback raised" in caplog.text and "the application's bug" in caplog.text
    await client.close()


async def test_without_a_callback_a_drop_is_logged(node: FakeNode, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="overlay.client")  # the simulator's tests silence "overlay"
    client = await connected(node)
    await client.subscribe("price < 10", sub_id="s", queue_size=1)
    node.notify(("s",))
    node.notify(("s",))
    await wait_until(lambda: "slow consumer" in caplog.text, 5.0, "the warning")
    assert "'s'" in caplog.text
    await client.close()


async def test_the_nodes_own_drops_and_errors_reach_the_callback_too(node: FakeNode) -> None:
    errors: list[OverlayError] = []
    client = await connected(node, error_cb=errors.append)
    node.send(cm.Error(-1, cm.ErrorCode.SLOW_CONSUMER, "notification queue full; notifications dropped"))
    node.send(cm.Error(-1, cm.ErrorCode.UNDELIVERABLE, "no instance could take 1-9"))
    await wait_until(lambda: len(errors) == 2, 5.0, "two errors")
    slow, lost = errors
    assert isinstance(slow, SlowConsumerError) and (slow.subscriber, slow.node_id) == ("", 1)
    assert isinstance(lost, RequestError) and lost.code == cm.ErrorCode.UNDELIVERABLE
    await client.close()


# -- owned tasks, closing ---------------------------------------------------------------------


async def test_close_ends_every_task_and_every_iteration(node: FakeNode) -> None:
    client = await connected(node)
    sub = await client.subscribe("price < 10")
    await client.publish(EVENT)
    assert client_tasks("c")
    consumer = asyncio.create_task(anext(sub, None))
    await asyncio.sleep(0)
    await client.close()
    assert client_tasks("c") == []
    assert await asyncio.wait_for(consumer, 5.0) is None  # the iteration ended
    with pytest.raises(ConnectionLost, match="closed"):
        await client.publish(EVENT)
    await client.close()  # twice is fine


async def test_an_error_callback_may_close_the_client(node: FakeNode) -> None:
    closed = asyncio.Event()

    async def error_cb(error: OverlayError) -> None:
        await client.close()
        closed.set()

    client = await connected(node, error_cb=error_cb)
    node.send(cm.Error(-1, cm.ErrorCode.UNDELIVERABLE, "x"))
    await asyncio.wait_for(closed.wait(), 5.0)
    await wait_until(lambda: client_tasks("c") == [], 5.0, "every task ended")


async def test_a_request_before_connect_is_a_local_error() -> None:
    client = Client([("127.0.0.1", 9)], client_id="c")
    with pytest.raises(LocalProtocolError, match="connect"):
        await client.publish(EVENT)
    await client.close()


# -- a lost connection -------------------------------------------------------------------------


async def test_a_lost_connection_is_reconnected_and_what_was_open_sent_again(node: FakeNode) -> None:
    client = await connected(node)
    sub = await client.subscribe("price < 10", sub_id="s")
    lost: list[Client] = []
    client.on_lost.append(lost.append)
    await client.publish_windowed(EVENT)
    await client.flush(timeout=5.0)
    node.drop()
    await wait_until(lambda: node.sessions == 2 and client.connected, 10.0, "the second session")
    await wait_until(lambda: len(node.of(cm.Subscribe)) == 2, 5.0, "the re-subscription")
    assert lost == [client] and client.connections == 2
    eid = node.notify(("s",))
    assert (await sub.next(5.0)).event_id == eid
    await client.close()


async def test_a_publish_not_acknowledged_goes_again_after_a_reconnect_under_its_id(node: FakeNode) -> None:
    """The node may have accepted the first copy: the same event id lets the
    cluster deliver it once (overlay.node.outbox)."""
    client = await connected(node)
    node.silent = True
    publishing = asyncio.ensure_future(client.publish(EVENT))
    await wait_until(lambda: len(node.of(cm.Publish)) == 1, 5.0, "the publish")
    node.silent = False
    node.drop()
    eid = await asyncio.wait_for(publishing, 10.0)
    first, again = node.of(cm.Publish)
    assert isinstance(first, cm.Publish) and isinstance(again, cm.Publish)
    assert first.event_id and again.event_id == first.event_id and again.seq != first.seq
    assert eid == "1-1"  # the fake node's name for it
    await client.close()


async def test_a_client_without_an_id_gets_one_of_its_own(node: FakeNode) -> None:
    address = ("127.0.0.1", 1)
    assert Client([address]).client_id != Client([address]).client_id


async def test_without_reconnect_a_lost_connection_ends_calls_and_subscriptions(node: FakeNode) -> None:
    client = await connected(node, reconnect=False)
    sub = await client.subscribe("price < 10")
    node.drop()
    with pytest.raises(ConnectionLost):
        await sub.next(5.0)
    with pytest.raises(ConnectionLost):
        await client.publish(EVENT)
    with pytest.raises(ConnectionLost):
        await client.publish_windowed(EVENT)
    await client.close()
    assert client_tasks("c") == []


async def test_a_subscription_the_node_refuses_after_a_reconnect_ends_with_the_refusal(node: FakeNode) -> None:
    errors: list[OverlayError] = []
    client = await connected(node, error_cb=errors.append)
    sub = await client.subscribe("price < 10", sub_id="gone")
    node.refuse["gone"] = cm.ErrorCode.BAD_EXPRESSION
    node.drop()
    with pytest.raises(RequestError, match="gone refused"):
        await sub.next(10.0)
    assert "gone" not in client.subscriptions
    await wait_until(lambda: any(isinstance(e, RequestError) for e in errors), 5.0, "the report")
    await client.close()


async def test_an_unsubscribe_left_pending_by_a_lost_connection_completes(node: FakeNode) -> None:
    client = await connected(node)
    sub = await client.subscribe("price < 10", sub_id="s")
    node.drop()  # the client has not noticed yet: its Unsubscribe goes to a closed socket
    await asyncio.wait_for(sub.close(), 10.0)  # no unknown_subscription from the new session
    assert client.connected
    assert not client.subscriptions and len(node.of(cm.Subscribe)) == 1  # not re-subscribed
    await client.close()
