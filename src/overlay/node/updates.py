"""Table updates between nodes: UpdateRoutingTable out and in (SPEC §3, §8.1 step <3>, §16).

Rules this module keeps:

1. A node that changes the table — a migration at <3>, a split, a merge, a
   replica set that shrinks, a recovery — first makes the change in its own
   table, which versions it (``channels.routing_table`` rules 4–6), then
   broadcasts one ``UpdateRoutingTable`` to every peer carrying each entry
   and each deletion *at its version*, with an id from the node's one
   session counter (migration sessions take theirs from it too, so the two
   never collide).  An update of its own (not a migration's, which waits in
   ``overlay.balance.migration``) waits for every live peer's
   ``ReplyUpdateGlobal``; an operator who asked for it is answered then.  A
   peer that becomes unreachable or restarts is no longer waited for.
2. An update received is *merged* (``channels.routing_table`` rule 7),
   never applied blindly: each entry or deletion takes effect only if it is
   newer than what the table holds for that channel.  One that is older —
   late, re-sent, or forged with an old version — changes nothing; it is
   counted (``table_updates_stale``) and logged, and the update is answered
   all the same.  An item without a version, with a version implausibly
   ahead of this table's clock (``MAX_VERSION_LEAD``), or naming an owner
   that is not a member is refused outright (``table_entries_refused``,
   logged as a warning).  The node remembers which channels replaced
   deleted ones (a split's children, a merge's result, the last
   ``MAX_REPLACED``), so a late (un)subscription for a deleted channel goes
   on to those only (``heirs``), and a split child's group state continues
   its parent's.
3. The local table follows the routing table (``node.core``'s invariant),
   for every change a merge made — from an update, or from anti-entropy
   (``node.table_sync``): a channel this node holds whose newer entry names
   other owners only, or was deleted, is dropped (a replica whose first
   owner took the channel back alone, a recovered channel a newer change
   gave elsewhere); a channel the newer entry gives this node that it does
   not hold is re-created empty and rebuilt from the access nodes
   (``node.recovery`` rule 5).  Channels in a migration session or a split
   are left to it (``engaged``); updates marked ``dead`` are left to
   ``node.recovery`` rule 3, which does the same for the items that are
   current after the merge.
4. The node remembers which channels each peer's latest updates named (the
   last ``RECENT_PER_ORIGIN``): when that peer dies in the middle of a
   broadcast, the recovery re-states those entries, at their versions, so
   every table agrees again (``node.recovery`` rule 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from overlay.actions import Action, ToPeer
from overlay.channels.channel import ChannelId
from overlay.channels.routing_table import Change, RouteEntry, version_text
from overlay.messages import peer as pm
from overlay.node.context import NodeContext

__all__ = ["MAX_REPLACED", "MAX_VERSION_LEAD", "TableUpdates"]

log = logging.getLogger("overlay.node")

# Deleted channels whose replacements a node remembers (for late reroutes);
# far more than the splits and merges a late message can be behind.
MAX_REPLACED: Final = 10_000
# Channels per peer named by its latest updates (rule 4): a dead node's last
# sessions touch a handful.
RECENT_PER_ORIGIN: Final = 64
# Rule 2: how far ahead of this table's clock a version may be (changes this
# node has not seen yet).  A cluster makes a few changes a second; a version
# millions ahead is a forgery or corruption, and taking it would freeze its
# channel against every later change.
MAX_VERSION_LEAD: Final = 1 << 20
# Stale or refused items named in one log line.
LOG_ITEMS: Final = 8

AdminDone = Callable[[tuple[int, int], Any, list[Action]], None]
Recreate = Callable[[list[ChannelId], list[Action]], None]
Dropped = Callable[[ChannelId], None]


class _TableUpdate:
    """An UpdateRoutingTable broadcast waiting for every ReplyUpdateGlobal;
    the operator who asked for it gets ``result`` then."""

    __slots__ = ("admin", "result", "waiting")

    def __init__(self, waiting: set[int], admin: tuple[int, int] | None, result: dict[str, Any]) -> None:
        self.waiting = waiting
        self.admin = admin
        self.result = result


class TableUpdates:
    """Rules 1–4.  ``admin_done`` answers the operator's request an update
    completes (``node.admin``).  The node core sets ``engaged`` (channels in
    a session or a split), ``recreate`` and ``dropped`` (``node.recovery``:
    a channel re-created empty and rebuilt, a rebuild forgotten) once the
    components they belong to exist (rule 3)."""

    def __init__(self, ctx: NodeContext, *, admin_done: AdminDone) -> None:
        self._ctx = ctx
        self._admin_done = admin_done
        self.engaged: Callable[[], set[ChannelId]] = set
        self.recreate: Recreate = lambda chids, out: None
        self.dropped: Dropped = lambda chid: None
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
    ) -> pm.UpdateRoutingTable:
        """Rule 1, for a change already made in this node's table (each item
        goes at the version the table gave it); ``session``: a migration's
        own id (it waits for the replies itself); ``dead``: the channels are
        recovered from that dead node.  Returns the update sent."""
        ctx = self._ctx
        routing = ctx.routing
        self._seq += 1
        uid = self._seq if session < 0 else session
        deleted = tuple(delete)
        msg = pm.UpdateRoutingTable(
            deleted,
            tuple(pm.RouteItem(c, e, routing.version(c)) for c, e in update),
            uid,
            ctx.id,
            dead,
            tuple(routing.version(c) for c in deleted),
        )
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
        return msg

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

    def apply(self, msg: pm.UpdateRoutingTable, out: list[Action], *, follow: bool = True) -> list[pm.RouteItem]:
        """Rules 2–4 for an update received; returns its items that the table
        holds now (taken, or held already at that version).  ``follow``:
        the local table follows (rule 3) — an update marked ``dead`` leaves
        that to ``node.recovery``."""
        ctx = self._ctx
        self.note_replaced(msg)
        _remember(self._recent.setdefault(msg.origin, {}), (i.ch_id for i in msg.update_chs))
        _remember(self._recent_deleted.setdefault(msg.origin, {}), msg.delete_chs)
        versions = msg.delete_versions
        deleted = [(c, versions[i] if i < len(versions) else 0) for i, c in enumerate(msg.delete_chs)]
        entries = [(i.ch_id, i.entry, i.version) for i in msg.update_chs]
        self.merge(entries, deleted, f"node {msg.origin}'s update {msg.session}", out, follow=follow)
        routing = ctx.routing
        return [i for i in msg.update_chs if routing.version(i.ch_id) == i.version and routing.get(i.ch_id) == i.entry]

    def merge(
        self,
        entries: Sequence[tuple[ChannelId, RouteEntry, int]],
        deleted: Sequence[tuple[ChannelId, int]],
        what: str,
        out: list[Action],
        *,
        follow: bool = True,
    ) -> list[Change]:
        """Rules 2 and 3: take what is newer than this table's; returns the changes made."""
        ctx = self._ctx
        routing = ctx.routing
        members = {ctx.id, *ctx.peers}
        ceiling = routing.clock + MAX_VERSION_LEAD
        refused: list[str] = []

        def plausible(chid: ChannelId, v: int, entry: RouteEntry | None) -> bool:
            if not v or v >> 32 > ceiling:
                refused.append(f"{chid}@{version_text(v)}")
                return False
            if entry is not None and not all(o in members for o in entry.owners):
                refused.append(f"{chid}->{list(entry.owners)}")
                return False
            return True

        merged = routing.merge(
            [(c, e, v) for c, e, v in entries if plausible(c, v, e)],
            [(c, v) for c, v in deleted if plausible(c, v, None)],
        )
        if refused:
            ctx.stats["table_entries_refused"] += len(refused)
            log.warning(
                "node %d: %s: refused %d items (no version, one far ahead of this table's clock %d, or an owner "
                "that is not a member): %s",
                ctx.id,
                what,
                len(refused),
                routing.clock,
                ", ".join(refused[:LOG_ITEMS]),
            )
        if merged.stale:
            ctx.stats["table_updates_stale"] += len(merged.stale)
            log.info(
                "node %d: %s: %d items not newer than this table's, ignored: %s",
                ctx.id,
                what,
                len(merged.stale),
                ", ".join(f"{c}@{version_text(v)} (here {version_text(m)})" for c, v, m in merged.stale[:LOG_ITEMS]),
            )
        if follow and merged.changed:
            self.follow(merged.changed, out)
        return merged.changed

    def follow(self, changes: Iterable[Change], out: list[Action]) -> None:
        """Rule 3: the local table follows the changes a merge made."""
        ctx = self._ctx
        local = ctx.local
        engaged = self.engaged()
        recreate: list[ChannelId] = []
        for chid, old, new in changes:
            if chid in engaged:
                continue
            ours = new is not None and ctx.id in new.owners
            if not ours and chid in local:
                local.remove(chid)
                self.dropped(chid)
                replica = old is not None and old.replicated and ctx.id in old.owners
                ctx.stats["replicas_dropped" if replica else "channels_dropped_by_table"] += 1
                log.info(
                    "node %d: channel %s is %s now (version %s); this node's copy dropped",
                    ctx.id,
                    chid,
                    f"on nodes {list(new.owners)}" if new is not None else "deleted",
                    version_text(ctx.routing.version(chid)),
                )
            elif ours and chid not in local:
                recreate.append(chid)
        if recreate:
            ctx.stats["channels_recreated_by_table"] += len(recreate)
            log.warning(
                "node %d: the table gives this node channels it does not hold: %s re-created, their "
                "subscriptions asked of the access nodes",
                ctx.id,
                ", ".join(map(str, recreate)),
            )
            self.recreate(recreate, out)

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
