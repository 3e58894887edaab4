"""Which run of each node this node knows (``node.core`` rules 6, 7).

Every process run of a node has an incarnation (its start time in ms, given
by the shell); the subscription ids a run makes start with
``node.incarnation:`` (``context.sub_prefix``).  A peer's hello carries its
incarnation: a new one means it restarted, and what its previous run left
here — the subscriptions of its clients, which died with it — is stale.
So is what a run declared dead (or that left) made, wherever it comes from
later: its clients went with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from overlay.node.context import NodeContext, sub_prefix

__all__ = ["PeerRuns"]

log = logging.getLogger("overlay.node")


class PeerRuns:
    """The incarnation of each peer, from its hellos."""

    def __init__(self, ctx: NodeContext) -> None:
        self._ctx = ctx
        self._incarnation: dict[int, int] = {}
        # node -> its run declared dead (or that left): that run's clients are gone too.
        self._ended: dict[int, int] = {}

    def hello(self, node: int, incarnation: int) -> bool:
        """Note ``node``'s incarnation; True when it is a new run of a node
        known before (it restarted)."""
        known = self._incarnation.get(node)
        if not incarnation or known == incarnation:
            return False
        self._incarnation[node] = incarnation
        return known is not None

    def stale_sub(self, gid: str, access: int) -> bool:
        """``gid`` was made by a previous run of ``access``: its client is gone."""
        ctx = self._ctx
        inc = ctx.incarnation if access == ctx.id else self._incarnation.get(access)
        if inc is not None and not gid.startswith(sub_prefix(access, inc)):
            return True
        # A run declared dead: a SubscriptionMove snapshot taken by a sender that
        # had not heard of the death yet still carries its clients' subscriptions
        # (fault seed 905: they stayed on the receiver for good).
        ended = self._ended.get(access)
        return ended is not None and gid.startswith(sub_prefix(access, ended))

    def drop_subscriptions_of(self, node: int, whose: str = "") -> None:
        """``node`` was declared dead (or drained and left): its clients are gone."""
        inc = self._incarnation.get(node)
        if inc is not None:
            self._ended[node] = inc
        self._drop(node, lambda gid: True, whose or f"dead node {node}'s clients")

    def drop_subscriptions_of_old_run(self, node: int) -> None:
        """The clients of ``node``'s previous run are gone with it."""
        self._drop(node, lambda gid: self.stale_sub(gid, node), f"node {node}'s previous run")

    def _drop(self, node: int, gone: Callable[[str], bool], whose: str) -> None:
        ctx = self._ctx
        dropped = 0
        for ch in ctx.local:
            ids = [s.id for s in ch if s.access_node == node and gone(s.id)]
            for gid in ids:
                ch.remove(gid)
            dropped += len(ids)
        if dropped:
            ctx.stats["subscriptions_of_dead_clients_removed"] += dropped
            log.info("node %d: removed %d subscriptions of %s", ctx.id, dropped, whose)
