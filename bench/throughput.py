"""Publish→notify throughput and latency: the overlay against Mosquitto and amqtt.

Run as ``.venv/bin/python bench/throughput.py [--quick] [--repeat N] [--only …]
[--profile]``; ``make bench`` installs the ``bench`` extra first.

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
   ``{topic: "bench/t", n: <seq>, payload: <100-byte string>}`` — the
   ``payload`` string attribute carries the 100 bytes, ``topic`` is the
   distinguishing attribute and every subscriber's filter is ``topic =
   "bench/t"`` (the analogue of one MQTT topic); the Publish frame is ~150
   bytes with the seq, tag and publish time the protocol carries anyway.
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
7. **The machine.**  It has 2 cores, shared by every process of a run — and
   possibly by other work.  The bench runs its processes at ``BENCH_NICE``
   (and its scheduler autogroup too, restored on exit) so the neighbours
   disturb it less; the "other" CPU column shows what they still took.

Targets (one node, 1→1): overlay ≥ 5× amqtt and ≥ 0.5× Mosquitto
throughput; p99 ≤ 5 ms at 5k msgs/s.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import atexit
import contextlib
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
HOST: Final = "127.0.0.1"
PAYLOAD_BYTES: Final = 100
TOPIC: Final = "bench/t"
# MQTT payload: seq and send time, then padding up to PAYLOAD_BYTES.
MQTT_HEAD: Final = struct.Struct(">qd")
MQTT_PAD: Final = b"x" * (PAYLOAD_BYTES - MQTT_HEAD.size)
OVERLAY_PAYLOAD: Final = "x" * PAYLOAD_BYTES
# The overlay's analogue of one MQTT topic: a distinguishing string attribute
# with one value, and an equality filter on it.
OVERLAY_FILTER: Final = f'topic = "{TOPIC}"'

# Bounds of one throughput run: whichever comes first.
EVENTS_1TO1: Final = 100_000
EVENTS_FANOUT: Final = 20_000
TIME_LIMIT: Final = 10.0
# The latency run: offered rate, length, and the uncounted warm-up before it.
FIXED_RATE: Final = 5_000
FIXED_SECONDS: Final = 4.0
FIXED_WARMUP: Final = 1_000
# A paced publisher sends what is due, then sleeps at least this long (uvloop's
# timer resolution is 1 ms; shorter sleeps would spin and steal a core).
PACE_SLEEP: Final = 0.001
# After the publisher stops, subscribers get this long without progress
# before the run ends with what they received.
DRAIN_GRACE: Final = 2.0
# Subscribers of a 1→10 run are split over this many processes.
FANOUT_SUB_PROCS: Final = 2
FANOUT: Final = (1, 10)
# The paho client's socket batching (``_paho_class``): flush past this many
# bytes (~150 messages), read this much at a time.
MQTT_WRITE_BATCH: Final = 16 * 1024
MQTT_READ_CHUNK: Final = 256 * 1024
# Generous per-subscription and per-connection queues so a short burst is not
# dropped as a slow consumer: the run measures delivery, not the drop policy.
SUB_QUEUE: Final = 100_000
STARTUP_TIMEOUT: Final = 20.0
# The machine may be shared with other work: every process of the bench runs
# at this priority (inherited) so what it measures is the systems, not the
# neighbours.  The CPU% column still shows what the others took.
BENCH_NICE: Final = -10
# Runs per configuration: the machine is shared, so one run can be unlucky.
REPEATS: Final = 3
TARGET_AMQTT: Final = 5.0
TARGET_MOSQUITTO: Final = 0.5
TARGET_P99_MS: Final = 5.0

CTX: Final = mp.get_context("fork")


# == environment ====================================================================


def ensure_python_deps() -> None:
    """Install the ``bench`` extra of pyproject.toml into this interpreter if missing."""
    try:
        import amqtt  # noqa: F401
        import paho.mqtt  # noqa: F401
    except ImportError:
        with open(ROOT / "pyproject.toml", "rb") as fh:
            reqs = tomllib.load(fh)["project"]["optional-dependencies"]["bench"]
        print(f"installing bench dependencies: {', '.join(reqs)}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *reqs], check=True)


def _find_mosquitto() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/bin/mosquitto") if os.access(p, os.X_OK)), None
    )


def ensure_mosquitto() -> str:
    """The mosquitto binary, installed from Debian's package when missing."""
    found = _find_mosquitto()
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise SystemExit("mosquitto is not installed and apt-get is not available")
    print("installing mosquitto (apt-get)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", "mosquitto"]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        # A fresh machine has no package lists yet.
        subprocess.run(["apt-get", "update"], env=env, stdout=subprocess.DEVNULL, check=True)
        subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=True)
    # The package may also start a system-wide broker on 1883; ours uses its own port.
    found = _find_mosquitto()
    if not found:
        raise SystemExit("apt-get installed mosquitto but its binary is not on PATH or in /usr/sbin")
    return found


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
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {STARTUP_TIMEOUT}s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc."""
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


@dataclass
class Target:
    """Where a run's clients connect, and which processes are the server."""

    kind: str  # "overlay" or "mqtt"
    pub: tuple[str, int]
    subs: list[tuple[str, int]]  # one address per subscriber slot, reused round-robin
    server_pids: list[int]

    def sub_addr(self, i: int) -> tuple[str, int]:
        return self.subs[i % len(self.subs)]


