"""The MQTT side of bench/throughput.py: installing the MQTT peers (the
``bench`` extra, Mosquitto) and running their brokers, the paho-mqtt client
with batched socket I/O, the MQTT publisher and subscriber process mains, and
the null MQTT broker of the load-generator check."""

from __future__ import annotations

import array
import contextlib
import os
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from throughput_common import (
    HOST,
    PAYLOAD_BYTES,
    ROOT,
    STARTUP_TIMEOUT,
    TOPIC,
    PubResult,
    SubResult,
    Target,
    _paced,
    free_port,
    wait_port,
)

# MQTT payload: seq and send time, then padding up to PAYLOAD_BYTES.
MQTT_HEAD: Final = struct.Struct(">qd")
MQTT_PAD: Final = b"x" * (PAYLOAD_BYTES - MQTT_HEAD.size)
# The paho client's socket batching (``_paho_class``): flush past this many
# bytes (~150 messages), read this much at a time.
MQTT_WRITE_BATCH: Final = 16 * 1024
MQTT_READ_CHUNK: Final = 256 * 1024


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


def _mqtt_pub_main(
    port: int, n: int, warmup: int, rate: float | None, limit: float, ready: Any, go: Any, out: Connection
) -> None:
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


# == load-generator check =============================================================


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
            conn.sendall(
                b"".join(fixed + head + MQTT_HEAD.pack(i, now) + MQTT_PAD for i in range(start, min(n, start + 256)))
            )
        while conn.recv(1 << 20):
            pass
