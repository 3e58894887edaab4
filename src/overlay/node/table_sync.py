"""Anti-entropy: routing tables re-converge (SPEC §16: "routing tables carry
versions, and a node behind fetches the current one").

An UpdateRoutingTable lost with a crashed link, a sync that left its sender
before the latest move, a table emptied by a bug or a forgery: every such
difference used to last for ever (a black hole, issue 17).  Versions
(``channels.routing_table`` rules 4–9) tell which of two states of a channel
is newer; this module finds the differences and fetches the newer states.

Rules:

1. Every heartbeat carries the digest of the sender's table and its clock
   (``Heartbeat.table_digest``, ``table_clock``; digest 0: no table yet).
2. A node that sees a peer's digest differ from its own on ``PERSIST``
   heartbeats of that peer in a row (a single one is mostly an update still
   on its way) asks that peer for what it lacks: a ``TableRequest`` naming
   every channel it holds at its version (as many as half a frame holds).
   At most one request is in flight, one starts at most every heartbeat
   interval, and never twice for the same pair of digests (theirs, ours):
   what a peer held at one digest is taken once.  A request unanswered
   within ``peer_timeout`` is given up (counted).
3. The answer (``TableReply``, in chunks of at most half a frame, ``last``
   on the final one) carries every entry the requester lacks or holds at an
   older version, and the tombstone of every channel it holds that was
   deleted at a newer version.  The requester merges the whole answer at
   once, on its last chunk (``node.updates`` rules 2 and 3): a split's
   tombstone and its children take effect together, and the local table
   follows.  An answer longer than ``MAX_TABLE_ITEMS`` is given up.
4. Both sides of a difference fetch from each other, so two tables that
   each hold something the other lacks converge too.  A requester or
   answerer of another epoch (``node.boot`` rule 3) merges nothing; the node
   of the older epoch answers with its whole table (a sync), which the other
   adopts.
5. The local table against the routing table, once a heartbeat interval: a
   channel the table gives this node that it does not hold, or one it holds
   that the table gives to others only or deleted, outside any session or
   split, found so on two checks in a row, is re-created or dropped
   (``node.updates`` rule 3) — the table is right by now, or rule 2 is
   fixing it.
6. ``agreed``: every live peer's latest digest is this node's (the
   simulator waits for it before it checks that every table is equal).
"""

from __future__ import annotations

import logging
from typing import Final, TypeVar

import msgspec

from overlay.actions import Action, ToPeer
from overlay.channels.channel import ChannelId
from overlay.channels.routing_table import Change
from overlay.messages import peer as pm
from overlay.node.boot import Boot
from overlay.node.context import NodeContext
from overlay.node.liveness import Liveness
from overlay.node.updates import TableUpdates

__all__ = ["PERSIST", "TableSync"]

log = logging.getLogger("overlay.node")

# Rule 2: heartbeats in a row with another digest before a fetch.
PERSIST: Final = 2
# Rule 2: what one ChannelVersion takes encoded, at most (an array of a
# channel id, two integers, and a 63-bit version).
CHANNEL_VERSION_BYTES: Final = 24
# Rule 3: the tombstones one answer chunk carries, at most, beside its entries.
REPLY_TOMBSTONES: Final = 1_000

T = TypeVar("T")


class _Fetch:
    """Rule 2: the request in flight, and the chunks of its answer so far."""

    __slots__ = ("deleted", "entries", "peer", "request", "started", "theirs")

    def __init__(self, peer: int, request: int, started: float, theirs: int) -> None:
        self.peer = peer
        self.request = request
        self.started = started
        self.theirs = theirs  # the peer's digest that started it
        self.entries: list[pm.RouteItem] = []
        self.deleted: list[pm.ChannelVersion] = []


