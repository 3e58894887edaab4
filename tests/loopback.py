"""What the real-node tests share: loopback listening sockets and condition waits."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable


def listening_socket() -> socket.socket:
    """A socket listening on 127.0.0.1 at an ephemeral port, handed to a Node so
    its port is known before the cluster config is written (no race)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition", step: float = 0.005) -> None:
    """Await a condition on state that has no event of its own (polled), bounded."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(step)
