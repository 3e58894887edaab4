"""The routing agent against round robin, with one slow access node (SPEC §12).

Run as ``.venv/bin/python bench/agent.py [--events N] [--concurrency C] [--slow-ms MS]``.

What it does:

1. **Cluster.**  Three nodes of ``cluster_configs/local.toml`` in this process
   (ephemeral loopback ports, balancing off), one of them made slow in one of
   two ways, each run separately:

   * ``delay`` — every reply of node 1 to its clients leaves ``--slow-ms``
     late (a node far away, or one whose answers queue behind other work);
   * ``stall`` — node 1's dispatcher sleeps ``--stall-ms`` before each batch it
     takes from its inbox (a node short of CPU: its latency grows with its
     load, and past ``choke_threshold`` it answers Choke).

2. **Publishers.**  ``--concurrency`` tasks publish ``--events`` events in all,
   each waiting for its PubAck before the next.  *Round robin*: one ``Client``
   per node, publish ``i`` to node ``i mod 3`` (Choke waited out).  *Agent*:
   one ``AgentClient`` over the three nodes (RLS window 16, a node
   without a sample for 0.25 s probed).  The same publishers, events and slow node for both.
3. **Measures** the publish → PubAck latency of every publish: p50, p99, max,
   the share each node carried, and the agent's chokes, timeouts and
   re-sends; then the ratio of p99s.  The nodes share the benchmark's event
   loop, so absolute numbers include the clients' own work; the comparison is
   like for like.

Target: with one slow node, the agent's p99 ≤ 0.5× round robin's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

from overlay.client import AgentClient, AgentSettings, Client
from overlay.config import load_config
from overlay.messages import client as cm
from overlay.net.node import Node
from overlay.testing import LoopbackCluster, wait_until
from overlay.testing.proxy import Proxy

ROOT: Final = Path(__file__).resolve().parent.parent
LOCAL: Final = load_config(ROOT / "cluster_configs" / "local.toml")
SLOW_NODE: Final = 1


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def make_slow(node: Node, mode: str, slow_ms: float, stall_ms: float) -> None:
    loop = asyncio.get_running_loop()
    if mode == "delay":
        # Every reply of the core to a client (PubAck, SubAck, errors) goes through
        # the shell's connections (a Proxy in front of them: the compiled
        # ClientConnections' methods are not replaced); an event's Notifies
        # (send_notifies) are not delayed: the bench times publish → PubAck.
        send = node.connections.send

        def delayed(sid: int, msg: cm.ClientMessage) -> None:
            loop.call_later(slow_ms / 1000, send, sid, msg)

        node.connections = Proxy(node.connections, send=delayed)  # type: ignore[assignment]
    else:

        async def stalled() -> None:  # before each batch it takes (net.dispatch rule 5)
            await asyncio.sleep(stall_ms / 1000)

        node.dispatcher.pace(stalled)


async def drive(publish: Any, events: int, concurrency: int) -> list[float]:
    clock = time.perf_counter  # uvloop's loop.time() ticks in milliseconds
    lat: list[float] = []
    counter = iter(range(events))

    async def worker() -> None:
        for i in counter:
            t0 = clock()
            await publish(i, {"price": float(i % 1000), "sym": "AB", "qty": i % 100})
            lat.append(clock() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat


async def run_one(mode: str, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    async with LoopbackCluster(LOCAL, balancing=False) as cluster:
        make_slow(cluster.nodes[SLOW_NODE], mode, args.slow_ms, args.stall_ms)
        addrs = [cluster.addr(i) for i in cluster.ids]
        extra: dict[str, Any] = {}
        if policy == "round robin":
            clients = [await Client([a]).connect() for a in addrs]
            carried = [0] * len(clients)

            async def publish(i: int, ev: dict[str, Any]) -> None:
                carried[i % len(clients)] += 1
                await clients[i % len(clients)].publish(ev)

            t0 = time.perf_counter()
            lat = await drive(publish, args.events, args.concurrency)
            elapsed = time.perf_counter() - t0
            extra["chokes"] = sum(c.chokes for c in clients)
            for c in clients:
                await c.close()
        else:
            agent = AgentClient(addrs, settings=AgentSettings(window=args.window))
            await agent.connect()
            await wait_until(lambda: len(agent.connected) == len(addrs), what="the agent connected everywhere")

            async def publish(i: int, ev: dict[str, Any]) -> None:
                await agent.publish(ev)

            t0 = time.perf_counter()
            lat = await drive(publish, args.events, args.concurrency)
            elapsed = time.perf_counter() - t0
            carried = list(agent.published)
            extra.update(chokes=agent.chokes, timeouts=agent.timeouts, resent=agent.resent)
            if args.verbose:
                print(policy, mode, agent.stats(), agent.agent.failures, file=sys.stderr)
            await agent.close()
        return {
            "mode": mode,
            "policy": policy,
            "p50": pct(lat, 50),
            "p99": pct(lat, 99),
            "max": max(lat),
            "mean": statistics.fmean(lat),
            "rate": len(lat) / elapsed,
            "share": [c / max(1, sum(carried)) for c in carried],
            **extra,
        }


async def main(args: argparse.Namespace) -> int:
    rows = []
    modes = ["delay", "stall"] if args.mode == "both" else [args.mode]
    for mode in modes:
        for policy in ("round robin", "agent"):
            rows.append(await run_one(mode, policy, args))
    print(
        f"\n{args.events} publishes, {args.concurrency} concurrent publishers, node {SLOW_NODE} slow "
        f"(delay: replies +{args.slow_ms:g} ms; stall: dispatcher sleeps {args.stall_ms:g} ms per batch)\n"
    )
    print(
        "| slow node | policy | p50 ms | p99 ms | max ms | publishes/s | share per node | chokes | timeouts/re-sent |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        share = " / ".join(f"{s:.0%}" for s in r["share"])
        to = f"{r['timeouts']}/{r['resent']}" if "timeouts" in r else "–"
        print(
            f"| {r['mode']} | {r['policy']} | {r['p50'] * 1e3:.2f} | {r['p99'] * 1e3:.2f} | {r['max'] * 1e3:.1f} "
            f"| {r['rate']:,.0f} | {share} | {r['chokes']} | {to} |"
        )
    print()
    ok = True
    for mode in modes:
        rr = next(r for r in rows if r["mode"] == mode and r["policy"] == "round robin")
        ag = next(r for r in rows if r["mode"] == mode and r["policy"] == "agent")
        ratio = ag["p99"] / rr["p99"]
        ok &= ratio <= 0.5
        print(
            f"{mode}: agent p99 / round-robin p99 = {ratio:.3f}  (target ≤ 0.5: {'met' if ratio <= 0.5 else 'MISSED'})"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--slow-ms", type=float, default=20.0)
    p.add_argument("--stall-ms", type=float, default=20.0)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--mode", choices=["delay", "stall", "both"], default="both")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with contextlib.suppress(ImportError):
        import uvloop

        sys.exit(uvloop.run(main(args)))
    sys.exit(asyncio.run(main(args)))
