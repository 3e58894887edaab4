"""An idle cluster looks idle (``overlay.balance.monitor`` rule 5): two events
in a while do not make the node that matched them OVERLOADED, no balancing
session starts, and nothing is logged as a warning."""

from __future__ import annotations

import logging

import pytest

from conftest import LOCAL
from overlay.testing import LoopbackCluster, wait_until

pytestmark = pytest.mark.timeout(60)

SLICE = 0.2


async def test_two_events_leave_every_node_stable_and_the_log_quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="overlay")
    async with LoopbackCluster(LOCAL, 3, admin=True, slice_seconds=SLICE) as cl:
        c = await cl.client(1, client_id="c")
        await c.subscribe("price < 100")
        pub = await cl.client(0, client_id="p")
        for price in (1.0, 2.0):
            await pub.publish({"price": price, "sym": "A"})
        cores = [n.core for n in cl.nodes.values()]
        start = cores[0].monitor.slice_no
        await wait_until(lambda: all(c.monitor.slice_no >= start + 12 for c in cores), 20, "a dozen slices")
        assert [c.monitor.state.value for c in cores] == ["STABLE"] * 3
        assert all(c.stats["journal_decision"] == 0 and c.stats["migrations_aborted"] == 0 for c in cores)
        assert all(c.local.load == 0 for c in cores)  # no decaying remnant of the two events (6e-61 once)
        assert all(v == 0 for c in cores for v in c.loads.all().values())
    warnings = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING
        and r.name.startswith("overlay")
        and "link to peer" not in r.getMessage()
        and "[tls] insecure = true" not in r.getMessage()
    ]  # the stop closes links at the end; a test cluster announces its plain TCP at start
    assert not warnings, [r.getMessage() for r in warnings]
