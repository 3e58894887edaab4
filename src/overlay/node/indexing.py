"""Background indexing of the local channels (``Channel`` rule 5).

A split, a merge or a SubscriptionMove stores subscriptions at once and
leaves their indexing (and the removal of stale ones) for later, so no event
waits behind a whole rebuild; the shell runs the work in small steps between
message batches while ``wanted`` is set.
"""

from __future__ import annotations

from collections.abc import Container

from overlay.node.context import NodeContext

__all__ = ["Indexing"]


class Indexing:
    """Whether indexing work is waiting, and one bounded step of it."""

    def __init__(self, ctx: NodeContext) -> None:
        self._ctx = ctx
        self.wanted = False

    def want(self) -> None:
        """Something left subscriptions to index."""
        self.wanted = True

    def step(self, limit: int, leaving: Container[object]) -> int:
        """Index up to ``limit`` pending (or drop stale) subscriptions over the
        local channels; how many are left.

        Pending subscriptions go first, everywhere: each one indexed makes
        later events cheaper, while a stale one is rarely even a candidate.  A
        channel on its way out (``leaving``) is left alone: its subscriptions
        are indexed by its receiver, and doing it here too took the sender's
        CPU in the very middle of the session (measured)."""
        channels = [ch for ch in self._ctx.local if ch.unindexed]
        work = [ch for ch in channels if ch.id not in leaving]
        for ch in work:
            if limit > 0 and ch.pending:
                before = ch.pending
                ch.index_step(limit, drop_stale=False)
                limit -= before - ch.pending
        for ch in work:
            if limit > 0 and ch.stale and not ch.pending:
                before = ch.stale
                ch.index_step(limit)
                limit -= before - ch.stale
        left = sum(ch.unindexed for ch in channels)  # a leaving one's too: a rollback keeps it here
        if not left:
            self.wanted = False
        return left
