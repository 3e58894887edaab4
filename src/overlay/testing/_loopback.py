"""Loopback sockets, bounded condition waits, and "nothing left to do" on real nodes.

Rules this module keeps:

1. A socket handed to a node is bound (and listening) before the node or the
   cluster config exists, so its port is known and no other process can take
   it in between.  ``free_ports`` is for node *processes*, which bind their
   own port (a socket cannot be handed over) — after it returned, and again
   when a killed node restarts.  A port free just now could be taken in
   between: the kernel hands out ports of its ephemeral range to every
   ``connect`` and ``bind(0)`` of the machine (a busy test suite makes
   thousands), and one of them took a node's port (``test_node_failures``,
   under load).  So ``free_ports`` takes ports *outside* that range, which
   the kernel never hands out, and reserves each one for the life of this
   process with a lock file that every ``free_ports`` of the machine
   respects (``PORT_LOCKS``): no other test process gets it, and the
   kernel gives it to no one.
2. Every wait is bounded and polls a condition: a loaded machine only makes
   the condition come later, never makes a test pass on a guess.
3. How test nodes talk (SPEC §16): plain TCP with the cluster secret
   (``insecure_tls``) unless a test asks for TLS (``dev_tls``): development
   certificates made once per process in a temporary directory (gone at
   exit), for every node id asked so far — a few milliseconds each.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Final

import msgspec

from overlay.config import TlsSettings
from overlay.net.node import Node

HOST: Final = "127.0.0.1"
# Connections a listening socket holds before they are accepted: a bench's
# burst of publishers connecting at once is never refused.
BACKLOG: Final = 512
# How long a harness operation (a node starting, a cluster ready) may take
# before it is a failure: seconds, generous for a loaded 2-core machine.
WAIT: Final = 10.0
# Between two polls of a condition: short next to any test's bound, long
# enough that polling costs the nodes sharing the loop next to nothing.
POLL: Final = 0.005
# Rule 1: the lock files reserving free_ports' ports (one per port, machine-wide);
# where its ports come from — from PORTS_FROM to the end of the port space, less
# the kernel's ephemeral range (Linux's is read from EPHEMERAL_RANGE; elsewhere
# none is known, so ASSUMED_EPHEMERAL is: Linux's default, and it holds the
# IANA range that BSDs use) — and how many ports it tries before it gives up.
PORT_LOCKS: Final = Path(tempfile.gettempdir()) / "overlay-test-ports"
EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORTS_FROM: Final = 10_000
ASSUMED_EPHEMERAL: Final = (32_768, 65_535)
PORT_TRIES: Final = 2_000
# Rule 1: port -> the descriptor of its lock, held until this process exits.
_reserved: dict[int, int] = {}


# Rule 3: the secret of every insecure test cluster (never a real one's).
LOOPBACK_SECRET: Final = "loopback test cluster secret"
_certs_dir: Path | None = None


def insecure_tls(secret: str = LOOPBACK_SECRET) -> TlsSettings:
    """Rule 3: plain TCP, peers proving ``secret``."""
    return TlsSettings(insecure=True, secret=secret)


def dev_tls(ids: Iterable[int], host: str = "127.0.0.1") -> TlsSettings:
    """Rule 3: TLS with this process's development certificates, made for ``ids`` if new."""
    from overlay.security.certs import make_dev_certs  # cryptography: only for the tests that ask

    global _certs_dir
    if _certs_dir is None:
        _certs_dir = Path(tempfile.mkdtemp(prefix="overlay-test-certs-"))
        atexit.register(shutil.rmtree, _certs_dir, True)
    make_dev_certs(_certs_dir, [(i, host) for i in ids])
    d = _certs_dir
    return TlsSettings(
        ca=str(d / "ca.pem"),
        cert=str(d / "node-{id}.pem"),
        key=str(d / "node-{id}.key"),
        client_cert=str(d / "client.pem"),
        client_key=str(d / "client.key"),
    )


def tls_toml(tls: TlsSettings) -> str:
    """``tls`` as a ``[tls]`` table of a config file (the keys that differ from the defaults)."""
    default = TlsSettings()
    lines = ["[tls]"]
    for key, value in msgspec.to_builtins(tls).items():
        if value != getattr(default, key):
            lines.append(f"{key} = {json.dumps(value)}")  # JSON strings and booleans are TOML's too
    return "\n".join(lines) + "\n"


