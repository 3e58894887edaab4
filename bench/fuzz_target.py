"""The node a ``bench/fuzz.py`` run attacks (rule 1 of its docstring), and
what is read from it.

1. ``write_config`` writes its one-node config (with ``[auth]`` and a key
   pair made for the run, unless off); ``token_for`` issues a token of it.
2. ``start`` runs it as an ``overlay node`` process, under coverage by
   ``fuzz_node.py`` when a data file is given; ``ready`` waits for it to
   say so, ``status`` asks for its status.
3. What is read from it: ``rss_of`` its RSS from ``/proc``, ``arcs_of`` the
   branch arcs its coverage data holds, ``tracebacks`` every Traceback in
   its log with the line that introduced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from overlay.auth import generate_keys, issue, load_signing_key
from overlay.client import Client
from overlay.config import load_config
from overlay.errors import OverlayError
from overlay.testing import NodeProcesses, write_cluster_config


def arcs_of(data_file: Path) -> set[tuple[str, int, int]]:
    import coverage

    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    out: set[tuple[str, int, int]] = set()
    for f in data.measured_files():
        name = f[f.rindex("/overlay/") + 1 :] if "/overlay/" in f else f
        out.update((name, a, b) for a, b in data.arcs(f) or ())
    return out


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def write_config(workdir: Path, port: int, auth: bool) -> Path:
    path = write_cluster_config(workdir / "fuzz.toml", [("127.0.0.1", port)], name="fuzz")
    if auth:
        private, public = generate_keys(workdir / "keys")
        with path.open("a") as fh:
            fh.write(f'\n[auth]\npublic_keys = ["{public}"]\nsigning_key = "{private}"\n')
    return path


def token_for(path: Path, subject: str) -> str:
    config = load_config(path)
    if not config.auth.enabled:
        return ""
    key = load_signing_key(config.auth.signing_key)
    return issue(
        key,
        subject=subject,
        roles=["publish", "subscribe", "admin"],
        audience=config.cluster.name,
        ttl=3600,
        now=time.time(),
        schema=config.schema,
    )


def start(workdir: Path, config: Path, port: int, cov_file: Path | None, name: str) -> NodeProcesses:
    wrapper = Path(__file__).resolve().parent / "fuzz_node.py"
    prefix = {0: [sys.executable, str(wrapper), str(cov_file)]} if cov_file else {}
    logs = workdir / name
    logs.mkdir()
    procs = NodeProcesses(config, [("127.0.0.1", port)], logs, prefix=prefix)
    procs.start_all()
    return procs


async def ready(procs: NodeProcesses, token: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert procs.alive(0), procs.tail(0)
        with contextlib.suppress(OSError, OverlayError, TimeoutError):
            c = await Client([procs.addr(0)], client_id=None, token=token, reconnect=False).connect(timeout=2)
            try:
                if (await c.admin("status", timeout=2))["ready"]:
                    return
            finally:
                await c.close()
        await asyncio.sleep(0.2)
    raise AssertionError(f"the node is not ready\n{procs.tail(0)}")


async def status(procs: NodeProcesses, token: str) -> dict[str, Any]:
    c = await Client([procs.addr(0)], client_id=None, token=token, reconnect=False).connect(timeout=5)
    try:
        result: dict[str, Any] = await c.admin("status", timeout=5)
        return result
    finally:
        await c.close()


def tracebacks(log: str) -> list[str]:
    """Each Traceback with the log line that introduced it (rule 4 of ``fuzz.py``'s docstring)."""
    lines = log.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            intro = lines[i - 1] if i else ""
            last = next((x for x in lines[i + 1 :] if x and not x.startswith((" ", "Traceback"))), "")
            out.append(f"{intro.strip()}\n      → {last.strip()}")
    return out