def bench_config(ports: Sequence[int]) -> Any:
    from overlay.config import config_from_dict

    return config_from_dict(
        {
            "cluster": {"name": "bench", "initializer": 0, "balancing": False},
            "nodes": [{"id": i, "host": HOST, "port": p} for i, p in enumerate(ports)],
            "schema": {
                "distinguishing": ["topic"],
                "attributes": [
                    {"name": "topic", "type": "string", "min": 1, "max": 64},
                    {"name": "n", "type": "int", "min": 0, "max": 2**31 - 1},
                    {"name": "payload", "type": "string", "min": 0, "max": 4 * PAYLOAD_BYTES},
                ],
            },
        },
        "<bench>",
    )


def _node_main(cfg: Any, node_id: int, sock: socket.socket, ready: Any, profile: str | None) -> None:
    import logging

    import uvloop

    from overlay.net.node import Node

    # Errors only: stopping a cluster makes every link report its peer gone,
    # and a drop during a run shows in the table's "lost" column anyway.
    logging.basicConfig(level=logging.ERROR)

    async def main() -> None:
        node = Node(cfg, node_id, sock=sock)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, node.stop)
        task = asyncio.create_task(node.run())
        await node.started.wait()
        ready.set()
        await task

    if profile is None:
        uvloop.run(main())
        return
    prof = cProfile.Profile()
    prof.enable()
    try:
        uvloop.run(main())
    finally:
        prof.disable()
        prof.dump_stats(profile)


@contextlib.contextmanager
def overlay_cluster(nodes: int, profile_dir: str | None = None) -> Iterator[Target]:
    socks = []
    for _ in range(nodes):
        s = socket.socket()
        s.bind((HOST, 0))
        s.listen(1024)
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    cfg = bench_config(ports)
    procs = []
    try:
        for i, s in enumerate(socks):
            ready = CTX.Event()
            prof = os.path.join(profile_dir, f"node-{i}.pstats") if profile_dir else None
            p = CTX.Process(target=_node_main, args=(cfg, i, s, ready, prof), name=f"node-{i}", daemon=True)
            p.start()
            procs.append((p, ready))
            s.close()  # the child holds it
        for p, ready in procs:
            if not ready.wait(STARTUP_TIMEOUT):
                raise RuntimeError(f"{p.name} did not start")
        addrs = [(HOST, port) for port in ports]
        if nodes == 1:
            yield Target("overlay", addrs[0], [addrs[0]], [p.pid for p, _ in procs])
        else:
            # Publisher on node 1, the channel on node 0 (the initializer owns
            # EC), subscribers from node 2 on: every event crosses nodes.
            subs = [addrs[(2 + i) % nodes] for i in range(nodes)]
            yield Target("overlay", addrs[1], subs, [p.pid for p, _ in procs])
    finally:
        for p, _ in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        for p, _ in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


@contextlib.contextmanager
def _server(argv: list[str], port: int, what: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run a broker until the block ends; its output goes to ``log``."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_port(port, proc, what)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def mosquitto_broker() -> Iterator[Target]:
    binary = ensure_mosquitto()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-mosquitto-") as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(
            f"listener {port} {HOST}\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "log_dest none\n"
            # Small messages go out at once, as asyncio's transports do for ours.
            "set_tcp_nodelay true\n"
            # QoS 0 to a connected client is never dropped for queue length.
            "max_queued_messages 0\n"
        )
        with _server([binary, "-c", str(conf)], port, "mosquitto", Path(tmp) / "mosquitto.log") as proc:
            yield Target("mqtt", (HOST, port), [(HOST, port)], [proc.pid])


