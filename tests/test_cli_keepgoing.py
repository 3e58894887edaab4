"""``overlay cluster up --keep-going`` (and ``overlay demo --keep-going``) as a
user meets it: real ``python -m overlay`` processes whose nodes the test
kills with SIGKILL.

A node's death is reported as without the flag (which node, how it died, its
last lines of log) but the survivors keep running and keep serving: a
subscriber on one survivor gets what is published on another, before and
after the initializer's death, and the demo traffic of ``--traffic`` goes on
(its clients fail over).  Once no node is left the command exits 1 naming
every death in order; Ctrl-C or SIGTERM stops the survivors cleanly (exit 0)
and leaves no process behind.  Without the flag a death stops everything
(``tests/test_cli.py``).  Every wait is on a condition (a line of output, a
notification, a process's end), bounded.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from overlay import cli
from overlay.cli import demo, local_cluster, workload
from overlay.cli.local_cluster import LocalCluster, node_list, stopping_line
from overlay.client import Client
from overlay.config import load_config
from test_cli import PROCESS_WAIT, ROOT, free_port, overlay, write_config

# Three node processes start, a death is declared (about 2 s) and its
# channels rebuilt; on a loaded two-core machine all of it takes a while.
pytestmark = pytest.mark.timeout(120)

# Bounds on one step: a cluster's start, a death's report, a notification
# that has to wait for the recovery of its channel.
STEP_WAIT = 60.0
READY_LINE = re.compile(r"\s+node (\d+) .* pid (\d+)")


class Launched:
    """A command's process, its stdout and stderr read line by line as they
    come (so that a chatty node never blocks on a full pipe)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = asyncio.Condition()
        assert proc.stdout is not None and proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._read(proc.stdout, self.out)),
            asyncio.create_task(self._read(proc.stderr, self.err)),
        ]

    async def _read(self, stream: asyncio.StreamReader, into: list[str]) -> None:
        while line := await stream.readline():
            async with self._changed:
                into.append(line.decode(errors="replace"))
                self._changed.notify_all()
        async with self._changed:
            self._changed.notify_all()

    def text(self) -> str:
        return f"stdout:\n{''.join(self.out)}\nstderr:\n{''.join(self.err)}"

    async def line(self, lines: list[str], pattern: str, start: int = 0) -> re.Match[str]:
        """The first line of ``lines`` from ``start`` on matching ``pattern``,
        once it is there; fails if the process ends first or ``STEP_WAIT`` passes."""

        def found() -> re.Match[str] | None:
            return next((m for line in lines[start:] if (m := re.search(pattern, line))), None)

        async def wait() -> re.Match[str]:
            async with self._changed:
                while (m := found()) is None:
                    if all(r.done() for r in self._readers):
                        raise AssertionError(f"output ended before {pattern!r}:\n{self.text()}")
                    await self._changed.wait()
                return m

        try:
            return await asyncio.wait_for(wait(), STEP_WAIT)
        except TimeoutError:
            raise AssertionError(f"no line matched {pattern!r} in {STEP_WAIT}s:\n{self.text()}") from None

    async def ready(self, nodes: int) -> dict[int, int]:
        """Every node's pid, from the lines ``cluster up`` prints at once when all are ready."""
        await self.line(self.out, rf"^\s+node {nodes - 1} ")
        return {int(m[1]): int(m[2]) for line in self.out if (m := READY_LINE.match(line))}

    async def end(self) -> int:
        """Its exit status, once it has exited and its output is read (bounded)."""
        try:
            code = await asyncio.wait_for(self.proc.wait(), STEP_WAIT)
            await asyncio.wait_for(asyncio.gather(*self._readers), PROCESS_WAIT)
        except TimeoutError:
            raise AssertionError(f"still running after {STEP_WAIT}s:\n{self.text()}") from None
        return code


@asynccontextmanager
async def launched(*argv: str) -> AsyncIterator[Launched]:
    """``overlay *argv`` as a process; SIGINT (then SIGKILL) at the end if it still runs."""
    proc = await asyncio.create_subprocess_exec(
        *overlay(*argv),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    run = Launched(proc)
    try:
        yield run
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), STEP_WAIT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for r in run._readers:
            r.cancel()


