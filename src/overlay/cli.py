"""The ``overlay`` command line (SPEC §14).

    overlay node --config F --id N [--capture DIR]   run one node until SIGINT/SIGTERM
    overlay node join --config F --id N      run node N (in F) joining a running cluster that does not list it
    overlay node drain N --config F [--token T]   move every channel off node N; waits, prints a summary
    overlay cluster up F [--duration S] [--capture DIR] [--traffic]
                                             every node of F as subprocesses
    overlay pub --config F [--node N] [--key K [--rank R]] [EVENT ...]   (events from stdin if none)
    overlay sub --config F [--node N] EXPR [--group G [--weight W]] [--count K] [--seconds S]
    overlay status --config F                the cluster at a glance
    overlay channel split --config F CH --attr A (--at V | --values a,b)
    overlay channel place --config F CH --node N
    overlay demo F [--seconds S]             cluster + bounded demo traffic (make run)
    overlay replay RUN_DIR [--master URL] [--out DIR]   Spark replay of a capture (SPEC §13)

Rules every command keeps:

1. Arguments and the config file are checked before anything starts or
   connects.  A bad one is one line on stderr and exit 2 — argparse's own
   errors too (``_Parser``).
2. SIGINT and SIGTERM cancel the command's main task; the handlers are the
   first thing installed in its event loop (``_guarded``).  A client command
   (pub, sub, status, channel, node drain) closes its connections within
   ``CLOSE_TIMEOUT`` and exits 130 (SIGINT) or 143 (SIGTERM); one that still
   has not ended ``INTERRUPT_GRACE`` after the signal exits anyway.  A server
   (node, cluster up, demo) stops its node(s) and exits 0: a signal is how it
   is meant to end; a second signal hurries it (``LocalCluster.stop`` kills).
3. No traceback reaches the user: an ``OverlayError`` is one line
   ``overlay: …`` (exit 2 when the command line or the config is at fault, 1
   when the cluster or the machine failed the command); anything else is
   ``overlay: internal error: …`` (exit 1) — with ``--log-level debug`` the
   traceback is shown instead.
4. ``cluster up`` and ``demo`` (``LocalCluster``) start nodes only on free
   ports, name whatever holds a taken one, accept a node as ready only when
   its Welcome names the node id and cluster of the config, and watch every
   node: one that exits, at start-up or later, is reported with its exit code
   and its last lines of log, and the others are stopped (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import errno
import importlib.metadata
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

import aiohttp

from overlay.capture import with_capture_dir
from overlay.channels import Kind, parse_event, parse_rfid, parse_subscription
from overlay.client import AgentClient, Client, load_agent_settings
from overlay.config import ClusterConfig, NodeConfig, load_config
from overlay.errors import (
    ConfigError,
    ConnectionLost,
    ExpressionError,
    LocalProtocolError,
    OverlayError,
    SchemaError,
)

__all__ = [
    "CommandFailed",
    "LocalCluster",
    "UsageError",
    "build_parser",
    "check_ports_free",
    "config_node",
    "finish_within",
    "main",
    "port_holders",
    "run_command",
    "traffic_failed",
]

log = logging.getLogger("overlay.cli")

T = TypeVar("T")

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
# A command ended by a signal exits 128 + its number, as a shell reports it.
EXIT_SIGNAL_BASE: Final = 128
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)

# Rule 2.  A client command gets this long to close its connections after a
# signal (an unsubscribe, a goodbye to each node)...
CLOSE_TIMEOUT: Final = 0.5
# ... and the whole process this long to be gone: past it, it exits without
# waiting for the rest, so that Ctrl-C ends a command within 2 s whatever the
# cluster does (a node that vanished mid-request never answers).
INTERRUPT_GRACE: Final = 1.5
# How long a client command waits for the first node to answer: a node that is
# starting answers within a second or two; a cluster that is not there should
# be reported while the user still watches.
CONNECT_TIMEOUT: Final = 5.0


class UsageError(OverlayError):
    """The command line asks for something that cannot be (exit 2)."""


class CommandFailed(OverlayError):
    """The cluster or the machine failed the command (exit 1).  ``details`` are
    printed after the message, one per line (e.g. a dead node's last log lines)."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = list(details)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# -- running a command (rule 2) ------------------------------------------------------


def _loop_run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency; this only guards odd platforms
        return asyncio.run(coro)
    return uvloop.run(coro)


def _exit_now(code: int) -> None:
    """The last resort of rule 2: a command still running ``INTERRUPT_GRACE``
    after a signal is left behind (what it waits for will not come)."""
    log.debug("still closing %.1fs after the signal; exiting without waiting", INTERRUPT_GRACE)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe: nothing more to say
            stream.flush()
    os._exit(code)


async def _guarded(main: Coroutine[Any, Any, int], server: bool) -> int:
    """Run ``main`` as a task that SIGINT/SIGTERM cancel (rule 2)."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(main)
    caught: list[int] = []

    def on_signal(signum: int) -> None:
        if not caught and not server:
            loop.call_later(INTERRUPT_GRACE, _exit_now, EXIT_SIGNAL_BASE + signum)
        caught.append(signum)
        task.cancel()  # again on a second signal: it hurries the clean-up

    # Signals reach the main thread only: a command run in another thread
    # (a test, an embedding program) leaves them to whoever owns it.
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, on_signal, int(sig))
    try:
        code = await task
    except asyncio.CancelledError:
        if not caught:
            raise
        code = EXIT_OK
    if caught and not server:
        return EXIT_SIGNAL_BASE + caught[0]
    return code


def run_command(main: Coroutine[Any, Any, int], *, server: bool = False) -> int:
    """Run a command's coroutine in a fresh event loop under rule 2."""
    return _loop_run(_guarded(main, server))


async def finish_within(aw: Awaitable[Any], timeout: float, what: str) -> None:
    """Await clean-up for at most ``timeout`` s, its errors logged, not raised:
    closing a client must not hold up (or fail) the end of a command."""
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
            log.debug("%s: not done after %.1fs; left behind", what, timeout)
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.debug("%s failed: %r", what, task.exception())


# -- argument checks (rule 1) -----------------------------------------------------------


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _positive_float(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _node_id(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"node ids are not negative, got {value}")
    return value


def _one_line(exc: BaseException) -> str:
    """An error's text on one line (an expression error draws a caret under
    the text on two more lines: here the position says it)."""
    if isinstance(exc, ExpressionError):
        return f"{exc.reason} at position {exc.position} of {exc.text!r}"
    return " ".join(str(exc).split("\n"))


def _first_cause(exc: BaseException) -> BaseException:
    """A TaskGroup's error says only how many tasks failed: its first member says what happened."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def config_node(cfg: ClusterConfig, node_id: int, flag: str = "--node") -> NodeConfig:
    for n in cfg.nodes:
        if n.id == node_id:
            return n
    raise UsageError(
        f"{flag} {node_id}: node {node_id} does not exist in {cfg.path} (its nodes: {', '.join(map(str, cfg.node_ids))})"
    )


def _addresses(cfg: ClusterConfig, node: int | None) -> list[tuple[str, int]]:
    nodes = [config_node(cfg, node)] if node is not None else list(cfg.nodes)
    return [(n.host, n.port) for n in nodes]


def _check_capture_dir(path: str | None) -> None:
    if path and Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"--capture {path}: exists and is not a directory")


# -- who holds a port (rule 4) ----------------------------------------------------------

PROC_NET_TCP: Final = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN: Final = "0A"  # the LISTEN state in /proc/net/tcp
# A holder's command line is cut here: the message stays one readable line.
CMDLINE_MAX: Final = 120


def _socket_inodes(port: int) -> set[str]:
    """Inodes of this machine's TCP sockets on local ``port``: the listening
    ones, or if none listens, every one (e.g. bound, not listening)."""
    listening: set[str] = set()
    other: set[str] = set()
    for table in PROC_NET_TCP:
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:  # not Linux, or no IPv6
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[9] == "0":  # inode 0: TIME_WAIT, owned by no one
                continue
            if int(fields[1].rpartition(":")[2], 16) == port:
                (listening if fields[3] == TCP_LISTEN else other).add(fields[9])
    return listening or other


def _cmdline(pid: str) -> str:
    try:
        raw = Path("/proc", pid, "cmdline").read_bytes()
    except OSError:
        return "?"
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return text if len(text) <= CMDLINE_MAX else text[: CMDLINE_MAX - 1] + "…"


def port_holders(port: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes holding a TCP socket on local
    ``port``, found in /proc (Linux; only processes we may inspect)."""
    targets = {f"socket:[{inode}]" for inode in _socket_inodes(port)}
    if not targets:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = list(os.scandir(f"/proc/{entry.name}/fd"))
            if any(os.readlink(fd.path) in targets for fd in fds):
                found.append((int(entry.name), _cmdline(entry.name)))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _held_by(port: int) -> str:
    holders = port_holders(port)
    if not holders:
        return "by a process this user cannot see"
    pid, cmd = holders[0]
    more = f" (and {len(holders) - 1} more)" if len(holders) > 1 else ""
    return f"by pid {pid}: {cmd}{more}"


def _check_port(n: NodeConfig, port: int, what: str) -> None:
    try:
        addresses = socket.getaddrinfo(n.host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CommandFailed(f"node {n.id}: host {n.host!r} does not resolve ({exc.strerror})") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node binds
            try:
                s.bind(address)
            except OSError as exc:
                where = f"node {n.id}'s {what} {n.host}:{port}"
                if exc.errno == errno.EADDRINUSE:
                    raise CommandFailed(f"{where} is taken {_held_by(port)}") from None
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise CommandFailed(f"{where}: {n.host} is not an address of this machine") from None
                raise CommandFailed(f"{where} cannot be bound: {exc.strerror}") from None


def check_ports_free(nodes: Iterable[NodeConfig]) -> None:
    """Every configured port of ``nodes`` can be bound here, or ``CommandFailed``
    names the first that cannot, its node, and the process holding it."""
    for n in nodes:
        for port, what in ((n.port, "port"), (n.admin_port, "admin_port")):
            if port:  # 0: an ephemeral port, always free
                _check_port(n, port, what)


# -- node -----------------------------------------------------------------------------


async def _node_main(cfg: ClusterConfig, node_id: int) -> int:
    from overlay.net.node import Node

    node = Node(cfg, node_id, freeze_gc=True)  # its own process (net.node: gc.freeze)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    signals = 0

    def on_signal() -> None:
        # The first signal stops the node cleanly (its queues flushed); a second
        # one cancels it where it is.
        nonlocal signals
        signals += 1
        if signals == 1:
            node.stop()
        else:
            main.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    try:
        await node.run()
    except asyncio.CancelledError:
        if signals < 2:
            raise
        log.warning("node %d: stopped at once (second signal); queued frames are lost", node_id)
    return EXIT_OK


def cmd_node(args: argparse.Namespace) -> int:
    if args.action == "drain":
        from overlay.membership_cli import cmd_drain

        return cmd_drain(args)
    if args.target is not None:
        raise UsageError(f"a node to run is given with --id N, not as {args.target!r} (that is for `node drain N`)")
    if args.id is None:
        raise UsageError("--id N is required: the node of the config to run")
    cfg = load_config(args.config)
    check_ports_free([config_node(cfg, args.id, "--id")])
    _check_capture_dir(args.capture)
    if args.capture:
        cfg = with_capture_dir(cfg, args.capture)
    return run_command(_node_main(cfg, args.id), server=True)


# -- local cluster (rule 4) -----------------------------------------------------------

# Lines of each node's stderr kept to show when it dies: the end of a
# traceback and the log lines before it.
TAIL_LINES: Final = 20
# A kept line is cut to this many characters: memory stays bounded for a node
# that logs huge lines (its forwarded output is not cut).
TAIL_LINE_MAX: Final = 400
READ_CHUNK: Final = 64 * 1024
READY_TIMEOUT: Final = 30.0
READY_POLL: Final = 0.1  # s between two tries of a node that does not answer yet
READY_CONNECT: Final = 2.0  # s one try may take
STOP_TIMEOUT: Final = 10.0  # s a node gets to stop after SIGTERM before it is killed


class _Tail:
    """The last ``TAIL_LINES`` lines of a byte stream, each cut to ``TAIL_LINE_MAX``."""

    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *complete, partial = (self._partial + data).split(b"\n")
        self._partial = partial[: TAIL_LINE_MAX * 4]  # UTF-8: at most 4 bytes a character
        for raw in complete:
            self.lines.append(raw.decode(errors="replace")[:TAIL_LINE_MAX])

    def close(self) -> None:
        if self._partial:
            self.feed(b"\n")


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            proc.send_signal(sig)


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _forward(data: bytes) -> None:
    """A node's stderr goes on to ours, as when it inherited it."""
    try:
        out = getattr(sys.stderr, "buffer", None)
        if out is not None:
            out.write(data)
        else:  # a text-only stream (e.g. a test's capture)
            sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()
    except (OSError, ValueError):  # our stderr is gone: keep draining the node's
        pass


class LocalCluster:
    """Every node of a config as a subprocess (rule 4).

    Invariant: from ``start`` to ``stop``, a node process that ends without
    being asked to sets ``failure`` (naming it, its exit status and its last
    ``TAIL_LINES`` lines of stderr) and wakes ``supervise``.  Each node's stderr
    is forwarded to ours by its watcher task, which ``stop`` awaits.
    """

    def __init__(self, config_path: str, log_level: str = "info", *, capture: str | None = None) -> None:
        self.config_path = config_path
        self.capture = capture  # every node captures to this run directory (SPEC §13)
        self.cfg = load_config(config_path)
        self.log_level = log_level
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.tails: dict[int, _Tail] = {}
        self.failure: CommandFailed | None = None
        self.ready = False
        self._failed = asyncio.Event()
        self._stopping = False
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start every node and wait until each is ready and is ours; on any
        failure (or cancellation) the nodes started so far are stopped."""
        check_ports_free(self.cfg.nodes)
        try:
            for n in self.cfg.nodes:
                await self._spawn(n)
            await self.supervise(_wait_ready(self.cfg, timeout))
        except BaseException:
            await self.stop()
            raise
        self.ready = True

    async def _spawn(self, n: NodeConfig) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "overlay",
            "--log-level",
            self.log_level,
            "node",
            "--config",
            self.config_path,
            "--id",
            str(n.id),
            *(["--capture", self.capture] if self.capture else []),
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the nodes in order
        )
        self.procs[n.id] = proc
        self.tails[n.id] = _Tail()
        self._watchers.append(asyncio.create_task(self._watch(n, proc), name=f"watch-node-{n.id}"))

    async def _watch(self, n: NodeConfig, proc: asyncio.subprocess.Process) -> None:
        tail = self.tails[n.id]
        assert proc.stderr is not None
        while data := await proc.stderr.read(READ_CHUNK):
            tail.feed(data)
            _forward(data)
        tail.close()
        code = await proc.wait()
        if self._stopping or self.failure is not None:
            return
        when = "while the cluster ran" if self.ready else "during start-up"
        self.failure = CommandFailed(
            f"node {n.id} ({n.host}:{n.port}, pid {proc.pid}) {_exit_status(code)} {when}; "
            f"the other nodes are stopped. Its last lines:",
            [f"  | {line}" for line in tail.lines] or ["  | (it wrote nothing)"],
        )
        self._failed.set()

    async def supervise(self, work: Awaitable[T]) -> T:
        """``work``'s result, unless a node ends first: then ``work`` is cancelled
        and the node's failure raised."""
        task = asyncio.ensure_future(work)
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # its own clean-up (closing clients) is bounded
        if self.failure is not None and (task.cancelled() or task.exception() is not None):
            raise self.failure
        return task.result()

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM every node and wait for each; one that takes longer than
        ``timeout`` — or every one, if we are cancelled meanwhile — is killed."""
        self._stopping = True
        for p in self.procs.values():
            _signal(p, signal.SIGTERM)
        try:
            for nid, p in self.procs.items():
                try:
                    await asyncio.wait_for(p.wait(), timeout)
                except TimeoutError:
                    log.warning("node %d did not stop within %ss; killing it", nid, timeout)
                    _signal(p, signal.SIGKILL)
                    await p.wait()
        except asyncio.CancelledError:  # a second Ctrl-C: no more waiting
            for p in self.procs.values():
                _signal(p, signal.SIGKILL)
            raise
        finally:
            if self._watchers:  # they end at the nodes' EOF
                await asyncio.wait(self._watchers, timeout=CLOSE_TIMEOUT)


def _not_ours(cfg: ClusterConfig, n: NodeConfig, c: Client) -> CommandFailed:
    return CommandFailed(
        f"{n.host}:{n.port} answers as node {c.node_id} of cluster {c.cluster!r}, not as node {n.id} "
        f"of {cfg.cluster.name!r}: another cluster holds that port (held {_held_by(n.port)})"
    )


async def _wait_ready(cfg: ClusterConfig, timeout: float) -> None:
    """Every node answers its clients, is the node of ``cfg`` (id and cluster
    name in its Welcome) and reports ready."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for n in cfg.nodes:
        while True:
            c = Client([(n.host, n.port)], client_id="overlay-cli", reconnect=False)
            try:
                await c.connect(timeout=READY_CONNECT)
                if c.node_id != n.id or c.cluster != cfg.cluster.name:
                    raise _not_ours(cfg, n, c)
                if c.ready:
                    break
            except CommandFailed:
                raise
            except (OSError, OverlayError, TimeoutError):
                pass  # not listening yet
            finally:
                await c.close()
            if loop.time() > deadline:
                raise CommandFailed(f"node {n.id} at {n.host}:{n.port} not ready after {timeout}s")
            await asyncio.sleep(READY_POLL)


def admin_url(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{port}"


def ready_lines(cluster: LocalCluster) -> list[str]:
    """One line per node: where it listens, its pid, its admin page."""
    lines = []
    for n in cluster.cfg.nodes:
        admin = f"  {admin_url(n.host, n.admin_port)}/" if n.admin_port else ""
        lines.append(f"  node {n.id}  {n.host}:{n.port}  pid {cluster.procs[n.id].pid}{admin}")
    return lines


def traffic_failed(group: BaseExceptionGroup[Any]) -> CommandFailed:
    """The first error of a traffic generator's TaskGroup, as one line (the
    group's own text only counts its members)."""
    log.debug("traffic failed", exc_info=group)
    first = _first_cause(group)
    return CommandFailed(f"the traffic stopped: {type(first).__name__}: {_one_line(first)}")


async def _forever(seconds: float | None) -> None:
    if seconds is None:
        await asyncio.Event().wait()
    else:
        await asyncio.sleep(seconds)


# How long `cluster up --traffic` drives the cluster without --duration.
DEFAULT_TRAFFIC_SECONDS: Final = 60.0


async def _cluster_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.config, args.log_level, capture=args.capture)
    await cluster.start()
    try:
        print(f"cluster {cluster.cfg.cluster.name!r} ready, Ctrl-C stops it:", flush=True)
        print("\n".join(ready_lines(cluster)), flush=True)
        if args.traffic:
            from overlay.traffic import run_traffic

            await cluster.supervise(run_traffic(cluster.cfg, args.duration or DEFAULT_TRAFFIC_SECONDS))
        else:
            await cluster.supervise(_forever(args.duration))
    finally:
        print("stopping the cluster…", flush=True)
        await cluster.stop()
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    load_config(args.config)
    _check_capture_dir(args.capture)
    return run_command(_cluster_up(args), server=True)


# -- pub / sub ------------------------------------------------------------------------


async def _connect(agent: AgentClient, config: str) -> None:
    where = ", ".join(f"{h}:{p}" for h, p in agent.addresses)
    log.debug("connecting to %s", where)
    try:
        await agent.connect(timeout=CONNECT_TIMEOUT)
    except TimeoutError:
        raise CommandFailed(
            f"no node answers at {where} within {CONNECT_TIMEOUT:.0f}s: is the cluster up? "
            f"(`overlay cluster up {config}`)"
        ) from None


async def _close_agent(agent: AgentClient) -> None:
    await finish_within(agent.close(), CLOSE_TIMEOUT, "closing the connections")


def _stdin_events() -> list[str]:
    return [line.strip() for line in sys.stdin if line.strip()]


async def _pub(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    events = args.events or _stdin_events()
    failed = 0
    # The routing agent (SPEC §12) over every node, or the one --node names.
    agent = AgentClient(_addresses(cfg, args.node), client_id="overlay-pub", settings=load_agent_settings(args.config))
    try:
        await _connect(agent, args.config)
        for i, text in enumerate(events):
            # --rank R is the first event's; the next ones follow it (R+1, R+2, …).
            rank = args.rank + i if args.rank else 0
            try:
                event_id = await agent.publish(text, key=args.key, rank=rank)
                print(json.dumps({"event_id": event_id, "event": text}), flush=True)
            except OverlayError as exc:
                failed += 1
                print(f"error: event {i + 1}: {_one_line(exc)}", file=sys.stderr)
            except TimeoutError:
                failed += 1
                print(f"error: event {i + 1}: no node acknowledged it in time", file=sys.stderr)
    finally:
        await _close_agent(agent)
    return EXIT_FAILED if failed else EXIT_OK


def _check_events(cfg: ClusterConfig, events: Sequence[str], source: str) -> None:
    for i, text in enumerate(events):
        try:
            parse_event(text, cfg.schema)
        except (ExpressionError, SchemaError) as exc:
            raise UsageError(f"{source} {i + 1}: {_one_line(exc)}") from None


def cmd_pub(args: argparse.Namespace) -> int:
    from overlay.client.connection import check_order

    if args.rank and not args.key:
        raise UsageError("--rank needs --key (ranks order the events of one key)")
    cfg = load_config(args.config)
    if args.node is not None:
        config_node(cfg, args.node)
    if args.events:
        _check_events(cfg, args.events, "event")
    else:  # read before the event loop starts: Ctrl-C ends a blocked read at once
        args.events = _stdin_events()
        if not args.events:
            raise UsageError("no events: give them as arguments, or one per line on stdin")
        _check_events(cfg, args.events, "stdin line")
    try:
        check_order(args.key, args.rank + len(args.events) - 1 if args.rank else 0)
    except LocalProtocolError as exc:
        raise UsageError(str(exc)) from None
    return run_command(_pub(args))


async def _notes(sub: Any, count: int | None) -> None:
    n = 0
    async for note in sub:
        line: dict[str, Any] = {"event_id": note.event_id, "event": note.event, "subscriptions": list(note.sub_ids)}
        if note.key:  # an ordered event: its sequence key and rank
            line |= {"key": note.key, "rank": note.rank}
        print(json.dumps(line), flush=True)
        n += 1
        if count and n >= count:
            return


async def _sub(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    # Held on two access nodes (one for a group) and moved when one is lost (SPEC §12).
    agent = AgentClient(_addresses(cfg, args.node), client_id="overlay-sub", settings=load_agent_settings(args.config))
    try:
        await _connect(agent, args.config)
        try:
            sub = await agent.subscribe(args.expression, group=args.group, weight=args.weight)
        except (TimeoutError, ConnectionLost) as exc:
            raise CommandFailed(f"no node took the subscription: {_one_line(exc) or 'timed out'}") from None
        homes = sorted(cfg.nodes[i].id if args.node is None else args.node for i in sub.homes)
        print(
            json.dumps({"subscribed": args.expression, "nodes": homes, "group": args.group}),
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(TimeoutError):  # --seconds are over
            await asyncio.wait_for(_notes(sub, args.count), args.seconds)
        # Acknowledged by the nodes; a node that is gone drops the session's
        # subscriptions with the connection anyway.
        await finish_within(sub.close(), CLOSE_TIMEOUT, "unsubscribing")
    finally:
        await _close_agent(agent)
    return EXIT_OK


def cmd_sub(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.node is not None:
        config_node(cfg, args.node)
    try:
        parse_subscription(args.expression, cfg.schema)
    except (ExpressionError, SchemaError) as exc:
        raise UsageError(f"expression: {_one_line(exc)}") from None
    return run_command(_sub(args))


# -- status / channel ------------------------------------------------------------------


# How long `overlay status` waits for one node's admin endpoint: a node that
# takes longer is as good as down to an operator looking at the table.
STATUS_TIMEOUT: Final = 3.0


async def _client_status(n: NodeConfig) -> tuple[dict[str, Any] | None, str]:
    """A node without an admin port in the config (0: ephemeral) is asked over
    the client protocol instead."""
    c = Client([(n.host, n.port)], client_id="overlay-status", reconnect=False)
    try:
        await c.connect(timeout=2)
        return await c.admin("status", timeout=5), ""
    except (OSError, OverlayError, TimeoutError) as exc:
        return None, f"down: {n.host}:{n.port} does not answer ({type(exc).__name__})"
    finally:
        await finish_within(c.close(), CLOSE_TIMEOUT, f"closing {n.host}:{n.port}")


async def _http_status(http: aiohttp.ClientSession, n: NodeConfig) -> tuple[dict[str, Any] | None, str]:
    url = admin_url(n.host, n.admin_port)
    try:
        async with http.get(f"{url}/status") as resp:
            if resp.status != 200:
                return None, f"{url} answered HTTP {resp.status}"
            return await resp.json(), ""
    except aiohttp.ClientConnectorError:
        return None, f"down: nothing listens on {url}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return None, f"down: {url} did not answer ({type(exc).__name__})"


async def node_statuses(cfg: ClusterConfig) -> list[tuple[dict[str, Any] | None, str]]:
    """Every node's ``/status`` from its admin endpoint, or why there is none."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT)) as http:
        return list(
            await asyncio.gather(*(_http_status(http, n) if n.admin_port else _client_status(n) for n in cfg.nodes))
        )


async def _statuses(cfg: ClusterConfig) -> list[dict[str, Any] | None]:
    return [st for st, _ in await node_statuses(cfg)]


def _level_bar(x: float, top: float, width: int = 10) -> str:
    filled = min(width, round(width * x / top)) if top > 0 else 0
    return "█" * filled + "·" * (width - filled)


def format_status(
    cfg: ClusterConfig, statuses: Sequence[dict[str, Any] | None], reasons: Sequence[str] | None = None
) -> str:
    """One line per node (state, load level dc, channels, S/dc̄ as it sees it),
    a cluster line, then the routing table."""
    reasons = list(reasons or [""] * len(statuses))
    levels = [st["dc"] for st in statuses if st]
    top = max(levels, default=0.0)
    rows = [f"{'node':>4}  {'admin':<22} {'state':<11} {'load level dc':<21} {'channels':>8} {'subs':>6} {'S/dc̄':>6}"]
    for n, st, why in zip(cfg.nodes, statuses, reasons):
        where = admin_url(n.host, n.admin_port) if n.admin_port else f"{n.host}:{n.port}"
        if st is None:
            rows.append(f"{n.id:>4}  {where:<22} {why or 'down'}")
            continue
        ratio = st.get("spread_ratio")
        if ratio is None and st.get("spread") is not None and st.get("mean_dc"):
            ratio = st["spread"] / st["mean_dc"]
        subs = st.get("subscriptions", sum(c.get("subscriptions", 0) for c in st["channels"]))
        rows.append(
            f"{n.id:>4}  {where:<22} {st['state']:<11} {_level_bar(st['dc'], top)} {st['dc']:>10.1f} "
            f"{len(st['channels']):>8} {subs:>6} {'–' if ratio is None else f'{ratio:.3f}':>6}"
        )
    up = [st for st in statuses if st]
    line = f"cluster {cfg.cluster.name!r}: {len(up)}/{len(statuses)} nodes answer"
    if up:
        mean = sum(levels) / len(levels)
        spread = (sum((x - mean) ** 2 for x in levels) / len(levels)) ** 0.5
        line += f", {len(up[0]['routing'])} channels, dc̄ {mean:.1f}, S/dc̄ {spread / mean if mean else 0.0:.3f}"
    rows.append(line)
    if up:
        rows.append("routing table:")
        for r in up[0]["routing"]:
            rows.append(f"  {r['id']:<8} node {','.join(map(str, r['owners'])):<6} {r['space']}")
    return "\n".join(rows)


async def _status(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    answers = await node_statuses(cfg)
    print(format_status(cfg, [st for st, _ in answers], [why for _, why in answers]))
    return EXIT_OK if all(st for st, _ in answers) else EXIT_FAILED


def cmd_status(args: argparse.Namespace) -> int:
    load_config(args.config)
    return run_command(_status(args))


async def _owner_of(cfg: ClusterConfig, channel: str) -> int:
    for st in await _statuses(cfg):
        if st:
            for r in st["routing"]:
                if r["id"] == channel:
                    return int(r["owners"][0])
            known = ", ".join(r["id"] for r in st["routing"])
            raise UsageError(f"channel {channel} does not exist (channels: {known})")
    raise CommandFailed(f"no node of {cfg.path} answers: is the cluster up?")


def _cut_value(cfg: ClusterConfig, attr_name: str, text: str) -> int | float:
    """``--at`` as a value of the attribute's kind, inside its domain."""
    attr = cfg.schema.attribute(attr_name)
    try:
        if attr.kind is Kind.RFID:
            value: int | float = parse_rfid(text) if "." in text else int(text)
        elif attr.kind is Kind.INT:
            value = int(text)
        else:
            value = float(text)
    except ValueError:
        kind = "an integer" if attr.kind is Kind.INT else "a number" if attr.kind is Kind.FLOAT else "an rfid code"
        raise UsageError(f"--at {text!r}: {attr_name} takes {kind}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"--at {text!r} is not a finite number")
    attr.check(value)
    return value


def _channel_args(cfg: ClusterConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The admin command and its arguments, checked against the config."""
    chid = args.channel
    node, _, seq = chid.partition(".")
    if not (node.isdecimal() and seq.isdecimal()):
        raise UsageError(f"channel ids look like NODE.SEQ (e.g. 0.0), got {chid!r}")
    if args.action == "place":
        if args.node is None:
            raise UsageError("place needs --node N: the node to move the channel to")
        if args.attr or args.at is not None or args.values:
            raise UsageError("place takes --node only (--attr, --at, --values are for split)")
        config_node(cfg, args.node)
        return "place", {"channel": chid, "node": args.node}
    if args.node is not None:
        raise UsageError("split takes --attr with --at or --values, not --node")
    if not args.attr:
        raise UsageError(f"split needs --attr, one of {', '.join(cfg.schema.da)}")
    try:
        attr = cfg.schema.attribute(args.attr)
        if attr.kind is Kind.STRING:
            if args.at is not None or not args.values:
                raise UsageError(f"{args.attr} is a string attribute: split it with --values a,b (not --at)")
            return "split", {"channel": chid, "attr": args.attr, "values": args.values.split(",")}
        if args.values or args.at is None:
            raise UsageError(f"{args.attr} is an ordered attribute: split it with --at VALUE (not --values)")
        return "split", {"channel": chid, "attr": args.attr, "at": _cut_value(cfg, args.attr, args.at)}
    except SchemaError as exc:
        raise UsageError(str(exc)) from None


async def _channel(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    command, kw = _channel_args(cfg, args)
    owner = await _owner_of(cfg, args.channel)
    from overlay.membership_cli import admin_token  # (it imports this module)

    c = Client(_addresses(cfg, owner), client_id="overlay-admin", reconnect=False, token=admin_token(args.token, cfg))
    try:
        try:
            await c.connect(timeout=CONNECT_TIMEOUT)
        except TimeoutError:
            raise CommandFailed(f"node {owner}, the owner of {args.channel}, does not answer") from None
        print(describe_channel_result(command, await c.admin(command, **kw)), flush=True)
    finally:
        await finish_within(c.close(), CLOSE_TIMEOUT, "closing the connection")
    return EXIT_OK


def describe_channel_result(command: str, result: dict[str, Any]) -> str:
    """What ``channel split``/``place`` did, in one line of plain words."""
    if command == "split" and "children" in result:
        kids = " and ".join(f"{c['id']} ({c['space']}, {c['subscriptions']} subscriptions)" for c in result["children"])
        return f"channel {result['split']} split on {result['attr']} into {kids}, on node {result['node']}"
    if command == "place" and result.get("moved") is False:
        return str(result.get("note", f"channel {result.get('channel')} stays where it is"))
    if command == "place":
        return (
            f"channel {', '.join(result.get('channels', []))} moved to node {result.get('receiver')}: "
            f"{result.get('subscriptions_moved', 0)} subscriptions, {result.get('bytes', 0)} bytes"
        )
    return json.dumps(result)


def cmd_channel(args: argparse.Namespace) -> int:
    _channel_args(load_config(args.config), args)
    return run_command(_channel(args))


def cmd_replay(args: argparse.Namespace) -> int:
    run = Path(args.run_dir)
    if not run.is_dir():
        raise UsageError(f"{run} is not a directory{'' if run.exists() else ' (it does not exist)'}")
    if not any(run.glob("node-*.ndjson")):
        raise UsageError(f"{run} holds no capture (node-*.ndjson): `overlay cluster up F --capture {run}` makes one")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    from overlay_spark.replay import run_from_args

    return run_from_args(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from overlay.demo import run_demo

    load_config(args.config)
    return run_command(run_demo(args.config, args.seconds, args.log_level), server=True)


# -- parser ---------------------------------------------------------------------------


def _version() -> str:
    try:
        return importlib.metadata.version("overlay")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        from overlay import __version__

        return __version__


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (rule 1): the usage it prints first
    is long for commands with many options, and ``--help`` shows it anyway."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


EXIT_CODES: Final = """\
exit codes:
  0    done (a server — node, cluster up, demo — also after Ctrl-C or SIGTERM)
  1    the cluster or the machine failed the command (no node answers, a node
       died, a port is taken, an event was refused, a replay check failed)
  2    a bad argument or config file (one line on stderr says which)
  130  a client command (pub, sub, status, channel, node drain) ended by Ctrl-C
  143  the same, ended by SIGTERM
Ctrl-C ends a client command within 2 s, whatever the cluster does."""

EXAMPLES: Final = {
    "overlay": """\
examples:
  overlay cluster up cluster_configs/local.toml
  overlay sub --config cluster_configs/local.toml 'price < 100 and sym = "IBM"'
  overlay pub --config cluster_configs/local.toml '{price: 42.5, sym: "IBM", qty: 10}'
  overlay status --config cluster_configs/local.toml
  overlay COMMAND --help        (each command's options and examples)""",
    "node": """\
examples:
  overlay node --config cluster_configs/local.toml --id 0
  overlay node join --config grown.toml --id 3      (node 3 joins the running nodes of grown.toml)
  overlay node drain 1 --config cluster_configs/local.toml
  overlay node --config F --id 0 --capture runs/x   (record what the node handles, for replay)

Ctrl-C or SIGTERM stops the node cleanly (exit 0); a second one at once.  `node drain`
waits for the drain: Ctrl-C ends the wait within 2 s (exit 130; 143 for SIGTERM).""",
    "cluster": """\
examples:
  overlay cluster up cluster_configs/local.toml                 (until Ctrl-C)
  overlay cluster up cluster_configs/hetero5.toml --duration 60 --traffic --capture runs/x
  overlay replay runs/x

Starts nothing when a configured port is taken (it names the process holding
it); stops every node and exits 1 when one of them dies.  Ctrl-C or SIGTERM
stops every node cleanly (exit 0); a second Ctrl-C kills them.""",
    "pub": """\
examples:
  overlay pub --config cluster_configs/local.toml '{price: 42.5, sym: "IBM", qty: 10}'
  overlay pub --config F --node 1 '{price: 1, sym: "A"}' '{price: 2, sym: "B"}'
  overlay pub --config F --key order-17 --rank 1 '{price: 1, sym: "A"}' '{price: 2, sym: "A"}'
  generate-events | overlay pub --config F                      (one event per line)

Prints one JSON line per accepted event: {"event_id": …, "event": …}.
Ctrl-C ends it within 2 s (exit 130; 143 for SIGTERM).""",
    "sub": """\
examples:
  overlay sub --config cluster_configs/local.toml 'price < 100 and sym = "IBM"'
  overlay sub --config F 'sym prefix "A"' --count 10 --seconds 30
  overlay sub --config F 'qty > 1000' --group workers --weight 2

Prints one JSON line per notification on stdout, the subscription's homes on stderr.
Ctrl-C ends it within 2 s, even when the cluster is gone (exit 130; 143 for SIGTERM).""",
    "status": """\
examples:
  overlay status --config cluster_configs/local.toml

Exits 1 when a node does not answer; Ctrl-C ends it within 2 s (exit 130).""",
    "channel": """\
examples:
  overlay channel split 0.0 --config cluster_configs/local.toml --attr price --at 500
  overlay channel split 0.1 --config F --attr sym --values IBM,AAPL
  overlay channel place 0.2 --config F --node 2

Channel ids and owners: `overlay status --config F`.  Ctrl-C ends the wait
within 2 s (exit 130); the node may still carry the command out.""",
    "demo": """\
examples:
  overlay demo cluster_configs/local.toml                       (what `make run` does)
  overlay demo cluster_configs/hetero5.toml --seconds 120

Ctrl-C stops the traffic and every node cleanly (exit 0).""",
    "replay": """\
examples:
  overlay cluster up cluster_configs/hetero5.toml --capture runs/x --duration 60 --traffic
  overlay replay runs/x                                         (writes runs/x/report/)
  overlay replay runs/x --master spark://host:7077 --out /tmp/report

Exits 1 when a validation fails, 2 when the capture cannot be read.""",
}


def _add(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, epilog=EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="overlay",
        description="content-based pub/sub overlay",
        epilog=EXAMPLES["overlay"] + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    p.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        help="log level (default info); debug also shows the traceback of an internal error",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    n = _add(sub, "node", "run one node; `node join` (a new node), `node drain N` (empty node N)")
    n.add_argument(
        "action", nargs="?", choices=["join", "drain"], help="join: run --id N joining a running cluster; drain N"
    )
    n.add_argument("target", nargs="?", type=_node_id, help="drain: the node to drain")
    n.add_argument("--config", required=True)
    n.add_argument("--id", type=_node_id, default=None)
    n.add_argument(
        "--token", default=None, help="drain: admin token (default: $OVERLAY_ADMIN_TOKEN, then the config's)"
    )
    n.add_argument("--timeout", type=_positive_float, default=300.0, help="drain: seconds to wait for it to finish")
    n.add_argument("--capture", metavar="DIR", help="write this node's capture to DIR (overrides cluster.capture_dir)")
    n.set_defaults(func=cmd_node)

    c = _add(sub, "cluster", "run every node of a config locally")
    c.add_argument("action", choices=["up"])
    c.add_argument("config")
    c.add_argument("--duration", type=_positive_float, default=None, help="stop after this many seconds")
    c.add_argument(
        "--capture", metavar="DIR", help="every node captures to DIR (one file per node), for `overlay replay DIR`"
    )
    c.add_argument("--traffic", action="store_true", help="drive the demo workload (make run's) until the end")
    c.set_defaults(func=cmd_cluster)

    pb = _add(sub, "pub", "publish events (arguments, or one per stdin line)")
    pb.add_argument("--config", required=True)
    pb.add_argument(
        "--node", type=_node_id, default=None, help="only this access node (default: the routing agent picks)"
    )
    pb.add_argument(
        "--key",
        default="",
        help="sequence key: events with one key arrive in order (docs/concepts.md#ordered-delivery-per-key)",
    )
    pb.add_argument("--rank", type=_positive_int, default=0, help="explicit rank of the first event (needs --key)")
    pb.add_argument("events", nargs="*")
    pb.set_defaults(func=cmd_pub)

    sb = _add(sub, "sub", "subscribe and print notifications as JSON lines")
    sb.add_argument("--config", required=True)
    sb.add_argument(
        "--node", type=_node_id, default=None, help="only this access node (default: any two, with failover)"
    )
    sb.add_argument("expression")
    sb.add_argument(
        "--group",
        default="",
        help="join this subscriber group: one instance gets each event (docs/concepts.md#subscriber-groups)",
    )
    sb.add_argument("--weight", type=_positive_float, default=1.0, help="static weight Ws within the group")
    sb.add_argument("--count", type=_positive_int, default=None, help="stop after this many notifications")
    sb.add_argument("--seconds", type=_positive_float, default=None, help="stop after this many seconds")
    sb.set_defaults(func=cmd_sub)

    st = _add(sub, "status", "show the cluster")
    st.add_argument("--config", required=True)
    st.set_defaults(func=cmd_status)

    ch = _add(sub, "channel", "operator commands on channels: split one, place one on a node")
    ch.add_argument("action", choices=["split", "place"])
    ch.add_argument("channel", help="channel id, e.g. 0.0")
    ch.add_argument("--config", required=True)
    ch.add_argument("--attr", help="split: attribute to cut")
    ch.add_argument("--at", help="split: cut an ordered attribute after this value")
    ch.add_argument("--values", help="split: comma-separated string values for the new type-1 child")
    ch.add_argument("--node", type=_node_id, help="place: the receiving node")
    ch.add_argument("--token", default=None, help="admin token (default: $OVERLAY_ADMIN_TOKEN, then the config's)")
    ch.set_defaults(func=cmd_channel)

    d = _add(sub, "demo", "local cluster with bounded demo traffic, shown live (make run)")
    d.add_argument("config")
    d.add_argument("--seconds", type=_positive_float, default=60.0, help="stop after this many seconds (default 60)")
    d.set_defaults(func=cmd_demo)

    rp = _add(sub, "replay", "replay a run's capture on Spark: spread, migrations, re-matching, audit")
    rp.add_argument("run_dir", help="directory holding the run's node-*.ndjson files")
    rp.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    rp.add_argument("--out", default=None, help="report directory (default RUN_DIR/report)")
    rp.add_argument(
        "--tail-guard",
        type=_non_negative_float,
        default=None,
        help="seconds before the first node stopped whose events the loss checks skip (default: one slice)",
    )
    rp.add_argument("--partitions", type=_positive_int, default=8, help="Spark shuffle partitions")
    rp.add_argument("--quiet", action="store_true", help="no progress lines")
    rp.set_defaults(func=cmd_replay)
    return p


# -- main (rule 3) ----------------------------------------------------------------------

# Errors of the user's making: the command line, the config file, an
# expression or a value that does not fit the schema.
USAGE_ERRORS: Final = (UsageError, ConfigError, ExpressionError, SchemaError, LocalProtocolError)


def _report(exc: OverlayError) -> int:
    print(f"overlay: {_one_line(exc)}", file=sys.stderr)
    for line in getattr(exc, "details", ()):
        print(line, file=sys.stderr)
    return EXIT_USAGE if isinstance(exc, USAGE_ERRORS) else EXIT_FAILED


def _stdout_gone() -> int:
    """stdout was closed under us (``overlay sub … | head``): say nothing more,
    and keep the interpreter's final flush from failing on it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C outside an event loop (loading, reading stdin)
        return EXIT_SIGNAL_BASE + signal.SIGINT
    except BrokenPipeError:
        return _stdout_gone()
    except OverlayError as exc:
        return _report(exc)
    except TimeoutError:
        print("overlay: timed out waiting for the cluster", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"overlay: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        if args.log_level == "debug":
            raise
        cause = _first_cause(exc)
        print(
            f"overlay: internal error: {type(cause).__name__}: {_one_line(cause)} (--log-level debug shows where)",
            file=sys.stderr,
        )
        return EXIT_FAILED
