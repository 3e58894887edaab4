"""``bench/subscriptions.py`` measures what it says (issue 18 item 4): its
workload is what its docstring promises, and a small run on five real node
processes loads, balances and probes correctly.  Its timing is not tested
here (it belongs to the bench, on a quiet machine)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Final

import pytest

from overlay.channels import parse_expression, parse_subscription
from overlay.config import load_config

ROOT: Final = Path(__file__).resolve().parent.parent
BENCH: Final = ROOT / "bench" / "subscriptions.py"


def _bench() -> ModuleType:
    # bench/ is not a package: its modules import each other by bare name.
    if str(BENCH.parent) not in sys.path:
        sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_subscriptions", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


sb = _bench()
wl = importlib.import_module("subscriptions_workload")  # its workload (bench/subscriptions.py rule 3)


def _schema(tmp_path: Path):  # type: ignore[no-untyped-def]
    addresses = [("127.0.0.1", 17000 + n) for n in range(sb.NODES)]
    return load_config(sb.bench_config(tmp_path / "c.toml", addresses, [0] * sb.NODES)).schema


def test_loaded_subscriptions_have_2_to_20_predicates_and_lie_in_their_band(tmp_path: Path) -> None:
    schema = _schema(tmp_path)
    rng = random.Random(3)
    counts = set()
    for k in range(2000):
        band = k % sb.NODES
        expr = parse_expression(wl.subscription(rng, band), schema)  # the node refuses none of them
        assert len(expr.conjuncts) == 1
        preds = expr.conjuncts[0].predicates
        counts.add(len(preds))
        assert 2 <= len(preds) <= wl.MAX_PREDICATES
        assert len({p.attr for p in preds}) == len(preds)  # one per attribute, as research filters
        (price,) = [p for p in preds if p.attr == "price"]
        lo, hi = price.args
        assert band * wl.BAND < lo <= hi <= (band + 1) * wl.BAND  # inside its channel alone
        assert "id" not in {p.attr for p in preds}  # the probes' attribute
    assert counts == set(range(2, wl.MAX_PREDICATES + 1))


def test_a_probe_subscription_matches_its_own_event_and_no_other_probes(tmp_path: Path) -> None:
    schema = _schema(tmp_path)
    rng = random.Random(4)
    events = [wl.event(rng, wl.PROBE_ID + i) for i in range(300)]
    for i, ev in enumerate(events):
        f = parse_subscription(wl.probe_subscription(rng, ev), schema)
        assert 3 <= len(f.predicates) <= wl.MAX_PREDICATES
        assert f.matches(ev)
        assert not any(f.matches(other) for other in events[i + 1 : i + 20])


@pytest.mark.timeout(300)
def test_a_small_run_loads_balances_probes_and_churns(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(BENCH), "--subs", "1500", "--probes", "10", "--rate", "50", "--churn", "2"]
    cmd += ["--json", str(out)]
    cmd += ["--logs", str(tmp_path / "logs"), "--load-timeout", "200"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["acked"] == 1500 and res["refused"] == 0, res
    assert res["held"] == [300] * sb.NODES  # balanced: a fifth of the space, a fifth of the load each
    assert res["probes"] == 10 and len(res["suback"]) == 10 and res["not_live"] == 0, res["probe_errors"]
    assert len(res["delivery"]) == 10
    assert all(r > 0 for r in res["rss_after"]) and len(res["cpu_load"]) == sb.NODES
    assert not res["notes"], res["notes"]
    # Rule 6: everything dropped and subscribed again, twice; the same held after each round.
    assert res["churn_held"] == [[300] * sb.NODES] * 2 and len(res["churn_rss"]) == 2
    for text in ("subscriptions/s", "memory/sub", "SubAck p99", "≤ 1000 ms", "200 policies per topic", "churn 2"):
        assert text in run.stdout, run.stdout
