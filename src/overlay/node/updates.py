"""Table updates between nodes: UpdateRoutingTable out and in (SPEC §3, §8.1 step <3>).

Rules this module keeps:

1. A node that changes the table — a migration at <3>, a split, a merge, a
   replica set that shrinks — broadcasts one ``UpdateRoutingTable`` to every
   peer, with an id from the node's one session counter (migration sessions
   take theirs from it too, so the two never collide).  An update of its own
   (not a migration's, which waits in ``overlay.balance.migration``) waits
   for every live peer's ``ReplyUpdateGlobal``; an operator who asked for it
   is answered then.  A peer that becomes unreachable or restarts is no
   longer waited for.
2. An update received is applied as it comes; the node remembers which
   channels replaced deleted ones (a split's children, a merge's result, the
   last ``MAX_REPLACED``), so a late (un)subscription for a deleted channel
   goes on to those only (``heirs``), and a split child's group state
   continues its parent's.
3. (``node.core`` rule 9) An update from the first owner of a replicated
   channel this node holds a replica of, giving the channel to that owner
   alone, makes this node drop its replica; an update from anyone else never
   makes a node drop a channel it owns.
4. The node remembers which channels each peer's latest updates named (the
   last ``RECENT_PER_ORIGIN``): when that peer dies in the middle of a
   broadcast, the recovery re-states those entries so every table agrees
   again (``node.recovery`` rule 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from overlay.actions import Action, ToPeer
from overlay.channels.channel import ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.messages import peer as pm
from overlay.node.context import NodeContext

__all__ = ["MAX_REPLACED", "TableUpdates"]

log = logging.getLogger("overlay.node")

# Deleted channels whose replacements a node remembers (for late reroutes);
# far more than the splits and merges a late message can be behind.
MAX_REPLACED: Final = 10_000
# Channels per peer named by its latest updates (rule 4): a dead node's last
# sessions touch a handful.
RECENT_PER_ORIGIN: Final = 64

AdminDone = Callable[[tuple[int, int], Any, list[Action]], None]


class _TableUpdate:
    """An UpdateRoutingTable broadcast waiting for every ReplyUpdateGlobal;
    the operator who asked for it gets ``result`` then."""

    __slots__ = ("admin", "result", "waiting")

    def __init__(self, waiting: set[int], admin: tuple[int, int] | None, result: dict[str, Any]) -> None:
        self.waiting = waiting
        self.admin = admin
        self.result = result


class TableUpdates:
    """Rules 1–3.  ``admin_done`` answers the operator's request an update
    completes (``node.admin``)."""

    def __init__(self, ctx: NodeContext, *, admin_done: AdminDone) -> None:
        self._ctx = ctx
        self._admin_done = admin_done
        self._seq = 0
        self._waiting: dict[int, _TableUpdate] = {}
        self.replaced: dict[ChannelId, tuple[ChannelId, ...]] = {}  # deleted -> what replaced it
        # Rule 4: the channels each peer's latest updates named (at most
        # RECENT_PER_ORIGIN, oldest first out).
        self._recent: dict[int, dict[ChannelId, None]] = {}
        self._recent_deleted: dict[int, dict[ChannelId, None]] = {}

    def next_session(self) -> int:
        """A new id for an update or a migration session (rule 1)."""
        self._seq += 1
        return self._seq

    def waiting(self) -> list[int]:
        """The ids of this node's updates still waiting for replies."""
        return sorted(self._waiting)

    def broadcast(
        self,
        delete: Iterable[ChannelId],
        update: Iterable[tuple[ChannelId, RouteEntry]],
        out: list[Action],
        *,
        session: int = -1,
        admin: tuple[int, int] | None = None,
        result: dict[str, Any] | None = None,
        dead: int = -1,
    ) -> int:
        """Rule 1; ``session``: a migration's own id (it waits for the replies
        itself); ``dead``: the channels are recovered from that dead node."""
        ctx = self._ctx
        self._seq += 1
        uid = self._seq if session < 0 else session
        msg = pm.UpdateRoutingTable(tuple(delete), tuple(pm.RouteItem(c, e) for c, e in update), uid, ctx.id, dead)
        self.note_replaced(msg)
        for p in ctx.peers:
            out.append(ToPeer(p, msg))
        if session < 0:
            waiting = set(ctx.peers) - ctx.unreachable
            done = {"update": uid, **(result or {})}
            if waiting:
                self._waiting[uid] = _TableUpdate(waiting, admin, done)
            elif admin is not None:
                self._admin_done(admin, done, out)
        return uid

    def on_reply(self, src: int, session: int, out: list[Action]) -> None:
        upd = self._waiting.get(session)
        if upd is None:
            return
        upd.waiting.discard(src)
        if not upd.waiting:
            del self._waiting[session]
            if upd.admin is not None:
                self._admin_done(upd.admin, upd.result, out)

    def stop_waiting_for(self, node: int, out: list[Action]) -> None:
        """Take ``node``'s reply as given, for every update of ours waiting on it."""
        for session, upd in list(self._waiting.items()):
            if node in upd.waiting:
                self.on_reply(node, session, out)

    def recent_from(self, origin: int) -> tuple[list[ChannelId], list[ChannelId]]:
        """Rule 4: the channels ``origin``'s latest updates set, and those they deleted, oldest first."""
        return list(self._recent.get(origin, ())), list(self._recent_deleted.get(origin, ()))

    def apply(self, msg: pm.UpdateRoutingTable) -> None:
        """Rules 2–4 for an update received."""
        ctx = self._ctx
        self.note_replaced(msg)
        _remember(self._recent.setdefault(msg.origin, {}), (i.ch_id for i in msg.update_chs))
        _remember(self._recent_deleted.setdefault(msg.origin, {}), msg.delete_chs)
        dropped = [
            i.ch_id
            for i in msg.update_chs
            if i.ch_id in ctx.local and ctx.id not in i.entry.owners and self._replica_set_shrank(i.ch_id, msg.origin)
        ]
        ctx.routing.apply(msg.delete_chs, ((i.ch_id, i.entry) for i in msg.update_chs))
        for chid in dropped:
            ctx.local.remove(chid)
            ctx.stats["replicas_dropped"] += 1
            log.info("node %d: channel %s is on node %d alone now; this replica dropped", ctx.id, chid, msg.origin)

    def _replica_set_shrank(self, chid: ChannelId, origin: int) -> bool:
        """Rule 3: the first owner of a replicated channel this node holds a
        replica of took it back alone (only it may, so a late update from
        anyone else never makes this node drop a channel it owns)."""
        ctx = self._ctx
        entry = ctx.routing.get(chid)
        return entry is not None and entry.replicated and entry.owner == origin and ctx.id in entry.owners

    def note_replaced(self, msg: pm.UpdateRoutingTable) -> None:
        """Rule 2: remember which channels replaced deleted ones, so a late
        (un)subscription for a deleted channel goes on to those only — the
        access node sent its other copies itself."""
        if not msg.delete_chs:
            return
        new = tuple(i.ch_id for i in msg.update_chs)
        replaced = self.replaced
        for c in msg.delete_chs:
            replaced[c] = new
        while len(replaced) > MAX_REPLACED:
            del replaced[next(iter(replaced))]

    def heirs(self, chid: ChannelId) -> set[ChannelId]:
        """The channels of the table that replaced ``chid``, through later splits and merges."""
        routing = self._ctx.routing
        heirs: set[ChannelId] = set()
        todo, seen = [chid], set()
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            if c in routing:
                heirs.add(c)
            else:
                todo.extend(self.replaced.get(c, ()))
        return heirs


def _remember(recent: dict[ChannelId, None], chids: Iterable[ChannelId]) -> None:
    """Rule 4: newest last, at most ``RECENT_PER_ORIGIN``."""
    for c in chids:
        recent.pop(c, None)
        recent[c] = None
    while len(recent) > RECENT_PER_ORIGIN:
        del recent[next(iter(recent))]
