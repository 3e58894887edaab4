"""overlay.client.agent: the routing agent's pure core (SPEC §12), no loop, no sockets.

RLS over a sliding window (exact on linear data; after downdates equal to a
batch least-squares fit of the window), the prediction's bounds, Choke fed in
as a latency, the ``mean + 3σ`` timeout and recovery after a failure; and the
``[agent]`` settings of the cluster TOML.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from overlay.client import AgentSettings, load_agent_settings
from overlay.client.agent import _P0, FAILURE_FACTOR, RlsEstimator, RoutingAgent
from overlay.errors import ConfigError


def batch_fit(samples: list[tuple[float, float]], ridge: float = 0.0) -> tuple[float, float]:
    """Least squares of m = x1·t + x0 by the normal equations, (AᵀA + ridge·I) x = Aᵀb.

    ``ridge = 1/P0`` is exactly what RLS started from ``P = P0·I, x = 0`` solves.
    """
    n = len(samples) + ridge
    st = sum(t for t, _ in samples)
    stt = sum(t * t for t, _ in samples) + ridge
    sm = sum(m for _, m in samples)
    stm = sum(t * m for t, m in samples)
    det = n * stt - st * st
    x1 = (n * stm - st * sm) / det
    x0 = (stt * sm - st * stm) / det
    return x1, x0


# -- RlsEstimator -----------------------------------------------------------------------


# Latencies of milliseconds drifting by milliseconds per second: the scale the
# agent sees.  The P = 10⁶·I prior biases x by about 10⁻⁶·|x| / λmin(AᵀA): well
# under a microsecond here, hence abs=1e-6 s against the plain line.
def line(t: float) -> float:
    return 0.002 * t + 0.001


def test_exact_fit_on_linear_data() -> None:
    est = RlsEstimator(window=8)
    for i in range(8):
        t = 100.0 + 0.5 * i
        est.add(t, line(t))
    # Times are relative to the first sample (rule 1): x0 is the value there.
    x1, x0 = est._x
    assert x1 == pytest.approx(0.002, abs=1e-6)
    assert x0 == pytest.approx(line(100.0), abs=1e-6)
    # Inside the window's range the prediction is the line itself.
    assert est.predict(101.25) == pytest.approx(line(101.25), abs=1e-6)
    # And exactly the ridge solution the prior implies.
    assert (x1, x0) == pytest.approx(batch_fit(list(est._window), 1 / _P0), rel=1e-9)


def test_exact_fit_survives_the_window_sliding() -> None:
    est = RlsEstimator(window=4)
    for i in range(50):
        t = 0.1 * i
        est.add(t, line(t))
    assert len(est) == 4
    assert est._x[0] == pytest.approx(0.002, abs=1e-6)
    assert est.predict(4.85) == pytest.approx(line(4.85), abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_window_downdate_equals_batch_least_squares(seed: int) -> None:
    rng = random.Random(seed)
    window = 8
    est = RlsEstimator(window=window)
    t = 0.0
    for _ in range(60):
        t += rng.uniform(0.001, 0.05)
        est.add(t, rng.uniform(0.0005, 0.02))
    assert len(est) == window
    # 60 updates and 52 downdates leave exactly the fit of the last 8 samples
    # (with the prior's ridge term; up to rounding).
    x1, x0 = batch_fit(list(est._window), 1 / _P0)
    assert est._x[0] == pytest.approx(x1, rel=1e-7)
    assert est._x[1] == pytest.approx(x0, rel=1e-7)
    # ... and, within the prior's bias, the plain least-squares fit.
    _, p0 = batch_fit(list(est._window))
    assert est._x[1] == pytest.approx(p0, abs=1e-4)


def test_prediction_stays_within_the_window_range() -> None:
    est = RlsEstimator(window=4)
    for t, m in [(0.0, 0.001), (0.001, 0.001), (0.002, 0.001), (0.003, 0.010)]:
        est.add(t, m)
    # The fitted slope is steep; an hour later it must not predict hours of latency.
    assert est.predict(3600.0) == pytest.approx(0.010)
    assert est.predict(-3600.0) == pytest.approx(0.001)


def test_few_samples_predict_their_mean() -> None:
    est = RlsEstimator(window=4)
    assert est.predict(1.0) == 0.0
    est.add(1.0, 0.02)
    assert est.predict(50.0) == pytest.approx(0.02)
    assert est.mean_std() == (pytest.approx(0.02), 0.0)


def test_window_needs_two_samples() -> None:
    with pytest.raises(ValueError):
        RlsEstimator(window=1)


# -- RoutingAgent -----------------------------------------------------------------------


def test_untried_nodes_first_then_the_cheapest() -> None:
    agent = RoutingAgent(["a", "b", "c"], window=4)
    agent.on_ack("a", 0.010, 1.0)
    agent.on_ack("b", 0.002, 1.0)
    assert agent.choose(1.1) == "c"  # no samples: cost 0, tried first
    agent.on_ack("c", 0.005, 1.1)
    assert agent.choose(1.2) == "b"
    assert agent.choose(1.2, exclude={"b"}) == "c"
    assert agent.choose(1.2, exclude={"a", "b", "c"}) == "b"  # nothing left: all again


def test_choke_is_fed_as_a_latency_and_moves_traffic() -> None:
    agent = RoutingAgent(["a", "b"], window=4)
    for i in range(4):
        agent.on_ack("a", 0.001, i * 0.01)
        agent.on_ack("b", 0.002, i * 0.01)
    assert agent.choose(0.05) == "a"
    agent.on_choke("a", 0.050, 0.05)
    assert len(agent.estimators["a"]) == 4  # the window slid
    assert agent.cost("a", 0.06) > agent.cost("b", 0.06)
    assert agent.choose(0.06) == "b"


def test_timeout_is_mean_plus_three_sigma_bounded() -> None:
    agent = RoutingAgent(["a"], window=8, min_timeout=0.05, max_timeout=2.0)
    assert agent.timeout("a") == 2.0  # fewer than 3 samples: the ceiling
    for i, m in enumerate([0.1, 0.2, 0.3, 0.2]):
        agent.on_ack("a", m, float(i))
    mean, std = 0.2, math.sqrt(0.005)
    assert agent.timeout("a") == pytest.approx(mean + 3 * std)
    fast = RoutingAgent(["b"], min_timeout=0.05)
    for i in range(5):
        fast.on_ack("b", 0.0001, float(i))
    assert fast.timeout("b") == 0.05  # the floor
    slow = RoutingAgent(["c"], max_timeout=1.0)
    for i in range(5):
        slow.on_ack("c", 3.0 * (i % 2), float(i))
    assert slow.timeout("c") == 1.0  # the ceiling


def test_failure_avoids_the_node_until_it_recovers() -> None:
    agent = RoutingAgent(["a", "b"], window=4, min_timeout=0.05)
    for i in range(4):
        agent.on_ack("a", 0.001, i * 0.1)
        agent.on_ack("b", 0.003, i * 0.1)
    timeout = agent.timeout("a")
    agent.on_timeout("a", 0.5)
    assert agent.failures["a"] == 1
    assert max(m for _, m in agent.estimators["a"]._window) == pytest.approx(FAILURE_FACTOR * timeout)
    assert agent.choose(0.6) == "b"
    # Good samples (e.g. probes) slide the failure out of the window.
    for i in range(4):
        agent.on_ack("a", 0.001, 0.6 + i * 0.1)
    assert agent.choose(1.1) == "a"


def test_agent_needs_a_node() -> None:
    with pytest.raises(ValueError):
        RoutingAgent([])


# -- settings ---------------------------------------------------------------------------


def test_agent_settings_from_the_cluster_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[cluster]\nname = "x"\n\n[agent]\nwindow = 32\nmin_timeout = 0.1\nredundancy = 3\n')
    s = load_agent_settings(cfg)
    assert (s.window, s.min_timeout, s.max_timeout, s.redundancy) == (32, 0.1, 5.0, 3)
    (tmp_path / "none.toml").write_text('[cluster]\nname = "x"\n')
    assert load_agent_settings(tmp_path / "none.toml") == AgentSettings()


@pytest.mark.parametrize("bad", ["window = 1", "min_timeout = 0", "redundancy = 0", "colour = 3"])
def test_bad_agent_settings_name_the_key(tmp_path: Path, bad: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[agent]\n{bad}\n")
    with pytest.raises(ConfigError, match=r"\[agent\]"):
        load_agent_settings(cfg)
