"""The cluster a simulated run uses (``make_config``, ``random_config``) and
the knobs of the run (``SimParams``), each varied with the seed."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from overlay.config import ClusterConfig, config_from_dict

from .workload import PRICE_MAX, QTY_MAX


def make_config(
    n: int,
    *,
    capacities: Iterable[float] | None = None,
    slice_seconds: float = 1.0,
    probability: float = 0.5,
    peer_timeout: float = 3.0,
    bandwidth: dict[tuple[int, int], float] | None = None,
    balancing: bool = True,
    name: str = "sim",
) -> ClusterConfig:
    """A cluster of ``n`` nodes (ids 0…n−1, initializer 0) over the sim schema:
    DA ``price`` (float) and ``sym`` (string), plus ``qty`` (int)."""
    caps = list(capacities) if capacities is not None else [1.0] * n
    doc = {
        "cluster": {
            "name": name,
            "initializer": 0,
            "slice_seconds": slice_seconds,
            "probability": probability,
            "peer_timeout": peer_timeout,
            "balancing": balancing,
        },
        "nodes": [{"id": i, "capacity": caps[i]} for i in range(n)],
        "bandwidth": {
            "default": 100.0,
            "links": [{"a": a, "b": b, "bw": bw} for (a, b), bw in sorted((bandwidth or {}).items())],
        },
        "schema": {
            "distinguishing": ["price", "sym"],
            "attributes": [
                {"name": "price", "type": "float", "min": 0, "max": PRICE_MAX},
                {"name": "sym", "type": "string", "min": 1, "max": 8},
                {"name": "qty", "type": "int", "min": 0, "max": QTY_MAX},
            ],
        },
    }
    return config_from_dict(doc, "<sim>")


def random_config(seed: int) -> ClusterConfig:
    """The cluster a seed runs on: 2–5 nodes, capacities and bandwidths vary."""
    rng = random.Random(f"config:{seed}")
    n = rng.choice((2, 3, 3, 4, 4, 5))
    caps = [rng.choice((1.0, 1.0, 1.0, 2.0, 0.5)) for _ in range(n)]
    bw = {}
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < 0.3:
                bw[(a, b)] = rng.choice((10.0, 50.0, 200.0))
    return make_config(
        n,
        capacities=caps,
        probability=rng.choice((0.5, 1.0)),
        bandwidth=bw,
    )


@dataclass
class SimParams:
    """The knobs of one run; ``for_seed`` varies them with the seed."""

    ops: int = 200  # client operations in the active phase
    initial_subs: int = 12
    clients_per_node: int = 2
    subs_only_slices: float = 7.0
    p_deliver: float = 0.70
    p_client: float = 0.20  # the rest of a step advances the clock
    dt_mean: float = 0.05  # seconds per clock advance (× slice_seconds 1.0)
    jitter: float = 0.01  # per-message delay bound (s)
    faults: bool = True
    p_fault: float = 0.03  # per clock advance
    w_publish: float = 0.62
    w_subscribe: float = 0.2
    w_unsubscribe: float = 0.1
    w_admin: float = 0.05
    w_close: float = 0.015
    w_join: float = 0.015
    hot_point: bool = False  # many identical events: channels must replicate
    hot_price: bool = False  # many events at one price, varied sym: string cuts
    max_drain_seconds: float = 120.0

    @classmethod
    def for_seed(cls, seed: int) -> SimParams:
        rng = random.Random(f"params:{seed}")
        return cls(
            ops=rng.randint(150, 260),
            initial_subs=rng.randint(4, 20),
            p_deliver=rng.uniform(0.55, 0.8),
            jitter=rng.choice((0.0, 0.005, 0.02, 0.2)),
            faults=rng.random() < 0.7,
            p_fault=rng.choice((0.01, 0.03, 0.08)),
            w_admin=rng.choice((0.02, 0.05, 0.1)),
            hot_point=rng.random() < 0.2,
            hot_price=rng.random() < 0.2,
        )


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """The cores' logs off for one run (thousands of seeded faults log a lot),
    and back as they were after it: other tests read them with ``caplog``."""
    logger = logging.getLogger("overlay")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