@contextlib.contextmanager
def amqtt_broker() -> Iterator[Target]:
    script = Path(sys.executable).parent / "amqtt"
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-amqtt-") as tmp:
        conf = Path(tmp) / "amqtt.yaml"
        # Only the listener and anonymous access: no packet logging, no $SYS.
        conf.write_text(
            "listeners:\n"
            "  default:\n"
            "    type: tcp\n"
            f"    bind: {HOST}:{port}\n"
            "plugins:\n"
            "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
            "    allow_anonymous: true\n"
        )
        with _server([str(script), "-c", str(conf)], port, "amqtt", Path(tmp) / "amqtt.log") as proc:
            yield Target("mqtt", (HOST, port), [(HOST, port)], [proc.pid])


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


def overlay_event(i: int) -> dict[str, Any]:
    return {"topic": TOPIC, "n": i, "payload": OVERLAY_PAYLOAD}


def _overlay_pub_main(addr: tuple[str, int], n: int, warmup: int, rate: float | None, limit: float, ready: Any, go: Any, out: Connection) -> None:
    import uvloop

    from overlay.client import Client

    async def main() -> PubResult:
        client = await Client([addr]).connect()
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        pace = _paced(rate)
        t0 = time.time()
        t_first = t0
        stop_at = t0 + limit
        sent = 0
        for i in range(n + warmup):
            if i == warmup:
                t_first = time.time()
            while (d := pace(i, t0)) > 0:
                await asyncio.sleep(d)
            await client.publish_windowed(overlay_event(i))
            sent += 1
            if not i & 1023 and time.time() > stop_at:
                break
        await client.flush(timeout=60)
        t_last = time.time()
        note = f"chokes={client.chokes}" if client.chokes else ""
        await client.close()
        return PubResult(max(sent - warmup, 0), t_first, t_last, note)

    out.send(uvloop.run(main()))


def _overlay_sub_main(addrs: list[tuple[str, int]], warmup: int, ready: Any, stop: Any, progress: Any, out: Connection) -> None:
    import uvloop

    from overlay.client import Client

    async def main() -> SubResult:
        clients = [await Client([a]).connect() for a in addrs]
        subs = [await c.subscribe(OVERLAY_FILTER, queue_size=SUB_QUEUE) for c in clients]
        lat = array.array("d")
        state = {"n": 0, "first": 0.0, "last": 0.0}
        ready.set()

        async def consume(sub: Any) -> None:
            async for note in sub:
                if note.event["n"] < warmup:
                    continue
                rx = note.received
                lat.append(rx - note.publish_time)
                if not state["n"]:
                    state["first"] = rx
                state["n"] += 1
                state["last"] = rx
                progress.value = state["n"]

        tasks = [asyncio.create_task(consume(s)) for s in subs]
        while not stop.is_set():
            await asyncio.sleep(0.02)
        for t in tasks:
            t.cancel()
        dropped = sum(s.dropped for s in subs)
        for c in clients:
            await c.close()
        return SubResult(state["n"], state["first"], state["last"], lat.tobytes(), f"client-dropped={dropped}" if dropped else "")

    out.send(uvloop.run(main()))


_PAHO_CLASS: Any = None


def _mqtt_client(name: str) -> Any:
    """A paho-mqtt client whose socket I/O is batched (see ``_paho_class``)."""
    import paho.mqtt.client as mqtt

    return _paho_class()(mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv311)


