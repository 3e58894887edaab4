"""overlay.cli as a user meets it: real ``python -m overlay`` processes.

Bad arguments of every subcommand (exit 2, one line, no traceback); Ctrl-C
and SIGTERM ending ``overlay sub`` with 130 and 143, against no cluster and
against a node that goes away (the 2 s it takes is measured by
``bench/cli_signals.py``: timing is no pass/fail matter); ``cluster up`` refusing taken ports, naming
their holder, refusing a node of another cluster, and reporting a node that
dies at start-up or later; the demo's lines in 100 columns; ``--version``
and the examples of every ``--help``.  Every wait is on a condition (a line
of output, a process's end), bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest

from loopback import listening_socket
from overlay import cli
from overlay.cli import demo, local_cluster, status, workload
from overlay.client import Notification
from overlay.config import load_config
from overlay.net.node import Node
from overlay.testing import LOOPBACK_SECRET

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / "cluster_configs" / "local.toml"
# Bounds on waiting for a subprocess (start-up imports take ~0.3 s here).
PROCESS_WAIT = 20.0


def overlay(*argv: str) -> list[str]:
    return [sys.executable, "-m", "overlay", *argv]


def run(*argv: str, timeout: float = PROCESS_WAIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        overlay(*argv), capture_output=True, text=True, timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL
    )


def free_port() -> int:
    """A port free right now (the OS picked it); a test binds it soon after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Plain TCP between these tests' nodes and commands (tests/test_tls.py runs the CLI over TLS).
INSECURE_TLS = f'[tls]\ninsecure = true\nsecret = "{LOOPBACK_SECRET}"\n\n'


def config_text(ports: list[int], *, name: str = "clitest", extra: str = "", tls: str = INSECURE_TLS) -> str:
    """local.toml's cluster and schema with ``len(ports)`` nodes on these ports
    (admin ports 0: ephemeral), no balancing, and ``tls`` (plain TCP)."""
    base = LOCAL.read_text()
    head = base[: base.index("[[nodes]]")].replace('name = "local"', f'name = "{name}"')
    schema = base[base.index("[bandwidth]") :]
    nodes = "".join(
        f'[[nodes]]\nid = {i}\nhost = "127.0.0.1"\nport = {p}\nadmin_port = 0\n\n' for i, p in enumerate(ports)
    )
    return head.replace("[cluster]\n", f"[cluster]\nbalancing = false\n{extra}") + nodes + tls + schema


def write_config(path: Path, ports: list[int], **kw: str) -> Path:
    path.write_text(config_text(ports, **kw))
    return path


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    err = proc.stderr
    assert "Traceback" not in err, err
    assert proc.returncode == code, (proc.returncode, err)
    assert len(err.splitlines()) == 1, err
    return err


# -- 3. bad arguments of every subcommand -----------------------------------------------


BAD_CONFIGS = {
    "bad.toml": ("[bandwidth]", "[bandwith]"),
    "typo.toml": ("slice_seconds", "slice_secnds"),
    "clash.toml": ("port = 7101", "port = 7100"),
    "admin_clash.toml": ("admin_port = 8102", "admin_port = 7100"),
    "inf.toml": ("probability = 0.5", "probability = 0.5\npeer_timeout = inf"),
    "nan.toml": ("slice_seconds = 2.0", "slice_seconds = nan"),
    "huge.toml": ("capacity = 1.0", "capacity = 1e308"),
}


def write_bad_configs(tmp: Path) -> None:
    """local.toml with one mistake each (``BAD_CONFIGS``: file -> (text, replacement))."""
    for name, (old, new) in BAD_CONFIGS.items():
        text = LOCAL.read_text()
        assert old in text
        (tmp / name).write_text(text.replace(old, new, 1))


