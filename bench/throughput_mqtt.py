"""The MQTT side of bench/throughput.py: installing the MQTT peers (the
``bench`` extra, Mosquitto) and running their brokers; the two MQTT clients —
the *raw* one (``mqtt_codec`` on an asyncio transport under uvloop, the
default) and paho-mqtt with batched socket I/O (``throughput_paho``, kept to
show what it did to the figures) — each with its publisher and subscriber
process mains (``MQTT_CLIENTS``); and the null MQTT broker of the
load-generator check.

Why a raw client: paho spends ~7 µs of Python per message published and
~13 µs per message received, so on a 2-core machine paho, not the broker,
set the pace and held Mosquitto to 20–30 % of a core — the deliveries/s
ratio against it flattered the overlay (issue 19 item 2).  The raw client encodes
the PUBLISH header once, writes a batch of packets per system call and
decodes with ``mqtt_codec``'s inline PUBLISH path: well under a microsecond
a message published, about one received.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final, cast

from mqtt_codec import (
    ConnAck,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttProtocolError,
    PingReq,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    encode,
    puback,
    publish_prefix,
)
from throughput_common import (
    HOST,
    MQTT_HEAD,
    MQTT_PAD,
    PAYLOAD_BYTES,
    ROOT,
    STARTUP_TIMEOUT,
    TOPIC,
    PubResult,
    SubResult,
    Target,
    _paced,
    free_port,
    freeze_heap,
    wait_port,
)
from throughput_paho import _paho_pub_main, _paho_sub_main

# The raw publisher writes this many packets per transport.write (~14 KB):
# one system call per batch, and small enough that a paced run's burst is
# one write.
RAW_BATCH: Final = 128
# At QoS 1 the raw publisher keeps at most this many PUBLISHes unacknowledged,
# as the overlay's publisher keeps at most its PUBLISH_WINDOW (4,000) Publishes
# without their PubAck; far below the 65,535 packet ids, so none is reused
# while in flight.
RAW_Q1_WINDOW: Final = 4_000
# Keep-alive the raw client announces; it pings at half of it (MQTT §3.1.2.10).
RAW_KEEPALIVE: Final = 60
# The raw publisher yields to its loop after this many batches even when the
# socket never pushes back, so keep-alive and reads still get their turn.
RAW_YIELD_EVERY: Final = 16


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


# == servers ========================================================================


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
def mosquitto_broker(client: str = "raw") -> Iterator[Target]:
    """Mosquitto on a free port, for ``client`` (a key of ``MQTT_CLIENTS``)."""
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
            # No cap on QoS 1 messages in flight (the raw-q1 publisher keeps
            # its own window, as the overlay's does).
            "max_inflight_messages 0\n"
        )
        with _server([binary, "-c", str(conf)], port, "mosquitto", Path(tmp) / "mosquitto.log") as proc:
            yield Target("mqtt", (HOST, port), [(HOST, port)], [proc.pid], mqtt_client=client)


@contextlib.contextmanager
def amqtt_broker(client: str = "raw") -> Iterator[Target]:
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
            yield Target("mqtt", (HOST, port), [(HOST, port)], [proc.pid], mqtt_client=client)


# == the raw client ===================================================================


class RawMqtt(asyncio.Protocol):
    """One MQTT 3.1.1 connection of the raw client: ``mqtt_codec`` on an
    asyncio transport.  Received PUBLISH payloads go to ``on_payload``, and
    a QoS 1 PUBLISH is answered with its PUBACK (those of one read in one
    write); PUBACKs received are counted in ``acked`` (the publisher's
    window); the CONNACK and SUBACKs resolve futures; writes wait on
    ``writable`` while the transport is above its high-water mark (TCP
    pushes back, as paho's blocking send did)."""

    def __init__(self, on_payload: Callable[[bytes], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.on_payload = on_payload
        self.decoder = MqttDecoder()
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[ConnAck] = loop.create_future()
        self.subacks: dict[int, asyncio.Future[SubAck]] = {}
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.error: Exception | None = None
        self.unexpected = 0  # PUBLISHes without a callback: counted, never silent
        self.acked = 0  # PUBACKs received (QoS 1 publishing)
        self.acks_arrived = asyncio.Event()
        self._pinger: asyncio.Task[None] | None = None

    # -- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport has asyncio.Transport's methods but is not its subclass.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except MqttProtocolError as exc:
            self._fail(exc)
            return
        on_payload = self.on_payload
        answers: list[bytes] = []
        acked = self.acked
        for p in packets:
            if p.__class__ is Publish:
                if on_payload is None:
                    self.unexpected += 1
                else:
                    on_payload(p.payload)
                if p.qos:
                    answers.append(puback(p.packet_id))
            elif p.__class__ is PubAck:
                self.acked += 1
            elif isinstance(p, ConnAck):
                if not self.connack.done():
                    self.connack.set_result(p)
            elif isinstance(p, SubAck):
                fut = self.subacks.pop(p.packet_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(p)
            # PINGRESP needs nothing; a broker sends no other packet to a client.
        if answers and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(answers))
        if self.acked != acked:
            self.acks_arrived.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("the broker closed the connection"))
        self.writable.set()  # a writer waiting for room must see the end
        if not self.closed.done():
            self.closed.set_result(None)
        if self._pinger is not None:
            self._pinger.cancel()

    # -- the client -----------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        futs: list[asyncio.Future[Any]] = [self.connack, *self.subacks.values()]
        for fut in futs:
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError(f"MQTT connection closed: {self.error}")
        self.transport.write(data)

    async def subscribe(self, topic: str, packet_id: int = 1, qos: int = 0) -> None:
        fut: asyncio.Future[SubAck] = asyncio.get_running_loop().create_future()
        self.subacks[packet_id] = fut
        self.write(encode(Subscribe(packet_id, ((topic, qos),))))
        ack = await asyncio.wait_for(fut, STARTUP_TIMEOUT)
        if ack.return_codes != (qos,):
            raise RuntimeError(f"broker refused SUBSCRIBE {topic!r}: return codes {list(ack.return_codes)}")

    async def drain(self) -> None:
        """Wait until the transport has handed everything to the socket."""
        assert self.transport is not None
        while self.transport.get_write_buffer_size() and not self.transport.is_closing():
            await self.writable.wait()
            await asyncio.sleep(0.0005)

    async def close(self) -> None:
        """DISCONNECT (§3.14), then close once it is written."""
        if self._pinger is not None:
            self._pinger.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode(Disconnect()))
            await self.drain()
            self.transport.close()
        await asyncio.wait_for(self.closed, 5)

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(RAW_KEEPALIVE / 2)
            self.write(encode(PingReq()))


async def raw_connect(port: int, client_id: str, on_payload: Callable[[bytes], None] | None = None) -> RawMqtt:
    """A connected raw client (CONNACK received, keep-alive running)."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: RawMqtt(on_payload), HOST, port)
    # asyncio's TCP transports set TCP_NODELAY already, as our Mosquitto config does.
    proto.write(encode(Connect(client_id, RAW_KEEPALIVE)))
    ack = await asyncio.wait_for(proto.connack, STARTUP_TIMEOUT)
    if ack.return_code:
        raise RuntimeError(f"broker refused CONNECT of {client_id!r}: return code {ack.return_code}")
    proto._pinger = loop.create_task(proto._ping())
    return proto


def _raw_pub_main(
    port: int,
    n: int,
    warmup: int,
    rate: float | None,
    limit: float,
    ready: Any,
    go: Any,
    out: Connection,
    qos: int = 0,
) -> None:
    import uvloop

    async def main() -> PubResult:
        c = await raw_connect(port, f"pub-{os.getpid()}")
        freeze_heap()
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        prefix = publish_prefix(TOPIC, PAYLOAD_BYTES, qos)
        pack, pad, now = MQTT_HEAD.pack, MQTT_PAD, time.time
        # QoS 1: each PUBLISH carries a packet id (1..65535, reused only long after its PUBACK).
        pid = [b""] if not qos else [j.to_bytes(2, "big") for j in range(1, 65536)]
        npid = len(pid)
        pace = _paced(rate)
        total = n + warmup
        t0 = now()
        t_first, stop_at = t0, t0 + limit
        i = batches = 0
        while i < total:
            if rate is None:
                upto = min(total, i + RAW_BATCH)
            else:
                if (d := pace(i, t0)) > 0:
                    await asyncio.sleep(d)
                    continue
                # Everything due by now, in one write (as paho's flush before a sleep).
                # At least message i itself: it was due (a rounding apart).
                upto = max(i + 1, min(total, i + RAW_BATCH, int((now() - t0) * rate) + 1))
            if i <= warmup < upto:
                t_first = now()
            if qos:
                while upto - c.acked > RAW_Q1_WINDOW and c.error is None:
                    c.acks_arrived.clear()
                    await c.acks_arrived.wait()  # the window is full: wait for PUBACKs
            c.write(b"".join([prefix + pid[j % npid] + pack(j, now()) + pad for j in range(i, upto)]))
            i = upto
            batches += 1
            if not c.writable.is_set():
                await c.writable.wait()  # TCP pushes back
            elif not batches % RAW_YIELD_EVERY:
                await asyncio.sleep(0)
            if c.error is not None:
                raise RuntimeError(f"publisher's MQTT connection failed: {c.error}")
            if now() > stop_at:
                break
        await c.drain()
        if qos:  # every PUBLISH answered, as the overlay's publisher waits for its PubAcks
            t_end = now() + STARTUP_TIMEOUT
            while c.acked < i and c.error is None and now() < t_end:
                c.acks_arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c.acks_arrived.wait(), max(t_end - now(), 0.001))
            if c.acked < i:
                raise RuntimeError(f"publisher: {i - c.acked} of {i} QoS 1 PUBLISHes never acknowledged")
        t_last = now()
        await c.close()
        return PubResult(max(i - warmup, 0), t_first, t_last)

    out.send(uvloop.run(main()))


def _raw_sub_main(port: int, k: int, warmup: int, ready: Any, stop: Any, progress: Any, out: Connection) -> None:
    import uvloop

    lat = array.array("d")
    append, unpack, now = lat.append, MQTT_HEAD.unpack_from, time.time
    received = bad = 0
    first = last = 0.0

    def on_payload(payload: bytes) -> None:
        nonlocal received, bad, first, last
        rx = now()
        if len(payload) != PAYLOAD_BYTES:  # the body must arrive whole
            bad += 1
            return
        seq, sent = unpack(payload)
        if seq < warmup:
            return
        append(rx - sent)
        if not received:
            first = rx
        received += 1
        last = rx

    async def main() -> SubResult:
        clients = [await raw_connect(port, f"sub-{os.getpid()}-{j}", on_payload) for j in range(k)]
        for c in clients:
            await c.subscribe(TOPIC)
        freeze_heap()
        ready.set()
        while not stop.is_set():
            progress.value = received
            if (failed := next((c.error for c in clients if c.error is not None), None)) is not None:
                raise RuntimeError(f"subscriber's MQTT connection failed: {failed}")
            await asyncio.sleep(0.02)
        progress.value = received
        notes = [f"bad-payload={bad}"] if bad else []
        if unexpected := sum(c.unexpected for c in clients):
            notes.append(f"unexpected={unexpected}")
        for c in clients:
            await c.close()
        return SubResult(received, first, last, lat.tobytes(), " ".join(notes))

    out.send(uvloop.run(main()))


# == load-generator check =============================================================


def _null_mqtt_broker(sock: socket.socket, mode: str, n: int) -> None:
    """A stand-in MQTT broker: CONNACK and SUBACK, then either discard
    everything (``sink``) or send ``n`` pre-encoded QoS 0 PUBLISH packets."""
    conn, _ = sock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = MqttDecoder()
    pending: list[Any] = []

    def packet() -> Any:
        while not pending:
            data = conn.recv(256 * 1024)
            if not data:
                raise EOFError
            pending.extend(decoder.feed(data))
        return pending.pop(0)

    with contextlib.suppress(EOFError, OSError):
        packet()  # CONNECT
        conn.sendall(encode(ConnAck()))
        if mode == "sink":
            while conn.recv(1 << 20):
                pass
            return
        sub = packet()
        conn.sendall(encode(SubAck(sub.packet_id, (0,))))
        time.sleep(0.2)
        prefix = publish_prefix(TOPIC, PAYLOAD_BYTES)
        for start in range(0, n, 256):
            now = time.time()
            conn.sendall(
                b"".join(prefix + MQTT_HEAD.pack(i, now) + MQTT_PAD for i in range(start, min(n, start + 256)))
            )
        while conn.recv(1 << 20):
            pass


# The MQTT clients: name -> (publisher main, subscriber main), both with the
# same arguments.
MQTT_CLIENTS: Final[dict[str, tuple[Callable[..., None], Callable[..., None]]]] = {
    "raw": (_raw_pub_main, _raw_sub_main),
    # Publishing at QoS 1 (a PUBACK for every PUBLISH), subscribed at QoS 0:
    # the frames and the guarantee of the overlay's unkeyed event — Publish,
    # PubAck, Notify; its subscribers acknowledge only keyed events and group
    # copies (messages.client.Notify), so neither side acknowledges deliveries.
    "raw-q1": (functools.partial(_raw_pub_main, qos=1), _raw_sub_main),
    "paho": (_paho_pub_main, _paho_sub_main),
}
