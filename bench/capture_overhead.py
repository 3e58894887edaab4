"""Publish throughput with capture on and off (SPEC §13; target ≤ 10 % overhead).

    .venv/bin/python bench/capture_overhead.py [--events 20000] [--rounds 3] [--nodes 3] [--core]

Each round starts the cluster twice — capture off, then on (the order
alternates between rounds) — with every node in its own forked process under
uvloop, on ports bound here before the fork.  Balancing is off so every run
does the same work: the whole space stays on node 0, the publisher's access
node, and subscribers on every other node (each event matches ~3 of their
subscriptions) receive the notifications over the overlay, so a captured
event costs its ``publish`` and ``event`` records on node 0 and ``deliver``
records on the others.

Two figures per run: **throughput** — events published and fully delivered
per second, from the first publish (pipelined, ``publish_windowed``) to the
last notification — and **CPU per event** — the user + system time all node
processes spent from the first publish to the last notification
(``/proc/<pid>/stat``, 10 ms ticks), divided by the events.
The machine's 2 cores are shared by the nodes, this process and whatever
else runs, so throughput swings from run to run; CPU per event is the
steadier measure of what capture costs.  The overhead is the ratio of medians.

``--core`` measures the same workload without processes or sockets: the
three node cores joined by the tests' in-memory ``CoreLink``, in this one
process, capture off and on alternately, CPU time per event.  Nothing else
shares that measurement, so it resolves the few microseconds capture adds
where the cluster runs on a busy machine only bound them.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUBS_PER_NODE = 12


def _node_main(cfg: Any, node_id: int, sock: socket.socket) -> None:
    import logging

    import uvloop

    logging.basicConfig(level=logging.ERROR)  # links dropping at shutdown are expected here

    from overlay.net.node import Node

    async def main() -> None:
        node = Node(cfg, node_id, sock=sock)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, node.stop)
        await node.run()

    uvloop.run(main())


def _config(nodes: int, capture_dir: str) -> tuple[Any, list[socket.socket]]:
    import msgspec

    from overlay.config import NodeConfig, load_config
    from overlay.testing import bound_socket, insecure_tls, override

    cfg = override(
        load_config(ROOT / "cluster_configs" / "local.toml"), cluster={"balancing": False, "capture_dir": capture_dir}
    )
    cfg = msgspec.structs.replace(cfg, tls=insecure_tls())  # the capture's cost, not TLS's
    socks = [bound_socket() for _ in range(nodes)]
    return cfg.with_nodes(
        tuple(NodeConfig(i, "127.0.0.1", s.getsockname()[1], 0, 1.0) for i, s in enumerate(socks))
    ), socks


async def _drive(cfg: Any, events: int, mark: Any) -> float:
    from overlay.cli import wait_ready
    from overlay.client import Client

    await wait_ready(cfg, 30)
    addrs = [(n.host, n.port) for n in cfg.nodes]
    subs = []
    clients = []
    others = addrs[1:] or addrs[:1]
    per = max(1, SUBS_PER_NODE * 2 // len(others)) if len(addrs) > 1 else SUBS_PER_NODE
    for k, a in enumerate(others):
        c = await Client([a], client_id=f"sub{k}").connect()
        clients.append(c)
        for j in range(per):
            lo = (j * 997 + k * 131) % 850
            subs.append(await c.subscribe(f"price >= {lo} and price < {lo + 150}"))
    pub = await Client([addrs[0]], client_id="pub").connect()
    clients.append(pub)
    # Expected notifications, from the filters (each Notify is counted per subscription id).
    expected = 0
    prices = [float((i * 7919) % 1000) for i in range(events)]
    ranges = []
    for s in subs:
        low = float(s.expression.split(">= ")[1].split(" ")[0])
        high = float(s.expression.split("< ")[1])
        ranges.append((low, high))
    for p in prices:
        expected += sum(1 for lo, hi in ranges if lo <= p < hi)
    got = [0]

    async def consume(s: Any) -> None:
        async for _note in s:  # every subscription gets its own copy
            got[0] += 1

    tasks = [asyncio.create_task(consume(s)) for s in subs]
    mark()  # CPU from here on: publishing and delivering only
    t0 = time.perf_counter()
    for i, p in enumerate(prices):
        await pub.publish_windowed({"price": p, "sym": "AB", "qty": i % 100})
    await pub.flush(timeout=120)
    deadline = time.perf_counter() + 60
    while got[0] < expected and time.perf_counter() < deadline:
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - t0
    mark()
    if got[0] < expected:
        print(f"  warning: {got[0]}/{expected} notifications arrived", file=sys.stderr)
    for t in tasks:
        t.cancel()
    for c in clients:
        await c.close()
    return events / elapsed


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(nodes: int, events: int, capture: bool) -> tuple[float, float, int]:
    tmp = tempfile.mkdtemp(prefix="capbench-")
    cfg, socks = _config(nodes, os.path.join(tmp, "run") if capture else "")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_node_main, args=(cfg, n.id, s), daemon=True) for n, s in zip(cfg.nodes, socks)]
    for p in procs:
        p.start()
    pids = [p.pid for p in procs if p.pid is not None]  # every one, once started
    for s in socks:
        s.close()
    try:
        import uvloop

        marks: list[float] = []
        rate = uvloop.run(_drive(cfg, events, lambda: marks.append(sum(_cpu_seconds(pid) for pid in pids))))
        cpu = marks[1] - marks[0]
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        for p in procs:
            p.join(15)
    size = sum(f.stat().st_size for f in Path(tmp).rglob("*.ndjson"))
    return rate, cpu / events * 1e6, size


def core_once(events: int, capture: bool) -> float:
    """CPU µs per event of three cores on CoreLink (``--core``)."""
    from overlay.capture import CaptureBuffer
    from overlay.messages import client as cm
    from overlay.testing.corelink import CoreLink

    cfg, socks = _config(3, "")
    for s in socks:
        s.close()
    net = CoreLink(cfg)
    net.start()
    bufs = []
    if capture:
        for c in net.cores.values():
            c.capture = CaptureBuffer(c.id)
            bufs.append(c.capture)
    for node in (1, 2):
        sid = net.open_client(node, f"s{node}")
        for j in range(SUBS_PER_NODE):
            lo = (j * 997 + node * 131) % 850
            net.request(node, sid, cm.Subscribe(j, f"s{j}", f"price >= {lo} and price < {lo + 150}"))
    pub = net.open_client(0, "p")
    t = time.process_time()
    for i in range(events):
        net.client_send(0, pub, cm.Publish(i, {"price": float((i * 7919) % 1000), "sym": "AB", "qty": i % 100}))
        if i % 100 == 0:
            net.run()
        if i % 5000 == 0:  # what the writer takes every 0.5 s at ~10k events/s
            for b in bufs:
                b.take()
    net.run()
    return (time.process_time() - t) / events * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="publish throughput with capture on and off")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--core", action="store_true", help="in-process cores on CoreLink, CPU per event only")
    a = ap.parse_args(argv)
    if a.core:
        per: dict[bool, list[float]] = {False: [], True: []}
        for r in range(a.rounds):
            for capture in (False, True) if r % 2 == 0 else (True, False):
                per[capture].append(core_once(a.events, capture))
                print(
                    f"round {r + 1}: capture {'on ' if capture else 'off'} {per[capture][-1]:6.1f} µs/event", flush=True
                )
        off, on = statistics.median(per[False]), statistics.median(per[True])
        print(
            f"\ncores' CPU per event (median): off {off:.1f} µs, on {on:.1f} µs -> +{on - off:.1f} µs ({100 * (on / off - 1):+.1f} %)"
        )
        return 0
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    size = 0
    for r in range(a.rounds):
        for capture in (False, True) if r % 2 == 0 else (True, False):
            rate, cpu, sz = run_once(a.nodes, a.events, capture)
            rates[capture].append(rate)
            cpus[capture].append(cpu)
            size = max(size, sz)
            print(
                f"round {r + 1}: capture {'on ' if capture else 'off'} {rate:8.0f} events/s, "
                f"nodes' CPU {cpu:6.1f} µs/event",
                flush=True,
            )
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    c_off, c_on = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(f"\nthroughput (median): off {off:.0f} events/s, on {on:.0f} events/s -> {100 * (1 - on / off):+.1f} %")
    print(f"nodes' CPU per event (median): off {c_off:.1f} µs, on {c_on:.1f} µs -> {100 * (c_on / c_off - 1):+.1f} %")
    print(f"({a.nodes} nodes, {a.events} events per run, {a.rounds} rounds, capture {size / a.events:.0f} bytes/event)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