def gone(pid: int) -> bool:
    """The process is no more (it ended and was reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def death(node: int, pid: int) -> str:
    """The start of the report of a SIGKILLed node (its port is any)."""
    return rf"^overlay: node {node} \(127\.0\.0\.1:\d+, pid {pid}\) was killed by SIGKILL while the cluster ran; "


async def round_trip(pub: Client, sub_client: Client, price: float) -> None:
    """A subscription on one node gets an event published on another."""
    sub = await asyncio.wait_for(sub_client.subscribe(f"price = {price}"), STEP_WAIT)
    await asyncio.wait_for(pub.publish({"price": price, "sym": "IBM"}), STEP_WAIT)
    note = await asyncio.wait_for(sub.next(), STEP_WAIT)
    assert note.event["price"] == price


async def test_keep_going_reports_a_death_and_the_survivors_go_on_serving(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    cfg = write_config(tmp_path / "c.toml", ports)
    async with launched("--log-level", "info", "cluster", "up", str(cfg), "--keep-going") as run:
        pids = await run.ready(3)
        assert "others keep running (--keep-going)" in run.out[0], run.text()
        # Balancing is off: node 0, the initializer, owns the only channel.
        at = {i: Client([("127.0.0.1", ports[i])], client_id=f"kg-{i}") for i in (1, 2)}
        try:
            for c in at.values():
                await asyncio.wait_for(c.connect(), STEP_WAIT)
            held = await asyncio.wait_for(at[2].subscribe("price < 10"), STEP_WAIT)
            await asyncio.wait_for(at[1].publish({"price": 1.0, "sym": "IBM"}), STEP_WAIT)
            assert (await asyncio.wait_for(held.next(), STEP_WAIT)).event["price"] == 1.0

            os.kill(pids[0], signal.SIGKILL)
            m = await run.line(run.err, death(0, pids[0]) + r"(.*)\. Its last lines:$")
            assert m[1] == "nodes 1 and 2 keep running (--keep-going)", m[0]
            after = run.err[run.err.index(m.string) + 1 :]
            assert after and after[0].startswith("  | "), run.text()
            assert any("node 0: listening on" in line for line in after if line.startswith("  | ")), run.text()

            # The subscription held before the death gets what is published after it ...
            await asyncio.wait_for(at[1].publish({"price": 2.0, "sym": "IBM"}), STEP_WAIT)
            assert (await asyncio.wait_for(held.next(), STEP_WAIT)).event["price"] == 2.0
            # ... and a new one, both ways between the survivors.
            await round_trip(at[1], at[2], 3.0)
            await round_trip(at[2], at[1], 4.0)
        finally:
            for c in at.values():
                await c.close()
        assert run.proc.returncode is None, run.text()
        assert not gone(pids[1]) and not gone(pids[2])

        run.proc.send_signal(signal.SIGINT)
        assert await run.end() == 0, run.text()
    stopping = [line for line in run.out if line.startswith("stopping the cluster")]
    assert (
        stopping
        and f"(died while it ran: node 0 (127.0.0.1:{ports[0]}, pid {pids[0]}) was killed by SIGKILL)" in (stopping[0])
    ), run.text()
    assert "Traceback" not in run.text(), run.text()
    assert all(gone(pid) for pid in pids.values()), pids


async def test_keep_going_exits_1_once_no_node_is_left(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    cfg = write_config(tmp_path / "c.toml", ports)
    async with launched("--log-level", "warning", "cluster", "up", str(cfg), "--keep-going") as run:
        pids = await run.ready(3)
        # One at a time, each death reported before the next: their order is known.
        os.kill(pids[1], signal.SIGKILL)
        m = await run.line(run.err, death(1, pids[1]) + r"(.*)\. Its last lines:$")
        assert m[1] == "nodes 0 and 2 keep running (--keep-going)", m[0]
        os.kill(pids[0], signal.SIGKILL)
        m = await run.line(run.err, death(0, pids[0]) + r"(.*)\. Its last lines:$")
        assert m[1] == (
            "node 2 keeps running (--keep-going), but 1 of 3 configured nodes is no majority: "
            "it refuses publishes and subscriptions (no_quorum) until more are back"
        ), m[0]
        assert run.proc.returncode is None, run.text()
        os.kill(pids[2], signal.SIGKILL)
        assert await run.end() == 1, run.text()
    assert re.search(death(2, pids[2]) + r"no node is left\. Its last lines:$", "".join(run.err), re.M), run.text()
    last = run.err[-1]
    expected = "; ".join(f"node {i} (127.0.0.1:{ports[i]}, pid {pids[i]}) was killed by SIGKILL" for i in (1, 0, 2))
    assert last == f"overlay: no node is left: {expected}\n", run.text()
    assert "Traceback" not in run.text(), run.text()


async def test_keep_going_stops_the_survivor_on_sigterm(tmp_path: Path) -> None:
    """Two nodes: one dies, the other is no majority (said so) and is stopped
    cleanly by SIGTERM, exit 0, nothing left running."""
    cfg = write_config(tmp_path / "c.toml", [free_port(), free_port()])
    async with launched("--log-level", "info", "cluster", "up", str(cfg), "--keep-going") as run:
        pids = await run.ready(2)
        os.kill(pids[1], signal.SIGKILL)
        m = await run.line(run.err, death(1, pids[1]) + r"(.*)\. Its last lines:$")
        assert m[1].startswith("node 0 keeps running (--keep-going), but 1 of 2 configured nodes is no majority"), m[0]
        run.proc.send_signal(signal.SIGTERM)
        assert await run.end() == 0, run.text()
    assert any("node 0: stopped" in line for line in run.err), run.text()  # cleanly, not killed
    assert "Traceback" not in run.text(), run.text()
    assert gone(pids[0]) and gone(pids[1])


async def test_the_traffic_of_cluster_up_goes_on_after_a_death(tmp_path: Path) -> None:
    """``--traffic`` under ``--keep-going``: the workload's clients of the dead
    node (a publisher among them) reconnect to another and go on; the traffic
    ends normally, exit 0 — pinned to their node, the publish in flight would
    have timed out and stopped the traffic (exit 1)."""
    cfg = write_config(tmp_path / "c.toml", [free_port() for _ in range(3)])
    argv = ("--log-level", "warning", "cluster", "up", str(cfg), "--keep-going", "--traffic", "--duration", "14")
    async with launched(*argv) as run:
        pids = await run.ready(3)
        await run.line(run.out, r"^traffic: t=.* published [1-9]")
        os.kill(pids[1], signal.SIGKILL)  # the node of publisher 1 and of 40 subscriptions
        await run.line(run.err, death(1, pids[1]))
        assert await run.end() == 0, run.text()
    assert "the traffic stopped" not in run.text(), run.text()
    assert any(line.startswith("stopping the cluster… (died while it ran: node 1 ") for line in run.out), run.text()
    assert all(gone(pid) for pid in pids.values()), pids


def test_the_workload_fails_over_to_every_other_node(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    cfg = load_config(write_config(tmp_path / "c.toml", ports))
    assert workload.failover_list(cfg, cfg.nodes[1]) == [("127.0.0.1", ports[i]) for i in (1, 0, 2)]


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["cluster", "up", "{cfg}", "--restart"], "unrecognized arguments: --restart"),
        (["cluster", "up", "{cfg}", "--keep-going", "--restart"], "unrecognized arguments: --restart"),
        (["node", "--config", "{cfg}", "--id", "0", "--keep-going"], "unrecognized arguments: --keep-going"),
        (["cluster", "up", "{cfg}", "--keep-going=yes"], "--keep-going: ignored explicit argument 'yes'"),
        (["demo", "{cfg}", "--keep-going", "--restart"], "unrecognized arguments: --restart"),
    ],
)
def test_bad_flags_are_refused_in_one_line(
    argv: list[str], word: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path / "c.toml", [free_port()])
    with pytest.raises(SystemExit) as exit_:
        cli.main([a.replace("{cfg}", str(cfg)) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert len(err.splitlines()) == 1 and word in err, err


def test_demo_passes_keep_going_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``overlay demo --keep-going`` runs the demo's cluster with it (the
    workload it drives is the one ``--traffic`` drives, tested above)."""
    cfg = write_config(tmp_path / "c.toml", [free_port()])
    given: list[bool] = []

    async def fake_demo(
        config_path: str, seconds: float, log_level: str = "warning", *, keep_going: bool = False
    ) -> int:
        given.append(keep_going)
        return 0

    monkeypatch.setattr(demo, "run_demo", fake_demo)
    assert cli.main(["demo", str(cfg)]) == 0
    assert cli.main(["demo", str(cfg), "--keep-going"]) == 0
    assert given == [False, True]


