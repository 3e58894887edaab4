"""paho-mqtt as an MQTT client of bench/throughput.py (``--mqtt-client
paho``, the ``mosquitto-paho`` system): its publisher and subscriber process
mains, kept to show what paho's own cost did to the figures.

Rules this module keeps:

1. paho encodes and parses MQTT itself, unchanged; only its socket I/O is
   batched (``_paho_class``): writes go to a buffer flushed by ``flush()``
   or past ``MQTT_WRITE_BATCH`` bytes, reads are served from one
   ``recv()`` of up to ``MQTT_READ_CHUNK`` bytes — as the overlay's asyncio
   client does.  A DISCONNECT is written out before the socket closes.
2. Sockets are non-blocking and driven by one selector per process
   (``_mqtt_pump``): a full socket is waited on, never spun on.
3. The payload is the bench's (``throughput_common.MQTT_HEAD``: sequence
   number and send time, padded to ``PAYLOAD_BYTES``), and the results
   are sent back as ``PubResult``/``SubResult``, like every client's.
"""

from __future__ import annotations

import array
import contextlib
import os
import selectors
import socket
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, Final, cast

from throughput_common import (
    HOST,
    MQTT_HEAD,
    MQTT_PAD,
    STARTUP_TIMEOUT,
    TOPIC,
    PubResult,
    SubResult,
    _paced,
    freeze_heap,
)

# The paho client's socket batching (``_paho_class``): flush past this many
# bytes (~150 messages), read this much at a time.
MQTT_WRITE_BATCH: Final = 16 * 1024
MQTT_READ_CHUNK: Final = 256 * 1024


_PAHO_CLASS: Any = None


def _mqtt_client(name: str) -> Any:
    """A paho-mqtt client whose socket I/O is batched (see ``_paho_class``)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    return _paho_class()(CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv311)


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

    # Without the bench extra (make lint) paho is not installed and its Client is Any.
    class BatchedClient(mqtt.Client):  # type: ignore[misc, unused-ignore]
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
            # paho's SocketLike; here a plain socket, whose send takes a memoryview.
            sock, buf = cast("socket.socket | None", self._sock), self._wbuf
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


def _paho_pub_main(
    port: int, n: int, warmup: int, rate: float | None, limit: float, ready: Any, go: Any, out: Connection
) -> None:
    c = _mqtt_client(f"pub-{os.getpid()}")
    _mqtt_connect(c, port)
    freeze_heap()
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


def _paho_sub_main(port: int, k: int, warmup: int, ready: Any, stop: Any, progress: Any, out: Connection) -> None:
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
    freeze_heap()
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
    out.send(SubResult(int(state["n"]), state["first"], state["last"], lat.tobytes()))