class TableSync:
    """Rules 1–6 for one node."""

    def __init__(self, ctx: NodeContext, updates: TableUpdates, boot: Boot, liveness: Liveness) -> None:
        self._ctx = ctx
        self._updates = updates
        self._boot = boot
        self._liveness = liveness
        self._interval = ctx.config.cluster.heartbeat_interval
        self._timeout = ctx.config.cluster.peer_timeout
        self._digests: dict[int, int] = {}  # peer -> the digest of its latest heartbeat
        self._clocks: dict[int, int] = {}
        self._differ: dict[int, int] = {}  # peer -> its heartbeats in a row with another digest
        self._synced: dict[int, tuple[int, int]] = {}  # peer -> (its digest, ours after) at the last fetch
        self._fetch: _Fetch | None = None
        self._last_start = -1e18
        self._requests = 0
        self._next_check = 0.0
        self._odd: set[ChannelId] = set()  # rule 5: found on the last check

    # -- rule 1 ------------------------------------------------------------------------------

    def summary(self) -> tuple[int, int]:
        """(digest, clock) of this node's table; (0, 0) without one."""
        if not self._boot.has_table:
            return 0, 0
        routing = self._ctx.routing
        return routing.digest, routing.clock

    # -- rule 2 ------------------------------------------------------------------------------

    def on_heartbeat(self, src: int, msg: pm.Heartbeat, now: float, out: list[Action]) -> None:
        theirs = msg.table_digest
        self._digests[src] = theirs
        self._clocks[src] = msg.table_clock
        if not theirs or not self._boot.has_table:
            return
        ours = self._ctx.routing.digest
        if theirs == ours:
            self._differ.pop(src, None)
            return
        n = self._differ[src] = self._differ.get(src, 0) + 1
        if (
            n >= PERSIST
            and self._fetch is None
            and now - self._last_start >= self._interval
            and self._synced.get(src) != (theirs, ours)
        ):
            self._request(src, theirs, now, out)

    def _request(self, peer: int, theirs: int, now: float, out: list[Action]) -> None:
        ctx = self._ctx
        routing = ctx.routing
        self._requests += 1
        self._fetch = _Fetch(peer, self._requests, now, theirs)
        self._last_start = now
        room = max(1, ctx.config.cluster.max_frame_size // 2 // CHANNEL_VERSION_BYTES)
        have = [pm.ChannelVersion(c, v) for c, _e, v in routing.versioned()][:room]
        ctx.stats["table_fetches"] += 1
        log.info(
            "node %d: routing table differs from node %d's (digest %016x, clock %d; here %016x, clock %d): "
            "asking it for the entries this node lacks",
            ctx.id,
            peer,
            theirs,
            self._clocks.get(peer, 0),
            routing.digest,
            routing.clock,
        )
        out.append(ToPeer(peer, pm.TableRequest(self._requests, self._boot.epoch, routing.digest, tuple(have))))

    # -- rules 3, 4 -----------------------------------------------------------------------------

    def on_request(self, src: int, msg: pm.TableRequest, out: list[Action]) -> None:
        ctx = self._ctx
        boot = self._boot
        if not boot.has_table or msg.epoch != boot.epoch:
            ctx.stats["table_requests_ignored"] += 1
            if boot.has_table and boot.epoch < msg.epoch:  # node.boot rule 3: ours is the older table
                out.append(ToPeer(src, boot.table_init(sync=True)))
            return
        ctx.stats["table_requests_served"] += 1
        routing = ctx.routing
        if msg.digest == routing.digest:
            out.append(ToPeer(src, pm.TableReply(msg.request, boot.epoch)))
            return
        have = {c.ch_id: c.version for c in msg.have}
        entries = [pm.RouteItem(c, e, v) for c, e, v in routing.versioned() if have.get(c, 0) < v]
        tombs = routing.tombstones()
        deleted = [pm.ChannelVersion(c, tombs[c]) for c, v in have.items() if tombs.get(c, 0) > v]
        budget = ctx.config.cluster.max_frame_size // 2
        parts: list[tuple[tuple[pm.RouteItem, ...], tuple[pm.ChannelVersion, ...]]] = [
            (tuple(chunk), ()) for chunk in _chunks(entries, budget)
        ]
        stones = _chunks(deleted, budget, size=CHANNEL_VERSION_BYTES, most=REPLY_TOMBSTONES)
        parts.extend(((), tuple(chunk)) for chunk in stones)
        parts = parts or [((), ())]
        for i, (chunk, tomb) in enumerate(parts):
            out.append(ToPeer(src, pm.TableReply(msg.request, boot.epoch, chunk, tomb, i == len(parts) - 1)))

    def on_reply(self, src: int, msg: pm.TableReply, out: list[Action]) -> None:
        ctx = self._ctx
        fetch = self._fetch
        if fetch is None or fetch.peer != src or fetch.request != msg.request or msg.epoch != self._boot.epoch:
            ctx.stats["table_replies_ignored"] += 1
            return
        fetch.entries.extend(msg.entries)
        fetch.deleted.extend(msg.deleted)
        if len(fetch.entries) + len(fetch.deleted) > pm.MAX_TABLE_ITEMS:
            self._fetch = None
            ctx.stats["table_fetches_abandoned"] += 1
            log.warning("node %d: node %d's answer to a table request is too long; given up", ctx.id, src)
            return
        if not msg.last:
            return
        self._fetch = None
        changed = self._updates.merge(
            [(i.ch_id, i.entry, i.version) for i in fetch.entries],
            [(d.ch_id, d.version) for d in fetch.deleted],
            f"node {src}'s table",
            out,
        )
        self._synced[src] = (fetch.theirs, ctx.routing.digest)
        if changed:
            ctx.stats["table_entries_fetched"] += len(changed)
            log.info(
                "node %d: took %d newer entries from node %d's table: %s",
                ctx.id,
                len(changed),
                src,
                ", ".join(_describe(c) for c in changed[:8]) + (" …" if len(changed) > 8 else ""),
            )

    # -- rules 2 and 5 on time ---------------------------------------------------------------

    def tick(self, now: float, out: list[Action]) -> None:
        fetch = self._fetch
        if fetch is not None and now - fetch.started > self._timeout:
            self._fetch = None
            self._ctx.stats["table_fetches_timed_out"] += 1
            log.info(
                "node %d: node %d did not answer a table request within %.1fs", self._ctx.id, fetch.peer, self._timeout
            )
        if now >= self._next_check:
            self._next_check = now + self._interval
            if self._boot.has_table:
                self._check_local(out)

    def _check_local(self, out: list[Action]) -> None:
        """Rule 5."""
        ctx = self._ctx
        routing, local, me = ctx.routing, ctx.local, ctx.id
        engaged = self._updates.engaged()
        odd = {c for c in routing.channels_of(me) if c not in local and c not in engaged}
        for ch in local:
            entry = routing.get(ch.id)
            if ch.id not in engaged and (
                (entry is not None and me not in entry.owners) or (entry is None and routing.deleted(ch.id))
            ):
                odd.add(ch.id)
        act = sorted(odd & self._odd)
        self._odd = odd - set(act)
        if act:
            ctx.stats["local_table_repairs"] += len(act)
            log.warning(
                "node %d: the local table disagrees with the routing table on %s on two checks in a row: repaired",
                ctx.id,
                ", ".join(map(str, act)),
            )
            self._updates.follow([Change(c, routing.get(c), routing.get(c)) for c in act], out)

    # -- rule 6 -------------------------------------------------------------------------------

    def agreed(self, now: float) -> bool:
        """Every live peer's latest heartbeat carried this node's digest."""
        if not self._boot.has_table:
            return False
        ours = self._ctx.routing.digest
        return all(self._digests.get(p) == ours for p in self._liveness.live(now) if p != self._ctx.id)

    def status(self) -> dict[str, object]:
        routing = self._ctx.routing
        return {
            "digest": f"{routing.digest:016x}",
            "clock": routing.clock,
            "tombstones": len(routing.tombstones()),
            "differs_from": sorted(p for p, d in self._digests.items() if d and d != routing.digest),
            "fetching_from": self._fetch.peer if self._fetch is not None else None,
        }


def _describe(change: Change) -> str:
    if change.new is None:
        return f"{change.chid} deleted"
    return f"{change.chid}->{list(change.new.owners)}"


def _chunks(items: list[T], budget: int, *, size: int = 0, most: int = pm.MAX_TABLE_ITEMS) -> list[list[T]]:
    """``items`` in runs whose encoding fits ``budget`` bytes (each item's own
    size, or ``size`` each) and at most ``most`` items."""
    out: list[list[T]] = []
    cur: list[T] = []
    used = 0
    for item in items:
        n = size or len(msgspec.msgpack.encode(item))
        if cur and (used + n > budget or len(cur) >= most):
            out.append(cur)
            cur, used = [], 0
        cur.append(item)
        used += n
    if cur:
        out.append(cur)
    return out