def test_help_says_what_keep_going_does(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["cluster"], ["demo"]):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        out = capsys.readouterr().out
        assert "--keep-going" in out and "no node is left" in " ".join(out.split()), out


def test_the_survivors_and_the_end_are_named(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", [free_port() for _ in range(5)])
    cluster = LocalCluster(str(cfg), keep_going=True)
    assert stopping_line(cluster) == "stopping the cluster…"
    cluster.deaths[3] = "node 3 (127.0.0.1:1, pid 9) was killed by SIGKILL"
    assert cluster._survivors() == "nodes 0, 1, 2 and 4 keep running (--keep-going)"
    cluster.deaths[0] = "node 0 (127.0.0.1:2, pid 8) exited with code 1"
    assert cluster._survivors() == "nodes 1, 2 and 4 keep running (--keep-going)"  # 3 of 5: a majority
    cluster.deaths[4] = "node 4 (127.0.0.1:3, pid 7) was killed by signal 99"
    assert cluster._survivors() == (
        "nodes 1 and 2 keep running (--keep-going), but 2 of 5 configured nodes are no majority: "
        "they refuse publishes and subscriptions (no_quorum) until more are back"
    )
    assert stopping_line(cluster) == (
        "stopping the cluster… (died while it ran: node 3 (127.0.0.1:1, pid 9) was killed by SIGKILL; "
        "node 0 (127.0.0.1:2, pid 8) exited with code 1; node 4 (127.0.0.1:3, pid 7) was killed by signal 99)"
    )
    assert node_list([5]) == "node 5"
    assert local_cluster._exit_status(-9) == "was killed by SIGKILL"
