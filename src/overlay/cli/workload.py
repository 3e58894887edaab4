"""The demo's workload, shared by ``overlay demo`` (``make run``) and
``overlay cluster up --traffic``: ``SUBSCRIBERS_PER_NODE`` subscriptions on
every node, a mix of narrow and wide filters, and ``PUBLISHERS`` publishers
whose events crowd one region of the event space (70 % of prices in the
lowest tenth), so the initializer is overloaded and balancing has work to do.
Bounded by ``MAX_EVENTS``.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from overlay.auth.keys import local_token
from overlay.cli.running import CLOSE_TIMEOUT, CommandFailed, finish_within, first_cause, log, one_line
from overlay.client import Client, Subscription
from overlay.client.transport import TokenSource
from overlay.config import ClusterConfig, NodeConfig
from overlay.security import client_ssl

__all__ = [
    "MAX_EVENTS",
    "PUBLISHERS",
    "SUBSCRIBERS_PER_NODE",
    "Report",
    "demo_event",
    "demo_subscriptions",
    "failover_list",
    "run_workload",
    "traffic_failed",
]

MAX_EVENTS: Final = 500_000
PUBLISHERS: Final = 2
SUBSCRIBERS_PER_NODE: Final = 40
SYMBOLS: Final = ("AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "META", "TSLA", "IBM")


def demo_event(rng: random.Random) -> dict[str, Any]:
    hot = rng.random() < 0.7
    price = rng.uniform(0, 100) if hot else rng.uniform(0, 1000)
    return {"price": round(price, 2), "sym": rng.choice(SYMBOLS), "qty": rng.randint(1, 5000)}


def demo_subscriptions(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        lo = rng.uniform(0, 900)
        kind = rng.random()
        if kind < 0.4:
            out.append(f"price >= {lo:.1f} and price < {lo + rng.uniform(5, 100):.1f}")
        elif kind < 0.8:
            out.append(f'sym = "{rng.choice(SYMBOLS)}" and price < {rng.uniform(10, 500):.1f}')
        else:
            out.append(f"qty > {rng.randint(1000, 4900)}")
    return out


async def _publisher(client: Client, seed: int, stop: asyncio.Event, counter: list[int]) -> None:
    rng = random.Random(seed)
    while not stop.is_set() and counter[0] < MAX_EVENTS:
        await client.publish(demo_event(rng))
        counter[0] += 1


async def _consumer(sub: Subscription, counter: list[int]) -> None:
    async for _note in sub:  # each subscription gets its own: one delivery
        counter[0] += 1


async def _close_all(clients: Sequence[Client]) -> None:
    await asyncio.gather(*(finish_within(c.close(), CLOSE_TIMEOUT, f"closing {c.client_id}") for c in clients))


Report = Callable[[list[int], list[int], asyncio.Event], Awaitable[None]]


def failover_list(cfg: ClusterConfig, n: NodeConfig) -> list[tuple[str, int]]:
    """Node ``n``'s address, then every other node's: a client of the workload
    starts on ``n`` and, should ``n`` die (``--keep-going``), reconnects to the
    next and subscribes or publishes again there, so the traffic goes on."""
    return [(m.host, m.port) for m in (n, *(m for m in cfg.nodes if m.id != n.id))]


def _token(cfg: ClusterConfig, subject: str, role: str) -> TokenSource:
    """With ``[auth]``, a token function: each (re)connection signs a fresh
    token with the config's key (``overlay.auth.keys.local_token``)."""
    if not cfg.auth.enabled:
        return ""
    return functools.partial(local_token, cfg, subject, role)


async def run_workload(
    cfg: ClusterConfig, name: str, seed: int, report: Report, published: list[int], delivered: list[int]
) -> None:
    """The demo's workload, for ``make run`` and ``cluster up --traffic``:
    ``SUBSCRIBERS_PER_NODE`` subscriptions on every node and ``PUBLISHERS``
    publishers of skewed events, counted in ``published`` and ``delivered``
    (per subscription), while ``report(published, delivered, stop)`` runs;
    publishing stops when it sets ``stop`` or returns (or at ``MAX_EVENTS``),
    then the clients close — within ``CLOSE_TIMEOUT`` on Ctrl-C or a failure too."""
    rng = random.Random(seed)
    stop = asyncio.Event()
    clients: list[Client] = []
    tls = client_ssl(cfg)
    try:
        async with asyncio.TaskGroup() as tg:
            for n in cfg.nodes:
                c = await Client(
                    failover_list(cfg, n),
                    client_id=f"{name}-sub-{n.id}",
                    token=_token(cfg, f"{name}-sub-{n.id}", "subscribe"),
                    ssl=tls,
                ).connect()
                clients.append(c)
                for expr in demo_subscriptions(rng, SUBSCRIBERS_PER_NODE):
                    tg.create_task(_consumer(await c.subscribe(expr), delivered))
            publishers = []
            for i in range(PUBLISHERS):
                n = cfg.nodes[i % len(cfg.nodes)]
                c = await Client(
                    failover_list(cfg, n),
                    client_id=f"{name}-pub-{i}",
                    token=_token(cfg, f"{name}-pub-{i}", "publish"),
                    ssl=tls,
                ).connect()
                clients.append(c)
                publishers.append(tg.create_task(_publisher(c, seed + i, stop, published)))
            await report(published, delivered, stop)
            stop.set()
            # Publishers finish their publish in flight, then the connections close,
            # which ends the consumers' iteration.
            await asyncio.gather(*publishers)
            await _close_all(clients)
            clients.clear()
    except ExceptionGroup as group:  # a publish that timed out, a refused subscription
        raise traffic_failed(group) from None
    finally:
        await _close_all(clients)  # after Ctrl-C or a failure: bounded, errors ignored


def traffic_failed(group: BaseExceptionGroup[Any]) -> CommandFailed:
    """The first error of a traffic generator's TaskGroup, as one line (the
    group's own text only counts its members)."""
    log.debug("traffic failed", exc_info=group)
    first = first_cause(group)
    return CommandFailed(f"the traffic stopped: {type(first).__name__}: {one_line(first)}")
