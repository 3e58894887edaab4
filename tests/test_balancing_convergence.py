"""Balancing convergence (SPEC §5, §6, §8): judged in virtual time, shown working over sockets.

Balancing quality is a property of the protocol's decisions, not of how fast
this machine is, so it is judged on the deterministic simulator
(``sim.convergence``: the real ``NodeCore``s, a virtual clock, seeded), where
a run is exact per seed and a CPU hog changes nothing.  Each seed's run is
the scenario the real-node tests used to time on the wall clock: all
channels start on the initializer, T = 0.4 s, p = 1, 1,000 events/s of
skewed traffic from a publisher on every node, 20 live and 240 load range
subscriptions.

* ``test_converges_from_the_initializer`` (local, 3 equal nodes) — S/dc̄
  falls below ``SPREAD_TARGET`` within 12 slices of the first whole slice of
  traffic and stays there for the rest of the run (at least 8 slices);
  natural migrations happened; every live subscription got every matching
  event exactly once.
* ``test_heterogeneous_capacities_converge`` (hetero5, capacities 1, 2, 1,
  4, 2, its bandwidths) — the same within 20 slices, staying at least 5, and
  load *levels* converge while the loads themselves differ, roughly with
  capacity (max d ≥ 2.5 × min d).
* ``test_no_oscillation_after_convergence`` — after convergence the moves
  that still fine-tune S/dc̄ do not ping-pong: no channel goes back to a node
  it left, and there are no more of them than nodes.
* ``test_a_seed_replays_exactly`` — the judgement is reproducible.

``test_balancing_works_over_sockets`` keeps what only real nodes show: over
TCP, with the shell's wall-clock slices and background splits, the
overloaded initializer moves channels off itself on its own, the receivers
then carry load, and nothing is lost or doubled.  It waits on those
conditions (bounded), never on a number of slices: on a loaded machine
slices close late and traffic is lumpy.  (Until 2026-11 the quality
assertions above ran here on real nodes, and failed now and then on a busy
machine; exactly-once across forced and natural moves with churn is
test_balancing's.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from pathlib import Path
from typing import Final

import msgspec
import pytest

from conftest import LOCAL
from overlay.channels import parse_subscription
from overlay.client import Client
from overlay.config import ClusterConfig, load_config
from overlay.testing import (
    LOADED_SUSPECT_TIMEOUT,
    QUEUE_SIZE,
    Ledger,
    LoopbackCluster,
    Sub,
    range_subscriptions,
    skewed_price,
    wait_until,
)
from overlay.testing.sim.convergence import SPREAD_TARGET, ConvergenceRun, ConvergenceSim, oscillations
from sim import golden

CONFIGS: Final = Path(__file__).resolve().parent.parent / "cluster_configs"
SEEDS: Final = range(6)
# (config, seeds of virtual time publishing, slices to converge, slices to stay)
SCENARIOS: Final = {
    "local.toml": (10.0, 12, 8),
    "hetero5.toml": (14.0, 20, 5),
}
# Seeds on which, before node.balancing rule 7 (a channel does not go back to
# a node it left lately), a small channel came back to a node it left after
# convergence: a slow cycle 1→3→2→1 (seed 1) and a ping-pong 0→2→0→2 between
# two equal nodes (seed 20), 2 of the first 60 hetero5 seeds.  Kept as
# regression cases.
RETURNED: Final = (("hetero5.toml", 1), ("hetero5.toml", 20))


def _config(name: str) -> ClusterConfig:
    cfg = load_config(CONFIGS / name)
    return msgspec.structs.replace(
        cfg, cluster=msgspec.structs.replace(cfg.cluster, slice_seconds=0.4, probability=1.0)
    )


@functools.cache
def _run(name: str, seed: int) -> ConvergenceRun:
    """One simulated run, shared by the tests that judge it."""
    return ConvergenceSim(_config(name), seed).run(SCENARIOS[name][0])


def _assert_converges(run: ConvergenceRun, within: int, stays: int) -> None:
    ratios = [round(r, 3) for r in run.ratios]
    at = run.converged_at
    assert at is not None, f"S/dc̄ never stayed below {SPREAD_TARGET}: {ratios}\n{run.describe()}"
    assert at <= within, f"converged {at} slices after the load settled: {ratios}\n{run.describe()}"
    assert len(ratios) - at >= stays, f"converged too late to see it stay: {ratios}\n{run.describe()}"
    assert run.migrations, f"no natural migration\n{run.describe()}"
    assert not run.lost, f"{len(run.lost)} deliveries wrong, e.g.:\n" + "\n".join(run.lost[:10])
    assert run.pairs > 1000, run.pairs  # the exactly-once check means something


@pytest.mark.parametrize("seed", SEEDS)
def test_converges_from_the_initializer(seed: int) -> None:
    _, within, stays = SCENARIOS["local.toml"]
    _assert_converges(_run("local.toml", seed), within, stays)


@pytest.mark.parametrize("seed", SEEDS)
def test_heterogeneous_capacities_converge(seed: int) -> None:
    _, within, stays = SCENARIOS["hetero5.toml"]
    run = _run("hetero5.toml", seed)
    _assert_converges(run, within, stays)
    # Levels converge while the loads themselves differ, roughly with capacity.
    assert max(run.loads) >= 2.5 * min(run.loads), run.loads


def _oscillation_cases() -> list[tuple[str, int]]:
    cases = [(name, seed) for name in SCENARIOS for seed in SEEDS]
    return cases + [key for key in RETURNED if key not in cases]


@pytest.mark.parametrize(("name", "seed"), _oscillation_cases())
def test_no_oscillation_after_convergence(name: str, seed: int) -> None:
    run = _run(name, seed)
    at = run.converged_at
    assert at is not None, run.describe()
    bad = oscillations(run.migrations, after=run.series[at][0], nodes=len(run.loads))
    assert not bad, "oscillation: " + "; ".join(bad) + "\n" + run.describe()


@pytest.mark.parametrize(("name", "seed"), [(n, s) for n, seeds in golden.CONVERGENCE.items() for s in seeds])
def test_runs_match_the_recorded_traces(name: str, seed: int) -> None:
    """The node cores decide exactly as when ``sim/golden_traces.json`` was recorded."""
    assert golden.convergence_digest(_run(name, seed)) == golden.expected_convergence(name, seed), _run(
        name, seed
    ).describe()


def test_a_seed_replays_exactly() -> None:
    a = _run("local.toml", 0)
    b = ConvergenceSim(_config("local.toml"), 0).run(SCENARIOS["local.toml"][0])
    assert (a.series, a.migrations, a.loads) == (b.series, b.migrations, b.loads)
    c = ConvergenceSim(_config("local.toml"), 1).run(SCENARIOS["local.toml"][0])
    assert c.series != a.series  # the seed matters


# -- over sockets ---------------------------------------------------------------------------

RATE: Final = 600.0  # events/s in all: the initializer overloads, the test process keeps up
# Bounds on conditions, not expectations: on a quiet machine the first
# migration comes within 2 s.
MOVE_TIMEOUT: Final = 60.0
QUIET_TIMEOUT: Final = 30.0


async def test_balancing_works_over_sockets() -> None:
    """The initializer, holding every channel, splits and migrates on its own;
    another node then reports load of its own; every live subscription gets
    every matching event exactly once.  Balancing quality is judged above, in
    virtual time."""
    # Not about failure detection: a loaded machine must not make the nodes
    # refuse with no_quorum (LOADED_SUSPECT_TIMEOUT says why).
    async with LoopbackCluster(LOCAL, slice_seconds=0.4, probability=1.0, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cl:
        ids = cl.ids
        first = cl.config.cluster.initializer
        led = Ledger()
        subscribers: list[Client] = []
        for k, i in enumerate(ids):
            c = await cl.client(i, client_id=f"sub-{i}")
            led.hook(k, c, i)
            subscribers.append(c)
        live = range_subscriptions(20, seed=7)
        for k, expr in enumerate(live):
            ci = k % len(subscribers)
            s = Sub(ci, f"live{k}", expr, parse_subscription(expr, cl.config.schema), time.time())
            led.subs[(ci, s.sub_id)] = s
            await subscribers[ci].subscribe(expr, sub_id=s.sub_id, queue_size=QUEUE_SIZE)
            s.acked = time.time()
        load = range_subscriptions(240, seed=8, venue="zz")  # tested, never notified
        await asyncio.gather(
            *(subscribers[k % len(ids)].subscribe(e, queue_size=QUEUE_SIZE) for k, e in enumerate(load))
        )

        publishers = [await cl.client(i, client_id=f"pub-{i}") for i in ids]
        stop = asyncio.Event()

        async def publish(k0: int, c: Client) -> None:
            """At RATE / n until ``stop``; qty = k·n + k0 names the event."""
            began, k = time.monotonic(), 0
            while not stop.is_set():
                while k < (time.monotonic() - began) * RATE / len(ids) and not stop.is_set():
                    qty = k * len(ids) + k0
                    ev = {"price": skewed_price(k, offset=k0 / len(ids)), "sym": "A", "qty": qty, "venue": "x"}
                    t = time.time()
                    led.events[qty] = (ev, t, t)
                    await c.publish_windowed(ev)
                    k += 1
                await asyncio.sleep(0.005)
            await c.flush(timeout=QUIET_TIMEOUT)

        def moved_and_loaded() -> bool:
            """A natural migration off the initializer, and a slice after it in
            which another node carried load."""
            moves = [m for m in cl.journal("migration", [first]) if not m["forced"]]
            return bool(moves) and any(
                e["d"] > 0 and e["time"] > moves[0]["time"] for i in ids if i != first for e in cl.journal("slice", [i])
            )

        tasks = [asyncio.create_task(publish(k0, c)) for k0, c in enumerate(publishers)]
        try:
            await wait_until(moved_and_loaded, MOVE_TIMEOUT, "a natural migration, then load on its receiver")
        finally:
            stop.set()
            await asyncio.gather(*tasks)

        due = _due(led)
        with contextlib.suppress(AssertionError):  # a loss is reported below, with the events
            await wait_until(lambda: sum(led.delivered.values()) >= due, QUIET_TIMEOUT, f"{due} notifications")
        await wait_until(cl.settled, QUIET_TIMEOUT, "tables to settle")
        bad, exact, _ = await led.violations_off_loop()
        assert not bad, f"{len(bad)} violations, e.g.:\n" + "\n".join(bad[:20])
        assert exact == due > 100, (exact, due)
        natural = [m for m in cl.journal("migration") if not m["forced"]]
        owners = {o for _, e in cl.nodes[first].core.routing.items() for o in e.owners}
        assert natural and owners - {first}, (natural, owners)
        print(
            f"{len(led.events)} events, {exact} pairs exactly once; {len(natural)} natural migrations; owners {sorted(owners)}"
        )


def _due(led: Ledger) -> int:
    """Notifications the live subscriptions must get (all SubAck'ed before the first publish)."""
    return sum(1 for s in led.subs.values() for ev, _, _ in led.events.values() if s.filter.matches(ev))
