"""Publish→notify throughput and latency: the overlay against Mosquitto and amqtt.

Run as ``.venv/bin/python bench/throughput.py [--quick] [--repeat N] [--only …]
[--secure] [--profile]``; ``make bench`` installs the ``bench`` extra first.

This file runs the bench; next to it, ``throughput_overlay.py`` holds the
overlay side (its nodes, publisher and subscriber processes, null node),
``throughput_mqtt.py`` the MQTT side (brokers, the paho client and its
processes, the null broker), and ``throughput_common.py`` what both share
(constants, ``Target``, the result records, pacing, process and CPU helpers).

What it does:

1. **Systems.**  The overlay with one node and with three (publisher on node
   1, the one channel on node 0, subscribers spread over nodes 2, 0, 1, so an
   event crosses nodes); Mosquitto (Debian's package, installed here with
   ``apt-get`` when missing) and amqtt (PyPI; its ``amqtt`` broker script),
   each on a free loopback port with a temporary config (Mosquitto with
   ``set_tcp_nodelay`` and no queue limit; amqtt with no packet logging and no
   $SYS).  Every server is its own process: overlay nodes are forked from
   here and run ``overlay.net.node.Node`` under uvloop on a socket bound
   before the fork.
2. **Workload.**  One publisher process; 1 or 10 subscribers (one connection
   each) in one subscriber process for 1→1, two for 1→10.  Payload: an MQTT
   message carries exactly 100 bytes (an 8-byte sequence number, an 8-byte
   send time, 84 bytes of padding) at QoS 0 on one topic.  An overlay event is
   ``{topic: "bench/t", n: <seq>}`` with an opaque 100-byte payload (the
   event's body, delivered with every notification and never matched, as
   MQTT's is) — ``topic`` is the distinguishing attribute and every
   subscriber's filter is ``topic = "bench/t"`` (the analogue of one MQTT
   topic); the Publish frame is ~150 bytes with the seq, id and publish time
   the protocol carries anyway.  Each subscriber checks every payload's size
   (``bad-payload`` in the notes if one differs).
3. **Throughput runs** publish as fast as the publisher may, bounded by a
   count and a time limit.  The overlay publisher uses
   ``Client.publish_windowed`` (pipelined, paced by PubAcks); the MQTT one is
   ``paho-mqtt`` at QoS 0 (paced by TCP only), with its socket I/O batched
   (``_paho_class``) so that paho's per-packet system calls do not set the
   pace.  Throughput is deliveries (notifications received by all subscribers
   together) per second, from the first publish to the last delivery;
   events/s is that over the fan-out; lost = published × fan-out − delivered.
   Latency is receive time minus the publisher's send time (one machine, one
   clock); under saturation it is mostly queueing.
4. **Latency runs**: 1→1 at a fixed offered 5,000 msgs/s (the publisher sends
   what is due, then sleeps ≥ 1 ms), after an uncounted warm-up.
5. **Repeats.**  Each configuration runs ``REPEATS`` times; the table shows
   the median run (by throughput, or by p99 for latency runs) and the range.
6. **Load-generator check**, printed after the table: (1) each client process
   alone against a stand-in that does no broker work — publishers against a
   null sink (the overlay one still gets a PubAck per frame), subscribers
   against a firehose of pre-encoded notifications; (2) the 1→1 runs again
   with a second publisher process; (3) every process's CPU during each run
   (server / publisher / subscribers / the rest of the machine).
7. **Cost of security** (``--secure``, or the systems ``overlay-1-sec`` and
   ``overlay-3-sec``): the overlay runs again with TLS on every port
   (development certificates made for the run: clients verify the node,
   peers authenticate each other) and ``[auth]`` — every client presents a
   token with the one role it needs, checked at its Hello and each publish
   against it — and the report sets deliveries/s and p99 of each
   configuration beside the plain run's, with the cost (1 − secure/plain).
8. **The machine.**  It has 2 cores, shared by every process of a run — and
   possibly by other work.  The bench runs its processes at ``BENCH_NICE``
   (and its scheduler autogroup too, restored on exit) so the neighbours
   disturb it less; the "other" CPU column shows what they still took.

Targets (one node, 1→1): overlay ≥ 5× amqtt and ≥ 0.5× Mosquitto
throughput; p99 ≤ 5 ms at 5k msgs/s; security costs ≤ 25 % of the plain
deliveries/s.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import io
import os
import pstats
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from throughput_common import (
    CTX,
    HOST,
    PAYLOAD_BYTES,
    STARTUP_TIMEOUT,
    TOPIC,
    PubResult,
    SubResult,
    Target,
    cpu_seconds,
    machine_busy,
    set_priority,
)
from throughput_mqtt import (
    _mqtt_pub_main,
    _mqtt_sub_main,
    _null_mqtt_broker,
    amqtt_broker,
    ensure_mosquitto,
    ensure_python_deps,
    mosquitto_broker,
)
from throughput_overlay import OVERLAY_FILTER, _null_overlay_node, _overlay_pub_main, _overlay_sub_main, overlay_cluster

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
FANOUT: Final = (1, 10)
# The machine may be shared with other work: every process of the bench runs
# at this priority (inherited) so what it measures is the systems, not the
# neighbours.  The CPU% column still shows what the others took.
BENCH_NICE: Final = -10
# Runs per configuration: the machine is shared, so one run can be unlucky.
REPEATS: Final = 3
TARGET_AMQTT: Final = 5.0
TARGET_MOSQUITTO: Final = 0.5
TARGET_P99_MS: Final = 5.0
TARGET_SECURE_COST: Final = 0.25  # of the plain deliveries/s
SECURE: Final = "-sec"  # the suffix of a secure overlay system


# == servers ========================================================================


# == clients (each in its own process) ================================================


# == one run ==========================================================================


@dataclass
class Run:
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
            fn = _mqtt_sub_main
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
            pfn = _mqtt_pub_main
            pargs = (target.pub[1], n // publishers, warmup, share, limit, pub_ready, go, ptx)
        pub = CTX.Process(target=pfn, args=pargs, name=f"pub-{j}", daemon=True)
        pub.start()
        pubs.append((pub, prx))
        if not pub_ready.wait(STARTUP_TIMEOUT):
            raise RuntimeError(f"{run.system}: publisher did not connect")

    roles = {"server": target.server_pids, "pub": [p.pid for p, _ in pubs], "subs": [p.pid for p, *_ in subs]}
    cpu0 = {r: sum(cpu_seconds(pid) for pid in pids) for r, pids in roles.items()}
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
    cpu1 = {r: sum(cpu_seconds(pid) for pid in pids) for r, pids in roles.items()}
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
    run.cpu = {r: 100.0 * (cpu1[r] - cpu0[r]) / wall for r in roles}
    # What processes outside this run took meanwhile: the machine is shared.
    run.cpu["other"] = max(0.0, 100.0 * (busy1 - busy0) / wall - sum(run.cpu.values()))
    run.server_us = 1e6 * (cpu1["server"] - cpu0["server"]) / max(run.sent, 1)
    run.notes.extend(x for x in [*(r.note for r in presults), *(r.note for r in results)] if x)
    return run


SYSTEMS: Final[dict[str, tuple[str, str, Callable[..., contextlib.AbstractContextManager[Target]]]]] = {
    "overlay-1": ("overlay", "1", lambda prof=None: overlay_cluster(1, prof)),
    "overlay-3": ("overlay", "3", lambda prof=None: overlay_cluster(3, prof)),
    "overlay-1-sec": ("overlay-sec", "1", lambda prof=None: overlay_cluster(1, prof, secure=True)),
    "overlay-3-sec": ("overlay-sec", "3", lambda prof=None: overlay_cluster(3, prof, secure=True)),
    "mosquitto": ("mosquitto", "1", lambda prof=None: mosquitto_broker()),
    "amqtt": ("amqtt", "1", lambda prof=None: amqtt_broker()),
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


def generator_capacity(kind: str, n: int) -> tuple[float, float]:
    """(publisher msgs/s against a null sink, subscriber msgs/s from a firehose)."""
    rates = []
    for mode in ("sink", "firehose"):
        s = socket.socket()
        s.bind((HOST, 0))
        s.listen(16)
        port = s.getsockname()[1]
        fn = _null_overlay_node if kind == "overlay" else _null_mqtt_broker
        server = CTX.Process(target=fn, args=(s, mode, n), daemon=True)
        server.start()
        s.close()
        try:
            target = Target("overlay" if kind == "overlay" else "mqtt", (HOST, port), [(HOST, port)], [server.pid])
            if mode == "sink":
                ready, go = CTX.Event(), CTX.Event()
                rx, tx = CTX.Pipe(duplex=False)
                if kind == "overlay":
                    p = CTX.Process(
                        target=_overlay_pub_main, args=(target.pub, n, 0, None, TIME_LIMIT, ready, go, tx), daemon=True
                    )
                else:
                    p = CTX.Process(
                        target=_mqtt_pub_main, args=(port, n, 0, None, TIME_LIMIT, ready, go, tx), daemon=True
                    )
                p.start()
                ready.wait(STARTUP_TIMEOUT)
                go.set()
                res: PubResult = rx.recv()
                p.join(10)
                rates.append(res.sent / (res.t_last - res.t_first))
            else:
                ready, stop = CTX.Event(), CTX.Event()
                progress = CTX.Value("q", 0, lock=False)
                rx, tx = CTX.Pipe(duplex=False)
                if kind == "overlay":
                    p = CTX.Process(
                        target=_overlay_sub_main, args=([target.pub], 0, ready, stop, progress, tx), daemon=True
                    )
                else:
                    p = CTX.Process(target=_mqtt_sub_main, args=(port, 1, 0, ready, stop, progress, tx), daemon=True)
                p.start()
                ready.wait(STARTUP_TIMEOUT)
                deadline = time.monotonic() + TIME_LIMIT
                while progress.value < n and time.monotonic() < deadline:
                    time.sleep(0.01)
                stop.set()
                sres: SubResult = rx.recv()
                p.join(10)
                rates.append(sres.received / max(sres.t_last - sres.t_first, 1e-9))
        finally:
            server.kill()
            server.join()
    return rates[0], rates[1]


# == report ===========================================================================


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def _median(runs: Sequence[Run], key: Callable[[Run], float]) -> Run:
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def _row(r: Run, spread: Sequence[Run] = ()) -> str:
    cpu = "/".join(f"{r.cpu.get(k, 0):.0f}" for k in ("server", "pub", "subs", "other"))
    rng = ""
    if len(spread) > 1:
        lo, hi = min(x.throughput for x in spread), max(x.throughput for x in spread)
        rng = f"{lo / 1000:.0f}–{hi / 1000:.0f}k"
    return (
        f"{r.system:<11} {r.nodes:>5} {('1→' + str(r.fanout)):>6} {r.offered:>8} {r.sent:>8,} {r.delivered:>10,} "
        f"{r.lost:>6,} {_fmt_rate(r.throughput):>9} {rng:>9} {_fmt_rate(r.events_per_s):>9} "
        f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.server_us:>7.1f} {cpu:>15}  {'; '.join(r.notes)}"
    )


HEADER: Final = (
    f"{'system':<11} {'nodes':>5} {'fan':>6} {'offered':>8} {'events':>8} {'delivered':>10} "
    f"{'lost':>6} {'deliv/s':>9} {'range':>9} {'events/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'srv µs':>7} {'CPU% s/p/s/oth':>15}  notes"
)


def print_security_cost(runs: dict[tuple[str, int], Run], lat_runs: dict[str, Run]) -> None:
    """Each secured configuration beside its plain twin: deliveries/s, p99, the cost."""
    print()
    print("cost of security (secured: TLS on every port and [auth] tokens), median runs:")
    for (key, fanout), sec in runs.items():
        if not key.endswith(SECURE) or (plain := runs.get((key.removesuffix(SECURE), fanout))) is None:
            continue
        cost = 1 - sec.throughput / plain.throughput if plain.throughput else float("nan")
        verdict = "met" if cost <= TARGET_SECURE_COST else "NOT met"
        print(
            f"  {plain.nodes} node{'s' if plain.nodes != '1' else ''} 1→{fanout:<2} deliv/s plain {_fmt_rate(plain.throughput):>9}"
            f", secured {_fmt_rate(sec.throughput):>9}: cost {cost:6.1%} (target ≤ {TARGET_SECURE_COST:.0%}, {verdict}); "
            f"p99 {plain.p99_ms:.2f} → {sec.p99_ms:.2f} ms"
        )
    for key, sec in lat_runs.items():
        if key.endswith(SECURE) and (plain := lat_runs.get(key.removesuffix(SECURE))) is not None:
            print(
                f"  {plain.nodes} node 1→1 at {FIXED_RATE:,}/s offered: p99 plain {plain.p99_ms:.2f} ms, "
                f"secured {sec.p99_ms:.2f} ms (p50 {plain.p50_ms:.2f} → {sec.p50_ms:.2f})"
            )


def print_profile(profile_dir: str) -> None:
    for path in sorted(Path(profile_dir).glob("*.pstats")):
        buf = io.StringIO()
        st = pstats.Stats(str(path), stream=buf)
        st.sort_stats("tottime").print_stats(25)
        print(f"\n--- cProfile of {path.stem} (sorted by own time) ---")
        print("\n".join(buf.getvalue().splitlines()[-32:]))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the messages, one repeat (a smoke run)")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated systems to run (overlay-1,overlay-3,mosquitto,amqtt; overlay-1-sec,overlay-3-sec)",
    )
    ap.add_argument(
        "--secure",
        action="store_true",
        help="run each overlay system selected plain and secured (TLS and tokens), with the cost of security; "
        "--profile then profiles the secured cluster",
    )
    ap.add_argument(
        "--repeat", type=int, default=REPEATS, help="runs per configuration; the median is shown (default %(default)s)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="also run the overlay 1→1 with cProfile in its nodes and print it"
    )
    ap.add_argument(
        "--profile-nodes", type=int, default=1, choices=(1, 3), help="nodes of the profiled run (default %(default)s)"
    )
    ap.add_argument("--profile-dir", default="", help="keep the profiled nodes' .pstats files here (to compare runs)")
    ap.add_argument("--no-check", action="store_true", help="skip the load-generator check")
    ap.add_argument(
        "--nice",
        type=int,
        default=BENCH_NICE,
        help="scheduling priority of every process of the bench (default %(default)s; needs root below 0)",
    )
    args = ap.parse_args(argv)
    scale = 0.1 if args.quick else 1.0
    reps = 1 if args.quick else max(1, args.repeat)
    keys = [k for k in (args.only.split(",") if args.only else (k for k in SYSTEMS if SECURE not in k)) if k]
    for k in keys:
        if k not in SYSTEMS:
            ap.error(f"unknown system {k!r}")
    if args.secure:  # each overlay system beside its secured twin
        keys = list(dict.fromkeys(x for k in keys for x in ((k, k + SECURE) if k + SECURE in SYSTEMS else (k,))))

    ensure_python_deps()
    # A plain kill still runs the atexit hooks (set_priority restores the group).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    priority = set_priority(args.nice)
    if "mosquitto" in keys:
        ensure_mosquitto()
    started = time.monotonic()
    print(
        f"machine: {os.cpu_count()} cores (shared by every server and client process of a run), load average "
        f"{os.getloadavg()[0]:.1f} at start; Python {sys.version.split()[0]}; {priority}"
    )
    print(
        f"payload: {PAYLOAD_BYTES} bytes — MQTT: the message body (QoS 0, topic {TOPIC!r}); overlay: the event's "
        f"payload, attributes {{topic, n}}, filter {OVERLAY_FILTER}"
    )
    print(
        f"throughput runs: ≤{int(EVENTS_1TO1 * scale):,} events (1→1) / ≤{int(EVENTS_FANOUT * scale):,} (1→10), "
        f"≤{TIME_LIMIT * scale:.1f} s each; latency runs: {FIXED_RATE:,}/s for {FIXED_SECONDS * scale:.1f} s after "
        f"{FIXED_WARMUP:,} uncounted; each configuration run {reps}×, the median run shown"
    )
    print()

    runs: dict[tuple[str, int], Run] = {}
    print(HEADER)
    print("-" * len(HEADER))
    for fanout in FANOUT:
        for key in keys:
            tries = [throughput_run(key, fanout, scale) for _ in range(reps)]
            runs[key, fanout] = r = _median(tries, lambda x: x.throughput)
            print(_row(r, tries), flush=True)
    lat_runs: dict[str, Run] = {}
    for key in keys:
        if SYSTEMS[key][1] == "1":
            tries = [latency_run(key, scale) for _ in range(reps)]
            lat_runs[key] = r = _median(tries, lambda x: x.p99_ms)
            print(_row(r), flush=True)
    print("-" * len(HEADER))
    print(
        "deliv/s: notifications received by all subscribers together per second (median run; range: all runs);\n"
        "events/s = deliv/s / fan-out; srv µs: server CPU time per event (all its processes);\n"
        "CPU%: server / publisher / subscribers / everything else on the machine, in % of one core (2 cores = 200 %)"
    )

    print()
    print("ratios, one node (throughput = deliveries/s of the median runs):")
    for fanout in FANOUT:
        ov = runs.get(("overlay-1", fanout))
        for peer, goal in (("amqtt", TARGET_AMQTT), ("mosquitto", TARGET_MOSQUITTO)):
            other = runs.get((peer, fanout))
            if ov is None or other is None or not other.throughput:
                continue
            ratio = ov.throughput / other.throughput
            verdict = ("met" if ratio >= goal else "NOT met") if fanout == 1 else "(target is for 1→1)"
            print(f"  1→{fanout:<2} overlay/{peer:<9} = {ratio:5.2f}×   target ≥ {goal}×  {verdict}")
    ov_lat = lat_runs.get("overlay-1")
    if ov_lat is not None:
        verdict = "met" if ov_lat.p99_ms <= TARGET_P99_MS else "NOT met"
        print(
            f"  overlay p99 at {FIXED_RATE:,}/s offered: {ov_lat.p99_ms:.2f} ms (p50 {ov_lat.p50_ms:.2f}, "
            f"max {ov_lat.max_ms:.2f})   target ≤ {TARGET_P99_MS} ms  {verdict}"
        )
    if any(SECURE in k for k in keys):
        print_security_cost(runs, lat_runs)

    if not args.no_check:
        print()
        print("load-generator check:")
        print("  1. each client process alone, against a stand-in that does no broker work:")
        n = int(EVENTS_1TO1 * max(scale, 0.5))
        for kind, names in (("overlay", ("overlay-1", "overlay-3")), ("mqtt", ("mosquitto", "amqtt"))):
            if not any(k in keys for k in names):
                continue
            pub_rate, sub_rate = generator_capacity(kind, n)
            top = max((runs[k, 1].throughput for k in names if (k, 1) in runs), default=0.0)
            print(
                f"     {kind:<8} publisher → null sink {_fmt_rate(pub_rate):>9}/s; firehose → one subscriber "
                f"{_fmt_rate(sub_rate):>9}/s; best measured 1→1 {_fmt_rate(top)}/s = "
                f"{top / min(pub_rate, sub_rate):.0%} of the weaker client alone"
            )
        print("  2. a second publisher process (half the events each), 1→1:")
        for key in ("overlay-1", "mosquitto"):
            if (key, 1) not in runs:
                continue
            one = runs[key, 1]
            two = _median([throughput_run(key, 1, scale, publishers=2) for _ in range(reps)], lambda x: x.throughput)
            print(
                f"     {key:<10} 1 publisher {_fmt_rate(one.throughput):>9}/s, 2 publishers {_fmt_rate(two.throughput):>9}/s "
                f"({two.throughput / one.throughput - 1:+.0%}); CPU% server/pubs/sub/other {'/'.join(f'{two.cpu[k]:.0f}' for k in ('server', 'pub', 'subs', 'other'))}"
            )
        print(
            "  3. the CPU% columns above: a server near 100 % of a core while its clients stay below is the bottleneck;\n"
            "     on 2 cores the clients' CPU is CPU the server does not get, which the 1→10 runs show most."
        )

    if args.profile:
        with contextlib.ExitStack() as stack:
            prof = args.profile_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-profile-"))
            Path(prof).mkdir(parents=True, exist_ok=True)
            with overlay_cluster(args.profile_nodes, prof, secure=args.secure) as target:
                r = run_workload(
                    target,
                    Run("overlay-sec" if args.secure else "overlay", str(args.profile_nodes), 1, "max"),
                    int(EVENTS_1TO1 * scale),
                    limit=TIME_LIMIT,
                )
            print(f"\nprofiled run (cProfile slows the node): {_fmt_rate(r.throughput)}/s")
            print_profile(prof)
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