def _paho_class() -> Any:
    """paho-mqtt's Client with batched socket I/O.

    paho encodes and parses MQTT itself (that stays as it is) but makes one
    ``send()`` per packet and three ``recv()`` calls per packet received; at
    tens of thousands of messages a second those system calls, not the broker,
    would set the pace.  Here writes go to a buffer flushed by ``flush()`` (or
    past ``MQTT_WRITE_BATCH`` bytes) and reads are served from one large
    ``recv()`` — what the overlay's asyncio client does too.
    """
    global _PAHO_CLASS
    if _PAHO_CLASS is not None:
        return _PAHO_CLASS
    import paho.mqtt.client as mqtt

    class BatchedClient(mqtt.Client):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._wbuf = bytearray()
            self._rbuf = b""
            self._rpos = 0

        def _sock_send(self, buf: bytes | bytearray) -> int:
            if self._sock is None:
                raise ConnectionError("not connected")
            self._wbuf += buf
            if len(self._wbuf) >= MQTT_WRITE_BATCH:
                self.flush()
            return len(buf)

        def flush(self) -> None:
            """Write out everything buffered (blocking until the socket takes it)."""
            sock, buf = self._sock, self._wbuf
            if not buf:
                return
            if sock is None:
                raise ConnectionError("not connected")
            done = 0
            with memoryview(buf) as view:
                while done < len(buf):
                    try:
                        done += sock.send(view[done:])
                    except BlockingIOError:
                        _wait_writable(sock)
            buf.clear()

        def _sock_close(self) -> None:
            # paho closes right after "sending" DISCONNECT: send it for real first.
            with contextlib.suppress(OSError):
                self.flush()
            super()._sock_close()

        def _sock_recv(self, bufsize: int) -> bytes:
            if self._rpos >= len(self._rbuf):
                if self._sock is None:
                    raise ConnectionError("not connected")
                self._rbuf = self._sock.recv(MQTT_READ_CHUNK)  # BlockingIOError: paho waits
                self._rpos = 0
                if not self._rbuf:
                    return b""
            out = self._rbuf[self._rpos : self._rpos + bufsize]
            self._rpos += len(out)
            return out

        def buffered(self) -> int:
            """Bytes received but not yet parsed: select() cannot see them."""
            return len(self._rbuf) - self._rpos

    _PAHO_CLASS = BatchedClient
    return BatchedClient


def _wait_writable(sock: socket.socket) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_WRITE)
        sel.select(1.0)


def _mqtt_pump(clients: Sequence[Any], timeout: float) -> None:
    """Read whatever arrived for ``clients``, waiting up to ``timeout``."""
    with selectors.DefaultSelector() as sel:
        for c in clients:
            sel.register(c.socket(), selectors.EVENT_READ, c)
        for key, _ in sel.select(timeout):
            _mqtt_read(key.data)


def _mqtt_read(c: Any) -> None:
    c.loop_read()  # one recv(), then one packet per call while bytes are buffered
    while c.buffered():
        c.loop_read()


def _mqtt_connect(c: Any, port: int) -> None:
    c.connect(HOST, port, keepalive=60)
    # paho leaves Nagle on: small QoS 0 writes would wait for the peer's ACK.
    # asyncio (the overlay client, amqtt) and our Mosquitto config turn it off.
    c.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.flush()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not c.is_connected():
        if time.monotonic() > deadline:
            raise RuntimeError("MQTT CONNACK not received")
        _mqtt_pump([c], 0.05)


def _mqtt_pub_main(port: int, n: int, warmup: int, rate: float | None, limit: float, ready: Any, go: Any, out: Connection) -> None:
    c = _mqtt_client(f"pub-{os.getpid()}")
    _mqtt_connect(c, port)
    ready.set()
    go.wait()
    pace = _paced(rate)
    pack = MQTT_HEAD.pack
    t0 = time.time()
    t_first = t0
    stop_at = t0 + limit
    sent = 0
    for i in range(n + warmup):
        if i == warmup:
            t_first = time.time()
        if rate is not None and pace(i, t0) > 0:
            c.flush()  # the burst that was due goes out before we sleep
            while (d := pace(i, t0)) > 0:
                time.sleep(d)
        c.publish(TOPIC, pack(i, time.time()) + MQTT_PAD, qos=0)
        sent += 1
        if not i & 1023:
            _mqtt_pump([c], 0)  # keep-alive and socket housekeeping
            c.loop_misc()
            if time.time() > stop_at:
                break
    c.flush()
    t_last = time.time()
    c.disconnect()
    out.send(PubResult(max(sent - warmup, 0), t_first, t_last))


