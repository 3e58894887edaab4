"""overlay.limits.descriptors (net.node rule 17): client connections against the process's file descriptors.

Found by the second outside audit: at a soft limit of 256 open files (many
systems start a process at 1024), 300 Hellos of a stranger took every
descriptor of a node long before ``[limits] max_clients`` (10,000) could
refuse one, and ``accept`` then failed for the admin endpoint and peers too
(97 WARNING lines of ``Too many open files`` in 10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from overlay.limits.descriptors import RESERVE_EXTRA, client_cap, reserve_for
from overlay.messages import client as cm
from overlay.messages.codec import encode_frame
from overlay.net.node import CLIENT_MAGIC
from overlay.testing import free_ports
from overlay.testing._processes import NodeProcesses, write_cluster_config

pytestmark = pytest.mark.timeout(90)


def test_the_reserve_is_what_peers_the_admin_endpoint_and_files_need() -> None:
    assert reserve_for(3, 256) == 6 + 256 + RESERVE_EXTRA


@pytest.mark.parametrize(
    "max_clients, descriptors, reserve, cap",
    [
        (10_000, 1 << 20, 400, 10_000),  # room enough: max_clients as configured
        (10_000, 1024, 326, 698),  # the common soft limit: lowered to what is left
        (0, 1024, 326, 698),  # no limit configured: still the descriptors'
        (10_000, 256, 322, 1),  # nothing left: one, so a client is told why it is refused
        (500, 1024, 326, 500),
    ],
)
def test_max_clients_is_lowered_to_the_descriptors_left(
    max_clients: int, descriptors: int, reserve: int, cap: int
) -> None:
    assert client_cap(max_clients, descriptors, reserve) == cap


def test_a_node_process_raises_its_soft_limit_to_the_hard_one() -> None:
    code = "from overlay.limits.descriptors import raise_descriptor_limit as r; print(*r(), *r())"
    out = subprocess.run(
        ["prlimit", "--nofile=256:4096", sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["256", "4096", "4096", "4096"]  # raised once; a second call has nothing to do


async def test_a_node_that_may_open_few_files_admits_fewer_clients_and_its_admin_endpoint_keeps_answering(
    tmp_path: Path,
) -> None:
    port, admin = free_ports(2)
    addresses = [("127.0.0.1", port)]
    limits = {"http_max_connections": 16}
    config = write_cluster_config(tmp_path / "c.toml", addresses, admin_ports=[admin], tables={"limits": limits})
    procs = NodeProcesses(config, addresses, tmp_path, prefix={0: ["prlimit", "--nofile=300:300"]})
    conns: list[asyncio.StreamWriter] = []
    try:
        procs.start_all()
        await procs.all_ready()
        cap = 300 - reserve_for(1, 16)
        line = await procs.wait_log(0, "client connections, not [limits] max_clients")
        assert f"may open 300 files, so it admits {cap} client connections" in line
        for i in range(cap + 20):  # a stranger's Hellos, past the cap
            _, writer = await asyncio.open_connection(*procs.addr(0))
            writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(f"stranger-{i}")))
            conns.append(writer)
        await procs.wait_log(0, f"its limit ([limits] max_clients = {cap})")
        # The admin endpoint still accepts.
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{admin}/healthz") as resp:
            assert resp.status == 200
        assert "Too many open files" not in procs.log(0)
    finally:
        for w in conns:
            with contextlib.suppress(Exception):
                w.close()
        procs.stop()
