"""The protocol under deterministic simulation (SPEC §15): seeded runs of a whole
cluster of real node cores, with the invariants of ``sim.invariants``.

Every failure names its seed.  To replay one exactly, with a readable trace::

    from sim.cluster import SimCluster
    from sim.setup import random_config
    sim = SimCluster(random_config(SEED), SEED, keep_trace=True)
    result = sim.run()          # result.describe(); sim.trace

``bench/simulation.py`` runs thousands more seeds and the 100/1,000-node
planning runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Final

import pytest
from sim.cluster import SimCluster
from sim.records import SimResult
from sim.setup import SimParams, make_config, random_config

from overlay.node_core import NodeCore

SEEDS: Final = 256
BATCH: Final = 32

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

_TOTALS: Counter[str] = Counter()


def _run(seed: int, params: SimParams | None = None) -> SimResult:
    return SimCluster(random_config(seed), seed, params).run()


@pytest.mark.parametrize("batch", range(SEEDS // BATCH))
def test_seeds(batch: int) -> None:
    failed = []
    for seed in range(batch * BATCH, (batch + 1) * BATCH):
        result = _run(seed)
        _TOTALS.update(result.stats)
        _TOTALS.update(result.faults)
        _TOTALS.update(f"admin {k}" for k, n in result.admin.items() for _ in range(n))
        _TOTALS["seeds"] += 1
        if not result.ok:
            failed.append(result.describe())
    assert not failed, f"{len(failed)} seed(s) failed:\n" + "\n".join(failed)


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_regression_seed(seed: int) -> None:
    result = _run(seed)
    assert result.ok, f"{REGRESSIONS[seed]}\n{result.describe()}"


def test_runs_exercise_the_protocol() -> None:
    """The seeds must reach the paths the invariants are about, or they prove little."""
    if _TOTALS["seeds"] < 64:  # run alone: gather the numbers here
        for seed in range(64):
            r = _run(seed)
            _TOTALS.update(r.stats)
            _TOTALS.update(r.faults)
            _TOTALS.update(f"admin {k}" for k, n in r.admin.items() for _ in range(n))
            _TOTALS["seeds"] += 1
    wanted = (
        "migrations", "migrations_aborted", "replications", "splits", "merges", "reforwards",
        "events_rerouted", "subscriptions_rerouted", "stall", "slow_link", "tick_pause",
        "admin split:ok", "admin place:ok",
    )
    missing = [k for k in wanted if not _TOTALS[k]]
    assert not missing, f"never happened in {_TOTALS['seeds']} seeds: {missing}; totals {dict(_TOTALS)}"


def test_same_seed_same_trace() -> None:
    for seed in (3, 146):
        a, b = _run(seed), _run(seed)
        assert a.trace_hash == b.trace_hash, f"seed {seed} is not reproducible"
        assert (a.steps, a.deliveries, a.events) == (b.steps, b.deliveries, b.events)
    assert _run(4).trace_hash != _run(5).trace_hash


def test_trace_does_not_depend_on_the_hash_seed() -> None:
    """A failing seed must replay the same in another process (set/dict order)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from sim.cluster import SimCluster; from sim.setup import random_config;"
        "print(SimCluster(random_config(254), 254).run().trace_hash)"
    )
    tests = str(Path(__file__).resolve().parent)
    hashes = set()
    for hs in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hs}
        out = subprocess.run([sys.executable, "-c", code, tests], env=env, capture_output=True, text=True, check=True)
        hashes.add(out.stdout.strip())
    assert len(hashes) == 1 and _run(254).trace_hash in hashes


# -- the invariants are not vacuous: sabotaged cores must fail ------------------------------


def _fails_somewhere(seeds: range) -> list[str]:
    for seed in seeds:
        r = _run(seed)
        if not r.ok:
            return r.failures
    return []


def test_lost_reforwards_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NodeCore, "_reforward_msg", lambda self, mig, chid, sign, msg, out: None)
    failures = _fails_somewhere(range(40))
    assert failures, "dropping every Reforward went unnoticed"


def test_double_notifications_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    orig = NodeCore._match

    def twice(self: NodeCore, ch, msg, out) -> None:  # type: ignore[no-untyped-def]
        orig(self, ch, msg, out)
        if msg.event_id.endswith("7"):
            orig(self, ch, msg, out)

    monkeypatch.setattr(NodeCore, "_match", twice)
    failures = _fails_somewhere(range(10))
    assert any("2 times" in f or "matched 2 times" in f for f in failures), failures[:3]


def test_resurrected_subscriptions_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unsubscribe without waiting for the subscribe in flight (the bug of seed 85)."""
    orig = NodeCore._send_unsubscribe

    def eager(self: NodeCore, sid, seq, local_id, gid, f, out) -> None:  # type: ignore[no-untyped-def]
        p = self._pending.get(gid)
        if p is not None and p.subscribe:
            del self._pending[gid]
        orig(self, sid, seq, local_id, gid, f, out)

    monkeypatch.setattr(NodeCore, "_send_unsubscribe", eager)
    failures = _fails_somewhere(range(40))
    assert any("still stored" in f for f in failures), failures[:3]


def test_splitting_an_arriving_channel_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let split, merge and moves touch channels still arriving (the bug of seed 164)."""
    monkeypatch.setattr(NodeCore, "_arriving", lambda self: set())
    failures = _fails_somewhere(range(40))
    assert failures, "splitting/moving arriving channels went unnoticed"


def test_a_quiet_small_cluster_balances() -> None:
    """No faults, no operator: natural splits and migrations alone, all invariants hold."""
    params = SimParams(faults=False, w_admin=0.0, w_close=0.0, ops=300)
    result = SimCluster(make_config(3, probability=1.0), 7, params).run()
    assert result.ok, result.describe()
    assert result.stats["migrations"] >= 1 and result.stats["splits"] >= 1, result.describe()
