"""A node's memory with subscribers that never read (SPEC §16; issue 17 item 4).

    .venv/bin/python bench/slow_consumers.py [--stuck 20] [--live 2] [--rate 1000] [--seconds 40]
        [--note 1000] [--budget BYTES] [--grace S]

One node in its own process (``overlay node``, whatever code ``PYTHONPATH``
points at — run it against an older tree to compare), ``--stuck``
subscribers that say Hello, subscribe to every event and never read again
(tiny socket buffers: what the node sends them stays with the node), and
``--live`` subscribers that read everything; one publisher sends
``--rate`` events per second, each with a ``--note`` of that many bytes,
for ``--seconds``.  Every second it prints the node's RSS (``VmRSS``), how
many stuck subscribers' sessions the node still holds (its own count), and
the live subscribers' deliveries; at the end the peak (``VmHWM``) and the node's slow-consumer
counters.  ``--budget``/``--grace`` write them into the config's
``[limits]`` (a tree without ``[limits]`` refuses the table: leave them
out; one without ``[tls]`` refuses that table: ``--no-tls-table``).
Bounded: the run ends after ``--seconds`` plus set-up, and the node is
stopped whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
CONFIG = """\
[cluster]
name = "slow"
balancing = false

[tls]
insecure = true
secret = "slow-consumers-bench-secret"

[[nodes]]
id = 0
host = "127.0.0.1"
port = {port}

[schema]
distinguishing = ["price", "sym"]
attributes = [
  {{ name = "price", type = "float", min = 0, max = 1000 }},
  {{ name = "sym", type = "string", min = 1, max = 8 }},
  {{ name = "note", type = "string", min = 0, max = 4096 }},
]
{limits}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def stuck_subscriber(port: int, k: int) -> socket.socket:
    """Hello, subscribe to everything, then never read (the socket is kept, unread)."""
    from overlay.messages import client as cm
    from overlay.messages.codec import encode_frame

    loop = asyncio.get_running_loop()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    await loop.sock_connect(s, (HOST, port))
    await loop.sock_sendall(
        s, b"OVC1" + encode_frame(cm.Hello(f"stuck-{k}")) + encode_frame(cm.Subscribe(1, "all", "price >= 0"))
    )
    got = b""
    while got.count(b"SubAck") < 1:  # the Welcome and the SubAck, then no more reading
        chunk = await asyncio.wait_for(loop.sock_recv(s, 4096), 10)
        if not chunk:
            raise RuntimeError(f"stuck subscriber {k} refused: {got!r}")
        got += chunk
    return s


async def run(args: argparse.Namespace) -> None:
    from overlay.client import Client

    port = free_port()
    limits = ""
    if args.budget or args.grace:
        limits = "\n[limits]\n"
        if args.budget:
            limits += f"queue_budget = {args.budget}\n"
        if args.grace:
            limits += f"slow_consumer_grace = {args.grace}\n"
    tmp = Path(tempfile.mkdtemp(prefix="overlay-slow-"))
    cfg = tmp / "slow.toml"
    text = CONFIG.format(port=port, limits=limits)
    if args.no_tls_table:
        text = text.replace('[tls]\ninsecure = true\nsecret = "slow-consumers-bench-secret"\n\n', "")
    cfg.write_text(text)
    log = (tmp / "node.log").open("wb")
    node = subprocess.Popen(
        [sys.executable, "-m", "overlay", "--log-level", "warning", "node", "--config", str(cfg), "--id", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
    )
    stuck: list[socket.socket] = []
    clients: list[Any] = []
    try:
        deadline = time.monotonic() + 30
        admin = None
        while admin is None:
            try:
                admin = await Client([(HOST, port)], client_id="bench-admin", reconnect=False).connect(timeout=2)
            except (OSError, TimeoutError):
                if time.monotonic() > deadline or node.poll() is not None:
                    raise RuntimeError(f"the node did not start: see {tmp / 'node.log'}") from None
                await asyncio.sleep(0.2)
        clients.append(admin)
        while not (await admin.admin("status"))["ready"]:
            await asyncio.sleep(0.1)
        base = rss_kb(node.pid)
        stuck = [await stuck_subscriber(port, k) for k in range(args.stuck)]
        got = [0] * args.live

        async def reader(i: int, sub: Any) -> None:
            async for _ in sub:
                got[i] += 1

        readers = []
        for i in range(args.live):
            c = await Client([(HOST, port)], client_id=f"live-{i}").connect()
            clients.append(c)
            readers.append(asyncio.create_task(reader(i, await c.subscribe("price >= 0", queue_size=100_000))))
        pub = await Client([(HOST, port)], client_id="publisher").connect()
        clients.append(pub)
        note = "n" * args.note
        print(f"node pid {node.pid}: {base / 1024:.0f} MB before the subscribers; config {cfg}")
        print(f"{'t s':>4} {'RSS MB':>7} {'stuck open':>10} {'published':>9} {'live got':>9}")
        t0 = time.monotonic()
        sent = 0
        next_print = t0 + 1
        while (now := time.monotonic()) - t0 < args.seconds:
            due = int((now - t0) * args.rate)
            while sent < due:
                await pub.publish_windowed({"price": float(sent % 1000), "sym": "S", "note": note}, window=2000)
                sent += 1
            if now >= next_print:
                next_print += 1
                open_ = (await admin.admin("status"))["sessions"] - args.live - 2  # the node's own count
                print(f"{now - t0:4.0f} {rss_kb(node.pid) / 1024:7.0f} {open_:>10} {sent:>9} {min(got, default=0):>9}")
            await asyncio.sleep(0.01)
        await pub.flush(timeout=60)
        stats = (await admin.admin("status"))["stats"]
        peak = rss_kb(node.pid, "VmHWM")
        print(
            f"end: RSS {rss_kb(node.pid) / 1024:.0f} MB, peak {peak / 1024:.0f} MB (from {base / 1024:.0f} MB); "
            f"stuck still open {(await admin.admin('status'))['sessions'] - args.live - 2} of {args.stuck}; "
            f"slow_consumer_disconnects {stats.get('slow_consumer_disconnects', 0)} "
            f"(stalled {stats.get('slow_consumer_disconnects_stalled', 0)}, "
            f"budget {stats.get('slow_consumer_disconnects_budget', 0)}), "
            f"notifications dropped {stats.get('slow_consumer_drops', 0)} (queue full) + "
            f"{stats.get('slow_consumer_dropped', 0)} (at disconnection); live got {min(got, default=0)} of {sent}"
        )
        for t in readers:
            t.cancel()
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)
        for s in stuck:
            s.close()
        node.terminate()
        try:
            node.wait(10)
        except subprocess.TimeoutExpired:
            node.kill()
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stuck", type=int, default=20, help="subscribers that never read (default 20)")
    ap.add_argument("--live", type=int, default=2, help="subscribers that read (default 2)")
    ap.add_argument("--rate", type=float, default=1000.0, help="events per second (default 1000)")
    ap.add_argument("--seconds", type=float, default=40.0, help="how long to publish (default 40)")
    ap.add_argument("--note", type=int, default=1000, help="bytes of payload per event (default 1000)")
    ap.add_argument("--budget", type=int, default=0, help="[limits] queue_budget to write (bytes; default: none)")
    ap.add_argument("--grace", type=float, default=0.0, help="[limits] slow_consumer_grace to write (s; default: none)")
    ap.add_argument("--no-tls-table", action="store_true", help="no [tls] table (a tree from before TLS)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
