"""Skewed traffic that makes a cluster balance: prices, range subscriptions, a driver.

Rules this module keeps:

1. Everything is deterministic: prices follow a golden-ratio sequence (the
   load per slice is smooth, not noisy) and subscriptions come from a seeded
   ``random.Random``, so a run offers the same load every time.
2. 70 % of events fall in a hot price range, so the node owning it overloads
   and balancing splits and migrates (SPEC §6–§8).
3. ``Traffic.stop`` lets every publisher flush what it published before it
   cancels the consumers: nothing is left half-sent when the nodes stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from overlay.client import Client, Subscription

if TYPE_CHECKING:
    from overlay.testing._cluster import LoopbackCluster

__all__ = [
    "GOLDEN",
    "QUEUE_SIZE",
    "Traffic",
    "bench_event",
    "load_ranges",
    "price_bands",
    "range_subscriptions",
    "skewed_price",
]

GOLDEN: Final = 0.6180339887498949
PRICE_MAX: Final = 1000.0
# A subscription queue that never overflows in a test: a drop would be a lost
# notification to the exactly-once checks, not the slow-consumer policy at work.
QUEUE_SIZE: Final = 1_000_000
# Between two bursts of a paced publisher: it catches up with its rate then.
PACE: Final = 0.005


def skewed_price(k: int, offset: float = 0.0, hot: tuple[float, float] = (0.0, 200.0)) -> float:
    """The ``k``-th price of a stream: 70 % in ``hot``, the rest over the
    whole domain [0, 1000] (rules 1, 2); ``offset`` in [0, 1) shifts the
    sequence, so publishers with different offsets do not send the same prices."""
    u = (offset + k * GOLDEN) % 1.0
    lo, hi = hot
    if u < 0.7:
        return round(lo + (hi - lo) * u / 0.7, 3)
    return round(PRICE_MAX * (u - 0.7) / 0.3, 3)


def load_ranges(n: int, seed: int = 11) -> list[str]:
    """``n`` price ranges 20 to 200 wide with a venue pattern no event matches:
    matching load for the benches' nodes (SPEC §5), nothing notified (rule 1)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lo = rng.uniform(0, 950)
        out.append(
            f'price >= {lo:.1f} and price < {min(PRICE_MAX, lo + rng.uniform(20, 200)):.1f} and venue prefix "zz"'
        )
    return out


def price_bands(n: int) -> list[str]:
    """``n`` price bands tiling [0, 1000]: every event is in exactly one."""
    width = PRICE_MAX / n
    out = []
    for k in range(n):
        top = "price <= 1000" if k == n - 1 else f"price < {(k + 1) * width:g}"
        out.append(f"price >= {k * width:g} and {top}")
    return out


def bench_event(qty: int) -> dict[str, Any]:
    """The benches' ``qty``-th event: a skewed price (rule 2), ``qty`` naming it."""
    return {"price": skewed_price(qty), "sym": "AB"[qty % 2], "qty": qty, "venue": "x"}


def range_subscriptions(n: int, seed: int, venue: str | None = None) -> list[str]:
    """``n`` price ranges, 30 to 300 wide (rule 1).  With ``venue``, a pattern
    no event matches is added: the matcher still tests them (they are load,
    SPEC §5) but nothing is notified, which keeps in-process runs cheap."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lo = rng.uniform(0, 900)
        expr = f"price >= {lo:.1f} and price < {min(PRICE_MAX, lo + rng.uniform(30, 300)):.1f}"
        out.append(expr if venue is None else f'{expr} and venue prefix "{venue}"')
    return out


class Traffic:
    """Range subscriptions spread over ``nodes`` of ``cluster`` (default: every
    node) and one publisher per node, ``rate`` skewed events/s in all, from
    ``start`` until ``stop``; notifications are consumed and counted (``delivered``)."""

    def __init__(
        self,
        cluster: LoopbackCluster,
        rate: float = 1500.0,
        subscriptions: int = 60,
        nodes: Iterable[int] | None = None,
    ) -> None:
        self.cluster = cluster
        self.nodes = cluster.ids if nodes is None else list(nodes)
        self.rate = rate
        self.n_subs = subscriptions
        self.published = 0
        self.delivered = 0
        self._stop = asyncio.Event()
        self._publishers: list[asyncio.Task[None]] = []
        self._consumers: list[asyncio.Task[None]] = []

    async def start(self) -> Traffic:
        ids = self.nodes
        subs = [await self.cluster.client(i, client_id=f"sub-{i}") for i in ids]
        for k, expr in enumerate(range_subscriptions(self.n_subs, seed=11)):
            sub = await subs[k % len(subs)].subscribe(expr, queue_size=QUEUE_SIZE)
            self._consumers.append(asyncio.create_task(self._consume(sub)))
        for i in ids:
            pub = await self.cluster.client(i, client_id=f"pub-{i}")
            self._publishers.append(asyncio.create_task(self._publish(pub, i / len(ids), self.rate / len(ids))))
        return self

    async def _consume(self, sub: Subscription) -> None:
        with contextlib.suppress(Exception):  # its node stopped under it: the test looks at the nodes, not at this
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
            await asyncio.sleep(PACE)
        await client.flush(timeout=10)

    async def stop(self) -> None:
        """Rule 3; a second call does nothing more."""
        self._stop.set()
        await asyncio.gather(*self._publishers, return_exceptions=True)
        for t in self._consumers:
            t.cancel()
        await asyncio.gather(*self._consumers, return_exceptions=True)
