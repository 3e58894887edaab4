"""One run of ``bench/throughput.py``: the systems it compares, the workload
driven against one of them, and each client process's capacity alone.

1. ``SYSTEMS`` names every system the bench knows (``overlay-1``,
   ``overlay-3``, their ``-sec`` twins, ``mosquitto``, ``mosquitto-q1``,
   ``mosquitto-paho``, ``amqtt``) and how to start it; ``throughput_run`` and ``latency_run``
   start one and run the workload of items 4 and 6 of ``throughput.py``'s
   docstring against it.
2. ``run_workload`` starts the subscriber processes, then the publishers,
   and fills a ``Run``: what was sent and delivered, the latencies, every
   process's CPU (item 5) and the machine's other work.
3. ``generator_capacity`` runs each client process alone against a stand-in
   that does no broker work (item 8 (1), the load-generator check).
"""

from __future__ import annotations

import array
import contextlib
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from throughput_common import (
    CTX,
    HOST,
    STARTUP_TIMEOUT,
    PubResult,
    SubResult,
    Target,
    cpu_seconds,
    machine_busy,
)
from throughput_mqtt import MQTT_CLIENTS, _null_mqtt_broker, amqtt_broker, mosquitto_broker
from throughput_overlay import _null_overlay_node, _overlay_pub_main, _overlay_sub_main, overlay_cluster

# Bounds of one throughput run: whichever comes first.
EVENTS_1TO1: Final = 100_000
EVENTS_FANOUT: Final = 20_000
TIME_LIMIT: Final = 10.0
# The latency run: offered rate, length, and the uncounted warm-up before it.
FIXED_RATE: Final = 5_000
FIXED_SECONDS: Final = 4.0
FIXED_WARMUP: Final = 1_000
# After the publisher stops, subscribers get this long without progress
# before the run ends with what they received.
DRAIN_GRACE: Final = 2.0
# Subscribers of a 1→10 run are split over this many processes.
FANOUT_SUB_PROCS: Final = 2
# The fan-outs every system is run at: 1→1 and 1→10.
FANOUT: Final = (1, 10)
SECURE: Final = "-sec"  # the suffix of a secure overlay system


