"""The queue to a peer that is down keeps its bound (``overlay.net.node`` rule 10),
and what was queued for a peer's previous run is not replayed into its next
one (rule 9)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from overlay.actions import ToPeer
from overlay.config import NodeConfig
from overlay.messages import peer as pm
from overlay.messages.codec import encode_frame
from overlay.net.node import Node
from overlay.testing import accept_peer, insecure_tls
from test_node import BASE, EC, WAIT, bound_socket

pytestmark = pytest.mark.timeout(30)

BOUND = 50


def _event(i: int) -> pm.Event:
    return pm.Event(f"e{i}", {"price": float(i % 1000), "sym": "A"}, 0, pm.DispatchSign.EVENT_DISPATCHED, EC)


async def test_frames_for_a_down_peer_past_the_bound_are_dropped_and_counted() -> None:
    socks = {0: bound_socket(), 1: bound_socket(listen=False)}  # node 1: refuses connections
    nodes = tuple(NodeConfig(i, "127.0.0.1", s.getsockname()[1], 0, 1.0) for i, s in socks.items())
    cfg = BASE.with_nodes(nodes)
    cfg = msgspec.structs.replace(
        cfg, cluster=msgspec.structs.replace(cfg.cluster, peer_queue=BOUND), tls=insecure_tls()
    )
    node = Node(cfg, 0, sock=socks[0])
    task = asyncio.create_task(node.run())
    try:
        await asyncio.wait_for(node.started.wait(), WAIT)
        link = node.links[1]
        node.execute([ToPeer(1, _event(i)) for i in range(BOUND * 3)])
        assert len(link.queue.normal) == BOUND and len(link.queue) <= 2 * BOUND
        assert node.core.stats["peer_frames_dropped"] >= BOUND * 2 - 1
    finally:
        node.stop()
        await asyncio.wait_for(task, WAIT)
        for s in socks.values():
            s.close()


async def test_what_was_queued_for_a_previous_run_of_a_peer_is_discarded() -> None:
    socks = {0: bound_socket(), 1: bound_socket(listen=False)}
    nodes = tuple(NodeConfig(i, "127.0.0.1", s.getsockname()[1], 0, 1.0) for i, s in socks.items())
    cfg = msgspec.structs.replace(
        BASE.with_nodes(nodes), cluster=msgspec.structs.replace(BASE.cluster, peer_queue=BOUND), tls=insecure_tls()
    )
    node = Node(cfg, 0, sock=socks[0])
    task = asyncio.create_task(node.run())
    try:
        await asyncio.wait_for(node.started.wait(), WAIT)
        node.peer_run(1, 111)  # node 1's first run, seen before it went down
        node.execute([ToPeer(1, _event(i)) for i in range(5)])
        got: list[pm.PeerMessage] = []
        done = asyncio.Event()

        async def restarted_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frames, first = await accept_peer(reader, writer, cfg, 1)  # as node 1 would (SPEC §16)
            got.extend(first)
            writer.write(encode_frame(pm.PeerHello(1, cfg.cluster.name, incarnation=222)))  # a new run
            while data := await reader.read(65536):
                got.extend(frames.feed(data))
                if any(isinstance(m, pm.Event) and m.event_id == "after" for m in got):
                    done.set()
            writer.close()

        socks[1].listen(8)
        server = await asyncio.start_server(restarted_peer, sock=socks[1])
        async with server:
            await asyncio.wait_for(node.links[1].connected.wait(), WAIT)
            node.execute(
                [ToPeer(1, pm.Event("after", {"price": 1.0, "sym": "A"}, 0, pm.DispatchSign.EVENT_DISPATCHED, EC))]
            )
            await asyncio.wait_for(done.wait(), WAIT)
        assert [m.event_id for m in got if isinstance(m, pm.Event)] == ["after"]
        # The 5 events, and any heartbeat queued meanwhile.
        assert node.core.stats["peer_frames_discarded_restart"] >= 5
    finally:
        node.stop()
        await asyncio.wait_for(task, WAIT)
        for s in socks.values():
            s.close()
