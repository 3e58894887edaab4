"""Where the routing agent may place a subscription next: AgentClient rule 6 (sans-IO).

No clock is read here; ``now`` is given.  Rules:

1. A node that failed to take a subscription (no answer in time, not
   ready, refused) is tried again only after a pause that grows with its
   failures — ``PLACE_BACKOFF·2^k`` after the k-th, at most
   ``PLACE_BACKOFF_MAX`` — and at most ``MAX_PLACE_ATTEMPTS`` times per
   connection to it: placing never spins.
2. A new connection to the node starts afresh: it is a new session.
3. A success forgets the node's failures for that subscription.
4. A subscription with no home is given up once every connected node has
   used up its attempts on it.

Invariant: ``_failures`` only holds (subscription, node) pairs that failed
since their last success, each with the connection count it failed on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["MAX_PLACE_ATTEMPTS", "PLACE_BACKOFF", "PLACE_BACKOFF_MAX", "Placements"]

MAX_PLACE_ATTEMPTS: Final = 8
PLACE_BACKOFF: Final = 0.1
PLACE_BACKOFF_MAX: Final = 5.0


class Placements:
    """Rules 1–4 over every subscription of one routing agent."""

    def __init__(self) -> None:
        # (sub id, node index) -> (failures, retry not before, connection count then)
        self._failures: dict[tuple[str, int], tuple[int, float, int]] = {}

    def may_try(self, sub_id: str, node: int, conn: int, now: float) -> bool:
        """Rules 1, 2: whether ``node`` (on its connection ``conn``) may be tried now."""
        failed = self._failures.get((sub_id, node))
        if failed is None:
            return True
        count, retry_at, then = failed
        if then != conn:
            del self._failures[(sub_id, node)]
            return True
        return count < MAX_PLACE_ATTEMPTS and now >= retry_at

    def failed(self, sub_id: str, node: int, conn: int, now: float) -> int:
        """Rule 1: one more failure; returns how many on this connection."""
        count = self._failures.get((sub_id, node), (0, 0.0, 0))[0] + 1
        pause = min(PLACE_BACKOFF_MAX, PLACE_BACKOFF * 2**count)
        self._failures[(sub_id, node)] = (count, now + pause, conn)
        return count

    def succeeded(self, sub_id: str, node: int) -> None:
        """Rule 3."""
        self._failures.pop((sub_id, node), None)

    def gave_up(self, sub_id: str, nodes: Iterable[int]) -> bool:
        """Rule 4: every one of ``nodes`` (the connected ones, at least one) used up its attempts."""
        nodes = list(nodes)
        return bool(nodes) and all(self._failures.get((sub_id, n), (0, 0.0, 0))[0] >= MAX_PLACE_ATTEMPTS for n in nodes)

    def forget(self, sub_id: str) -> None:
        """The subscription ended."""
        for key in [k for k in self._failures if k[0] == sub_id]:
            del self._failures[key]