def with_tls_table(text: str, tls: TlsSettings) -> str:
    """A config file's ``text`` with its ``[tls]`` table replaced by ``tls``'s
    (added when it has none): a copy of a shipped config, for a test cluster's
    command line."""
    table = tls_toml(tls) + "\n"
    replaced, n = re.subn(r"(?ms)^\[tls\]\n.*?(?=^\[|\Z)", lambda _: table, text)
    return replaced if n else text.rstrip("\n") + "\n\n" + table


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports for the configs of node processes, free
    now and reserved for the life of this process (rule 1): outside the
    kernel's ephemeral range, locked against every other ``free_ports``."""
    start, end = _ephemeral_range()
    below, above = range(PORTS_FROM, start), range(end + 1, 65_536)
    ports = below if len(below) >= len(above) else above
    if len(ports) < 10 * n:
        raise RuntimeError(
            f"only {len(ports)} ports lie outside the kernel's ephemeral range {start}-{end} ({EPHEMERAL_RANGE}): "
            f"too few to reserve {n}; narrow the range (sysctl net.ipv4.ip_local_port_range)"
        )
    return reserve_ports(n, (random.choice(ports) for _ in range(PORT_TRIES)))


def reserve_ports(n: int, candidates: Iterable[int]) -> list[int]:
    """The first ``n`` of ``candidates`` that this process can reserve (rule 1):
    its lock taken (no other process holds it) and the port free to bind now."""
    PORT_LOCKS.mkdir(mode=0o777, exist_ok=True)
    out: list[int] = []
    for port in candidates:
        if port in _reserved or port in out:
            continue
        fd = os.open(PORT_LOCKS / str(port), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released only when this process ends
            with socket.socket() as s:
                # As the node binds it: a port whose last connections linger in TIME_WAIT is free.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((HOST, port))
        except OSError:  # another process's port (its lock, or bound by something else)
            os.close(fd)
            continue
        _reserved[port] = fd
        out.append(port)
        if len(out) == n:
            return out
    raise RuntimeError(f"found {len(out)} of {n} free ports to reserve (locks in {PORT_LOCKS})")


def _ephemeral_range() -> tuple[int, int]:
    """The first and last port the kernel hands out by itself (rule 1)."""
    with contextlib.suppress(OSError, ValueError):
        start, end = EPHEMERAL_RANGE.read_text().split()
        return int(start), int(end)
    return ASSUMED_EPHEMERAL


def bound_socket(port: int = 0, *, listen: bool = True, sndbuf: int | None = None) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:``port`` (0: an ephemeral one), to hand
    to a ``Node`` (rule 1).  ``listen=False`` leaves it bound but refusing
    connections: a peer that is down until the test listens on it itself.
    ``sndbuf`` sets the send buffer, which the sockets it accepts inherit
    (Linux): small buffers make a slow reader visible at once."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # A restarted node takes its port back while connections of its last run linger in TIME_WAIT.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sndbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        s.bind((HOST, port))
        if listen:
            s.listen(BACKLOG)
    except BaseException:
        s.close()
        raise
    return s


async def wait_until(
    cond: Callable[[], object], timeout: float = WAIT, what: str = "condition", step: float = POLL
) -> None:
    """Return once ``cond()`` is true; ``AssertionError`` naming ``what`` if it
    is still false after ``timeout`` seconds (rule 2).  For state that has no
    event of its own to await."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(step)


async def wait_progressing(
    cond: Callable[[], object],
    progress: Callable[[], object],
    stall: float = WAIT,
    what: str = "condition",
    timeout: float = 600.0,
) -> None:
    """Return once ``cond()`` is true; ``AssertionError`` naming ``what`` once
    ``progress()`` (e.g. the notifications received so far) did not change
    for ``stall`` seconds, or after ``timeout`` (rule 2).  For work of a size
    the test does not bound in time (traffic until a moment, then its
    backlog): a loaded machine slows the progress, only a stall fails."""
    start = time.monotonic()
    seen, since = progress(), start
    while True:
        if cond():
            return
        if (now := time.monotonic()) - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (progress: {seen!r})")
        if (current := progress()) != seen:
            seen, since = current, now
        elif now - since > stall:
            raise AssertionError(f"no progress for {stall}s waiting for {what} (stuck at {seen!r})")
        await asyncio.sleep(POLL)


def nodes_quiet(nodes: Iterable[Node], peers: Collection[int] | None = None) -> bool:
    """Nothing left to do on any of these running nodes: no inbound message
    queued, nothing queued for a client or for a connected peer (of
    ``peers`` only, when given: a silent or dead peer's queue never drains),
    no balancing session and no (un)subscription open.  What a test waits for
    before it compares counters, instead of pausing for a guess at how long
    the rest takes."""
    for n in nodes:
        if len(n.inbox) or any(len(w.queue) for w in n.clients.values()):
            return False
        for p, link in n.links.items():
            if (peers is None or p in peers) and link.connected.is_set() and len(link.queue):
                return False
        core = n.core
        if not core.settled():  # no migration session, no (un)subscription waiting
            return False
    return True
