"""Who holds a port (rule 4 of ``overlay.cli``): ``cluster up``, ``demo`` and
``node`` bind-test every configured port before starting anything, and a
taken one is named with the process holding it (found in /proc, Linux)."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from overlay.cli.running import CommandFailed
from overlay.config import NodeConfig

__all__ = ["check_ports_free", "held_by", "port_holders"]

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


def held_by(port: int) -> str:
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
                    raise CommandFailed(f"{where} is taken {held_by(port)}") from None
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