def _mqtt_sub_main(port: int, k: int, warmup: int, ready: Any, stop: Any, progress: Any, out: Connection) -> None:
    lat = array.array("d")
    state = {"n": 0, "first": 0.0, "last": 0.0, "subacks": 0}
    unpack = MQTT_HEAD.unpack_from

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        rx = time.time()
        seq, sent = unpack(msg.payload)
        if seq < warmup:
            return
        lat.append(rx - sent)
        if not state["n"]:
            state["first"] = rx
        state["n"] += 1
        state["last"] = rx

    def on_subscribe(*_: Any) -> None:
        state["subacks"] += 1

    clients = []
    for j in range(k):
        c = _mqtt_client(f"sub-{os.getpid()}-{j}")
        c.on_message = on_message
        c.on_subscribe = on_subscribe
        _mqtt_connect(c, port)
        c.subscribe(TOPIC, qos=0)
        c.flush()
        clients.append(c)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while state["subacks"] < k and time.monotonic() < deadline:
        _mqtt_pump(clients, 0.01)
    ready.set()
    sel = selectors.DefaultSelector()
    for c in clients:
        sel.register(c.socket(), selectors.EVENT_READ, c)
    last_check = time.monotonic()
    while True:
        for key, _ in sel.select(0.02):
            _mqtt_read(key.data)
        now = time.monotonic()
        if now - last_check > 0.02:
            last_check = now
            progress.value = state["n"]
            if stop.is_set():
                break
            for c in clients:
                c.loop_misc()
                c.flush()
    for c in clients:
        c.disconnect()
    out.send(SubResult(state["n"], state["first"], state["last"], lat.tobytes()))


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
            args: tuple[Any, ...] = ([target.sub_addr(i) for i in slots], warmup, ready, stop, progress, tx)
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
            pargs: tuple[Any, ...] = (target.pub, n // publishers, warmup, share, limit, pub_ready, go, ptx)
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
    "mosquitto": ("mosquitto", "1", lambda prof=None: mosquitto_broker()),
    "amqtt": ("amqtt", "1", lambda prof=None: amqtt_broker()),
}


def throughput_run(key: str, fanout: int, scale: float, publishers: int = 1) -> Run:
    system, nodes, start = SYSTEMS[key]
    n = int((EVENTS_1TO1 if fanout == 1 else EVENTS_FANOUT) * scale)
    with start() as target:
        return run_workload(target, Run(system, nodes, fanout, "max"), n, limit=TIME_LIMIT * scale, publishers=publishers)


def latency_run(key: str, scale: float) -> Run:
    system, nodes, start = SYSTEMS[key]
    n = int(FIXED_RATE * FIXED_SECONDS * scale)
    with start() as target:
        return run_workload(
            target, Run(system, nodes, 1, f"{FIXED_RATE}/s"), n, warmup=FIXED_WARMUP, rate=FIXED_RATE, limit=FIXED_SECONDS * scale + 30
        )


# == load-generator check =============================================================


def _null_overlay_node(sock: socket.socket, mode: str, n: int) -> None:
    """A stand-in node: ``sink`` answers each Publish with a PubAck and does
    nothing else; ``firehose`` answers a Subscribe and then sends ``n``
    pre-encoded Notify frames as fast as the socket takes them."""
    import uvloop

    from overlay.messages import client as cm
    from overlay.messages.codec import client_reader, encode_frame

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        writer.write(b"OVC1")
        frames = client_reader()
        blast = None
        while data := await reader.read(256 * 1024):
            acks = []
            for msg in frames.feed(data):
                match msg:
                    case cm.Hello():
                        acks.append(encode_frame(cm.Welcome(0, 1, True, "null")))
                    case cm.Publish():
                        acks.append(encode_frame(cm.PubAck(msg.seq, "e")))
                    case cm.Subscribe():
                        acks.append(encode_frame(cm.SubAck(msg.seq, msg.sub_id, 1)))
                        blast = msg.sub_id
            writer.writelines(acks)
            if blast is not None and mode == "firehose":
                sub_id, blast = blast, None
                asyncio.get_running_loop().create_task(firehose(writer, sub_id))
            await writer.drain()

    async def firehose(writer: asyncio.StreamWriter, sub_id: str) -> None:
        await asyncio.sleep(0.2)  # let the client report ready first
        batch = 256
        for start in range(0, n, batch):
            now = time.time()
            writer.writelines(
                encode_frame(cm.Notify(f"e{i}", overlay_event(i), (sub_id,), now))
                for i in range(start, min(n, start + batch))
            )
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(serve, sock=sock, limit=256 * 1024)
        await server.serve_forever()

    uvloop.run(main())


