"""Splits and merges of local channels, committed to the tables (SPEC §8.3, §8.4).

Rules (numbered as in ``overlay.node.balancing``, which decides when):

3. A split is worked out in bounded steps (``overlay.balance.split_job``);
   committing it replaces the parent by its two children in the local and
   routing tables, gives each child its share of the parent's load (they can
   be ranked before their first slice ends), and broadcasts the change.  An
   operator's split runs every step at once.
5. Channels whose load stays at or below ``MERGE_THRESHOLD`` for
   ``MERGE_SLICES`` slices merge with an adjacent cold local channel that is
   not moving, arriving, being split or replicated.
6. Every split and merge is journalled.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from typing import Final

from overlay.actions import Action
from overlay.balance.merge import merge_pair, mergeable_pairs
from overlay.balance.split import Cut
from overlay.balance.split_job import SplitJob
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.channels.space import EventSpace
from overlay.node.context import NodeContext
from overlay.node.indexing import Indexing
from overlay.node.loads import ChannelLoads
from overlay.node.updates import TableUpdates

__all__ = ["MERGE_SLICES", "MERGE_THRESHOLD", "Splits"]

log = logging.getLogger("overlay.balance")

MERGE_THRESHOLD: Final = 0
MERGE_SLICES: Final = 5


class Splits:
    """Rules 3, 5, 6: commits splits, and merges cold channels."""

    def __init__(self, ctx: NodeContext, loads: ChannelLoads, updates: TableUpdates, indexing: Indexing) -> None:
        self._ctx = ctx
        self._loads = loads
        self._updates = updates
        self._indexing = indexing
        self._cold: dict[ChannelId, int] = {}  # channel id -> slices in a row at or below MERGE_THRESHOLD

    def split_now(
        self, ch: Channel, cut: Cut, now: float, out: list[Action], admin: tuple[int, int] | None = None
    ) -> list[Channel]:
        """Split ``ch`` at ``cut`` at once (an operator's split: nobody waits on it)."""
        local = self._ctx.local
        job = SplitJob(ch, (local.new_id(), local.new_id()), self._ctx.schema, cut=cut)
        job.run()
        return self.commit(job, now, out, admin)

    def commit(
        self, job: SplitJob, now: float, out: list[Action], admin: tuple[int, int] | None = None
    ) -> list[Channel]:
        ctx = self._ctx
        ch, cut = job.parent, job.cut
        assert cut is not None
        # The children get the parent's slices, divided by the cut, so the
        # scheduler can rank them before their own first slice ends.
        children = job.commit()
        self._loads.divide(ch, children)
        ctx.local.remove(ch.id)
        for c in children:
            ctx.local.add(c)
        self._indexing.want()
        entries = [(c.id, RouteEntry(c.space, (ctx.id,))) for c in children]
        ctx.routing.apply([ch.id], entries)
        ctx.stats["splits"] += 1
        ctx.stats["split_steps"] += job.steps
        ctx.stats["split_changes_replayed"] += job.replayed
        kids = [{"id": str(c.id), "space": c.space.text(ctx.schema), "subscriptions": len(c)} for c in children]
        ctx.journal.record(
            "split",
            now,
            parent=str(ch.id),
            attr=cut.attr,
            children=kids,
            low_load=cut.low_load,
            high_load=cut.high_load,
            steps=job.steps,
            replayed=job.replayed,
        )
        log.info("node %d: split %s on %s into %s", ctx.id, ch.id, cut.attr, ", ".join(str(c.id) for c in children))
        # What an operator who asked for it is told: the new ids and spaces.
        self._updates.broadcast(
            [ch.id],
            entries,
            out,
            admin=admin,
            result={"split": str(ch.id), "attr": cut.attr, "node": ctx.id, "children": kids},
        )
        return children

    def idle_merges(self, now: float, out: list[Action], engaged: Container[object]) -> None:
        """Rule 5, once a slice; ``engaged``: channels that may not be merged now."""
        ctx = self._ctx
        for ch in ctx.local:
            if ch.last.load <= MERGE_THRESHOLD:
                self._cold[ch.id] = self._cold.get(ch.id, 0) + 1
            else:
                self._cold.pop(ch.id, None)
        cold = [
            ch
            for ch in ctx.local
            if self._cold.get(ch.id, 0) >= MERGE_SLICES and ch.id not in engaged and not ctx.routing[ch.id].replicated
        ]
        for a, b, space in mergeable_pairs(cold, ctx.schema)[:1]:
            self._merge(a, b, space, now, out)

    def _merge(self, a: Channel, b: Channel, space: EventSpace, now: float, out: list[Action]) -> Channel:
        ctx = self._ctx
        merged = merge_pair(a, b, ctx.local.new_id(), space, consume=True)
        ctx.local.remove(a.id)
        ctx.local.remove(b.id)
        ctx.local.add(merged)
        self._loads.merged((a.id, b.id), merged.id)
        self._indexing.want()
        self._cold.pop(a.id, None)
        self._cold.pop(b.id, None)
        entry = RouteEntry(merged.space, (ctx.id,))
        ctx.routing.apply([a.id, b.id], [(merged.id, entry)])
        ctx.stats["merges"] += 1
        ctx.journal.record(
            "merge",
            now,
            parts=[str(a.id), str(b.id)],
            merged=str(merged.id),
            space=merged.space.text(ctx.schema),
            subscriptions=len(merged),
        )
        self._updates.broadcast([a.id, b.id], [(merged.id, entry)], out)
        return merged
