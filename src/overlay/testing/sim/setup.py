"""The cluster a simulated run uses (``make_config``, ``random_config``,
``fault_config``) and the knobs of the run (``SimParams``), each varied with
the seed.

The failure detector (SPEC §16, ``[cluster] heartbeat_interval`` and
``suspect_timeout``) must not turn the delays of a run without node faults
into deaths: one stall silences a node for up to 2× ``peer_timeout`` and a
slow link holds a direction for up to 2.5×, but stalls of one node overlap
and chain (13.3 s, 4.4× the timeout, was the longest in 1,500 seeds; a chain
cannot outlast the active phase, ~11 s at most, plus one stall), so those
runs suspect a peer only after ``SUSPECT_FACTOR`` × ``peer_timeout``.  Runs with node faults
(``fault_config``, ``SimParams.for_fault_seed``) use the product's defaults:
a crash, a cut or a long pause is noticed in seconds.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from overlay.config import ClusterConfig, config_from_dict

from .workload import PRICE_MAX, QTY_MAX

# Runs without node faults: a peer is suspected only after this many peer
# timeouts of silence, above the longest chain of stalls and slow links.
SUSPECT_FACTOR: Final = 10.0
# ... and heartbeats are sent once a simulated second: cheaper, and still
# far more often than the suspicion needs.
QUIET_HEARTBEAT: Final = 1.0
# Runs with node faults: the shipped defaults of ``[cluster]``.
FAULT_HEARTBEAT: Final = 0.25
FAULT_SUSPECT: Final = 1.5


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
    heartbeat_interval: float = QUIET_HEARTBEAT,
    suspect_timeout: float | None = None,
) -> ClusterConfig:
    """A cluster of ``n`` nodes (ids 0…n−1, initializer 0) over the sim schema:
    DA ``price`` (float) and ``sym`` (string), plus ``qty`` (int).
    ``suspect_timeout`` defaults to ``SUSPECT_FACTOR`` × ``peer_timeout``."""
    caps = list(capacities) if capacities is not None else [1.0] * n
    suspect = suspect_timeout if suspect_timeout is not None else SUSPECT_FACTOR * peer_timeout
    doc = {
        "cluster": {
            "name": name,
            "initializer": 0,
            "slice_seconds": slice_seconds,
            "probability": probability,
            "peer_timeout": peer_timeout,
            "balancing": balancing,
            "heartbeat_interval": heartbeat_interval,
            "suspect_timeout": suspect,
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


def _nodes_and_links(rng: random.Random, n: int) -> tuple[list[float], dict[tuple[int, int], float]]:
    """A seed's capacities and the bandwidths that differ from the default (drawn in this order)."""
    caps = [rng.choice((1.0, 1.0, 1.0, 2.0, 0.5)) for _ in range(n)]
    bw = {}
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < 0.3:
                bw[(a, b)] = rng.choice((10.0, 50.0, 200.0))
    return caps, bw


def random_config(seed: int) -> ClusterConfig:
    """The cluster a seed runs on: 2–5 nodes, capacities and bandwidths vary."""
    rng = random.Random(f"config:{seed}")
    n = rng.choice((2, 3, 3, 4, 4, 5))
    caps, bw = _nodes_and_links(rng, n)
    return make_config(
        n,
        capacities=caps,
        probability=rng.choice((0.5, 1.0)),
        bandwidth=bw,
    )


def fault_config(seed: int) -> ClusterConfig:
    """The cluster a node-fault seed runs on: 3–5 nodes (a majority survives
    any one node), capacities and bandwidths vary, the failure detector at
    the product's defaults."""
    rng = random.Random(f"fault-config:{seed}")
    n = rng.choice((3, 3, 4, 5))
    caps, bw = _nodes_and_links(rng, n)
    return make_config(
        n,
        capacities=caps,
        probability=rng.choice((0.5, 1.0)),
        bandwidth=bw,
        name="sim-faults",
        heartbeat_interval=FAULT_HEARTBEAT,
        suspect_timeout=FAULT_SUSPECT,
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
    # Node faults (``sim.faults``): crashes and restarts, partitions, pauses,
    # one node at a time; the clients reconnect, retry and re-send.
    node_faults: bool = False
    active_seconds: float = 0.0  # the active phase lasts at least this long (simulated)
    first_fault: float = 2.0  # the first fault comes this long into the active phase, at most
    w_crash: float = 0.4
    w_partition: float = 0.3
    w_pause: float = 0.3
    p_no_restart: float = 0.1  # a crashed node stays down to the end of the run
    # A partition loses everything sent across it: a shell without net.peer_link
    # rule 6 (else held until the heal, as the shell does).
    p_lossy_cut: float = 0.0
    # Under node faults: publishes with a sequence key (one of ``keys``, the
    # home assigns the ranks: SPEC §10) and subscriptions that join a group
    # (one of ``groups``, every instance with the group's filter: SPEC §11).
    p_keyed: float = 0.0
    keys: int = 4
    p_group: float = 0.0
    groups: int = 2
    # Runs as the real dispatcher hands them to the core: a session's
    # Publishes, a peer's Events, several in one call (``sim.inbox``).
    batching: bool = True

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

    @classmethod
    def for_fault_seed(cls, seed: int) -> SimParams:
        """A run with node faults (``fault_config``): long enough in simulated
        time for two or three faults and their recoveries, with the delays of
        rule 3 kept below the suspicion (``SimNetwork.advance``)."""
        rng = random.Random(f"fault-params:{seed}")
        return cls(
            ops=rng.randint(150, 260),
            initial_subs=rng.randint(4, 20),
            p_deliver=rng.uniform(0.55, 0.75),
            jitter=rng.choice((0.0, 0.005, 0.02, 0.1)),
            faults=True,
            p_fault=rng.choice((0.01, 0.03)),
            w_admin=rng.choice((0.0, 0.02, 0.05)),
            w_close=0.01,
            hot_point=rng.random() < 0.2,
            hot_price=rng.random() < 0.2,
            node_faults=True,
            active_seconds=rng.uniform(14.0, 24.0),
            first_fault=rng.uniform(0.5, 4.0),
            w_crash=rng.choice((0.4, 0.6)),
            p_no_restart=rng.choice((0.0, 0.15)),
            max_drain_seconds=60.0,
            p_keyed=rng.choice((0.15, 0.3, 0.5)),
            keys=rng.choice((2, 4, 8)),
            p_group=rng.choice((0.1, 0.2, 0.3)),
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