def _null_mqtt_broker(sock: socket.socket, mode: str, n: int) -> None:
    """A stand-in MQTT broker: CONNACK and SUBACK, then either discard
    everything (``sink``) or send ``n`` pre-encoded QoS 0 PUBLISH packets."""
    conn, _ = sock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""

    def packet() -> tuple[int, bytes]:
        nonlocal buf
        while True:
            if len(buf) >= 2:
                length, mult, pos = 0, 1, 1
                while pos < len(buf):
                    b = buf[pos]
                    length += (b & 127) * mult
                    mult *= 128
                    pos += 1
                    if not b & 128:
                        if len(buf) >= pos + length:
                            head, body, buf = buf[0], buf[pos : pos + length], buf[pos + length :]
                            return head, body
                        break
            data = conn.recv(256 * 1024)
            if not data:
                raise EOFError
            buf += data

    with contextlib.suppress(EOFError, OSError):
        packet()  # CONNECT
        conn.sendall(b"\x20\x02\x00\x00")
        if mode == "sink":
            while conn.recv(1 << 20):
                pass
            return
        _, body = packet()  # SUBSCRIBE: packet id first
        conn.sendall(b"\x90\x03" + body[:2] + b"\x00")
        time.sleep(0.2)
        topic = TOPIC.encode()
        head = struct.pack(">H", len(topic)) + topic
        size = len(head) + PAYLOAD_BYTES
        fixed = bytes([0x30, size]) if size < 128 else bytes([0x30, (size & 127) | 128, size >> 7])
        for start in range(0, n, 256):
            now = time.time()
            conn.sendall(b"".join(fixed + head + MQTT_HEAD.pack(i, now) + MQTT_PAD for i in range(start, min(n, start + 256))))
        while conn.recv(1 << 20):
            pass


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
                    p = CTX.Process(target=_overlay_pub_main, args=(target.pub, n, 0, None, TIME_LIMIT, ready, go, tx), daemon=True)
                else:
                    p = CTX.Process(target=_mqtt_pub_main, args=(port, n, 0, None, TIME_LIMIT, ready, go, tx), daemon=True)
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
                    p = CTX.Process(target=_overlay_sub_main, args=([target.pub], 0, ready, stop, progress, tx), daemon=True)
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
        f"{r.system:<10} {r.nodes:>5} {('1→' + str(r.fanout)):>6} {r.offered:>8} {r.sent:>8,} {r.delivered:>10,} "
        f"{r.lost:>6,} {_fmt_rate(r.throughput):>9} {rng:>9} {_fmt_rate(r.events_per_s):>9} "
        f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.server_us:>7.1f} {cpu:>15}  {'; '.join(r.notes)}"
    )


HEADER: Final = (
    f"{'system':<10} {'nodes':>5} {'fan':>6} {'offered':>8} {'events':>8} {'delivered':>10} "
    f"{'lost':>6} {'deliv/s':>9} {'range':>9} {'events/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'srv µs':>7} {'CPU% s/p/s/oth':>15}  notes"
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
    ap.add_argument("--only", default="", help="comma-separated systems to run (overlay-1,overlay-3,mosquitto,amqtt)")
    ap.add_argument("--repeat", type=int, default=REPEATS, help="runs per configuration; the median is shown (default %(default)s)")
    ap.add_argument("--profile", action="store_true", help="also run overlay-1 1→1 with cProfile in the node and print it")
    ap.add_argument("--no-check", action="store_true", help="skip the load-generator check")
    ap.add_argument(
        "--nice", type=int, default=BENCH_NICE, help="scheduling priority of every process of the bench (default %(default)s; needs root below 0)"
    )
    args = ap.parse_args(argv)
    scale = 0.1 if args.quick else 1.0
    reps = 1 if args.quick else max(1, args.repeat)
    keys = [k for k in (args.only.split(",") if args.only else SYSTEMS) if k]
    for k in keys:
        if k not in SYSTEMS:
            ap.error(f"unknown system {k!r}")

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
        f"payload: {PAYLOAD_BYTES} bytes — MQTT: the message body (QoS 0, topic {TOPIC!r}); overlay: the 'payload' "
        f"string attribute of {{topic, n, payload}}, filter {OVERLAY_FILTER}"
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
        with tempfile.TemporaryDirectory(prefix="bench-profile-") as prof:
            with overlay_cluster(1, prof) as target:
                r = run_workload(target, Run("overlay", "1", 1, "max"), int(EVENTS_1TO1 * scale), limit=TIME_LIMIT)
            print(f"\nprofiled run (cProfile slows the node): {_fmt_rate(r.throughput)}/s")
            print_profile(prof)
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
