"""SPEC §16's promise under node faults, by deterministic simulation (SPEC §15).

Each seed runs a cluster of 3–5 real node cores (``fault_config``) through
crashes and restarts, partitions and pauses, one node at a time
(``overlay.testing.sim.faults``), while clients publish, subscribe,
unsubscribe, lose their sessions, reconnect elsewhere, retry and re-send
(``sim.client_faults``); then ``sim.invariants`` rule 6 (the promise) and
rules 2–5 are checked.  Every failure names its seed; to replay one exactly,
with its trace::

    from overlay.testing.sim.cluster import SimCluster
    sim = SimCluster.for_fault_seed(SEED, keep_trace=True)
    result = sim.run()          # result.describe(); sim.trace

``bench/simulation.py --faults`` runs thousands more.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Final

import pytest

from overlay.testing.sim.cluster import SimCluster
from overlay.testing.sim.records import SimResult

SEEDS: Final = 200
BATCH: Final = 20
WORKERS: Final = min(2, os.cpu_count() or 1)  # the seeds run on two processes: ~35-45 s

# The first test computes every seed (the others read the cache): on a machine
# shared with other runs that can take several times the suite's 120 s.
pytestmark = pytest.mark.timeout(600)

# Every one of these 200 seeds keeps SPEC §16's promise, and so do all 1,000
# of ``bench/simulation.py --faults`` (the last to fail — 561, 963, 808, 1094,
# 1533, 330, 905 — are regression seeds below).


def _run(seed: int) -> SimResult:
    return SimCluster.for_fault_seed(seed).run()


@functools.cache
def _results() -> dict[int, SimResult]:
    """Every seed's result, computed once for the tests of this module."""
    with ProcessPoolExecutor(WORKERS) as pool:
        return dict(zip(range(SEEDS), pool.map(_run, range(SEEDS), chunksize=4), strict=True))


