"""A drawn balancing session starts spread over START_SPREAD of a slice (node.balancing rule 2).

Cores only (``CoreLink``), time driven by hand: node 0 holds every channel and
all the load; with p = 1 it draws at every slice, and its RequestLoadBalance
must come after the decision, within START_SPREAD·T of it, at the first tick
past a time drawn from its random source.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from overlay.config import load_config
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.balancing import START_SPREAD
from overlay.testing.corelink import CoreLink

T = 1.0
TICK = 0.01
_LOADED = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
CONFIG = msgspec.structs.replace(
    _LOADED, cluster=msgspec.structs.replace(_LOADED.cluster, balancing=True, probability=1.0, slice_seconds=T)
)


def loaded_cluster(seed: str) -> CoreLink:
    net = CoreLink(CONFIG, now=0.0)
    for core in net.cores.values():
        core.rng.seed(seed)
    net.start()
    sid = net.open_client(0, "c")
    net.client_send(0, sid, cm.Subscribe(1, "s", "price >= 0"))
    net.run()
    return net


def run_until_request(net: CoreLink, until: float) -> tuple[float | None, list[float]]:
    """Tick every core each TICK; (time of node 0's first RequestLoadBalance,
    times its slices closed)."""
    sid = next(iter(net.cores[0].sessions))
    closed: list[float] = []
    now = 0.0
    k = 0
    while now < until:
        now = round(now + TICK, 6)
        k += 1
        net.client_send(0, sid, cm.Publish(10_000 + k, {"price": float(k % 500), "sym": "A", "qty": 1}))
        slices = net.cores[0].monitor.slice_no
        for i in net.cores:
            net.tick(i, now)
        if net.cores[0].monitor.slice_no != slices:
            closed.append(now)
        if any(src == 0 and isinstance(m, pm.RequestLoadBalance) for src, _dst, m in net.pending()):
            return now, closed
        net.run()
    return None, closed


@pytest.mark.parametrize("seed", ["a", "b", "c", "d"])
def test_a_drawn_session_starts_within_the_spread_after_the_decision(seed):
    net = loaded_cluster(seed)
    at, closed = run_until_request(net, 6 * T)
    assert at is not None, "node 0 never asked a receiver"
    decided = max(c for c in closed if c <= at)
    # The decision waits for the peers' LIEMs (a tick here); the start waits
    # a random part of the spread, then the next tick.
    assert decided < at <= decided + START_SPREAD * T + 3 * TICK


def test_starts_differ_between_seeds():
    offsets = set()
    for seed in "abcdefgh":
        at, closed = run_until_request(loaded_cluster(seed), 6 * T)
        assert at is not None
        offsets.add(round(at - max(c for c in closed if c <= at), 6))
    assert len(offsets) > 2  # spread, not one fixed delay