def bad_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """id -> (argv, a word the one error line must hold); configs from ``write_bad_configs``."""
    cfg = str(LOCAL)
    bad_toml, typo, clash, admin_clash, inf, nan, huge = (tmp / name for name in BAD_CONFIGS)
    event = '{price: 1, sym: "A"}'
    split_sym = ["channel", "split", "0.0", "--config", cfg, "--attr", "sym", "--values"]
    return {
        "node-unknown-id": (["node", "--config", cfg, "--id", "9"], "does not exist"),
        "node-no-config": (["node", "--config", str(tmp / "missing.toml"), "--id", "0"], "does not exist"),
        "node-join-no-id": (["node", "join", "--config", cfg], "--id"),
        "node-drain-unknown": (["node", "drain", "9", "--config", cfg], "does not exist"),
        "node-drain-timeout-nan": (["node", "drain", "1", "--config", cfg, "--timeout", "nan"], "finite"),
        "cluster-up-missing": (["cluster", "up", str(tmp / "missing.toml")], "does not exist"),
        "cluster-up-duration": (["cluster", "up", cfg, "--duration", "-1"], "positive"),
        "cluster-up-clash": (["cluster", "up", str(clash)], "7100"),
        "cluster-up-admin-clash": (["cluster", "up", str(admin_clash)], "admin_port"),
        "pub-unknown-node": (["pub", "--config", cfg, "--node", "9", event], "0, 1, 2"),
        "pub-bad-event": (["pub", "--config", cfg, "{price: abc}"], "position"),
        "pub-rank-without-key": (["pub", "--config", cfg, "--rank", "2", event], "--key"),
        "pub-empty-key": (["pub", "--config", cfg, "--key", "", event], "must not be empty"),  # was: unordered
        "sub-empty-group": (["sub", "--config", cfg, "price < 1", "--group", ""], "blank"),  # was: no group
        "sub-blank-group": (["sub", "--config", cfg, "price < 1", "--group", " "], "blank"),  # was: the node's exit 1
        "sub-count-zero": (["sub", "--config", cfg, "price < 1", "--count", "0"], "--count"),
        "sub-count-negative": (["sub", "--config", cfg, "price < 1", "--count", "-3"], "--count"),
        "sub-seconds-negative": (["sub", "--config", cfg, "price < 1", "--seconds", "-1"], "--seconds"),
        "sub-weight-inf": (["sub", "--config", cfg, "price < 1", "--weight", "inf"], "finite"),
        "sub-bad-expression": (["sub", "--config", cfg, "pric < 1"], "pric"),
        "sub-unknown-table": (["sub", "--config", str(bad_toml), "price < 1"], "did you mean 'bandwidth'"),
        "status-key-typo": (["status", "--config", str(typo)], "did you mean 'slice_seconds'"),
        "status-inf": (["status", "--config", str(inf)], "peer_timeout"),
        "status-nan": (["status", "--config", str(nan)], "slice_seconds"),
        "status-huge": (["status", "--config", str(huge)], "capacity"),
        "split-at-abc": (["channel", "split", "0.0", "--config", cfg, "--attr", "price", "--at", "abc"], "abc"),
        "split-at-nan": (["channel", "split", "0.0", "--config", cfg, "--attr", "price", "--at", "nan"], "finite"),
        "split-no-at": (["channel", "split", "0.0", "--config", cfg, "--attr", "price"], "--at"),
        "split-no-attr": (["channel", "split", "0.0", "--config", cfg, "--at", "5"], "--attr"),
        "split-no-values": (["channel", "split", "0.0", "--config", cfg, "--attr", "sym"], "--values"),
        # Each value checked here, as the node would (its refusal was exit 1).
        "split-values-long": ([*split_sym, "IBM,TOOLONGSYM"], "--values 'TOOLONGSYM'"),
        "split-values-empty": ([*split_sym, "IBM,,X"], "--values ''"),
        "split-values-many": ([*split_sym, ",".join(f"S{i}" for i in range(1100))], "at most 1024"),
        "place-unknown-node": (["channel", "place", "0.0", "--config", cfg, "--node", "9"], "0, 1, 2"),
        "place-bad-channel": (["channel", "place", "zero", "--config", cfg, "--node", "1"], "NODE.SEQ"),
        "demo-seconds-nan": (["demo", cfg, "--seconds", "nan"], "finite"),
        "demo-bad-config": (["demo", str(typo)], "slice_secnds"),
        "replay-missing": (["replay", str(tmp / "no-run")], "does not exist"),
        "replay-tail-guard": (["replay", str(tmp), "--tail-guard", "-1"], "negative"),
        "replay-conf-no-equals": (["replay", str(tmp), "--conf", "spark.executor.memory"], "KEY=VALUE"),
        "replay-conf-not-spark": (["replay", str(tmp), "--conf", "executor.memory=2g"], "start with 'spark.'"),
        "replay-conf-no-value": (["replay", str(tmp), "--conf", "spark.executor.memory="], "no value"),
        "replay-conf-no-key": (["replay", str(tmp), "--conf", "=2g"], "no key"),
        "no-command": ([], "COMMAND"),
        "log-level": (["--log-level", "loud", "status", "--config", cfg], "log-level"),
    }


