"""The replay's loads tables (``overlay_spark.loads``) over gathered rows, without Spark."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

pytest.importorskip("pyspark")

from overlay_spark import loads
from overlay_spark.records import NodeInfo

T0 = 1000.0
NODES = [NodeInfo(0, 1.0), NodeInfo(1, 2.0), NodeInfo(2, 1.0)]


def _slice(node: int, k: int, d: float | None, channels: dict[str, float]) -> dict[str, Any]:
    return {"node": node, "slice": k, "time": T0 + 2.0 * k, "slice_seconds": 2.0, "d": d, "channels": channels}


def _ev(node: int, k: int, channel: str, w: int, tested: int | None, events: int = 1) -> dict[str, Any]:
    return {"node": node, "slice": k, "channel": channel, "w": w, "tested": tested, "events": events}


def _inputs(**journal: list[dict[str, Any]]) -> loads.LoadInputs:
    return loads.LoadInputs(NODES, T0, 2.0, 0, journal=journal)


def test_slice_table_spread_per_slice_over_the_nodes_that_reported() -> None:
    inp = _inputs(
        slice=[
            _slice(0, 1, 60.0, {}),
            _slice(1, 1, 0.0, {}),
            _slice(2, 1, 0.0, {}),
            _slice(0, 2, 20.0, {}),
            _slice(1, 2, 40.0, {}),
            _slice(9, 2, 99.0, {}),  # a node the header does not list
        ]
    )
    s1, s2 = loads.slice_table(inp)
    assert (s1["slice"], s1["nodes"], s1["complete"]) == (1, 3, True)
    assert s1["mean_dc"] == pytest.approx(20.0)
    assert s1["S"] == pytest.approx(math.sqrt(800.0))
    assert s1["S_over_mean"] == pytest.approx(math.sqrt(800.0) / 20.0)
    assert (s2["nodes"], s2["complete"], s2["d_2"], s2["dc_2"]) == (2, False, None, None)
    assert (s2["d_1"], s2["dc_1"]) == (40.0, 20.0)
    assert s2["S"] == pytest.approx(0.0) and s2["total_d"] == 60.0
    assert (s2["t_start"], s2["t_end"], s2["t"]) == (T0 + 2.0, T0 + 4.0, 4.0)


def test_stddev_is_the_population_deviation_and_skips_nulls() -> None:
    xs = [3.5, 1e6, -2.0, 7.25, 0.0]
    assert loads._stddev_pop([*xs, None]) == pytest.approx(statistics.pstdev(xs))
    assert loads._stddev_pop([None]) is None and loads._avg([]) is None


def test_window_table_zero_fills_and_charges_the_counterfactual_to_the_initializer() -> None:
    inp = _inputs()
    inp.events = [_ev(1, 0, "0.2", 0, 30), _ev(1, 0, "0.3", 0, 10, 2), _ev(2, 1, "0.4", 2, 20)]
    per_w, per_node = loads.window_table(inp)
    assert [(r["scenario"], r["w"]) for r in per_w] == [(s, w) for s in ("actual", "counterfactual") for w in (0, 1, 2)]
    actual0 = per_w[0]
    assert (actual0["total_d"], actual0["events"]) == (40.0, 3)
    assert actual0["mean_dc"] == pytest.approx((0.0 + 20.0 + 0.0) / 3)
    assert per_w[1]["events"] == 0 and per_w[1]["S_over_mean"] is None  # a window with no event
    cf0 = per_w[3]
    assert cf0["S_over_mean"] == pytest.approx(math.sqrt(2))  # all on node 0: (D, 0, 0)
    assert [(r["w"], r["node"], r["d"]) for r in per_node[:3]] == [(0, 0, 0.0), (0, 1, 40.0), (0, 2, 0.0)]
    assert per_node[-1] == {"w": 2, "node": 2, "capacity": 1.0, "d": 20.0, "events": 1, "dc": 20.0, "t": 6.0}


def test_migration_table_takes_the_complete_slices_around_each_session() -> None:
    slices = [
        {"slice": 1, "complete": True, "t_start": T0, "t_end": T0 + 2, "S": 5.0, "S_over_mean": 0.5},
        {"slice": 2, "complete": False, "t_start": T0 + 2, "t_end": T0 + 4, "S": 9.0, "S_over_mean": 0.9},
        {"slice": 3, "complete": True, "t_start": T0 + 4, "t_end": T0 + 6, "S": 1.0, "S_over_mean": 0.1},
    ]
    mig = {
        "node": 0,
        "time": T0 + 2.6,
        "slice": 1,
        "session": 1,
        "receiver": 1,
        "channels": ["0.2", "0.3"],
        "subscriptions": 30,
        "bytes": 100,
        "bw": 200.0,
        "mig_cost": 0.15,
        "forced": False,
        "duration": 0.5,
    }
    (m,) = loads.migration_table(_inputs(migration=[mig]), slices)
    assert (m["kind"], m["sender"], m["channels"]) == ("migration", 0, "0.2 0.3")
    assert m["t_start"] == pytest.approx(2.1) and m["t_done"] == pytest.approx(2.6)
    assert (m["slice_before"], m["ratio_before"], m["slice_after"], m["ratio_after"]) == (1, 0.5, 3, 0.1)


def test_slice_cost_check_flags_a_mismatch_except_in_a_changed_or_the_last_slice() -> None:
    inp = _inputs(
        slice=[
            _slice(0, 1, 30.0, {"0.0": 30.0}),
            _slice(0, 2, 25.0, {"0.0": 20.0, "0.1": 5.0}),  # 0.1 reported 5, events say 7
            _slice(0, 3, 10.0, {"0.0": 10.0}),  # a split in this slice: not compared
            _slice(0, 4, 1.0, {"0.0": 1.0}),
        ],
        split=[{"node": 0, "slice": 2}],
    )
    inp.events = [
        _ev(0, 0, "0.0", 0, 30),
        _ev(0, 1, "0.0", 1, 20),
        _ev(0, 1, "0.1", 1, 7),
        _ev(0, 2, "0.0", 2, 4),
        _ev(0, 4, "0.0", 5, 50),  # reported by slice 5, which never closed
    ]
    per_slice, (total,) = loads.slice_cost_check(inp)
    assert [(r["slice"], r["mismatched_channels"], r["changed"]) for r in per_slice] == [
        (1, 0, False),
        (2, 1, False),
        (3, 1, True),
        (4, 1, False),
    ]
    assert (per_slice[1]["reported_d"], per_slice[1]["recomputed_d"], per_slice[1]["slice_d"]) == (25.0, 27.0, 25.0)
    assert total == {
        "node": 0,
        "slices": 4,
        "reported_d": 66.0,
        "recomputed_d": 61.0,
        "changed_slices": 1,
        "bad_slices": 2,
    }
