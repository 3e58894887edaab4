"""overlay.testing.NodeProcesses and write_cluster_config: a generated config
with tables beside ``[cluster]`` (``[auth]`` here) loads as written; the
readiness probe of a cluster with ``[auth]`` signs its own token; and
``terminate`` stops one node cleanly (exit status 0) while the other still
answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.auth import generate_keys
from overlay.client import Client
from overlay.config import load_config
from overlay.errors import RequestError
from overlay.testing import NodeProcesses, free_ports, write_cluster_config

pytestmark = pytest.mark.timeout(90)


async def test_an_auth_cluster_of_processes_is_probed_with_a_signed_token_and_one_node_terminated(
    tmp_path: Path,
) -> None:
    private, public = generate_keys(tmp_path / "keys")
    addresses = [("127.0.0.1", p) for p in free_ports(2)]
    path = write_cluster_config(
        tmp_path / "c.toml",
        addresses,
        name="procs",
        tables={"auth": {"public_keys": [str(public)], "signing_key": str(private)}, "groups": {"ack_timeout": 3.0}},
    )
    cfg = load_config(path)
    assert cfg.auth.enabled and cfg.auth.public_keys == (str(public),) and cfg.groups.ack_timeout == 3.0
    procs = NodeProcesses(path, addresses, tmp_path)
    try:
        procs.start_all()
        await procs.all_ready()  # the probe's Hello carries a token signed with the config's key
        with pytest.raises(RequestError, match="unauthorized"):
            await Client([addresses[0]], reconnect=False).connect(timeout=5)
        procs.terminate(1)
        assert procs.procs[1].returncode == 0 and not procs.alive(1) and procs.alive(0)
        assert (await procs.status(0))["ready"]
    finally:
        procs.stop()
