"""Deterministic simulation of a whole cluster of node cores (SPEC §15).

``cluster.SimCluster`` runs one seeded scenario (on ``setup``'s config and
params, with ``workload``'s subscriptions, remembering ``records``);
``invariants`` checks what must hold after it.  ``tests/test_simulation.py`` runs a few hundred seeds,
``bench/simulation.py`` many more and the 100/1,000-node planning runs.
The cores get what a real node's dispatcher hands them: runs of a peer's
Events and of a session's Publishes in one call (``inbox``).

With node faults (``SimCluster.for_fault_seed``) ``faults`` crashes,
restarts, partitions and pauses nodes one at a time, ``client_faults`` makes
the clients reconnect, retry and re-send, and ``invariants`` checks SPEC
§16's promise (``tests/test_simulation_faults.py``, ``bench/simulation.py --faults``).

``convergence.ConvergenceSim`` plays the steady skewed traffic of the
balancing tests on a virtual clock: S/dc̄ per slice, the moves, exactly-once
(``tests/test_balancing_convergence.py``).
"""

from .cluster import SimCluster
from .convergence import ConvergenceRun, ConvergenceSim
from .records import SimResult
from .setup import SimParams, fault_config, make_config, random_config

__all__ = [
    "ConvergenceRun",
    "ConvergenceSim",
    "SimCluster",
    "SimParams",
    "SimResult",
    "fault_config",
    "make_config",
    "random_config",
]
