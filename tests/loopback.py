"""What the real-node tests share: loopback listening sockets, condition waits,
and the condition most of them wait for (``nodes_quiet``)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free just now, for configs of node
    processes (a process binds its own port; a socket cannot be handed over)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def listening_socket() -> socket.socket:
    """A socket listening on 127.0.0.1 at an ephemeral port, handed to a Node so
    its port is known before the cluster config is written (no race)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


async def wait_until(
    cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition", step: float = 0.005
) -> None:
    """Await a condition on state that has no event of its own (polled), bounded."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(step)


def nodes_quiet(nodes: Iterable[Any]) -> bool:
    """Nothing left to do on any of these running ``overlay.net.node.Node``s:
    no inbound message queued, nothing queued for a connected peer or for a
    client, no balancing session or (un)subscription open.  What tests wait
    for (``wait_until(lambda: nodes_quiet(...))``) before they compare
    counters, instead of pausing for a guess at how long the rest takes."""
    for n in nodes:
        core = n.core
        if len(n.inbox) or any(len(w.queue) for w in n.clients.values()):
            return False
        if any(len(link.queue) for link in n.links.values() if link.connected.is_set()):
            return False
        if core.incoming or core._pending or any(m.active for m in core.outgoing.values()):
            return False
    return True