@pytest.mark.parametrize("batch", range(SEEDS // BATCH))
def test_the_promise_holds_under_faults(batch: int) -> None:
    results = _results()
    failed = [results[s].describe() for s in range(batch * BATCH, (batch + 1) * BATCH) if not results[s].ok]
    assert not failed, f"{len(failed)} seed(s) failed:\n" + "\n".join(failed)


def test_a_failing_seed_replays_exactly() -> None:
    """Whatever a seed finds, running it again finds it again, step for step
    (here and in another process)."""
    for seed in (0, 34):
        a, b = _run(seed), _results()[seed]
        assert a.trace_hash == b.trace_hash, f"seed {seed} does not replay"
        assert (a.failures, a.journal, a.steps, a.deliveries, a.events) == (
            b.failures,
            b.journal,
            b.steps,
            b.deliveries,
            b.events,
        ), f"seed {seed}: same trace, another outcome"


def test_the_seeds_exercise_the_faults() -> None:
    """The runs must reach the faults and the clients' answers to them, or they prove little."""
    totals: Counter[str] = Counter()
    for r in _results().values():
        totals.update(r.faults)
        totals.update(r.stats)
    wanted = (
        "crash",
        "partition",
        "pause",
        "slow_link",
        "messages_lost",
        "sessions_lost",
        "reconnects",
        "resubscribed",
        "migrations",
        "splits",
        # ordered keys and groups across deaths (sim.setup: p_keyed, p_group)
        "ordered_keys_taken_over",
        "ordered_released_again",
        "ordered_redispatched",
        "group_sticky",
        "tracked_duplicates_dropped",
        # runs handed over in one call, as the real dispatcher does, and shared Notifies (sim.inbox)
        "event_runs",
        "publish_runs",
        "notifies_actions",
    )
    missing = [k for k in wanted if not totals[k]]
    assert not missing, f"never happened in {SEEDS} seeds: {missing}; totals {dict(totals)}"


# A ratchet.  Once the simulated links carried
# what the cores send (``SimNetwork.lagging``: before, heartbeats starved
# every other message for seconds), 197 of these 200 seeds passed and none
# found a PubAck'd event missing for a promised subscription (978 of 1,000 in
# ``bench/simulation.py --faults``).  With keyed publishes and group
# instances in every seed (node.keyhome, node.groups rule 9: invariants
# rules 6, 7), 196 passed and none lost a PubAck'd event or gave one to two
# instances of a group (the 4 that failed were (un)subscriptions and tables).
# With versioned routing tables and anti-entropy (``node.table_sync``) all 200 pass.
# A change that makes either figure worse fails here; raise them as fixes land.
MIN_PASSING: Final = 200
MAX_RULE_6: Final = 0


def test_no_regression_on_the_seeds_that_keep_the_promise() -> None:
    results = _results()
    passing = sum(r.ok for r in results.values())
    lost = [s for s, r in results.items() if any("rule 6" in f or "lost for" in f for f in r.failures)]
    assert passing >= MIN_PASSING, f"{passing} of {SEEDS} seeds pass (at least {MIN_PASSING} did)"
    assert len(lost) <= MAX_RULE_6, f"{len(lost)} seeds lose a PubAck'd event (at most {MAX_RULE_6} did): {lost}"


# Fault seeds beyond SEEDS that once found a bug, kept after the fix (their
# schedules drift as the cores change, but the promise must hold on them).
REGRESSION_SEEDS: Final = (
    593,  # a replica kept a subscription whose unsubscription died with the first owner
    668,  # a dead node's re-stated update removed a channel a live sender was moving in; then a crash
    345,  # a sync that left its sender before a migration moved the channel back on a restarted node
    138,  # after a recovery the tables differed on one channel and overlapped on another: nothing re-synced them
    5,  # a split channel came back after a restart and was merged beside its own child: the spaces overlapped
    285,  # a death of a node's old run, told after its new run said hello, cut the new run off for good
    373,  # the same: its (un)subscriptions were never answered
    577,  # the same, in a 5-node cluster
    561,  # a group copy of a channel its dead owner had split just before: the rebuilt child sent it to a 2nd instance
    963,  # a keyed event released to a migration's receiver that died with it: no recovery update re-sent it
    808,  # a moved channel's group copy failed at its sender and its receiver: each picked another instance
    1094,  # a moved channel's group copy in flight, its instance gone at the receiver: a 2nd instance
    1533,  # the same (tests/test_group_handover.py pins the schedule down)
    330,  # a restart claim naming this node sole owner of its replica: its own clients' subscriptions dropped
    905,  # a SubscriptionMove snapshot carried a dead run's subscriptions: kept on the receiver for good
    153,  # a last Rebuild that overtook the recovery's update was not counted: the channel held its events for good
    821,  # a group copy failed by a session's close was offered again to that session's other instance
    459,  # a group copy for an instance gone, its group id pruned, dropped unanswered; handed over; receiver crashed
    929,  # the same
    785,  # a keyed event released to the dead old run of its key's new home: the old home passing it on never re-sent it
    427,  # matched again on a receiver before the hand-over, the sender's choice gone: each side picked an instance
    1077,  # a split child's move handed over the parent's delivery of the other child's event: each side picked one
    1132,  # a keyed event died with a node's old run, restarted before declared dead: its home never released it again
    1751,  # a copy to an instance that had taken the event, failed by its access node that forgot it: replaced
    739,  # a split parent's failed copy re-offered to 13 instances gone since, ~6 s each: not quiet in the drain
    3467,  # matched again with its group's copy in flight, reported to no node: PubAck'd; the copy died with the owner
    4893,  # a receiver's answer reached a session aborted for it unreachable, not yet forgotten: a protocol error
)


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_fault_seeds_that_found_a_bug_keep_the_promise(seed: int) -> None:
    result = _run(seed)
    assert result.ok, result.describe()
