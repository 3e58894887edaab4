"""How a node comes to hold the routing table: first start, restart, re-join (SPEC §3, §16).

A node keeps nothing on disk, so a process that starts cannot tell on its
own whether the cluster is new or has been running for hours; its peers can.
The rules:

1. Every node starts without a table and says so in its PeerHello.  A peer
   that holds a table answers such a hello with it (``RoutingTableInit``
   marked ``sync``): that is how a restarted node, or a node that missed the
   initialisation, gets the current table.
2. Only the initializer creates the whole-space channel, and only once it
   knows no live peer holds a table: every configured peer said hello
   without one, or ``grace`` seconds passed without a hello from a peer
   holding one (some peers are down).  A restarted initializer therefore
   *joins* a running cluster like any other node instead of re-initialising
   it (it used to, and the survivors' tables were replaced by a lone EC).
3. Every table belongs to an *epoch*: the incarnation of the initializer
   that created it.  Two nodes holding tables of different epochs (a cluster
   initialised twice, e.g. while partitioned) settle on the older one: the
   node of the older epoch sends its table, the other adopts it.
4. A node that adopts a table reconciles its local table with it: channels
   the table does not give it are dropped (an initializer's tentative EC);
   channels the table gives it that it does not hold (it held them before
   it restarted) are re-created, and rebuilt as a dead node's channels are
   (``node.recovery`` rule 5: every access node sends their subscriptions,
   their events wait until it has); a replicated channel's other replicas
   keep it, and the node leaves its replica set.
5. Table updates that arrive before the table are kept and applied after it.
6. A sync from a peer of the same epoch, to a node that holds a table, is
   merged into it entry by entry (``channels.routing_table`` rule 7): what
   is newer than the receiver's is taken, what is older is ignored.  This
   repairs a table adopted from a peer that had not heard of the latest
   moves yet, and a sync that left its sender before the latest move came
   there changes nothing (fault seed 345: it used to move a channel back
   to its old owner on a node that had just heard of its migration).  A
   sync carries the latest ``INIT_TOMBSTONES`` tombstones with the entries,
   at their versions; a node adopting it never gives a new channel one of
   their ids.

``BootState`` holds the state of rules 1, 2 and 5; ``Boot`` applies them all
and owns whether the node holds a table, its epoch, and whether it is ready
(``node.core`` rule 1: the initializer is ready once every peer it sent the
table to replied; any other node once it holds a table).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

from overlay.actions import Action, ToPeer
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.channels.space import EventSpace
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.updates import TableUpdates

__all__ = ["INIT_TOMBSTONES", "MAX_BUFFERED_UPDATES", "Boot", "BootState"]

log = logging.getLogger("overlay.node")

# Table updates a node without a table keeps for later (rule 5): far more
# than a cluster makes while one node boots; past it the oldest go (the syncs
# of rule 6 repair what they said).
MAX_BUFFERED_UPDATES: Final = 10_000
# Tombstones a RoutingTableInit carries (rule 6): the latest, enough for the
# deletions a restarted node can have missed, small beside a frame.
INIT_TOMBSTONES: Final = 1_000


class BootState:
    """Rules 1, 2 and 5 for one node."""

    def __init__(self, peers: Iterable[int], *, initializer: bool, grace: float) -> None:
        self.peers = set(peers)
        self.initializer = initializer
        self.grace = grace
        self.deadline: float | None = None  # set by start(); None: not booting (tests start at once)
        self.heard: dict[int, bool] = {}  # peer -> whether its hello said it holds a table
        self.buffered: list[pm.UpdateRoutingTable] = []

    def start(self, now: float) -> None:
        self.deadline = now + self.grace

    def hello(self, node: int, has_table: bool) -> None:
        self.heard[node] = has_table

    def may_initialise(self, now: float) -> bool:
        """Rule 2: the initializer may create EC now (it holds no table yet)."""
        if not self.initializer or self.deadline is None:
            return False
        if any(self.heard.values()):
            return False  # a live peer holds a table: it sends it (rule 1)
        return self.peers <= set(self.heard) or now >= self.deadline

    def keep(self, msg: pm.UpdateRoutingTable) -> None:
        """Rule 5."""
        self.buffered.append(msg)
        if len(self.buffered) > MAX_BUFFERED_UPDATES:
            del self.buffered[0]

    def take_buffered(self) -> list[pm.UpdateRoutingTable]:
        out, self.buffered = self.buffered, []
        return out


class Boot:
    """The routing table at start (rules 1–6); ``recreated`` rebuilds the
    channels of rule 4 (``node.recovery``)."""

    def __init__(
        self,
        ctx: NodeContext,
        updates: TableUpdates,
        *,
        recreated: Callable[[list[ChannelId], list[Action]], None] = lambda chids, out: None,
    ) -> None:
        self._ctx = ctx
        self._updates = updates
        self._recreated = recreated  # rule 4: their subscriptions are rebuilt (node.recovery)
        self.has_table = False
        self.ready = False
        self.epoch = 0  # of the table held (rule 3)
        self._init_waiting: set[int] = set()
        self.state = BootState(ctx.peers, initializer=self.is_initializer, grace=ctx.config.cluster.peer_timeout)

    @property
    def is_initializer(self) -> bool:
        return self._ctx.id == self._ctx.config.cluster.initializer

    def start(self, now: float) -> list[Action]:
        """Rule 1 for a cluster known to be new (core tests, the simulator):
        the initializer builds EC and announces the table at once."""
        return self._initialise(now) if self.is_initializer else []

    def boot(self, now: float) -> list[Action]:
        """Start as a process does (the shell): no table until the peers tell
        whether the cluster runs already."""
        self.state.start(now)
        return self.check(now)

    def waiting_for(self) -> list[int]:
        """The peers whose ReplyRoutingTableInit the initializer waits for."""
        return sorted(self._init_waiting)

    def hello(self, node: int, msg: pm.PeerHello, now: float, out: list[Action]) -> None:
        """A peer's hello (rule 1): one without our table, or with a younger
        epoch, gets ours; the initializer may initialise now (rule 2)."""
        self.state.hello(node, msg.has_routing_table)
        if self.has_table and (not msg.has_routing_table or (msg.epoch != self.epoch and self.epoch < msg.epoch)):
            out.append(ToPeer(node, self.table_init(sync=True)))
        out.extend(self.check(now))

    def on_init_reply(self, src: int) -> None:
        self._init_waiting.discard(src)
        if not self._init_waiting and self.has_table:
            self._become_ready()

    def on_update(self, src: int, msg: pm.UpdateRoutingTable, out: list[Action]) -> list[pm.RouteItem] | None:
        """An update: merged (``node.updates`` rule 2), or kept until the table
        comes (rule 5); answered either way.  Returns the items the table
        holds now (None: kept for later); the local table follows them here
        unless the update is marked ``dead`` (``node.recovery`` rule 3 does)."""
        items = None
        if self.has_table:
            items = self._updates.apply(msg, out, follow=msg.dead < 0)
        else:
            self.state.keep(msg)
        out.append(ToPeer(src, pm.ReplyUpdateGlobal(msg.session, msg.origin)))
        return items

    def check(self, now: float) -> list[Action]:
        if self.has_table or not self.state.may_initialise(now):
            return []
        heard = sorted(self.state.heard)
        log.info(
            "node %d: no live peer holds a table (heard from %s): initialising the cluster",
            self._ctx.id,
            heard or "none",
        )
        return self._initialise(now, peers=heard)

    def _initialise(self, now: float, peers: list[int] | None = None) -> list[Action]:
        """Rule 1: build EC, announce the table, ready when the peers replied
        (``peers``: those known up; the others get the table with their hello)."""
        out: list[Action] = []
        ec = Channel(self._ctx.local.new_id(), EventSpace.whole(self._ctx.schema), self._ctx.schema)
        self._ctx.local.add(ec)
        self._ctx.routing.set(ec.id, RouteEntry(ec.space, (self._ctx.id,)))
        self.has_table = True
        self.epoch = self._ctx.incarnation
        self._init_waiting = set(self._ctx.peers if peers is None else peers)
        init = self.table_init()
        for p in self._ctx.peers:
            out.append(ToPeer(p, init))
        if not self._init_waiting:
            self._become_ready()
        log.info("node %d: initializer, created %s, waiting for %d peers", self._ctx.id, ec.id, len(self._ctx.peers))
        return out

    def table_init(self, *, sync: bool = False) -> pm.RoutingTableInit:
        routing = self._ctx.routing
        deleted = list(routing.tombstones().items())[-INIT_TOMBSTONES:]
        return pm.RoutingTableInit(
            tuple(pm.RouteItem(c, e, v) for c, e, v in routing.versioned()),
            self.epoch,
            sync,
            tuple(pm.ChannelVersion(c, v) for c, v in deleted),
        )

    def _become_ready(self) -> None:
        if not self.ready:
            self.ready = True
            log.info("node %d: ready (%d channels in routing table)", self._ctx.id, len(self._ctx.routing))

    def on_table(self, src: int, msg: pm.RoutingTableInit, out: list[Action]) -> None:
        """node.boot rules 1, 3, 6."""
        if not self.has_table or msg.epoch < self.epoch:
            if self.has_table:
                log.warning(
                    "node %d: node %d holds a table of an older epoch (%d < %d): adopting it",
                    self._ctx.id,
                    src,
                    msg.epoch,
                    self.epoch,
                )
            self._adopt_table(msg, out)
        elif msg.epoch > self.epoch:  # they initialised a cluster that runs already: ours wins
            out.append(ToPeer(src, self.table_init(sync=True)))
        elif msg.sync:
            self._merge_owner_table(src, msg, out)
        if not msg.sync:
            out.append(ToPeer(src, pm.ReplyRoutingTableInit(self._ctx.id)))

    def _adopt_table(self, msg: pm.RoutingTableInit, out: list[Action]) -> None:
        """node.boot rules 4 and 5."""
        self._ctx.routing.replace_all(
            [(i.ch_id, i.entry, i.version) for i in msg.routing_table], [(d.ch_id, d.version) for d in msg.deleted]
        )
        for chid in (*self._ctx.routing, *self._ctx.routing.tombstones()):
            self._ctx.local.observe_id(chid)
        self.epoch = msg.epoch
        self.has_table = True
        for ch in list(self._ctx.local):  # e.g. a tentative EC of ours
            entry = self._ctx.routing.get(ch.id)
            if entry is None or self._ctx.id not in entry.owners:
                self._ctx.local.remove(ch.id)
        recreated: list[ChannelId] = []
        left: list[str] = []
        for chid in self._ctx.routing.channels_of(self._ctx.id):
            if chid in self._ctx.local:
                continue
            entry = self._ctx.routing[chid]
            if entry.replicated:  # the other replicas hold its subscriptions
                new = RouteEntry(entry.space, tuple(o for o in entry.owners if o != self._ctx.id))
                self._ctx.routing.set(chid, new)
                self._updates.broadcast((), [(chid, new)], out)
                left.append(str(chid))
            else:
                self._ctx.local.add(Channel(chid, entry.space, self._ctx.schema))
                recreated.append(chid)
        if recreated or left:
            self._ctx.stats["channels_recreated_empty"] += len(recreated)
            log.warning(
                "node %d: the cluster's table names this node owner of channels it does not hold (lost when it "
                "stopped): %s re-created, their subscriptions asked of the access nodes%s",
                self._ctx.id,
                ", ".join(map(str, recreated)) or "none",
                f"; left the replica sets of {', '.join(left)}" if left else "",
            )
            self._ctx.journal.record("rejoin", self._ctx.now, recreated=[str(c) for c in recreated], replicas_left=left)
            if recreated:
                self._recreated(recreated, out)
        for upd in self.state.take_buffered():
            self._updates.apply(upd, out)
        self._init_waiting = set()  # an initialisation of ours, if any, is abandoned
        self._become_ready()

    def _merge_owner_table(self, src: int, msg: pm.RoutingTableInit, out: list[Action]) -> None:
        """node.boot rule 6."""
        changed = self._updates.merge(
            [(i.ch_id, i.entry, i.version) for i in msg.routing_table],
            [(d.ch_id, d.version) for d in msg.deleted],
            f"node {src}'s table",
            out,
        )
        if changed:
            self._ctx.stats["table_entries_repaired"] += len(changed)
            log.info("node %d: node %d's table corrects %d entries here", self._ctx.id, src, len(changed))
