"""The overlay side of bench/throughput.py: its config and node processes, its
publisher and subscriber processes, and the null node of the load-generator
check.

A *secure* cluster (``overlay_cluster(..., secure=True)``) is the same with
TLS on every port — development certificates made for the run, peers
authenticated by them, clients verifying the node against the CA — and
``[auth]``: keys made for the run, every client presenting a token with the
one role it needs (``ClientSecurity``), each publish checked against it.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import cProfile
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from throughput_common import (
    CTX,
    HOST,
    PAYLOAD_BYTES,
    STARTUP_TIMEOUT,
    TOPIC,
    ClientSecurity,
    PubResult,
    SubResult,
    Target,
    _paced,
    freeze_heap,
)

# Every overlay event carries an opaque payload of PAYLOAD_BYTES, as every
# MQTT message carries its body: like for like (issue 18).
OVERLAY_PAYLOAD: Final = b"x" * PAYLOAD_BYTES
# The overlay's analogue of one MQTT topic: a distinguishing string attribute
# with one value, and an equality filter on it.
OVERLAY_FILTER: Final = f'topic = "{TOPIC}"'
# Generous per-subscription and per-connection queues so a short burst is not
# dropped as a slow consumer: the run measures delivery, not the drop policy.
SUB_QUEUE: Final = 100_000
# The life of a secure run's tokens: longer than any run.
TOKEN_TTL: Final = 3600.0


def bench_config(ports: Sequence[int], secure_dir: Path | None = None) -> Any:
    """The bench cluster's config: plain TCP, as the MQTT brokers it is compared
    with run here; with ``secure_dir``, TLS with development certificates and
    ``[auth]`` with keys, both made there."""
    from overlay.auth import generate_keys
    from overlay.config import config_from_dict

    doc: dict[str, Any] = {
        "cluster": {"name": "bench", "initializer": 0, "balancing": False},
        "tls": {"insecure": True, "secret": "throughput bench secret"},
        "nodes": [{"id": i, "host": HOST, "port": p} for i, p in enumerate(ports)],
        "schema": {
            "distinguishing": ["topic"],
            "attributes": [
                {"name": "topic", "type": "string", "min": 1, "max": 64},
                {"name": "n", "type": "int", "min": 0, "max": 2**31 - 1},
            ],
        },
    }
    if secure_dir is not None:
        from overlay.security.certs import make_dev_certs

        certs = secure_dir / "certs"
        make_dev_certs(certs, [(i, HOST) for i in range(len(ports))])
        doc["tls"] = {
            "ca": str(certs / "ca.pem"),
            "cert": str(certs / "node-{id}.pem"),
            "key": str(certs / "node-{id}.key"),
        }
        private, public = generate_keys(secure_dir / "keys")
        doc["auth"] = {"public_keys": [str(public)], "signing_key": str(private)}
    return config_from_dict(doc, "<bench>")


def client_security(cfg: Any) -> ClientSecurity:
    """Tokens for a secure run's clients, signed with the config's key, and its CA."""
    from overlay.auth.keys import local_token

    return ClientSecurity(
        local_token(cfg, "bench-pub", "publish", ttl=TOKEN_TTL),
        local_token(cfg, "bench-sub", "subscribe", ttl=TOKEN_TTL),
        cfg.tls.ca,
    )


def client_options(security: ClientSecurity | None, role: str) -> dict[str, Any]:
    """``Client`` keyword arguments for a ``pub`` or ``sub`` process (its own
    TLS context: made in the process that uses it)."""
    if security is None:
        return {}
    from overlay.security import client_context

    token = security.pub_token if role == "pub" else security.sub_token
    return {"token": token, "ssl": client_context(security.ca) if security.ca else None}


def _node_main(cfg: Any, node_id: int, sock: socket.socket, ready: Any, profile: str | None) -> None:
    import logging

    import uvloop

    from overlay.net.node import Node

    # Errors only: stopping a cluster makes every link report its peer gone,
    # and a drop during a run shows in the table's "lost" column anyway.
    logging.basicConfig(level=logging.ERROR)

    async def main() -> None:
        # Its own process, as ``overlay node`` runs one: start-up objects frozen
        # out of the cyclic GC (net.node), so its full passes stay short.
        node = Node(cfg, node_id, sock=sock, freeze_gc=True)
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
def overlay_cluster(nodes: int, profile_dir: str | None = None, *, secure: bool = False) -> Iterator[Target]:
    socks = []
    for _ in range(nodes):
        s = socket.socket()
        s.bind((HOST, 0))
        s.listen(1024)
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    keys = tempfile.TemporaryDirectory(prefix="bench-secure-") if secure else None
    cfg = bench_config(ports, Path(keys.name) if keys else None)
    security = client_security(cfg) if secure else None
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
        pids = [p.pid for p, _ in procs if p.pid is not None]  # every one: they started
        if nodes == 1:
            yield Target("overlay", addrs[0], [addrs[0]], pids, security)
        else:
            # Publisher on node 1, the channel on node 0 (the initializer owns
            # EC), subscribers from node 2 on: every event crosses nodes.
            subs = [addrs[(2 + i) % nodes] for i in range(nodes)]
            yield Target("overlay", addrs[1], subs, pids, security)
    finally:
        if keys is not None:
            keys.cleanup()
        for p, _ in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        for p, _ in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def overlay_event(i: int) -> dict[str, Any]:
    """The attributes of event ``i``; its body is ``OVERLAY_PAYLOAD``, sent as the payload."""
    return {"topic": TOPIC, "n": i}


def _overlay_pub_main(
    addr: tuple[str, int],
    n: int,
    warmup: int,
    rate: float | None,
    limit: float,
    ready: Any,
    go: Any,
    out: Connection,
    security: ClientSecurity | None = None,
) -> None:
    import uvloop

    from overlay.client import Client

    async def main() -> PubResult:
        client = await Client([addr], **client_options(security, "pub")).connect()
        freeze_heap()
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
            await client.publish_windowed(overlay_event(i), payload=OVERLAY_PAYLOAD)
            sent += 1
            if not i & 1023 and time.time() > stop_at:
                break
        await client.flush(timeout=60)
        t_last = time.time()
        note = f"chokes={client.chokes}" if client.chokes else ""
        await client.close()
        return PubResult(max(sent - warmup, 0), t_first, t_last, note)

    out.send(uvloop.run(main()))


def _overlay_sub_main(
    addrs: list[tuple[str, int]],
    warmup: int,
    ready: Any,
    stop: Any,
    progress: Any,
    out: Connection,
    security: ClientSecurity | None = None,
) -> None:
    import uvloop

    from overlay.client import Client

    async def main() -> SubResult:
        clients = [await Client([a], **client_options(security, "sub")).connect() for a in addrs]
        subs = [await c.subscribe(OVERLAY_FILTER, queue_size=SUB_QUEUE) for c in clients]
        lat = array.array("d")
        state = {"n": 0, "first": 0.0, "last": 0.0, "bad_payload": 0}
        freeze_heap()
        ready.set()

        async def consume(sub: Any) -> None:
            async for note in sub:
                if len(note.payload) != PAYLOAD_BYTES:  # the body must arrive whole, as MQTT's does
                    state["bad_payload"] += 1
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
        notes = [f"client-dropped={dropped}"] if dropped else []
        if state["bad_payload"]:
            notes.append(f"bad-payload={state['bad_payload']}")
        return SubResult(int(state["n"]), state["first"], state["last"], lat.tobytes(), " ".join(notes))

    out.send(uvloop.run(main()))


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
                encode_frame(cm.Notify(f"e{i}", overlay_event(i), (sub_id,), now, payload=OVERLAY_PAYLOAD))
                for i in range(start, min(n, start + batch))
            )
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(serve, sock=sock, limit=256 * 1024)
        await server.serve_forever()

    uvloop.run(main())
