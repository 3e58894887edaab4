"""How soon a signalled client command is gone: ``overlay sub`` and SIGINT/SIGTERM.

Run as ``flock /tmp/bench.lock .venv/bin/python bench/cli_signals.py [--runs N]``
(the lock: never two benchmarks at once on the machine).

What it measures, ``--runs`` times each (default 5):

1. ``overlay sub`` against a config whose nodes are not there (it is
   connecting, with backoff), sent SIGINT, then SIGTERM;
2. ``overlay sub`` subscribed on a one-node cluster (a node of this process)
   whose node then stops (it is reconnecting, its subscription homeless),
   sent SIGINT.

Each run: the command is started, the bench waits for its line saying it is
inside its event loop (connecting, or subscribed), sends the signal and
times until the process has exited; the exit status must be 130 (SIGINT) or
143 (SIGTERM).  The target is deliverable 2 of ``overlay.cli``: within 2 s
(``CLOSE_TIMEOUT`` for the clients to close, ``INTERRUPT_GRACE`` for the
process, whatever the cluster does).  The tests (``tests/test_cli.py``) check
the exit statuses only: on a loaded machine the wall time is the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from overlay.config import load_config
from overlay.net.node import Node
from overlay.testing import LOOPBACK_SECRET, bound_socket

ROOT: Final = Path(__file__).resolve().parent.parent
LOCAL: Final = ROOT / "cluster_configs" / "local.toml"
# Deliverable 2 of overlay.cli: a signalled client command is gone within this.
TARGET: Final = 2.0
# Bound on any one wait of the bench (a start-up, an exit).
WAIT: Final = 30.0


def config_text(ports: list[int]) -> str:
    """local.toml's cluster and schema with nodes on ``ports``, plain TCP, no balancing."""
    base = LOCAL.read_text()
    head = base[: base.index("[[nodes]]")].replace("[cluster]\n", "[cluster]\nbalancing = false\n")
    schema = base[base.index("[bandwidth]") :]
    nodes = "".join(
        f'[[nodes]]\nid = {i}\nhost = "127.0.0.1"\nport = {p}\nadmin_port = 0\n\n' for i, p in enumerate(ports)
    )
    tls = f'[tls]\ninsecure = true\nsecret = "{LOOPBACK_SECRET}"\n\n'
    return head + nodes + tls + schema


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_sub(cfg: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "overlay",
        "--log-level",
        "debug",
        "sub",
        "--config",
        str(cfg),
        "price < 5",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )


async def read_until(proc: asyncio.subprocess.Process, needle: str) -> None:
    assert proc.stderr is not None
    seen = ""
    while needle not in seen:
        line = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        if not line:
            raise RuntimeError(f"the command ended before {needle!r}: {seen}")
        seen += line.decode(errors="replace")


async def signal_and_time(proc: asyncio.subprocess.Process, sig: int) -> float:
    """Seconds from ``sig`` to the process's exit (its status checked)."""
    assert proc.stderr is not None
    t0 = time.monotonic()
    proc.send_signal(sig)
    await asyncio.wait_for(proc.stderr.read(), WAIT)
    code = await asyncio.wait_for(proc.wait(), WAIT)
    took = time.monotonic() - t0
    if code != 128 + sig:
        raise RuntimeError(f"exit status {code} after signal {sig}, not {128 + sig}")
    return took


async def no_cluster(tmp: Path, sig: int) -> float:
    cfg = tmp / "none.toml"
    cfg.write_text(config_text([free_port(), free_port()]))
    proc = await start_sub(cfg)
    await read_until(proc, "overlay.cli: connecting to 127.0.0.1")
    return await signal_and_time(proc, sig)


async def node_gone(tmp: Path) -> float:
    sock = bound_socket()
    cfg = tmp / "one.toml"
    cfg.write_text(config_text([int(sock.getsockname()[1])]))
    node = Node(load_config(cfg), 0, sock=sock)
    task = asyncio.create_task(node.run())
    try:
        await asyncio.wait_for(node.started.wait(), WAIT)
        proc = await start_sub(cfg)
        await read_until(proc, '"subscribed"')
    finally:
        node.stop()
        await asyncio.wait_for(task, WAIT)
        sock.close()
    return await signal_and_time(proc, signal.SIGINT)


def report(name: str, times: list[float]) -> None:
    within = sum(t <= TARGET for t in times)
    print(
        f"{name:<34} median {statistics.median(times):5.2f} s  max {max(times):5.2f} s  "
        f"within {TARGET:.0f} s: {within}/{len(times)}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each case (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cli-signals-") as d:
        tmp = Path(d)
        cases: dict[str, Callable[[], Awaitable[float]]] = {
            "sub, no cluster, SIGINT": lambda: no_cluster(tmp, signal.SIGINT),
            "sub, no cluster, SIGTERM": lambda: no_cluster(tmp, signal.SIGTERM),
            "sub, its node gone, SIGINT": lambda: node_gone(tmp),
        }
        for name, case in cases.items():
            report(name, [await case() for _ in range(args.runs)])


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
