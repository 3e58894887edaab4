"""The README's Quick start works as written, on a cluster with live traffic.

The block marked ``quick-start`` in README.md is read and run command by
command, as a user would in three terminals: ``certs dev`` first, then
``cluster up`` and ``sub`` in the background, the others one after the
other, each expected to succeed.  The only changes:
``cluster_configs/local.toml`` is a copy on free ports (tests never take
fixed ports) with a failure detector for a busy machine
(``LOADED_SUSPECT``), its certificates go beside it (``cluster_configs/certs`` →
the copy's ``certs``), and ``.venv/bin/overlay`` is this interpreter's
``-m overlay``.  Everything runs over TLS, as the README's cluster does;
this test's own clients too.  A publisher sends a few events a second for the whole run,
as a cluster in use has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import shlex
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopback import free_ports, wait_until
from overlay.client import Client
from overlay.config import load_config
from overlay.security import client_ssl

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "cluster_configs/local.toml"
CERTS = "cluster_configs/certs"


def quick_start_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quick-start.*?-->\s*```sh\n(.*?)```", text, re.S)
    assert block, "README.md has no block marked quick-start"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]


# [cluster] suspect_timeout of the copy.  The quick start is not about failure
# detection, and with the default (1.5 s; a node refuses no_quorum once a
# majority has not echoed its heartbeats for 1 s) a CI machine busy with
# other work held node processes long enough for nodes to refuse the
# README's own commands with no_quorum.  10 s: a 6.7 s lease.
LOADED_SUSPECT = 10.0


def config_copy(tmp: Path) -> tuple[Path, list[int]]:
    text = (ROOT / CONFIG).read_text()
    ports = free_ports(6)
    for old, new in zip(["7100", "7101", "7102", "8100", "8101", "8102"], ports):
        text = text.replace(f"= {old}\n", f"= {new}\n")
    assert "suspect_timeout" not in text, "the README's config sets its own suspect_timeout: keep it or change this"
    text = text.replace("[cluster]\n", f"[cluster]\nsuspect_timeout = {LOADED_SUSPECT}\n", 1)
    path = tmp / "local.toml"
    path.write_text(text)
    return path, ports[:3]


def as_run(argv: list[str], config: Path) -> list[str]:
    assert argv[0] == ".venv/bin/overlay", argv
    swap = {CONFIG: str(config), CERTS: str(config.parent / "certs")}
    return [sys.executable, "-m", "overlay", *(swap.get(a, a) for a in argv[1:])]


async def traffic(ports: list[int], stop: asyncio.Event, tls: ssl.SSLContext | None, sent: list[int]) -> int:
    """A few events a second through every node, all over the space; ``sent[0]`` counts them."""
    rng = random.Random(1)
    async with Client([("127.0.0.1", p) for p in ports], ssl=tls) as c:
        while not stop.is_set():
            await c.publish(
                {"price": round(rng.uniform(0, 1000), 2), "sym": rng.choice(["IBM", "AAPL"]), "qty": sent[0]}
            )
            sent[0] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
    return sent[0]


async def wait_ready(ports: list[int], tls: ssl.SSLContext | None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for p in ports:
        while True:
            with contextlib.suppress(OSError, TimeoutError, Exception):
                c = await Client([("127.0.0.1", p)], reconnect=False, ssl=tls).connect(timeout=1)
                try:
                    if c.ready or (await c.admin("status", timeout=1))["ready"]:
                        break
                finally:
                    await c.close()
            assert time.monotonic() < deadline, f"node on port {p} not ready"
            await asyncio.sleep(0.1)


async def test_the_quick_start_runs_as_written_with_live_traffic(tmp_path: Path) -> None:
    commands = quick_start_commands()
    assert [c[1] for c in commands][:3] == ["certs", "cluster", "sub"], (
        "the block makes the certificates, starts the cluster, then a subscriber"
    )
    config, ports = config_copy(tmp_path)
    made = await asyncio.to_thread(subprocess.run, as_run(commands[0], config), capture_output=True, timeout=60)
    assert made.returncode == 0 and b"uses them" in made.stdout, (made.stdout, made.stderr)
    tls = client_ssl(load_config(config))
    assert tls is not None, "the README's cluster runs with TLS"
    log = open(tmp_path / "cluster-up.log", "wb")  # a file, not a pipe: nobody reads it while it runs
    up = subprocess.Popen(as_run(commands[1], config), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sub = None
    stop = asyncio.Event()
    try:
        await wait_ready(ports, tls)
        sent = [0]
        pump = asyncio.create_task(traffic(ports, stop, tls, sent))
        await wait_until(lambda: sent[0] >= 10 or pump.done(), 30, "the cluster has seen traffic")
        assert not pump.done(), pump.exception()
        sub = subprocess.Popen(
            as_run(commands[2], config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        # The subscriber says on stderr when its subscription is in place.
        line = await asyncio.to_thread(sub.stderr.readline)  # type: ignore[union-attr]
        assert b"subscribed" in line, line
        outputs = {}
        for argv in commands[3:]:
            run = await asyncio.to_thread(subprocess.run, as_run(argv, config), capture_output=True, timeout=60)
            assert run.returncode == 0, (argv, run.stdout.decode(), run.stderr.decode())
            assert b"Traceback" not in run.stderr
            outputs[" ".join(argv[1:3])] = run.stdout.decode()
        assert "split on price into 0.1" in outputs["channel split"] and "0.2" in outputs["channel split"]
        assert "moved to node 2" in outputs["channel place"]
        stop.set()
        assert await pump > 0
        # The subscriber printed the published event (and it is still alive).
        sub.send_signal(signal.SIGINT)
        out, err = await asyncio.to_thread(sub.communicate, timeout=10)
        notes = [json.loads(x) for x in out.decode().splitlines()]
        assert any(n["event"] == {"price": 42.5, "sym": "IBM", "qty": 10} for n in notes), (notes, err)
        assert b"Traceback" not in err
    finally:
        stop.set()
        for p in (sub, up):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
    log.close()
    assert up.returncode == 0, (tmp_path / "cluster-up.log").read_text(errors="replace")[-3000:]
