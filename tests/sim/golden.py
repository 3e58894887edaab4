"""The recorded behaviour of the node cores: one trace hash per seeded run of
the suite, kept in ``golden_traces.json`` and checked by the tests that make
those runs (``test_simulation``, ``test_balancing_convergence``).

A restructuring of the node core must leave every hash as it is.  A change
that means to alter behaviour records the file anew, and says so in its
commit::

    cd tests && ../.venv/bin/python -m sim.golden
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

GOLDEN_FILE: Final = Path(__file__).with_name("golden_traces.json")

SEEDS: Final = 256  # the seeded runs of test_simulation.test_seeds

# Seeds that once failed, with what they found (each fixed in the node core).
REGRESSIONS: Final[dict[int, str]] = {
    164: "the receiver split a channel of an unfinished incoming migration; SubscriptionMove then crashed",
    85: "an unsubscribe overtook its subscribe (still on a stale route) and the subscribe resurrected it",
    25: "the same, through a replicated channel",
    28: "an operator split one replica of a replicated channel; the other node kept a channel no table named",
    21: "a rerouted subscription went again to every channel of its filter: stray copies outlived the unsubscribe",
    78: "an answer that overtook its reroute notice left the access node waiting forever",
    63: "a subscription sent by an old table reached only the first replica of a replicated channel",
    48: "a ChannelTransfer after the receiver gave up was a protocol error instead of a refusal",
    146: "a stale event was matched on an arriving channel before its subscriptions came: lost",
    254: "a stale (un)subscription was applied on one replica only: replicas diverged",
    879: "a late subscription for a split channel fanned out to every channel, again at each hop, until dropped",
    1242: "the same fan-out: copies bounced past MAX_HOPS and the SubAck never came",
    1049: "stale events detoured off a filled arriving channel bounced between sender and receiver past MAX_HOPS",
}

# Convergence runs (sim.convergence): config name → seeds.
CONVERGENCE: Final[dict[str, tuple[int, ...]]] = {
    "local.toml": tuple(range(6)),
    "hetero5.toml": (*range(6), 20),
}


def sim_seeds() -> list[int]:
    return sorted(set(range(SEEDS)) | set(REGRESSIONS))


def convergence_digest(run: Any) -> str:
    """A convergence run has no trace hash of its own: digest what it showed."""
    shown = (run.series, run.migrations, run.loads, run.lost, run.pairs)
    return hashlib.sha256(repr(shown).encode()).hexdigest()


def load() -> dict[str, dict[str, str]]:
    data: dict[str, dict[str, str]] = json.loads(GOLDEN_FILE.read_text())
    return data


def expected_sim(seed: int) -> str:
    return load()["sim"][str(seed)]


def expected_convergence(name: str, seed: int) -> str:
    return load()["convergence"][f"{name}:{seed}"]


def record() -> None:
    """Run every case and write the file (minutes: it is the suite's simulation)."""
    from overlay.testing.sim.cluster import SimCluster
    from overlay.testing.sim.setup import random_config
    from test_balancing_convergence import _run  # the test module owns the scenarios

    sims = {str(s): SimCluster(random_config(s), s).run().trace_hash for s in sim_seeds()}
    conv = {f"{name}:{s}": convergence_digest(_run(name, s)) for name, seeds in CONVERGENCE.items() for s in seeds}
    GOLDEN_FILE.write_text(json.dumps({"sim": sims, "convergence": conv}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(sims)} simulator seeds and {len(conv)} convergence runs in {GOLDEN_FILE}")


if __name__ == "__main__":
    record()