# One case of each subcommand runs as a real process (what a user sees, from
# the interpreter's start to its exit); the others in this process, faster.
AS_PROCESS = (
    "node-unknown-id",
    "node-join-no-id",
    "node-drain-unknown",
    "cluster-up-clash",
    "pub-bad-event",
    "sub-count-negative",
    "status-inf",
    "split-at-abc",
    "place-unknown-node",
    "demo-seconds-nan",
    "replay-missing",
)
IN_PROCESS = [case for case in bad_cases(Path("/unused")) if case not in AS_PROCESS]


@pytest.fixture(scope="module")
def bad_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bad")
    write_bad_configs(tmp)
    return tmp


@pytest.fixture(scope="module")
def process_runs(bad_tmp: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """The ``AS_PROCESS`` cases at once (each is an interpreter start; two cores).

    Eleven interpreter starts take a few seconds on a quiet machine and many
    more on a busy one; each is bounded by its own ``PROCESS_WAIT``, so the
    tests using this fixture time their own body only (``FUNC_ONLY``): the
    first of them no longer pays for every start within its 30 s."""
    cases = bad_cases(bad_tmp)
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(AS_PROCESS, pool.map(lambda case: run(*cases[case][0]), AS_PROCESS)))


# pytest-timeout bounds these tests' bodies; the fixture's processes bound themselves.
FUNC_ONLY = pytest.mark.timeout(30, func_only=True)


