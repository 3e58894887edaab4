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
   it restarted) are re-created empty, so events for them are matched (their
   subscriptions died with the old process and must be made again — the
   recovery of a dead node's channels is not implemented yet) and nothing
   loops through re-routes; a replicated channel's other replicas keep it,
   and the node leaves its replica set.
5. Table updates that arrive before the table are kept and applied after it.
6. A sync from a peer of the same epoch, to a node that holds a table, is
   authoritative for that peer's own channels (the owner made every change
   to them): the receiver takes the peer's entries for them.  This repairs a
   table adopted from a peer that had not heard of the latest moves yet.

``Boot`` holds the state of rules 1, 2 and 5; the node core applies the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from overlay.channels.channel import ChannelId
from overlay.channels.routing_table import RouteEntry, RoutingTable
from overlay.messages import peer as pm

__all__ = ["MAX_BUFFERED_UPDATES", "Boot", "owner_entries"]

# Table updates a node without a table keeps for later (rule 5): far more
# than a cluster makes while one node boots; past it the oldest go (the syncs
# of rule 6 repair what they said).
MAX_BUFFERED_UPDATES: Final = 10_000


class Boot:
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


def owner_entries(
    table: RoutingTable, src: int, items: Iterable[pm.RouteItem], skip: set[ChannelId]
) -> tuple[list[ChannelId], list[tuple[ChannelId, RouteEntry]]]:
    """Rule 6: what to delete and set in ``table`` so it agrees with ``src``'s
    table (``items``) on every channel ``src`` owns or is said to own here.
    Channels in ``skip`` (this node's own, or in a session) are left alone."""
    theirs = {i.ch_id: i.entry for i in items}
    delete: list[ChannelId] = []
    update: list[tuple[ChannelId, RouteEntry]] = []
    for chid, entry in theirs.items():
        if src in entry.owners and chid not in skip and table.get(chid) != entry:
            update.append((chid, entry))
    for chid, entry in table.items():
        if src in entry.owners and chid not in skip:
            now = theirs.get(chid)
            if now is None:
                delete.append(chid)  # split, merged or gone at its owner
            elif now != entry and (chid, now) not in update:
                update.append((chid, now))  # moved on by its owner
    return delete, update
