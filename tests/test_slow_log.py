"""The node's slow log (``overlay.net.node`` rule 8): whatever holds the loop
past ``slow_ms`` is journalled as ``slow`` with what it was and for how long."""

from __future__ import annotations

import pytest

from conftest import LOCAL
from overlay.testing import LoopbackCluster, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def slow_entries(cl: LoopbackCluster, node: int = 0) -> list[dict]:
    return [e for e in cl.nodes[node].core.journal if e["kind"] == "slow"]


async def test_every_handler_past_the_threshold_is_journalled() -> None:
    # 0.1 µs: every message and tick is "slow".
    async with LoopbackCluster(LOCAL, 2, admin=True, slice_seconds=0.3, slow_ms=0.0001) as cl:
        await wait_until(lambda: {"tick", "LIEM"} <= {e["what"] for e in slow_entries(cl)}, 10, "a slow tick and LIEM")
        liem = next(e for e in slow_entries(cl) if e["what"] == "LIEM")
        assert liem["source"] == "peer 1" and liem["ms"] >= 0 and liem["node"] == 0
        assert cl.nodes[0].core.stats["journal_slow"] >= 2


async def test_off_at_zero_and_quiet_under_the_threshold() -> None:
    async with LoopbackCluster(LOCAL, 2, admin=True, slice_seconds=0.3, slow_ms=0) as cl:
        await wait_until(lambda: len(cl.nodes[0].core.monitor.live()) == 1, 10, "a LIEM")
        node = cl.nodes[0]
        assert not slow_entries(cl)
        # A GC pass is timed like a handler (the callback a node process installs).
        node._gc_timer("start", {"generation": 1})
        node._gc_timer("stop", {"generation": 1})
        assert not slow_entries(cl)
        node.slow_log.threshold = 0.0
        node._gc_timer("start", {"generation": 2})
        node._gc_timer("stop", {"generation": 2})
        (entry,) = slow_entries(cl)
        assert entry["what"] == "gc gen 2" and entry["source"] == "node 0"
