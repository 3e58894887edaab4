"""``overlay replay --master spark://…`` on a real Spark standalone cluster
(issue 19 item 4): a master and a worker on loopback
(``overlay_spark.standalone``), executors with Spark's default memory, the
replay of a synthetic capture (``spark/gen_capture.py``) run as the command
a user types — and its report equals the one ``local[2]`` writes.

Both replays are subprocesses: a Python process holds one SparkContext, and
the other replay tests keep theirs (local) for the whole session.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from overlay_spark.standalone import StandaloneCluster

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)  # three JVMs and two replays on a busy 2-core machine

# Every table of the report (report.md itself names the master and the elapsed time).
TABLES = (
    "slices.csv",
    "windows.csv",
    "node_loads.csv",
    "migrations.csv",
    "costs.csv",
    "slice_costs.csv",
    "validations.csv",
    "headline.csv",
)


def _gen_capture(run: Path) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("gen_capture", ROOT / "spark" / "gen_capture.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    cfg = str(ROOT / "cluster_configs" / "hetero5.toml")
    res: dict[str, Any] = gen.generate(run, cfg, 6_000, 40.0, 120, True, 7)
    return res


# A small capture: JVMs that start fast (JIT at C1) and few tasks per stage.
QUICK = ["--partitions", "2", "--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1"]


def _replay(run: Path, out: Path, master: str, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, "-m", "overlay", "replay", str(run), "--master", master, "--out", str(out), *QUICK]
    return subprocess.Popen(
        [*cmd, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )


def _finish(proc: subprocess.Popen[str], what: str) -> None:
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the {what} replay did not finish in 240 s:\n{out[-3000:]}")
    assert proc.returncode == 0, f"the {what} replay exited {proc.returncode}:\n{out[-3000:]}"
    print(f"--- {what} replay\n{out}")


def _cell(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def _table(path: Path) -> list[list[Any]]:
    with open(path, newline="") as f:
        return [[_cell(c) for c in row] for row in csv.reader(f)]


def test_replay_on_a_standalone_cluster_equals_the_local_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    info = _gen_capture(run)
    assert info["deliveries"] > 0
    local = _replay(run, tmp_path / "local", "local[2]")
    try:
        with StandaloneCluster(tmp_path / "spark") as cluster:
            assert cluster.url.startswith("spark://127.0.0.1:")
            remote = _replay(
                run,
                tmp_path / "cluster",
                cluster.url,
                "--conf",
                "spark.driver.host=127.0.0.1",
                "--conf",
                "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1",
            )
            try:
                _finish(remote, "standalone-cluster")
            finally:
                if remote.poll() is None:
                    remote.kill()
                    remote.wait()
            # The job ran on the cluster's executor, not in the driver.
            apps = list((tmp_path / "spark" / "worker").glob("app-*/*/stderr"))
            assert apps, "no executor ran on the worker"
        _finish(local, "local")
    finally:
        if local.poll() is None:
            local.kill()
            local.wait()
    for name in TABLES:
        got, want = _table(tmp_path / "cluster" / name), _table(tmp_path / "local" / name)
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            assert len(g) == len(w) and all(_same(x, y) for x, y in zip(g, w)), (name, g, w)
    report = (tmp_path / "cluster" / "report.md").read_text()
    assert "all validations passed" in report and "spark://127.0.0.1:" in report
