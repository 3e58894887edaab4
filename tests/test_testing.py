"""overlay.testing: the loopback harness itself — config overrides checked,
real ports in the config, nodes stopped, crashed, restarted and joined, a
node that ends with an error failing the test that ran it, and the ports of
node processes reserved."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import msgspec
import pytest

from conftest import LOCAL
from overlay.testing import (
    LoopbackCluster,
    _loopback,
    bound_socket,
    free_ports,
    override,
    skewed_price,
    wait_progressing,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


def test_overrides_replace_only_what_they_name_and_are_checked() -> None:
    cfg = override(LOCAL, cluster={"slice_seconds": 0.3}, sequencer={"hold_ttl": 1.0})
    assert cfg.cluster.slice_seconds == 0.3 and cfg.cluster.name == LOCAL.cluster.name
    assert cfg.sequencer.hold_ttl == 1.0 and cfg.sequencer.policy == LOCAL.sequencer.policy
    assert cfg.nodes == LOCAL.nodes and cfg.schema == LOCAL.schema
    with pytest.raises(msgspec.ValidationError, match="slice_secs"):
        override(LOCAL, cluster={"slice_secs": 1.0})
    with pytest.raises(msgspec.ValidationError, match="probability"):
        override(LOCAL, cluster={"probability": 1.5})
    with pytest.raises(msgspec.ValidationError, match="policy"):
        LoopbackCluster(LOCAL, sequencer={"policy": "maybe"})


async def test_the_config_lists_every_real_port_capacity_and_placeholder() -> None:
    cl = LoopbackCluster(LOCAL, 4, admin=True, capacities=[1, 2, 3, 4], placeholders=[3], balancing=False)
    try:
        assert [n.id for n in cl.config.nodes] == [0, 1, 2, 3] and cl.ids == [0, 1, 2]
        assert [n.capacity for n in cl.config.nodes] == [1, 2, 3, 4]
        assert all(n.port == cl.addr(n.id)[1] != 0 for n in cl.config.nodes)
        assert all(cl.config.node(i).admin_port == cl.admin_socks[i].getsockname()[1] for i in cl.ids)
        assert cl.config.node(3).admin_port == 0 and not cl.config.cluster.balancing
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(cl.addr(3))  # bound, not listening: a peer that is down
        await cl.start(ready=False)
        assert all(cl.nodes[i].admin_port == cl.config.node(i).admin_port for i in cl.ids)
    finally:
        await cl.stop()
    assert all(s.fileno() == -1 for s in (*cl.socks.values(), *cl.admin_socks.values()))


async def _serves(cl: LoopbackCluster, access: int, owner: int = 0) -> None:
    sub = await (await cl.client(owner)).subscribe(f"price < 10 and qty = {access}")
    await (await cl.client(access)).publish({"price": 1.0, "sym": "A", "qty": access})
    assert (await sub.next(5.0)).event["qty"] == access


async def test_a_stopped_or_crashed_node_restarts_on_its_port_and_serves_again() -> None:
    async with LoopbackCluster(LOCAL, balancing=False) as cl:
        for end in (cl.stop_node, cl.crash_node):
            first = cl.nodes[2]
            await end(2)
            assert cl.running == [0, 1]
            await wait_until(lambda: 2 not in cl.nodes[0].links or not cl.nodes[0].links[2].connected.is_set())
            again = await cl.restart_node(2)
            assert again is cl.nodes[2] is not first and again.core.incarnation != first.core.incarnation
            await cl.wait_ready()
            await _serves(cl, 2)


async def test_a_joined_node_is_known_to_every_node_and_stopped_with_the_cluster() -> None:
    async with LoopbackCluster(LOCAL, admin=True, balancing=False) as cl:
        joined = await cl.join(capacity=2.0)
        assert joined.id == 3 and joined.me.capacity == 2.0 and joined.admin_port == joined.me.admin_port != 0
        assert all(n.id != 3 for n in cl.config.nodes)  # the others' config does not list it
        await wait_until(lambda: all(3 in cl.nodes[i].core.peers for i in (0, 1, 2)), what="node 3 known")
        await cl.wait_ready()
        await _serves(cl, 3)
    assert cl.tasks[3].done() and not cl.running


async def test_a_node_that_ends_with_an_error_fails_the_stop() -> None:
    cl = LoopbackCluster(LOCAL, 1, autostart=False)
    node = cl.nodes[0]
    go = asyncio.Event()

    async def broken_run() -> None:
        node.started.set()
        await go.wait()
        raise RuntimeError("the node broke")

    node.run = broken_run  # type: ignore[method-assign]
    await cl.start(ready=False)
    go.set()
    with pytest.raises(AssertionError, match=r"node-0.*the node broke"):
        await cl.stop()


async def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.05s waiting for the moon"):
        await wait_until(lambda: False, 0.05, "the moon")


async def test_wait_progressing_waits_while_there_is_progress_and_fails_on_a_stall() -> None:
    count = 0

    async def creep() -> None:
        nonlocal count
        while count < 30:
            count += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(creep())
    await wait_progressing(lambda: count >= 30, lambda: count, stall=5.0, what="thirty")
    await task
    with pytest.raises(AssertionError, match=r"no progress for 0\.05s waiting for forty \(stuck at 30\)"):
        await wait_progressing(lambda: count >= 40, lambda: count, stall=0.05, what="forty")


def test_bound_socket_can_take_a_port_back_and_skewed_prices_are_skewed() -> None:
    with bound_socket() as s:
        port = s.getsockname()[1]
    with bound_socket(port) as again:
        assert again.getsockname()[1] == port
    prices = [skewed_price(k) for k in range(10_000)]
    # 70 % in the hot range, plus its share (a fifth) of the 30 % spread over [0, 1000].
    assert 0.75 < sum(p <= 200.0 for p in prices) / len(prices) < 0.77
    assert min(prices) >= 0.0 and max(prices) <= 1000.0
    moved = [skewed_price(k, hot=(600.0, 800.0)) for k in range(10_000)]
    assert 0.75 < sum(600.0 <= p <= 800.0 for p in moved) / len(moved) < 0.77


def test_free_ports_lie_outside_the_kernels_ephemeral_range() -> None:
    """Rule 1 of ``overlay.testing._loopback``: no ``connect`` or ``bind(0)``
    of the machine can take a node process's port before it binds it."""
    start, end = _loopback._ephemeral_range()
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(not start <= p <= end and p >= _loopback.PORTS_FROM for p in ports), (ports, start, end)


def test_a_reserved_port_goes_to_no_other_process_and_a_taken_one_to_none() -> None:
    mine = free_ports(3)
    spare = [p for p in range(_loopback.PORTS_FROM, _loopback._ephemeral_range()[0]) if p not in mine]
    code = "import sys; from overlay.testing._loopback import reserve_ports; print(reserve_ports(3, map(int, sys.argv[1:])))"
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, mine + spare[:200])], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    theirs = msgspec.json.decode(out.stdout)
    assert len(theirs) == 3 and not set(theirs) & set(mine), (mine, theirs)
    with bound_socket() as busy:  # bound by a socket, not reserved by anyone
        port = busy.getsockname()[1]
        got = _loopback.reserve_ports(1, [port, *spare[200:400]])
    assert got != [port] and len(got) == 1
