"""Every node of a config as a subprocess (rule 4 of ``overlay.cli``), for
``cluster up`` and ``demo``: started only on free ports, accepted as ready only
when its Welcome names the node and cluster of the config, and watched — a
node that exits is reported with its exit status and last lines of log.

What a death does once the cluster is ready is the caller's choice: by
default it fails the command (the others are stopped); with ``keep_going``
it is reported and the survivors keep running, so that an operator can
watch the cluster fail over — the command fails only when no node is left.
A death during start-up always fails it: there is no cluster to fail over yet."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import sys
from collections.abc import Awaitable
from typing import Final, TypeVar

from overlay.auth.keys import local_token
from overlay.cli.args import admin_url, cluster_tls
from overlay.cli.ports import check_ports_free, held_by
from overlay.cli.running import CLOSE_TIMEOUT, CommandFailed, log, print_error
from overlay.client import Client
from overlay.config import ClusterConfig, NodeConfig, load_config
from overlay.errors import OverlayError, RequestError, TlsError
from overlay.messages.client import ErrorCode
from overlay.security import node_security

__all__ = ["LocalCluster", "node_list", "ready_lines", "stopping_line", "wait_ready"]

T = TypeVar("T")

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
    being asked to is in ``deaths`` (its id -> who it was and how it ended).
    Without ``keep_going``, or during start-up, it also sets ``failure``
    (naming it, its exit status and its last ``TAIL_LINES`` lines of stderr)
    and wakes ``supervise``.  With ``keep_going``, once the cluster is ready,
    the same report goes to stderr at once and only the death of the last
    node sets ``failure`` (every death, in order).  Each node's stderr is
    forwarded to ours by its watcher task, which ``stop`` awaits.
    """

    def __init__(
        self, config_path: str, log_level: str = "info", *, capture: str | None = None, keep_going: bool = False
    ) -> None:
        self.config_path = config_path
        self.capture = capture  # every node captures to this run directory (SPEC §13)
        self.cfg = load_config(config_path)
        self.log_level = log_level
        self.keep_going = keep_going
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.tails: dict[int, _Tail] = {}
        self.deaths: dict[int, str] = {}  # in the order they happened
        self.failure: CommandFailed | None = None
        self.ready = False
        self._failed = asyncio.Event()
        self._stopping = False
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start every node and wait until each is ready and is ours; on any
        failure (or cancellation) the nodes started so far are stopped."""
        check_ports_free(self.cfg.nodes)
        for n in self.cfg.nodes:  # a missing certificate: one line now, not a node dying at start
            node_security(self.cfg, n.id)
        cluster_tls(self.cfg)
        try:
            for n in self.cfg.nodes:
                await self._spawn(n)
            await self.supervise(wait_ready(self.cfg, timeout))
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
        who = f"node {n.id} ({n.host}:{n.port}, pid {proc.pid}) {_exit_status(code)}"
        self.deaths[n.id] = who
        last_lines = [f"  | {line}" for line in tail.lines] or ["  | (it wrote nothing)"]
        if not (self.keep_going and self.ready):
            when = "while the cluster ran" if self.ready else "during start-up"
            self.failure = CommandFailed(f"{who} {when}; the other nodes are stopped. Its last lines:", last_lines)
            self._failed.set()
            return
        # --keep-going: the same report, now, and the survivors go on.
        report = CommandFailed(f"{who} while the cluster ran; {self._survivors()}. Its last lines:", last_lines)
        with contextlib.suppress(OSError, ValueError):  # our stderr is gone: the watching goes on
            print_error(report)
        if len(self.deaths) == len(self.cfg.nodes):
            self.failure = CommandFailed(f"no node is left: {'; '.join(self.deaths.values())}")
            self._failed.set()

    def _survivors(self) -> str:
        """Who keeps running, and whether they still serve: a cluster without a
        majority of its configured nodes refuses publishes and subscriptions."""
        alive = [n.id for n in self.cfg.nodes if n.id not in self.deaths]
        if not alive:
            return "no node is left"
        one = len(alive) == 1
        says = f"{node_list(alive)} {'keeps' if one else 'keep'} running (--keep-going)"
        total = len(self.cfg.nodes)
        if 2 * len(alive) <= total:
            says += (
                f", but {len(alive)} of {total} configured nodes {'is' if one else 'are'} no majority: "
                f"{'it refuses' if one else 'they refuse'} publishes and subscriptions (no_quorum) until more are back"
            )
        return says

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
        f"of {cfg.cluster.name!r}: another cluster holds that port (held {held_by(n.port)})"
    )


async def wait_ready(cfg: ClusterConfig, timeout: float) -> None:
    """Every node answers its clients, is the node of ``cfg`` (id and cluster
    name in its Welcome) and reports ready."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # With [auth], a Hello needs a token: one signed with the config's key (its subject is the client id).
    token = local_token(cfg, "overlay-cli", "subscribe", ttl=timeout + READY_CONNECT)
    tls = cluster_tls(cfg)
    for n in cfg.nodes:
        while True:
            c = Client([(n.host, n.port)], client_id="overlay-cli", reconnect=False, token=token, ssl=tls)
            try:
                await c.connect(timeout=READY_CONNECT)
                if c.node_id != n.id or c.cluster != cfg.cluster.name:
                    raise _not_ours(cfg, n, c)
                if c.ready:
                    break
            except CommandFailed:
                raise
            except RequestError as exc:
                if exc.code == ErrorCode.UNAUTHORIZED:  # it answers, and will never take our token
                    raise CommandFailed(
                        f"node {n.id} refused the token signed with [auth] signing_key: {exc.reason}"
                    ) from None
            except TlsError as exc:  # waiting will not mend a certificate
                raise CommandFailed(f"node {n.id}: {exc}") from None
            except (OSError, OverlayError, TimeoutError):
                pass  # not listening yet
            finally:
                await c.close()
            if loop.time() > deadline:
                raise CommandFailed(f"node {n.id} at {n.host}:{n.port} not ready after {timeout}s")
            await asyncio.sleep(READY_POLL)


def node_list(ids: list[int]) -> str:
    """``node 1``, ``nodes 0 and 2``, ``nodes 0, 1 and 3``."""
    if len(ids) == 1:
        return f"node {ids[0]}"
    return f"nodes {', '.join(map(str, ids[:-1]))} and {ids[-1]}"


def ready_lines(cluster: LocalCluster) -> list[str]:
    """One line per node: where it listens, its pid, its admin page."""
    lines = []
    for n in cluster.cfg.nodes:
        admin = f"  {admin_url(n.host, n.admin_port, cluster.cfg)}/" if n.admin_port else ""
        lines.append(f"  node {n.id}  {n.host}:{n.port}  pid {cluster.procs[n.id].pid}{admin}")
    return lines


def stopping_line(cluster: LocalCluster) -> str:
    """What the end of a run says: that the cluster stops, and which nodes
    had died before (``keep_going``) — the command then exits 0."""
    if cluster.failure is not None or not cluster.deaths:
        return "stopping the cluster…"
    return f"stopping the cluster… (died while it ran: {'; '.join(cluster.deaths.values())})"
