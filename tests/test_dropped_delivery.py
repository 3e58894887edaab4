"""A tracked Notify the shell drops for a full client queue fails at once
(``overlay.net.clients`` rule 3, ``overlay.net.node`` rule 5): a group's
event goes to another instance now, not after ``ack_timeout``."""

from __future__ import annotations

import asyncio
import socket

import pytest

from conftest import LOCAL
from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame
from overlay.net.node import CLIENT_MAGIC
from overlay.testing import WAIT, LoopbackCluster, wait_until

pytestmark = pytest.mark.timeout(60)

# Far longer than the test may take: a delivery failing by timeout instead
# of at once would miss every wait below.
ACK_TIMEOUT = 40.0
# Well under ACK_TIMEOUT: how long the failover may take.
FAILOVER_WAIT = 10.0
# Room for the live instance's bursts (a batch of events and the ones failed
# over) however the loop schedules its writer.
CLIENT_QUEUE = 256
# Enough for the stuck instance's queue to fill: before the node's writer
# for it waits, its transport buffers 64 kB (≈ 800 Notifies) besides the
# sockets' buffers and the queue; 9 events in 10 go its way until it fails.
EVENTS = 2000


def ev(i: int) -> dict:
    return {"price": float(i % 1000), "sym": "AB", "qty": i % 100}


async def stuck_instance(cl: LoopbackCluster, node: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A group instance on ``node`` that subscribes, then never reads: small
    buffers, so its access node's queue for it fills soon."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    raw.setblocking(False)
    await asyncio.get_running_loop().sock_connect(raw, cl.addr(node))
    # A small stream limit: the reader stops taking bytes from the socket
    # once it holds 2 kB, so what the node sends stays in the kernel.
    reader, writer = await asyncio.open_connection(sock=raw, limit=1024)
    # Weight 9: most events go its way until it fails.
    writer.write(
        CLIENT_MAGIC + encode_frame(cm.Hello("stuck")) + encode_frame(cm.Subscribe(1, "s", "price >= 0", "g", 9.0))
    )
    assert await asyncio.wait_for(reader.readexactly(4), WAIT) == CLIENT_MAGIC
    frames = client_reader()
    got: list[cm.ClientMessage] = []
    while len(got) < 2:
        data = await asyncio.wait_for(reader.read(4096), WAIT)
        assert data, f"closed after {got}"
        got += frames.feed(data)
    assert isinstance(got[0], cm.Welcome) and isinstance(got[1], cm.SubAck), got
    return reader, writer


async def test_a_group_event_dropped_for_a_full_queue_goes_to_another_instance_at_once() -> None:
    async with LoopbackCluster(
        LOCAL,
        3,
        balancing=False,
        sndbuf=4096,
        client_queue=CLIENT_QUEUE,
        groups={"ack_timeout": ACK_TIMEOUT, "fault_period": ACK_TIMEOUT},
        limits={"slow_consumer_grace": ACK_TIMEOUT},  # it reads at last: not cut as a slow consumer meanwhile
    ) as cl:
        reader, writer = await stuck_instance(cl, 1)
        try:
            live = await cl.raw(2)
            await live.subscribe("price >= 0", group="g", weight=1.0)
            pub = await cl.raw(0)
            for b in range(0, EVENTS, 50):
                acks = await asyncio.gather(*(pub.publish_nowait(ev(i)) for i in range(b, b + 50)))
                assert all(isinstance(a, cm.PubAck) for a in acks)
            access = cl.nodes[1].core.stats  # node 1 serves the stuck instance only

            def failed_over() -> bool:
                # What node 1 took for the stuck instance stays there; every
                # other event is at the live instance.
                kept = access["notifies_out"] - access["slow_consumer_drops"]
                return access["slow_consumer_drops"] > 0 and len(live.notes) == EVENTS - kept

            await wait_until(failed_over, FAILOVER_WAIT, "the dropped events at the live instance")
            assert access["deliveries_dropped_slow"] == access["slow_consumer_drops"]  # each one a tracked delivery
            assert cl.stat("group_redispatched") == access["slow_consumer_drops"]
            assert cl.stat("delivery_ack_timeouts") == 0  # none waited for the timeout

            # The stuck instance reads at last: it holds exactly the others.
            kept = access["notifies_out"] - access["slow_consumer_drops"]
            frames = client_reader()
            stuck: list[cm.Notify] = []
            while len(stuck) < kept:
                data = await asyncio.wait_for(reader.read(1 << 16), WAIT)
                assert data, f"closed after {len(stuck)} of {kept} notifications"
                stuck += [m for m in frames.feed(data) if isinstance(m, cm.Notify)]
            ids = [n.event_id for n in live.notes] + [n.event_id for n in stuck]
            assert len(ids) == len(set(ids)) == EVENTS  # each event once, at one instance
        finally:
            writer.close()
