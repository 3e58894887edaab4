"""Node processes as an operator runs them, and one node cut off by a network
namespace: what ``tests/test_node_failures.py`` and ``bench/failover.py``
kill, pause and partition (SPEC §16).

Rules this module keeps:

1. Every node is its own ``overlay node --config F --id N`` process (the
   interpreter running this module, ``-m overlay``), in its own session, its
   output (the log at ``info``) in one file per run of the process.  A node
   that rejoins after being declared dead does so inside the same process
   (``overlay node`` starts a new run on the same ports), so its log goes on
   in the same file.
2. ``kill`` is SIGKILL, ``pause``/``resume`` SIGSTOP/SIGCONT, ``terminate``
   one node's clean shutdown (SIGTERM, as Ctrl-C); ``stop`` ends every
   process still running with SIGTERM, then SIGKILL after ``STOP_TIMEOUT``
   — after a test, nothing of it is left running (a paused process is
   resumed first, or SIGTERM would wait for ever).
3. Every wait is bounded and polls a condition (``overlay.testing._loopback``
   rule 2): a node ready, a line in a log.  With an ``[auth]`` table in the
   config, the readiness probe signs itself a token with its signing key,
   as ``overlay cluster up`` does.
4. ``Partition`` gives one node a network namespace of its own, joined to
   the host by a veth pair; the other nodes listen on an address of an
   interface of the host's own that nothing cuts, so cutting the veth (``ip link set … down`` on the host's end)
   cuts that node off from every peer and every client on the host while the
   rest keep talking.  Inside the namespace the cut node's own address still
   answers, so a probe run there (``in_namespace``) sees what it tells its
   clients.  Names are unique per ``Partition`` (the process id and a
   counter); ``close`` deletes everything it created, whatever failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from overlay.auth.keys import local_token
from overlay.client import Client
from overlay.config import TlsSettings, load_config
from overlay.errors import OverlayError
from overlay.security import client_ssl
from overlay.testing._loopback import WAIT, insecure_tls, tls_toml

__all__ = ["NodeProcesses", "Partition", "log_time", "write_cluster_config"]

# SIGTERM gives a node this long to stop cleanly before SIGKILL (rule 2).
STOP_TIMEOUT: Final = 10.0
# A node process's imports and start on a loaded 2-core machine: generous.
START_TIMEOUT: Final = 30.0
# The life of the readiness probe's token (rule 3): one probe.
PROBE_TOKEN_TTL: Final = 60.0
# Between two polls of a log file or a node's readiness.
LOG_POLL: Final = 0.05
READY_POLL: Final = 0.1
# The schema of every generated config: ``qty`` names an event (unique per
# run, hence the large bound), ``price`` places it, ``sym`` is a second
# distinguishing attribute.
SCHEMA: Final = """[schema]
distinguishing = ["price", "sym"]
attributes = [
  { name = "price", type = "float", min = 0, max = 1000 },
  { name = "sym", type = "string", min = 1, max = 8 },
  { name = "qty", type = "int", min = 0, max = 1000000000 },
  { name = "venue", type = "string", min = 0, max = 16 },
]
"""
# The ``asctime`` of ``overlay``'s log lines (``cli.running.setup_logging``).
_ASCTIME: Final = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def write_cluster_config(
    path: Path,
    addresses: Sequence[tuple[str, int]],
    *,
    name: str = "failures",
    settings: Mapping[str, object] | None = None,
    capacities: Sequence[float] | None = None,
    admin_ports: Sequence[int] | None = None,
    tls: TlsSettings | None = None,
    tables: Mapping[str, Mapping[str, object]] | None = None,
    schema: str = SCHEMA,
) -> Path:
    """A config of ``len(addresses)`` nodes (ids 0…, node 0 the initializer;
    admin ports ephemeral unless given), with ``[cluster]`` ``settings``,
    ``tls`` (default: plain TCP and the test secret, ``insecure_tls``;
    ``dev_tls(ids, host)`` for TLS), the other ``tables`` (``{"auth": {...},
    "groups": {...}}``) and ``schema`` (a ``[schema]`` table; ``SCHEMA`` unless
    a bench needs attributes of its own)."""
    settings = dict(settings or {})
    lines = ["[cluster]", f"name = {_toml(settings.pop('name', name))}", "initializer = 0"]
    lines += [f"{k} = {_toml(v)}" for k, v in settings.items()]
    for i, (host, port) in enumerate(addresses):
        cap = capacities[i] if capacities else 1.0
        admin = admin_ports[i] if admin_ports else 0
        lines += ["", "[[nodes]]", f"id = {i}", f"host = {_toml(host)}", f"port = {port}"]
        lines += [f"admin_port = {admin}", f"capacity = {cap!r}"]
    for table, keys in (tables or {}).items():
        lines += ["", f"[{table}]", *(f"{k} = {_toml(v)}" for k, v in keys.items())]
    lines += ["", tls_toml(tls or insecure_tls())]
    path.write_text("\n".join(lines) + "\n" + schema)
    return path


def log_time(line: str) -> float:
    """The Unix time of one of ``overlay``'s log lines (local ``asctime``, ms)."""
    m = _ASCTIME.match(line)
    if m is None:
        raise ValueError(f"not a log line of overlay: {line[:80]!r}")
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000


