"""Demo traffic against a running cluster: ``overlay cluster up F --traffic``.

The workload of ``make run`` (``overlay.demo``): subscribers on every node
with a mix of narrow and wide filters, publishers whose events crowd one
region of the event space, so the initializer is overloaded and balancing
has work to do.  Publishing stops ``SETTLE`` seconds before the end, so the
last notifications arrive and the capture ends quiet; then the clients
close (their subscriptions end, as in any run).  Ctrl-C cancels it (the
command's signal handling, ``overlay.cli`` rule 2): the clients are closed
within ``overlay.cli.CLOSE_TIMEOUT`` all the same.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Final

from overlay.cli import traffic_failed
from overlay.client import Client, Subscription
from overlay.config import ClusterConfig
from overlay.demo import _close_all, deliveries, demo_event, demo_subscriptions

__all__ = ["run_traffic", "SETTLE"]

SETTLE: Final = 3.0
PUBLISHERS: Final = 2
SUBSCRIBERS_PER_NODE: Final = 40
REPORT_EVERY: Final = 5.0


async def _publish(client: Client, seed: int, until: float, counter: list[int]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        await client.publish(demo_event(rng))
        counter[0] += 1


async def _consume(sub: Subscription, counter: list[int]) -> None:
    async for note in sub:
        counter[0] += deliveries(note)


async def run_traffic(cfg: ClusterConfig, seconds: float, *, seed: int = 7) -> tuple[int, int]:
    """Drive the cluster for ``seconds``; returns (events published,
    per-subscription deliveries)."""
    rng = random.Random(seed)
    published, delivered = [0], [0]
    clients: list[Client] = []
    start = time.monotonic()
    until = start + max(0.0, seconds - SETTLE)
    try:
        async with asyncio.TaskGroup() as tg:
            for n in cfg.nodes:
                c = await Client([(n.host, n.port)], client_id=f"traffic-sub-{n.id}").connect()
                clients.append(c)
                for expr in demo_subscriptions(rng, SUBSCRIBERS_PER_NODE):
                    tg.create_task(_consume(await c.subscribe(expr), delivered))
            pubs = []
            for i in range(PUBLISHERS):
                n = cfg.nodes[i % len(cfg.nodes)]
                c = await Client([(n.host, n.port)], client_id=f"traffic-pub-{i}").connect()
                clients.append(c)
                pubs.append(tg.create_task(_publish(c, seed + i, until, published)))
            print(f"traffic: {SUBSCRIBERS_PER_NODE * len(cfg.nodes)} subscriptions, {PUBLISHERS} publishers "
                  f"for {seconds - SETTLE:.0f}s, then {SETTLE:.0f}s to settle", flush=True)
            while (left := start + seconds - time.monotonic()) > 0:
                await asyncio.sleep(min(REPORT_EVERY, left))
                print(f"traffic: t={time.monotonic() - start:5.1f}s published {published[0]}, "
                      f"per-subscription deliveries {delivered[0]}", flush=True)
            await asyncio.gather(*pubs)
            await _close_all(clients)
            clients.clear()
    except ExceptionGroup as group:  # a publish that timed out, a refused subscription
        raise traffic_failed(group) from None
    finally:
        await _close_all(clients)  # after Ctrl-C or a failure: bounded, errors ignored
    return published[0], delivered[0]