@dataclass
class Run:
    """What one run of one system measured; the tables show the median of a configuration's runs."""

    system: str
    nodes: str
    fanout: int
    offered: str
    sent: int = 0
    delivered: int = 0
    seconds: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    cpu: dict[str, float] = field(default_factory=dict)  # role -> % of one core
    proc_cpu: dict[str, list[float]] = field(default_factory=dict)  # role -> each process's % of one core
    server_us: float = float("nan")  # server CPU per published event
    notes: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.sent * self.fanout - self.delivered

    @property
    def throughput(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def events_per_s(self) -> float:
        return self.throughput / self.fanout

    @property
    def server_us_per_delivery(self) -> float:
        return self.server_us / self.fanout

    @property
    def server_cpu(self) -> str:
        """Each server process's CPU % of one core ("97", or "60+45+30" for three nodes)."""
        return "+".join(f"{x:.0f}" for x in self.proc_cpu.get("server", [])) or "?"

    @property
    def busiest_client(self) -> tuple[str, float]:
        """The client process that used the most CPU: (role, % of one core)."""
        return max(
            ((role, x) for role in ("pub", "subs") for x in self.proc_cpu.get(role, [])),
            key=lambda rx: rx[1],
            default=("", 0.0),
        )


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    if not sorted_xs:
        return float("nan")
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def run_workload(
    target: Target,
    run: Run,
    n: int,
    *,
    warmup: int = 0,
    rate: float | None = None,
    limit: float = TIME_LIMIT,
    publishers: int = 1,
) -> Run:
    """Start subscribers, then ``publishers`` publishers sharing ``n`` events
    (and ``rate``), against ``target``; fill ``run`` and return it."""
    fanout = run.fanout
    procs_n = 1 if fanout == 1 else FANOUT_SUB_PROCS
    groups = [list(range(fanout))[g::procs_n] for g in range(procs_n)]
    stop = CTX.Event()
    go = CTX.Event()
    subs = []
    for g, slots in enumerate(groups):
        ready = CTX.Event()
        progress = CTX.Value("q", 0, lock=False)
        rx, tx = CTX.Pipe(duplex=False)
        if target.kind == "overlay":
            args: tuple[Any, ...] = (
                [target.sub_addr(i) for i in slots],
                warmup,
                ready,
                stop,
                progress,
                tx,
                target.security,
            )
            fn: Callable[..., None] = _overlay_sub_main
        else:
            args = (target.pub[1], len(slots), warmup, ready, stop, progress, tx)
            fn = MQTT_CLIENTS[target.mqtt_client][1]
        p = CTX.Process(target=fn, args=args, name=f"sub-{g}", daemon=True)
        p.start()
        subs.append((p, ready, progress, rx, len(slots)))
    for p, ready, *_ in subs:
        if not ready.wait(STARTUP_TIMEOUT):
            raise RuntimeError(f"{run.system}: subscriber {p.name} did not get ready")
    pubs = []
    share = rate / publishers if rate is not None else None
    for j in range(publishers):
        pub_ready = CTX.Event()
        prx, ptx = CTX.Pipe(duplex=False)
        if target.kind == "overlay":
            pfn: Callable[..., None] = _overlay_pub_main
            pargs: tuple[Any, ...] = (
                target.pub,
                n // publishers,
                warmup,
                share,
                limit,
                pub_ready,
                go,
                ptx,
                target.security,
            )
        else:
            pfn = MQTT_CLIENTS[target.mqtt_client][0]
            pargs = (target.pub[1], n // publishers, warmup, share, limit, pub_ready, go, ptx)
        pub = CTX.Process(target=pfn, args=pargs, name=f"pub-{j}", daemon=True)
        pub.start()
        pubs.append((pub, prx))
        if not pub_ready.wait(STARTUP_TIMEOUT):
            raise RuntimeError(f"{run.system}: publisher did not connect")

    # Every process here has started, so each has its pid.
    roles: dict[str, list[int]] = {
        "server": target.server_pids,
        "pub": [p.pid for p, _ in pubs if p.pid is not None],
        "subs": [p.pid for p, *_ in subs if p.pid is not None],
    }
    cpu0 = {pid: cpu_seconds(pid) for pids in roles.values() for pid in pids}
    busy0 = machine_busy()
    wall0 = time.monotonic()
    go.set()
    # Wait for the publishers, then for the subscribers to catch up or stall.
    deadline = time.monotonic() + limit + 60
    presults: list[PubResult] = []
    for pub, prx in pubs:
        while not prx.poll(0.1):
            if not pub.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{run.system}: publisher did not finish (exit code {pub.exitcode})")
        presults.append(prx.recv())
    sent = sum(r.sent for r in presults)
    last_total, last_change = -1, time.monotonic()
    while True:
        total = sum(pr.value for _, _, pr, _, _ in subs)
        if all(pr.value >= sent * k for _, _, pr, _, k in subs):
            break
        if total != last_total:
            last_total, last_change = total, time.monotonic()
        elif time.monotonic() - last_change > DRAIN_GRACE:
            run.notes.append("subscribers stalled")
            break
        time.sleep(0.02)
    cpu1 = {pid: cpu_seconds(pid) for pids in roles.values() for pid in pids}
    busy1 = machine_busy()
    wall = time.monotonic() - wall0
    stop.set()
    results: list[SubResult] = []
    for p, _, _, rx, _ in subs:
        if not rx.poll(30):
            raise RuntimeError(f"{run.system}: subscriber {p.name} did not report")
        results.append(rx.recv())
        p.join(10)
    for pub, _ in pubs:
        pub.join(10)

    run.sent = sent
    run.delivered = sum(r.received for r in results)
    t_first = min(r.t_first for r in presults)
    t_end = max((r.t_last for r in results if r.received), default=max(r.t_last for r in presults))
    run.seconds = max(t_end - t_first, 1e-9)
    lat: list[float] = []
    for r in results:
        a = array.array("d")
        a.frombytes(r.latencies)
        lat.extend(a)
    lat.sort()
    run.p50_ms = _percentile(lat, 0.50) * 1e3
    run.p99_ms = _percentile(lat, 0.99) * 1e3
    run.max_ms = (lat[-1] if lat else float("nan")) * 1e3
    run.proc_cpu = {r: [100.0 * (cpu1[pid] - cpu0[pid]) / wall for pid in pids] for r, pids in roles.items()}
    run.cpu = {r: sum(xs) for r, xs in run.proc_cpu.items()}
    # What processes outside this run took meanwhile: the machine is shared.
    run.cpu["other"] = max(0.0, 100.0 * (busy1 - busy0) / wall - sum(run.cpu.values()))
    run.server_us = 1e6 * sum(cpu1[pid] - cpu0[pid] for pid in roles["server"]) / max(run.sent, 1)
    run.notes.extend(x for x in [*(r.note for r in presults), *(r.note for r in results)] if x)
    return run


SYSTEMS: Final[dict[str, tuple[str, str, Callable[..., contextlib.AbstractContextManager[Target]]]]] = {
    "overlay-1": ("overlay", "1", lambda prof=None: overlay_cluster(1, prof)),
    "overlay-3": ("overlay", "3", lambda prof=None: overlay_cluster(3, prof)),
    "overlay-1-sec": ("overlay-sec", "1", lambda prof=None: overlay_cluster(1, prof, secure=True)),
    "overlay-3-sec": ("overlay-sec", "3", lambda prof=None: overlay_cluster(3, prof, secure=True)),
    "mosquitto": ("mosquitto", "1", lambda prof=None: mosquitto_broker("raw")),
    # The same broker with the raw clients publishing at QoS 1 (a PUBACK for
    # every PUBLISH), delivering at QoS 0: the overlay's unkeyed guarantee,
    # where plain ``mosquitto`` (QoS 0) answers nothing.
    "mosquitto-q1": ("mosquitto-q1", "1", lambda prof=None: mosquitto_broker("raw-q1")),
    # The same broker driven by paho-mqtt, the bench's client before issue 19:
    # what paho's CPU per message did to Mosquitto's figures.
    "mosquitto-paho": ("mosquitto-paho", "1", lambda prof=None: mosquitto_broker("paho")),
    "amqtt": ("amqtt", "1", lambda prof=None: amqtt_broker("raw")),
}


def throughput_run(key: str, fanout: int, scale: float, publishers: int = 1) -> Run:
    system, nodes, start = SYSTEMS[key]
    n = int((EVENTS_1TO1 if fanout == 1 else EVENTS_FANOUT) * scale)
    with start() as target:
        return run_workload(
            target, Run(system, nodes, fanout, "max"), n, limit=TIME_LIMIT * scale, publishers=publishers
        )


def latency_run(key: str, scale: float) -> Run:
    system, nodes, start = SYSTEMS[key]
    n = int(FIXED_RATE * FIXED_SECONDS * scale)
    with start() as target:
        return run_workload(
            target,
            Run(system, nodes, 1, f"{FIXED_RATE}/s"),
            n,
            warmup=FIXED_WARMUP,
            rate=FIXED_RATE,
            limit=FIXED_SECONDS * scale + 30,
        )


# == load-generator check =============================================================


def generator_capacity(client: str, n: int) -> tuple[float, float, float, float]:
    """Each client process alone against a null server: (publisher msgs/s into
    a sink, its CPU % of one core, subscriber msgs/s from a firehose, its CPU %).
    ``client`` is "overlay" or an MQTT client ("raw", "paho")."""
    out: list[float] = []
    for mode in ("sink", "firehose"):
        s = socket.socket()
        s.bind((HOST, 0))
        s.listen(16)
        port = s.getsockname()[1]
        fn = _null_overlay_node if client == "overlay" else _null_mqtt_broker
        server = CTX.Process(target=fn, args=(s, mode, n), daemon=True)
        server.start()
        s.close()
        try:
            if client == "overlay":
                pub_fn, sub_fn = _overlay_pub_main, _overlay_sub_main
                where: Any = (HOST, port)
            else:
                pub_fn, sub_fn = MQTT_CLIENTS[client]
                where = port
            if mode == "sink":
                ready, go = CTX.Event(), CTX.Event()
                rx, tx = CTX.Pipe(duplex=False)
                p = CTX.Process(target=pub_fn, args=(where, n, 0, None, TIME_LIMIT, ready, go, tx), daemon=True)
                p.start()
                ready.wait(STARTUP_TIMEOUT)
                cpu0, wall0 = cpu_seconds(p.pid or 0), time.monotonic()
                go.set()
                res: PubResult = rx.recv()
                cpu1, wall1 = cpu_seconds(p.pid or 0), time.monotonic()
                p.join(10)
                out += [res.sent / (res.t_last - res.t_first), 100.0 * (cpu1 - cpu0) / (wall1 - wall0)]
            else:
                ready, stop = CTX.Event(), CTX.Event()
                progress = CTX.Value("q", 0, lock=False)
                rx, tx = CTX.Pipe(duplex=False)
                sargs = (
                    ([where], 0, ready, stop, progress, tx)
                    if client == "overlay"
                    else (where, 1, 0, ready, stop, progress, tx)
                )
                p = CTX.Process(target=sub_fn, args=sargs, daemon=True)
                p.start()
                ready.wait(STARTUP_TIMEOUT)
                deadline = time.monotonic() + STARTUP_TIMEOUT
                while not progress.value and time.monotonic() < deadline:
                    time.sleep(0.001)  # the firehose starts 0.2 s after the SUBACK: idle time is not load
                cpu0, wall0 = cpu_seconds(p.pid or 0), time.monotonic()
                deadline = wall0 + TIME_LIMIT
                while progress.value < n and time.monotonic() < deadline:
                    time.sleep(0.01)
                cpu1, wall1 = cpu_seconds(p.pid or 0), time.monotonic()
                stop.set()
                sres: SubResult = rx.recv()
                p.join(10)
                out += [sres.received / max(sres.t_last - sres.t_first, 1e-9), 100.0 * (cpu1 - cpu0) / (wall1 - wall0)]
        finally:
            server.kill()
            server.join()
    return out[0], out[1], out[2], out[3]
