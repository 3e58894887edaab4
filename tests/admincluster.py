"""A cluster of real nodes in this process for the admin and browser tests.

Every node's peer socket and admin socket are bound to 127.0.0.1:0 before
the nodes start and the config is rewritten with the real ports, so each
node finds the others' admin endpoints in the config (overlay.net.admin
rule 5) exactly as it would with fixed ports.  ``Traffic`` publishes a
skewed stream and holds range subscriptions on every node, so the
initializer overloads and balancing splits and migrates (SPEC §6–§8).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import msgspec

from loopback import listening_socket
from loopback import wait_until as until
from overlay.client import Client
from overlay.config import ClusterConfig, NodeConfig, load_config
from overlay.net.node import Node

CONFIGS: Final = Path(__file__).resolve().parent.parent / "cluster_configs"
GOLDEN: Final = 0.6180339887498949


class AdminCluster:
    """``async with AdminCluster(n, **cluster_settings) as cl``: n nodes running."""

    def __init__(
        self, n: int = 3, *, only: Iterable[int] | None = None, wait_ready: bool = True, **settings: Any
    ) -> None:
        cfg = load_config(CONFIGS / "local.toml")
        cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, **settings))
        self.socks = [listening_socket() for _ in range(n)]
        self.admin_socks = [listening_socket() for _ in range(n)]
        nodes = tuple(
            NodeConfig(i, "127.0.0.1", s.getsockname()[1], a.getsockname()[1], 1.0)
            for i, (s, a) in enumerate(zip(self.socks, self.admin_socks))
        )
        self.config: ClusterConfig = cfg.with_nodes(nodes)
        self.nodes = {
            i: Node(self.config, i, sock=s, admin_sock=a) for i, (s, a) in enumerate(zip(self.socks, self.admin_socks))
        }
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.clients: list[Client] = []
        self.wait_ready = wait_ready
        self.only = list(self.nodes) if only is None else list(only)  # the nodes __aenter__ starts

    def url(self, node: int = 0) -> str:
        return f"http://127.0.0.1:{self.nodes[node].admin_port}"

    def addr(self, node: int) -> tuple[str, int]:
        n = self.config.node(node)
        return (n.host, n.port)

    def start(self, node: int) -> None:
        self.tasks[node] = asyncio.create_task(self.nodes[node].run(), name=f"node-{node}")

    async def __aenter__(self) -> AdminCluster:
        for i in self.only:
            self.start(i)
        await asyncio.wait_for(asyncio.gather(*(self.nodes[i].started.wait() for i in self.tasks)), 10)
        if self.wait_ready:
            await until(lambda: all(n.core.ready for n in self.nodes.values()), 10, "cluster ready")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                await c.close()
        for n in self.nodes.values():
            n.stop()
        await asyncio.wait_for(asyncio.gather(*self.tasks.values(), return_exceptions=True), 15)
        for t in self.tasks.values():
            assert t.done() and (t.cancelled() or t.exception() is None), t
        for s in self.socks + self.admin_socks:
            s.close()

    async def stop_node(self, node: int, timeout: float = 10.0) -> None:
        self.nodes[node].stop()
        await asyncio.wait_for(self.tasks[node], timeout)

    async def client(self, node: int, name: str) -> Client:
        c = await Client([self.addr(node)], client_id=name, reconnect=False).connect()
        self.clients.append(c)
        return c

    def stat(self, key: str) -> int:
        return sum(n.core.stats.get(key, 0) for n in self.nodes.values())


def skewed_price(k: int, offset: float = 0.0) -> float:
    """70 % of events in [0, 200], the rest over the whole domain (smooth)."""
    u = (offset + k * GOLDEN) % 1.0
    if u < 0.7:
        return round(200.0 * u / 0.7, 3)
    return round(1000.0 * (u - 0.7) / 0.3, 3)


class Traffic:
    """Range subscriptions on every node and a publisher per node at ``rate``
    events/s in all, until ``stop()``; notifications are consumed."""

    def __init__(self, cluster: AdminCluster, rate: float = 1500.0, subscriptions: int = 60) -> None:
        self.cluster = cluster
        self.rate = rate
        self.n_subs = subscriptions
        self.published = 0
        self.delivered = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> Traffic:
        rng = random.Random(11)
        ids = list(self.cluster.nodes)
        subs = [await self.cluster.client(i, f"sub-{i}") for i in ids]
        for k in range(self.n_subs):
            lo = rng.uniform(0, 900)
            sub = await subs[k % len(subs)].subscribe(
                f"price >= {lo:.1f} and price < {min(1000.0, lo + rng.uniform(30, 300)):.1f}", queue_size=1_000_000
            )
            self._tasks.append(asyncio.create_task(self._consume(sub)))
        for i in ids:
            pub = await self.cluster.client(i, f"pub-{i}")
            self._tasks.append(asyncio.create_task(self._publish(pub, i / len(ids), self.rate / len(ids))))
        return self

    async def _consume(self, sub: Any) -> None:
        with contextlib.suppress(Exception):
            async for _ in sub:
                self.delivered += 1

    async def _publish(self, client: Client, offset: float, rate: float) -> None:
        start = time.monotonic()
        k = 0
        while not self._stop.is_set():
            due = int((time.monotonic() - start) * rate)
            while k < due and not self._stop.is_set():
                await client.publish_windowed({"price": skewed_price(k, offset), "sym": "A", "qty": k % 100_000})
                k += 1
                self.published += 1
            await asyncio.sleep(0.005)
        await client.flush(timeout=10)

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            if not t.get_coro().__qualname__.endswith("_publish"):  # type: ignore[union-attr]
                t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
