"""What both sides of bench/throughput.py share: the address, payload size,
topic and timeouts, the fork context, where a run connects (``Target``) and
with what credentials (``ClientSecurity``), what client processes report
(``PubResult``, ``SubResult``), publish pacing, and helpers for ports,
scheduling priority and CPU accounting."""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
HOST: Final = "127.0.0.1"
PAYLOAD_BYTES: Final = 100
TOPIC: Final = "bench/t"
# MQTT payload: seq and send time, then padding up to PAYLOAD_BYTES.
MQTT_HEAD: Final = struct.Struct(">qd")
MQTT_PAD: Final = b"x" * (PAYLOAD_BYTES - MQTT_HEAD.size)
# A paced publisher sends what is due, then sleeps at least this long (uvloop's
# timer resolution is 1 ms; shorter sleeps would spin and steal a core).
PACE_SLEEP: Final = 0.001
STARTUP_TIMEOUT: Final = 20.0

CTX: Final = mp.get_context("fork")


# == environment ====================================================================


def freeze_heap() -> None:
    """Take what a client process holds once connected out of the cyclic GC.

    A forked client inherits the bench's whole heap; its first full collection
    while the run is on walked all of it and stalled the subscriber 15–20 ms
    (measured with a ``gc.callbacks`` probe), which was the overlay's max
    latency at 5,000/s.  The node processes freeze their start-up state the
    same way (``net.node``); every client — overlay, raw MQTT, paho — does
    this at the same point, so the comparison stays even."""
    gc.collect()
    gc.freeze()


def set_priority(nice: int) -> str:
    """Run this process and its children at ``nice``; say what was done.

    With scheduler autogroups (one group per session) a process's nice only
    orders it inside its group, so the group's nice is set too: the bench's
    processes then win the CPU from other sessions' work on a shared machine.
    """
    done = []
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        done.append(f"nice {nice}")
    except OSError as exc:
        done.append(f"nice {os.getpriority(os.PRIO_PROCESS, 0)} (could not set {nice}: {exc.strerror})")
    group = Path("/proc/self/autogroup")
    if group.exists():
        try:
            before = group.read_text().split()[-1]  # "/autogroup-N nice K"
            group.write_text(str(nice))
            # The group is the whole session's: give it back its nice on exit.
            atexit.register(lambda: group.write_text(before))
            done.append(f"scheduler autogroup at nice {nice}")
        except OSError as exc:
            done.append(f"scheduler autogroup unchanged ({exc.strerror})")
    return ", ".join(done)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {STARTUP_TIMEOUT}s")


# Whether this kernel keeps per-thread scheduler statistics (CONFIG_SCHED_INFO).
SCHEDSTAT: Final = os.path.exists("/proc/self/schedstat")


def cpu_seconds(pid: int) -> float:
    """CPU time of a live process so far: the scheduler's nanosecond count of
    each of its threads (``/proc/PID/task/*/schedstat``) when the kernel keeps
    it, else user + system time from ``/proc/PID/stat``.

    The stat figure counts in clock ticks (10 ms): over a one-second run of
    100k events that is ±0.1 µs per event, too coarse for the headline's
    ratio of two small figures.  The nanosecond sum misses a thread that ends
    during a run; the bench's servers and clients keep theirs to the end.
    """
    if SCHEDSTAT:
        total = 0
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return 0.0
        for task in tasks:
            # A thread that ended just now is skipped.
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
        return total / 1e9
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait)."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


# == servers ========================================================================


@dataclass(frozen=True)
class ClientSecurity:
    """What the clients of a secured overlay present: a token each (the
    publisher's with the ``publish`` role, the subscribers' with
    ``subscribe``) and, with TLS, the cluster CA they verify the node with."""

    pub_token: str
    sub_token: str
    ca: str = ""  # a PEM file; "" when the nodes speak plain TCP


@dataclass
class Target:
    """Where a run's clients connect, and which processes are the server."""

    kind: str  # "overlay" or "mqtt"
    pub: tuple[str, int]
    subs: list[tuple[str, int]]  # one address per subscriber slot, reused round-robin
    server_pids: list[int]
    security: ClientSecurity | None = None
    mqtt_client: str = "raw"  # an MQTT run's client: "raw" or "paho" (throughput_mqtt.MQTT_CLIENTS)

    def sub_addr(self, i: int) -> tuple[str, int]:
        return self.subs[i % len(self.subs)]


# == clients (each in its own process) ================================================


@dataclass
class PubResult:
    sent: int
    t_first: float  # wall clock of the first counted publish
    t_last: float
    note: str = ""


@dataclass
class SubResult:
    received: int
    t_first: float
    t_last: float
    latencies: bytes  # array('d') of seconds, counted messages only
    note: str = ""


def _paced(rate: float | None) -> Callable[[int, float], float]:
    """How long to sleep before message ``i`` of a run started at ``t0`` (0: send now)."""
    if rate is None:
        return lambda i, t0: 0.0

    def wait(i: int, t0: float) -> float:
        ahead = t0 + i / rate - time.time()
        return max(ahead, PACE_SLEEP) if ahead > 0 else 0.0

    return wait