class NodeProcesses:
    """The node processes of one config (rules 1–3).  ``prefix[n]``: what
    node ``n``'s command line runs under (``Partition.exec_prefix``)."""

    def __init__(
        self,
        config: Path,
        addresses: Sequence[tuple[str, int]],
        logs: Path,
        *,
        prefix: Mapping[int, Sequence[str]] | None = None,
        log_level: str = "info",
    ) -> None:
        self.config = config
        self.addresses = list(addresses)
        self.logs = logs
        self.prefix = dict(prefix or {})
        self.log_level = log_level
        self.cluster = load_config(config)
        self.tls = client_ssl(self.cluster)  # how ``status`` talks to the nodes
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.runs: dict[int, int] = {}
        self.paused: set[int] = set()

    def addr(self, node: int) -> tuple[str, int]:
        return self.addresses[node]

    def log_path(self, node: int, run: int | None = None) -> Path:
        return self.logs / f"node-{node}-process-{run or self.runs[node]}.log"

    def start(self, node: int) -> None:
        """A new process of ``node`` (its first, or after a kill)."""
        self.runs[node] = self.runs.get(node, 0) + 1
        cmd = [
            *self.prefix.get(node, ()),
            sys.executable,
            "-m",
            "overlay",
            "--log-level",
            self.log_level,
            "node",
            "--config",
            str(self.config),
            "--id",
            str(node),
        ]
        with open(self.log_path(node), "wb") as out:  # the child keeps its own descriptor
            self.procs[node] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start_all(self) -> None:
        for node in range(len(self.addresses)):
            self.start(node)

    def kill(self, node: int) -> float:
        """SIGKILL; returns when it was sent (``time.time()``) once the process is gone."""
        proc = self.procs[node]
        at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait(STOP_TIMEOUT)
        self.paused.discard(node)
        return at

    def terminate(self, node: int) -> float:
        """SIGTERM, a clean shutdown (rule 2); returns when it was sent once the
        process is gone (SIGKILL after ``STOP_TIMEOUT``)."""
        proc = self.procs[node]
        at = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return at

    def pause(self, node: int) -> float:
        """SIGSTOP; returns when it was sent."""
        at = time.time()
        self.procs[node].send_signal(signal.SIGSTOP)
        self.paused.add(node)
        return at

    def resume(self, node: int) -> float:
        at = time.time()
        self.procs[node].send_signal(signal.SIGCONT)
        self.paused.discard(node)
        return at

    def alive(self, node: int) -> bool:
        return self.procs[node].poll() is None

    def log(self, node: int) -> str:
        """Every line node ``node``'s processes logged, oldest first."""
        return "".join(
            self.log_path(node, run).read_text(errors="replace") for run in range(1, self.runs.get(node, 0) + 1)
        )

    def lines(self, node: int, text: str) -> list[str]:
        """The lines of ``node``'s log that contain ``text``."""
        return [line for line in self.log(node).splitlines() if text in line]

    def tail(self, node: int, chars: int = 3000) -> str:
        return f"--- node {node} ---\n{self.log(node)[-chars:]}"

    async def wait_log(self, node: int, text: str, timeout: float = WAIT, *, after: float = 0.0) -> str:
        """The first line of ``node``'s log containing ``text`` (logged at or
        after Unix time ``after``); ``AssertionError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines(node, text):
                with contextlib.suppress(ValueError):
                    if log_time(line) >= after:
                        return line
            if time.monotonic() > deadline:
                raise AssertionError(f"node {node} logged no {text!r} within {timeout}s\n{self.tail(node)}")
            await asyncio.sleep(LOG_POLL)

    async def status(self, node: int, timeout: float = 2.0) -> dict[str, object]:
        """Node ``node``'s ``status`` admin answer, over a connection of its own."""
        token = local_token(self.cluster, f"status-{node}", "subscribe", ttl=PROBE_TOKEN_TTL)  # rule 3
        c = Client([self.addr(node)], client_id=f"status-{node}", reconnect=False, token=token, ssl=self.tls)
        await c.connect(timeout=timeout)
        try:
            result: dict[str, object] = await c.admin("status", timeout=timeout)
            return result
        finally:
            await c.close()

    async def ready(self, node: int, timeout: float = START_TIMEOUT) -> None:
        """Until node ``node`` answers ``status`` with ``ready`` (rule 3)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.alive(node), f"node {node} exited with {self.procs[node].returncode}\n{self.tail(node)}"
            with contextlib.suppress(OSError, OverlayError, TimeoutError):
                if (await self.status(node, timeout=1.0))["ready"]:
                    return
            await asyncio.sleep(READY_POLL)
        raise AssertionError(f"node {node} not ready after {timeout}s\n{self.tail(node)}")

    async def all_ready(self, timeout: float = START_TIMEOUT) -> None:
        await asyncio.gather(*(self.ready(n, timeout) for n in range(len(self.addresses))))

    def stop(self) -> None:
        """Rule 2."""
        for node in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                self.resume(node)
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


_partitions = itertools.count(1)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Partition:
    """One node's network namespace and the host's side of it (rule 4).

    ``host_address``: where the other nodes listen (an interface of the
    host's own); ``node_address``: the cut node's, inside the namespace.  Both are
    in 10.0.0.0/8, in a /24 no interface of the host uses.
    """

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}{next(_partitions)}"
        self.namespace = f"ovcut{tag}"
        self.host_veth = f"ovh{tag}"[:15]
        self.node_veth = f"ovn{tag}"[:15]
        self.anchor = f"ovd{tag}"[:15]
        self.anchor_peer = f"ove{tag}"[:15]
        net = self._free_net()
        self.host_address = f"{net}.1"  # on the uncut interface
        self._veth_host = f"{net}.5"
        self.node_address = f"{net}.6"
        self._created: list[tuple[str, ...]] = []  # what close() deletes, newest first

    @staticmethod
    def available() -> str:
        """Why a partition cannot be made here ("" when it can)."""
        if shutil.which("ip") is None:
            return "the ip command (iproute2) is not installed"
        if os.geteuid() != 0:
            return "network namespaces need root"
        return ""

    @staticmethod
    def _free_net() -> str:
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
        rng = random.Random()
        for _ in range(100):
            net = f"10.{rng.randrange(64, 250)}.{rng.randrange(0, 255)}"
            if f" {net}." not in used:
                return net
        raise RuntimeError("no free 10.x.y.0/24 for a partition")

    def create(self) -> Partition:
        ns, hv, nv = self.namespace, self.host_veth, self.node_veth
        try:
            _ip("netns", "add", ns)
            self._created.append(("netns", "delete", ns))
            # The majority's address, on an interface nothing cuts: a veth
            # pair of the host's own (the dummy driver is not everywhere).
            _ip("link", "add", self.anchor, "type", "veth", "peer", "name", self.anchor_peer)
            self._created.append(("link", "delete", self.anchor))
            _ip("addr", "add", f"{self.host_address}/32", "dev", self.anchor)
            _ip("link", "set", self.anchor_peer, "up")
            _ip("link", "set", self.anchor, "up")
            _ip("link", "add", hv, "type", "veth", "peer", "name", nv)
            self._created.append(("link", "delete", hv))  # takes its peer with it
            _ip("link", "set", nv, "netns", ns)
            _ip("addr", "add", f"{self._veth_host}/30", "dev", hv)
            _ip("link", "set", hv, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.node_address}/30", "dev", nv)
            _ip("-n", ns, "link", "set", nv, "up")
            _ip("-n", ns, "route", "add", f"{self.host_address}/32", "via", self._veth_host)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def exec_prefix(self) -> list[str]:
        """Run a command inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace]

    def cut(self) -> float:
        """The host's end of the veth goes down; returns when (``time.time()``)."""
        at = time.time()
        _ip("link", "set", self.host_veth, "down")
        return at

    def heal(self) -> float:
        at = time.time()
        _ip("link", "set", self.host_veth, "up")
        return at

    async def in_namespace(self, code: str, *args: str, timeout: float = 30.0) -> tuple[int, str]:
        """``python -c code args…`` inside the namespace (the probe of rule 4):
        its exit status and its output (stdout and stderr)."""
        proc = await asyncio.create_subprocess_exec(
            *self.exec_prefix,
            sys.executable,
            "-c",
            code,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace")

    def close(self) -> None:
        for args in reversed(self._created):
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                _ip(*args)
        self._created.clear()

    def __enter__(self) -> Partition:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()
