"""Ordered delivery and subscriber groups: throughput, shares, tail latency (issue 7 item 7).

    .venv/bin/python bench/ordering.py [--events 20000]

One in-process cluster of 3 nodes on loopback (balancing off); a publisher on
node 0 pipelines publishes; subscribers are raw protocol clients
(``overlay.testing.RawClient``) that ack every notification at once.

* **ordered**: events/s delivered with 1, 100 and 1,000 sequence keys,
  against unordered events of the same cluster in the same run.  Target: with
  1,000 keys ≥ 50 % of unordered.
* **group shares**: 3 instances with weights 1, 2, 3 after 10k events, the
  largest |share − weight share|.  Target ≤ 2 %.
* **group p99**: 3 equal instances, one slowed (10 ms per event) that reports
  ``LF = 0.9`` on its acks, as the client library's load factor would under
  that queue; events at a steady 500/s; p99 of publish → ack.  Baseline:
  the same with every instance reporting ``LF = 0`` (the dispatcher then is
  plain round robin).  Target ≤ 0.5×.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from overlay.channels.schema import Value
from overlay.config import load_config
from overlay.testing import LoopbackCluster, RawClient, wait_until

LOCAL = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
WINDOW = 2000


def ev(i: int) -> dict[str, Value]:
    return {"price": float(i % 1000), "sym": "AB", "qty": i}


async def pump(pub: RawClient, n: int, key_of: Callable[[int], str] | None = None) -> None:
    """Publish n events with at most WINDOW unanswered (a callback per reply, not
    asyncio.wait over the window: that would cost O(WINDOW) per wake-up)."""
    room = asyncio.Event()
    room.set()
    state = {"open": 0}

    def done(_: asyncio.Future[Any]) -> None:
        state["open"] -= 1
        if state["open"] < WINDOW:
            room.set()

    for i in range(n):
        if state["open"] >= WINDOW:
            room.clear()
            await room.wait()
        state["open"] += 1
        pub.publish_nowait(ev(i), key=key_of(i) if key_of else "").add_done_callback(done)
    while state["open"]:
        room.clear()
        await room.wait()


async def throughput(cl: LoopbackCluster, sub: RawClient, pub: RawClient, n: int, keys: int) -> tuple[float, float]:
    """(events/s by the wall clock, events per CPU-second of this process).

    The whole cluster and its clients run in this one process, so the second
    is the cluster's capacity, unaffected by other work on the machine."""
    start_notes = len(sub.notes)
    t, c = time.perf_counter(), time.process_time()
    await pump(pub, n, (lambda i: f"key{i % keys}") if keys else None)
    await wait_until(lambda: len(sub.notes) - start_notes >= n, 120, "delivery")
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


async def ordered_section(n: int, rounds: int = 3) -> list[tuple[str, tuple[float, float]]]:
    """Cases interleaved over ``rounds`` rounds, medians reported: the machine's
    other load shifts every case alike."""
    cl = await LoopbackCluster(LOCAL, 3, balancing=False).start()
    try:
        sub = await cl.raw(1)
        await sub.subscribe("price >= 0")
        pub = await cl.raw(0)
        await throughput(cl, sub, pub, 2000, 0)  # warm-up
        cases = [
            ("unordered", 0, n),
            ("ordered, 1 key", 1, min(n, 2000)),
            ("ordered, 100 keys", 100, n),
            ("ordered, 1000 keys", 1000, n),
        ]
        got: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in cases}
        for _ in range(rounds):
            for name, keys, m in cases:
                got[name].append(await throughput(cl, sub, pub, m, keys))

        def med(xs: list[float]) -> float:
            return sorted(xs)[len(xs) // 2]

        return [(name, (med([w for w, _ in got[name]]), med([c for _, c in got[name]]))) for name, _, _ in cases]
    finally:
        await cl.stop()


async def shares_section(n: int) -> float:
    cl = await LoopbackCluster(LOCAL, 3, balancing=False).start()
    try:
        weights = [1.0, 2.0, 3.0]
        inst = [await cl.raw(i) for i in range(3)]
        for c, w in zip(inst, weights):
            await c.subscribe("price >= 0", group="g", weight=w)
        pub = await cl.raw(0)
        await pump(pub, n)
        await wait_until(lambda: sum(len(c.notes) for c in inst) >= n, 60, "group delivery")
        return max(abs(len(c.notes) / n - w / sum(weights)) for c, w in zip(inst, weights))
    finally:
        await cl.stop()


async def latency_section(aware: bool, n: int = 2500, rate: float = 500.0) -> float:
    cl = await LoopbackCluster(LOCAL, 3, balancing=False).start()
    try:
        inst = [await cl.raw(i) for i in range(3)]
        inst[2].delay = 0.010
        if aware:
            inst[2].lf = 0.9
        for c in inst:
            await c.subscribe("price >= 0", group="g")
        pub = await cl.raw(0)
        t0 = time.perf_counter()
        for i in range(n):
            pub.publish_nowait(ev(i))
            lag = t0 + (i + 1) / rate - time.perf_counter()
            if lag > 0:
                await asyncio.sleep(lag)
        await wait_until(lambda: sum(len(c.acked) for c in inst) >= n, 60, "every event acked")
        lat = sorted(d for c in inst for _, d in c.acked)  # receive → ack, i.e. queue + processing
        return lat[int(0.99 * (len(lat) - 1))]
    finally:
        await cl.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rows = await ordered_section(args.events)
    (base, cbase) = rows[0][1]
    print(f"{'case':<22}{'events/s':>10}{'ratio':>8}{'events/CPU-s':>14}{'ratio':>8}")
    for name, (rate, crate) in rows:
        print(f"{name:<22}{rate:>10,.0f}{rate / base:>8.0%}{crate:>14,.0f}{crate / cbase:>8.0%}")
    err = await shares_section(10_000)
    print(f"\ngroup share error after 10k events (weights 1:2:3): {err:.2%}  (target ≤ 2%)")
    rr = await latency_section(aware=False)
    lfd = await latency_section(aware=True)
    print(
        f"group p99 processing latency, one instance slowed 10 ms: round robin {rr * 1000:.1f} ms, "
        f"LF-weighted {lfd * 1000:.1f} ms, ratio {lfd / rr:.2f}  (target ≤ 0.5)"
    )


if __name__ == "__main__":
    asyncio.run(main())