@FUNC_ONLY
@pytest.mark.parametrize("case", AS_PROCESS)
def test_every_subcommand_refuses_bad_arguments_in_one_line(
    case: str, bad_tmp: Path, process_runs: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    err = assert_one_line_error(process_runs[case])
    assert bad_cases(bad_tmp)[case][1] in err, err


@pytest.mark.parametrize("case", IN_PROCESS)
def test_bad_arguments_and_configs_are_refused_in_one_line(
    case: str, bad_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, word = bad_cases(bad_tmp)[case]
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and word in err, err


@FUNC_ONLY
def test_replay_of_a_missing_directory_creates_nothing(
    bad_tmp: Path, process_runs: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    assert process_runs["replay-missing"].returncode == 2
    assert not (bad_tmp / "no-run").exists()


@pytest.mark.parametrize(
    "error", [RuntimeError("boom\nsecond line"), ExceptionGroup("in a TaskGroup", [RuntimeError("boom")])]
)
def test_an_unexpected_exception_is_one_line_unless_debug(
    error: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(args: object) -> int:
        raise error

    monkeypatch.setattr(status, "cmd_status", boom)
    assert cli.main(["status", "--config", str(LOCAL)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("overlay: internal error: RuntimeError: boom") and len(err.splitlines()) == 1, err
    with pytest.raises(type(error)):
        cli.main(["--log-level", "debug", "status", "--config", str(LOCAL)])


# -- 4. --version and examples -----------------------------------------------------------


def test_version_comes_from_the_package_metadata() -> None:
    import importlib.metadata

    from overlay.build import BUILD

    proc = run("--version")
    # With the build it runs (compiled or pure Python: overlay.build rule 3).
    assert proc.returncode == 0 and proc.stdout.strip() == f"overlay {importlib.metadata.version('overlay')} ({BUILD})"


SUBCOMMANDS = ["node", "cluster", "pub", "sub", "status", "channel", "token", "demo", "replay"]


@pytest.mark.parametrize("command", [[], *([c] for c in SUBCOMMANDS)], ids=["overlay", *SUBCOMMANDS])
def test_every_help_shows_an_example(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "examples:\n  overlay " in out, out
    if command in ([], ["sub"], ["pub"]):
        assert "130" in out and "143" in out  # the exit codes of a signalled command


def _status(node: int, state: str, dc: float, channels: int, moves: int = 0) -> dict[str, object]:
    return {"node": node, "state": state, "dc": dc, "channels": [{}] * channels, "stats": {"migrations": moves}}


@pytest.mark.parametrize("nodes", [3, 5])
def test_demo_lines_fit_in_100_columns(nodes: int) -> None:
    states = ["OVERLOADED", "STABLE", "UNDERLOADED", "BUSY", "STABLE"]
    worst = [_status(i, states[i], 987_654_321.0 * (i + 1), 99, 999) for i in range(nodes)]
    worst[1] = None  # a node that does not answer
    lines = [
        demo.LEGEND,
        demo._line(9999.0, 9.9e9, 9.9e9, worst),
        demo._line(1.0, 0.0, 0.0, [_status(i, "STABLE", 0.0, 1) for i in range(nodes)]),
        demo._line(12.0, 1234.0, 56789.0, [_status(i, "STABLE", 100.0 * (i + 1), 2, 1) for i in range(nodes)]),
    ]
    for line in lines:
        assert demo._columns(line) <= demo.LINE_WIDTH, line
    assert "per-subscription deliveries" in demo.LEGEND
    assert "S/dc̄" in lines[3] and f"moves {nodes}" in lines[3]
    assert " down" in lines[1]


async def test_demo_counts_per_subscription_deliveries() -> None:
    """Each subscription hands over its own copy of a notification listing
    three subscriptions: the demo counts one delivery per copy taken."""
    note = Notification("e1", {"price": 1.0}, ("s1", "s2", "s3"))

    class Sub:
        def __aiter__(self):
            return self

        async def __anext__(self):
            if self.left:
                self.left -= 1
                return note
            raise StopAsyncIteration

    counter = [0]
    for _ in note.sub_ids:
        s = Sub()
        s.left = 1
        await workload._consumer(s, counter)  # type: ignore[arg-type]
    assert counter == [3]


def test_tail_keeps_the_last_lines_bounded() -> None:
    tail = local_cluster._Tail()
    for i in range(local_cluster.TAIL_LINES * 3):
        tail.feed(f"line {i}\n".encode())
    tail.feed(b"x" * (local_cluster.TAIL_LINE_MAX * 10))
    tail.close()
    lines = list(tail.lines)
    assert len(lines) == local_cluster.TAIL_LINES and lines[-2] == f"line {local_cluster.TAIL_LINES * 3 - 1}"
    assert len(lines[-1]) == local_cluster.TAIL_LINE_MAX


# -- 2. signals end a client command (130, 143) ---------------------------------------------


async def _read_until(stream: asyncio.StreamReader, needle: str, seen: list[str]) -> None:
    while needle not in "".join(seen):
        line = await stream.readline()
        if not line:
            raise AssertionError(f"output ended before {needle!r}: {''.join(seen)}")
        seen.append(line.decode(errors="replace"))


async def _signal_and_wait(proc: asyncio.subprocess.Process, sig: int, seen: list[str]) -> str:
    """Send ``sig``, wait (bounded) for the end; all of stderr.

    How soon the process is gone is a figure of the machine as much as of
    the command (a loaded machine schedules it late): bench/cli_signals.py
    measures the 2 s of deliverable 2.  Here a command that ignored the
    signal, or waited for its node, would run past ``PROCESS_WAIT`` — ``sub``
    without ``--seconds`` never ends on its own."""
    proc.send_signal(sig)
    assert proc.stderr is not None
    rest = await asyncio.wait_for(proc.stderr.read(), PROCESS_WAIT)
    await asyncio.wait_for(proc.wait(), PROCESS_WAIT)
    return "".join(seen) + rest.decode(errors="replace")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_sub_against_no_cluster_ends_on_a_signal(tmp_path: Path, sig: int, code: int) -> None:
    cfg = write_config(tmp_path / "c.toml", [free_port(), free_port()])
    # --log-level debug: the command says when it starts connecting, so we know
    # it is inside its event loop, retrying, when we signal it.
    proc = await asyncio.create_subprocess_exec(
        *overlay("--log-level", "debug", "sub", "--config", str(cfg), "price < 5"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    seen: list[str] = []
    assert proc.stderr is not None
    await asyncio.wait_for(_read_until(proc.stderr, "overlay.cli: connecting to 127.0.0.1", seen), PROCESS_WAIT)
    err = await _signal_and_wait(proc, sig, seen)
    assert proc.returncode == code, err
    assert "Traceback" not in err, err


@contextlib.asynccontextmanager
async def one_node(tmp_path: Path) -> AsyncIterator[tuple[Node, Path]]:
    """A one-node cluster in this process, and its config file for a subprocess."""
    sock = listening_socket()
    path = write_config(tmp_path / "one.toml", [sock.getsockname()[1]])
    node = Node(load_config(path), 0, sock=sock)
    task = asyncio.create_task(node.run())
    try:
        await asyncio.wait_for(node.started.wait(), PROCESS_WAIT)
        yield node, path
    finally:
        node.stop()
        await asyncio.wait_for(task, PROCESS_WAIT)
        sock.close()


async def test_sub_ends_on_ctrl_c_after_its_node_went_away(tmp_path: Path) -> None:
    async with one_node(tmp_path) as (_node, cfg):
        proc = await asyncio.create_subprocess_exec(
            *overlay("sub", "--config", str(cfg), "price < 5"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        seen: list[str] = []
        assert proc.stderr is not None
        await asyncio.wait_for(_read_until(proc.stderr, '"subscribed"', seen), PROCESS_WAIT)
    # The node is gone: the client is reconnecting, its subscription homeless.
    err = await _signal_and_wait(proc, signal.SIGINT, seen)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err


# -- 1. cluster up: taken ports, another cluster, a node that dies ----------------------------


def test_port_holders_finds_this_process() -> None:
    with listening_socket() as s:
        holders = cli.port_holders(s.getsockname()[1])
    assert os.getpid() in [pid for pid, _ in holders]


def test_cluster_up_refuses_a_taken_port_and_names_its_holder(tmp_path: Path) -> None:
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        cfg = write_config(tmp_path / "c.toml", [free_port(), port])
        proc = run("cluster", "up", str(cfg))
    err = assert_one_line_error(proc, code=1)
    assert f"node 1's port 127.0.0.1:{port}" in err and f"pid {os.getpid()}" in err, err
    assert "pytest" in err or "python" in err, err  # the holder's command line


async def test_ready_means_the_node_of_our_config(tmp_path: Path) -> None:
    async with one_node(tmp_path) as (_node, path):
        theirs = load_config(path)
        renamed = msgspec.structs.replace(theirs, cluster=msgspec.structs.replace(theirs.cluster, name="ours"))
        with pytest.raises(cli.CommandFailed, match="node 0 of cluster 'clitest', not as node 0 of 'ours'"):
            await local_cluster.wait_ready(renamed, 5.0)
        other_id = renamed.with_nodes((msgspec.structs.replace(theirs.nodes[0], id=1),))
        other_id = msgspec.structs.replace(other_id, cluster=theirs.cluster)
        with pytest.raises(cli.CommandFailed, match=r"answers as node 0 .* not as node 1"):
            await local_cluster.wait_ready(other_id, 5.0)
        await local_cluster.wait_ready(theirs, 5.0)  # and ours is


@contextlib.contextmanager
def cluster_up(*argv: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(overlay(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(PROCESS_WAIT)


def test_cluster_up_reports_a_node_that_dies_and_stops_the_others(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", [free_port(), free_port()])
    with cluster_up("--log-level", "info", "cluster", "up", str(cfg)) as proc:
        assert proc.stdout is not None
        pids = {}
        while len(pids) < 2:  # "  node 1  127.0.0.1:PORT  pid N" once every node is ready
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            if m := re.match(r"\s+node (\d+) .* pid (\d+)", line):
                pids[int(m[1])] = int(m[2])
        os.kill(pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=PROCESS_WAIT)
    assert proc.returncode == 1, err
    assert "node 1 (127.0.0.1:" in err and "was killed by SIGKILL while the cluster ran" in err, err
    assert "the other nodes are stopped" in err and "--keep-going" not in err, err  # fail fast is the default
    assert "Its last lines:" in err and "node 1: listening on" in err.split("Its last lines:")[1], err
    assert "Traceback" not in err, err
    with pytest.raises(ProcessLookupError):  # node 0 was stopped and reaped
        os.kill(pids[0], 0)


def test_cluster_up_reports_a_node_that_dies_at_start(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    cfg = write_config(tmp_path / "c.toml", [free_port()], extra=f'capture_dir = "{not_a_dir}"\n')
    proc = run("cluster", "up", str(cfg))
    assert proc.returncode == 1, proc.stderr
    assert "node 0 (127.0.0.1:" in proc.stderr and "exited with code 1 during start-up" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


async def test_the_traffic_of_cluster_up_runs_against_a_cluster_and_counts_what_it_did() -> None:
    """``overlay cluster up F --traffic`` drives ``overlay.cli.traffic``: it
    publishes, every subscription gets its events, and the clients close."""
    from loopback import wait_until
    from overlay.cli import traffic
    from test_node import Cluster

    cluster = await Cluster().start()
    try:
        published, delivered = await asyncio.wait_for(traffic.run_traffic(cluster.config, traffic.SETTLE + 1.0), 30)
        assert published > 0 and delivered > 0
        await wait_until(lambda: all(not n.core.sessions for n in cluster.nodes.values()), what="its clients gone")
    finally:
        await cluster.stop()
