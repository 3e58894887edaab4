"""``make run``: the local cluster with bounded, skewed demo traffic, shown live.

Publishers send events whose ``price`` is hot around one region of the event
space (70 % of events in the lowest tenth); subscribers on every node hold a
mix of narrow and wide subscriptions.  Every second the terminal shows events
published and delivered, each node's balancing state, load level ``dc`` and
channel count, and the spread ``S/dc̄`` that balancing drives down as the
overloaded initializer splits and moves channels to the others.
Bounded by ``seconds`` and by ``MAX_EVENTS``; Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from typing import Any, Final

from overlay.cli import LocalCluster, _statuses, admin_url
from overlay.client import Client, Subscription

__all__ = ["run_demo"]

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
    async for _ in sub:
        counter[0] += 1


async def run_demo(config_path: str, seconds: float, log_level: str = "warning") -> int:
    cluster = LocalCluster(config_path, "warning" if log_level == "info" else log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"starting {len(cluster.cfg.nodes)} nodes from {config_path} …", flush=True)
    await cluster.start()
    cfg = cluster.cfg
    print("cluster ready: " + ", ".join(f"node {n.id} {n.host}:{n.port}" for n in cfg.nodes), flush=True)
    for n in cfg.nodes:  # the live page: every node serves the whole cluster
        if n.admin_port:
            print(f"  node {n.id} admin: {admin_url(n.host, n.admin_port)}/", flush=True)
    rng = random.Random(7)
    clients: list[Client] = []
    published = [0]
    delivered = [0]
    try:
        async with asyncio.TaskGroup() as tg:
            for n in cfg.nodes:
                c = await Client([(n.host, n.port)], client_id=f"demo-sub-{n.id}").connect()
                clients.append(c)
                for expr in demo_subscriptions(rng, SUBSCRIBERS_PER_NODE):
                    sub = await c.subscribe(expr)
                    tg.create_task(_consumer(sub, delivered))
            publishers = []
            for i in range(PUBLISHERS):
                n = cfg.nodes[i % len(cfg.nodes)]
                c = await Client([(n.host, n.port)], client_id=f"demo-pub-{i}").connect()
                clients.append(c)
                publishers.append(tg.create_task(_publisher(c, i, stop, published)))
            print(f"{SUBSCRIBERS_PER_NODE * len(cfg.nodes)} subscriptions, {PUBLISHERS} publishers; "
                  f"{seconds:.0f}s or {MAX_EVENTS} events, Ctrl-C to stop\n", flush=True)
            start = time.monotonic()
            last = (start, 0, 0)
            while not stop.is_set() and time.monotonic() - start < seconds and published[0] < MAX_EVENTS:
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
                now = time.monotonic()
                statuses = await _statuses(cfg)
                dt = now - last[0]
                print(_line(now - start, (published[0] - last[1]) / dt, (delivered[0] - last[2]) / dt, statuses), flush=True)
                last = (now, published[0], delivered[0])
            stop.set()
            # Publishers finish their publish in flight, then the connections close,
            # which ends the consumers' iteration.
            await asyncio.gather(*publishers)
            for c in clients:
                await c.close()
    finally:
        print(f"\npublished {published[0]} events, {delivered[0]} notifications delivered; stopping …", flush=True)
        await cluster.stop()
    return 0


def _line(t: float, pub_rate: float, del_rate: float, statuses: list[dict[str, Any] | None]) -> str:
    """One line a second: traffic, then each node's state, load level and channels,
    then the spread S/dc̄ of the load levels (what balancing lowers)."""
    parts = [f"t={t:5.1f}s pub {pub_rate:6.0f}/s notify {del_rate:6.0f}/s |"]
    levels = []
    moves = 0
    for st in statuses:
        if st is None:
            parts.append(" down |")
            continue
        levels.append(st["dc"])
        moves += st["stats"].get("migrations", 0) + st["stats"].get("replications", 0)
        parts.append(f" n{st['node']} {st['state'][:5]:<5} dc {st['dc']:8.0f} ch {len(st['channels']):2d} |")
    if levels and sum(levels) > 0:
        mean = sum(levels) / len(levels)
        spread = (sum((v - mean) ** 2 for v in levels) / len(levels)) ** 0.5
        parts.append(f" S/dc̄ {spread / mean:5.2f} {_bar(spread / mean)} moves {moves}")
    return "".join(parts)


def _bar(x: float, width: int = 12) -> str:
    filled = min(width, int(round(x / 1.5 * width)))
    return "█" * filled + "·" * (width - filled)
