"""A node's client connections against its process's file descriptors (SPEC §16: every connection bounded).

Rules this module keeps:

1. A process that runs a node raises its soft ``RLIMIT_NOFILE`` to the hard
   limit at start (``raise_descriptor_limit``): many systems start a
   process at 1024, far below ``[limits] max_clients`` (10,000), and past
   the soft limit ``accept`` fails for everybody — peers, the admin
   endpoint, capture files — not only for clients.
2. ``client_cap``: a node admits at most the client connections its
   descriptors leave after ``reserve`` (``reserve_for``: each peer's links
   both ways, the admin endpoint's ``http_max_connections``, the listening
   sockets, log and capture files).  Where the limit is still below
   ``max_clients`` plus that reserve, ``max_clients`` is lowered to fit, and
   the node says so at start: a stranger's connections then fill the client
   count (refused ``too_many_connections``, counted), not the process.
3. ``client_cap`` is pure (numbers in, a number out); only
   ``raise_descriptor_limit`` and ``descriptor_limit`` touch the process.
"""

from __future__ import annotations

import resource
from typing import Final

__all__ = ["RESERVE_EXTRA", "client_cap", "descriptor_limit", "raise_descriptor_limit", "reserve_for"]

# Rule 2: the listening sockets, the event loop's own, log and capture files, a margin.
RESERVE_EXTRA: Final = 64
# Rule 1: the target where the hard limit is unlimited (Linux's own ceiling, nr_open, is 2^20 by default).
UNLIMITED_TARGET: Final = 1 << 20


def reserve_for(nodes: int, http_max_connections: int) -> int:
    """Rule 2: descriptors a node needs besides its clients'."""
    return 2 * nodes + http_max_connections + RESERVE_EXTRA


def client_cap(max_clients: int, descriptors: int, reserve: int) -> int:
    """Rule 2: ``max_clients`` (0: no limit), lowered to the descriptors left after ``reserve`` (at least 1)."""
    room = max(1, descriptors - reserve)
    return room if not max_clients or max_clients > room else max_clients


def descriptor_limit() -> int:
    """The process's soft ``RLIMIT_NOFILE``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else UNLIMITED_TARGET


def raise_descriptor_limit() -> tuple[int, int]:
    """Rule 1: the soft limit raised to the hard one; (before, after).  A
    limit the process may not raise is left as it is (rule 2 copes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else UNLIMITED_TARGET
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target
