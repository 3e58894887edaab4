"""The node core: one node's protocol logic with no sockets and no clock.

A decoded message and ``now`` go in; the actions to perform come out
(``ToPeer``, ``ToClient``, ``CloseClient``).  The asyncio shell in
``overlay.net.node`` reads frames, calls the core, and carries out what it
returns; the simulator of SPEC §15 drives the same core with in-memory links.

Rules this module keeps (SPEC §3, §4, §8):

1. Initialisation: the initializer creates ``EC = <WES, ∅>`` and sends
   RoutingTableInit to every peer; it is ready when every peer replied.  Any
   other node is ready once it holds a routing table.  Before that a client's
   publish/subscribe is answered with ``not_ready``.
2. One hop: a client's (un)subscription goes to every channel it belongs to —
   applied here for local channels, sent DISPATCHED with ``ch_id`` to the
   owner of each remote one.  An event goes to its one channel the same way.
   A DISPATCHED message is applied to the named local channel without a
   routing lookup.
3. A DISPATCHED message whose channel is not here is re-routed with the
   current routing table (a bounded number of hops), never dropped silently;
   if this node is moving that channel out and is past time <2>, it is
   reforwarded to the receiver instead (``overlay.balance.migration``).  A
   channel still arriving here counts as not here; an (un)subscription for a
   moved channel goes on to that channel only, one for a split or merged
   channel to the channels that replaced it.  A replicated channel's
   (un)subscriptions enter at its first owner and are relayed along its
   owners, the last one answering.
4. An (un)subscription is acknowledged to its client only when every copy of
   it has been applied (``SubscriptionApplied``; a reroute announces its new
   copies), so an event published after the SubAck is matched against it.  An
   unsubscribe waits until its subscribe is applied everywhere, so it cannot
   overtake it.
5. The owner matches an event once and sends one Notification per
   subscribers' access node; the access node sends each client one Notify
   listing that client's matching subscriptions — at most once per
   subscription per event.
6. Subscription ids are unique per subscribe call
   (``node.incarnation:session:local_id:n``), so a re-subscribe never revives
   an old one, and event ids (``node-incarnation-n``) never repeat across
   restarts: the incarnation is the process's start time, given by the shell.
7. A peer whose hello carries a new incarnation restarted: what this node
   held for its old run is dropped — the subscriptions of its dead clients,
   sessions with it (rolled back, or completed where the tables already
   moved), waits for its replies — as when a peer is unreachable past the
   timeout.  How a node gets its table at start is ``overlay.node_boot``'s.
8. One bad state never stops a node: an unexpected error in a part of
   ``tick`` is logged with the state and counted, and the other parts and
   the next ticks run; an error matching an event for one subscription is
   that subscription's (counted), and every other match is served.
9. An operator's split or move of a replicated channel first gives it back to
   its first owner alone (``UpdateRoutingTable``); a replica that sees its
   first owner take it back drops its copy (each replica held the same
   subscriptions; events in flight to it are re-routed to the owner).
"""

from __future__ import annotations

import logging
import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from overlay.actions import Action, CloseClient, ToClient, ToPeer
from overlay.balance.migration import IncomingMigration, OutgoingMigration
from overlay.balance.monitor import Monitor, SliceReport
from overlay.capture import CaptureBuffer
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.groups import GroupDispatcher
from overlay.channels.predicates import Filter
from overlay.channels.routing_table import RouteEntry
from overlay.channels.space import EventSpace
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.acks import AwaitedAcks
from overlay.node.balancing import Balancing
from overlay.node.context import NodeContext, sub_prefix
from overlay.node.groups import Groups
from overlay.node.indexing import Indexing
from overlay.node.loads import ChannelLoads
from overlay.node.migration import Migration
from overlay.node.notify import UNDELIVERABLE, Notifier
from overlay.node.ordering import ACKED, COMPLETE, SEQUENCED, Ordering
from overlay.node.splits import Splits
from overlay.node.updates import TableUpdates
from overlay.node_boot import Boot, owner_entries
from overlay.node_clients import ClientsMixin, _Pending, _Session
from overlay.node_membership import MembershipMixin
from overlay.node_status import StatusMixin

__all__ = ["Action", "CloseClient", "NodeCore", "ToClient", "ToPeer"]

log = logging.getLogger("overlay.node")

# A message re-routed this many times is dropped (counted and logged): tables
# that disagree for longer than a few hops are a bug, not a transient.
MAX_HOPS: Final = 4


class NodeCore(ClientsMixin, MembershipMixin, StatusMixin):
    """One node's state and protocol logic (module rules 1–6).

    Invariant: a channel is in ``local`` iff the routing table names this node
    as its owner, except inside a migration session between <1> and <3> on
    either side (SPEC §8.1).
    """

    def __init__(
        self, config: ClusterConfig, node_id: int, *, incarnation: int = 0, admin_token: str | None = None
    ) -> None:
        self.ctx = ctx = NodeContext(config, node_id, incarnation)
        self.id = node_id
        self.incarnation = incarnation
        # What the client protocol's changing admin commands need (node_clients); "" = nothing.
        self.admin_token = config.cluster.admin_token if admin_token is None else admin_token
        self.peer_incarnation: dict[int, int] = {}  # from the peers' hellos (rule 7)
        self.epoch = 0  # of the table held (node_boot rule 3)
        self.me = ctx.me
        self.schema = ctx.schema
        self.peers = ctx.peers
        self.routing = ctx.routing
        self.local = ctx.local
        self.stats = ctx.stats
        self.journal = ctx.journal.entries  # SPEC §14: read by the admin endpoint and `admin journal`
        self.record = ctx.journal.record
        self.unreachable = ctx.unreachable
        self.has_table = False
        self.ready = False
        self._init_waiting: set[int] = set()
        self.boot_state = Boot(self.peers, initializer=self.is_initializer, grace=config.cluster.peer_timeout)
        self.sessions: dict[int, _Session] = {}
        self._sub_owner: dict[str, tuple[int, str]] = {}  # global sub id -> (session, local id)
        self._pending: dict[str, _Pending] = {}
        self._session_seq = 0
        self.timeout = config.cluster.peer_timeout
        self.updates = TableUpdates(ctx, admin_done=self._admin_done)  # SPEC §3: UpdateRoutingTable
        # SPEC §10: ordered delivery per sequence key.
        self.ordering = Ordering(
            ctx,
            dispatch_event=self._dispatch_event,
            deliveries_acked=lambda pairs, out: self.groups.deliveries_acked(pairs, out),
            sessions=self.sessions,
        )
        # SPEC §11 (and §10's acks): the access node's side, then the owner's.
        self.notifier = Notifier(
            ctx,
            self.ordering,
            owners=self._sub_owner,
            sessions=self.sessions,
            owner_ack=lambda ack, out: self.groups.on_delivery_ack(ack, out),
            close_session=self.client_closed,
        )
        self.groups = Groups(
            ctx,
            self.notifier,
            self.ordering,
            replaced=self.updates.replaced,
            subscriptions_failed=self._subscriptions_failed,
        )
        # SPEC §5-8: background indexing, loads, splits and merges, migration sessions, balancing.
        self.indexing = Indexing(ctx)
        self.loads = ChannelLoads(node_id)
        self.splits = Splits(ctx, self.loads, self.updates, self.indexing)
        self.migration = Migration(
            ctx,
            self.updates,
            self.groups,
            self.indexing,
            reapply=self._reapply,
            stale_sub=self._stale_sub,
            admin_done=self._admin_done,
        )
        self.balancing = Balancing(
            ctx,
            self.migration,
            self.splits,
            self.loads,
            self.indexing,
            ready=lambda: self.ready,
            draining=lambda: self.draining,
        )
        self.migration.planner = self.balancing  # the two sides of a session need each other
        ctx.journal.slice_no = lambda: self.balancing.monitor.slice_no

    # -- the shared context (overlay.node.context) -----------------------------------------

    @property
    def config(self) -> ClusterConfig:
        return self.ctx.config

    @config.setter
    def config(self, config: ClusterConfig) -> None:
        self.ctx.config = config

    @property
    def now(self) -> float:
        return self.ctx.now

    @now.setter
    def now(self, now: float) -> None:
        self.ctx.now = now

    @property
    def capture(self) -> CaptureBuffer | None:
        return self.ctx.capture

    @capture.setter
    def capture(self, capture: CaptureBuffer | None) -> None:
        self.ctx.capture = capture

    # == lifecycle ===============================================================

    @property
    def is_initializer(self) -> bool:
        return self.id == self.config.cluster.initializer

    def start(self, now: float) -> list[Action]:
        """Rule 1 for a cluster known to be new (core tests, the simulator):
        the initializer builds EC and announces the table at once."""
        return self._initialise(now) if self.is_initializer else []

    def boot(self, now: float) -> list[Action]:
        """Start as a process does (the shell): no table until the peers tell
        whether the cluster runs already (``overlay.node_boot``)."""
        self.boot_state.start(now)
        return self._boot_check(now)

    def _boot_check(self, now: float) -> list[Action]:
        if self.has_table or not self.boot_state.may_initialise(now):
            return []
        heard = sorted(self.boot_state.heard)
        log.info(
            "node %d: no live peer holds a table (heard from %s): initialising the cluster", self.id, heard or "none"
        )
        return self._initialise(now, peers=heard)

    def _initialise(self, now: float, peers: list[int] | None = None) -> list[Action]:
        """Rule 1: build EC, announce the table, ready when the peers replied
        (``peers``: those known up; the others get the table with their hello)."""
        out: list[Action] = []
        ec = Channel(self.local.new_id(), EventSpace.whole(self.schema), self.schema)
        self.local.add(ec)
        self.routing.set(ec.id, RouteEntry(ec.space, (self.id,)))
        self.has_table = True
        self.epoch = self.incarnation
        self._init_waiting = set(self.peers if peers is None else peers)
        init = self._table_init()
        for p in self.peers:
            out.append(ToPeer(p, init))
        if not self._init_waiting:
            self._become_ready()
        log.info("node %d: initializer, created %s, waiting for %d peers", self.id, ec.id, len(self.peers))
        return out

    def _table_init(self, *, sync: bool = False) -> pm.RoutingTableInit:
        return pm.RoutingTableInit(tuple(pm.RouteItem(c, e) for c, e in self.routing.items()), self.epoch, sync)

    def _become_ready(self) -> None:
        if not self.ready:
            self.ready = True
            log.info("node %d: ready (%d channels in routing table)", self.id, len(self.routing))

    def hello(self) -> pm.PeerHello:
        me = self.me  # the address lets a node that does not know us add us (node_membership rule 5)
        return pm.PeerHello(
            self.id,
            self.config.cluster.name,
            self.has_table,
            me.host,
            me.port,
            me.admin_port,
            me.capacity,
            self.left,
            self.incarnation,
            self.epoch,
        )

    def peer_hello(self, node: int, msg: pm.PeerHello, now: float) -> list[Action]:
        """A peer (re)connected to us: it may have joined (node_membership), or
        restarted (rule 7); one without our table gets it (node_boot rule 1)."""
        if msg.cluster != self.config.cluster.name:
            raise RemoteProtocolError(
                f"node {node} belongs to cluster {msg.cluster!r}, not {self.config.cluster.name!r}"
            )
        self.now = now
        out = self._member_hello(node, msg)  # an unknown node joins (node_membership rule 5)
        known = self.peer_incarnation.get(node)
        if msg.incarnation and known != msg.incarnation:
            self.peer_incarnation[node] = msg.incarnation
            if known is not None:
                log.warning("node %d: node %d restarted; dropping what its previous run left here", self.id, node)
                self.stats["peers_restarted"] += 1
                self.migration.peer_gone(node, f"node {node} restarted", out)
                self._drop_subscriptions_of_old_run(node)
        self.boot_state.hello(node, msg.has_routing_table)
        if self.has_table and (not msg.has_routing_table or (msg.epoch != self.epoch and self.epoch < msg.epoch)):
            out.append(ToPeer(node, self._table_init(sync=True)))
        out.extend(self._boot_check(now))
        return out

    # -- the table at start (overlay.node_boot) -------------------------------------------

    def _on_table(self, src: int, msg: pm.RoutingTableInit, out: list[Action]) -> None:
        """node_boot rules 1, 3, 6."""
        if not self.has_table or msg.epoch < self.epoch:
            if self.has_table:
                log.warning(
                    "node %d: node %d holds a table of an older epoch (%d < %d): adopting it",
                    self.id,
                    src,
                    msg.epoch,
                    self.epoch,
                )
            self._adopt_table(msg, out)
        elif msg.epoch > self.epoch:  # they initialised a cluster that runs already: ours wins
            out.append(ToPeer(src, self._table_init(sync=True)))
        elif msg.sync:
            self._merge_owner_table(src, msg, out)
        if not msg.sync:
            out.append(ToPeer(src, pm.ReplyRoutingTableInit(self.id)))

    def _adopt_table(self, msg: pm.RoutingTableInit, out: list[Action]) -> None:
        """node_boot rules 4 and 5."""
        self.routing.replace_all({i.ch_id: i.entry for i in msg.routing_table})
        for chid in self.routing:
            self.local.observe_id(chid)
        self.epoch = msg.epoch
        self.has_table = True
        for ch in list(self.local):  # e.g. a tentative EC of ours
            entry = self.routing.get(ch.id)
            if entry is None or self.id not in entry.owners:
                self.local.remove(ch.id)
        recreated, left = [], []
        for chid in self.routing.channels_of(self.id):
            if chid in self.local:
                continue
            entry = self.routing[chid]
            if entry.replicated:  # the other replicas hold its subscriptions
                new = RouteEntry(entry.space, tuple(o for o in entry.owners if o != self.id))
                self.routing.set(chid, new)
                self.updates.broadcast((), [(chid, new)], out)
                left.append(str(chid))
            else:
                self.local.add(Channel(chid, entry.space, self.schema))
                recreated.append(str(chid))
        if recreated or left:
            self.stats["channels_recreated_empty"] += len(recreated)
            log.warning(
                "node %d: the cluster's table names this node owner of channels it does not hold (lost when it "
                "stopped): %s re-created empty (their subscriptions must be made again)%s",
                self.id,
                ", ".join(recreated) or "none",
                f"; left the replica sets of {', '.join(left)}" if left else "",
            )
            self.record("rejoin", self.now, recreated=recreated, replicas_left=left)
        for upd in self.boot_state.take_buffered():
            self.updates.apply(upd)
        self._init_waiting = set()  # an initialisation of ours, if any, is abandoned
        self._become_ready()

    def _merge_owner_table(self, src: int, msg: pm.RoutingTableInit, out: list[Action]) -> None:
        """node_boot rule 6."""
        skip = set(self.local.ids()) | self.balancing.engaged()
        delete, update = owner_entries(self.routing, src, msg.routing_table, skip)
        if delete or update:
            self.stats["table_entries_repaired"] += len(delete) + len(update)
            log.info(
                "node %d: node %d's table corrects %d entries of its channels here",
                self.id,
                src,
                len(delete) + len(update),
            )
            self.routing.apply(delete, update)

    def _drop_subscriptions_of_old_run(self, node: int) -> None:
        """Rule 7: the clients of ``node``'s previous run are gone with it."""
        dropped = 0
        for ch in self.local:
            stale = [s.id for s in ch if s.access_node == node and self._stale_sub(s.id, node)]
            for gid in stale:
                ch.remove(gid)
            dropped += len(stale)
        if dropped:
            self.stats["subscriptions_of_dead_clients_removed"] += dropped
            log.info("node %d: removed %d subscriptions of node %d's previous run", self.id, dropped, node)

    def _stale_sub(self, gid: str, access: int) -> bool:
        """Made by a previous run of ``access`` (rule 7): its client is gone."""
        inc = self.incarnation if access == self.id else self.peer_incarnation.get(access)
        return inc is not None and not gid.startswith(sub_prefix(access, inc))

    # == peers ===================================================================

    def handle_peer(self, src: int, msg: pm.PeerMessage, now: float) -> list[Action]:
        out: list[Action] = []
        self.now = now
        if self.capture is not None:
            self.capture.now = now
        match msg:
            case pm.Event():
                self._on_event(msg, out)
            case pm.Notification():
                self._on_notification(msg, out, src)
            case pm.Subscription():
                self._on_subscription(msg, out)
            case pm.UnSubscription():
                self._on_unsubscription(msg, out)
            case pm.SubscriptionApplied():
                self._on_applied(msg, out)
            case pm.NotificationAck():
                self.stats["notification_acks"] += 1
                self._on_notification_ack(src, msg, out)
            case pm.RoutingTableInit():
                self._on_table(src, msg, out)
            case pm.ReplyRoutingTableInit():
                self._init_waiting.discard(src)
                if not self._init_waiting and self.has_table:
                    self._become_ready()
            case pm.UpdateRoutingTable():
                if self.has_table:
                    self.updates.apply(msg)
                else:
                    self.boot_state.keep(msg)  # node_boot rule 5
                out.append(ToPeer(src, pm.ReplyUpdateGlobal(msg.session, msg.origin)))
            case pm.ReplyUpdateGlobal():
                self._on_update_reply(src, msg, now, out)
            case pm.RequestLoadBalance():
                self.migration.on_request(src, msg, now, out)
            case pm.ChannelTransfer():
                self.migration.on_channel_transfer(src, msg, now, out)
            case pm.SubscriptionMove():
                self.migration.on_subscription_move(src, msg, now, out)
            case pm.Reforward():
                self.migration.on_reforward(src, msg, now, out)
            case pm.CompleteLoadBalance():
                self.migration.on_complete(src, msg, now, out)
            case pm.ReplyRequestLoadBalance() | pm.ReplyChannelTransfer() | pm.ReplySubscriptionMove():
                self.migration.on_reply(src, msg, now, out)
            case pm.LIEM():
                self.stats["liems_in"] += 1
                self.balancing.on_liem(src, msg)
            case pm.PeerHello():
                out.extend(self.peer_hello(src, msg, now))
            case pm.PeerError():
                log.warning("node %d: peer %d refused a message: %s %s", self.id, src, msg.code, msg.message)
            case _:
                raise RemoteProtocolError(f"unexpected {type(msg).__name__} from node {src}")
        return out

    # -- events (rules 2, 3, 5) ------------------------------------------------------

    def _on_event(self, msg: pm.Event, out: list[Action]) -> None:
        if msg.dispatch_sign is pm.DispatchSign.EVENT_NEW:  # a keyed event for its home (node.ordering)
            self.ordering.sequence(msg, out)
            return
        chid = msg.ch_id
        assert chid is not None
        mig = self.migration.reforwarding.get(chid)
        if mig is not None and not mig.replicate:  # a replica's events stay here
            self.migration.reforward(mig, chid, pm.ReforwardSign.EVENT_MESSAGE, msg, out)
            return
        ch = self.local.get(chid)
        if ch is None or (self.migration.incoming and self.migration.unfilled(chid, event=True)):
            self._reroute_event(msg, out)
            return
        self._match(ch, msg, out)

    def _match(self, ch: Channel, msg: pm.Event, out: list[Action]) -> None:
        try:
            matched, _tested = ch.match(msg.event_exp, msg.access_node)
        except Exception:  # a bug or a poisoned subscription: serve the others (SPEC §16)
            (matched, _tested), failed = ch.match_isolating(msg.event_exp, msg.access_node)
            self._subscriptions_failed(ch, msg, failed, "matching")
        self.ctx.tested_hist.observe(_tested)
        if self.capture is not None:
            self.capture.event(
                msg.event_id,
                msg.access_node,
                ch.id,
                _tested,
                matched,
                self.monitor.slice_no,
                msg.key or None,
                msg.rank or None,
            )
        stats = self.stats
        stats["events_matched"] += 1
        if msg.key or (matched and any(s.group for s in matched)):
            if self.groups.deliver_tracked(ch, msg, matched, out):  # ordered / groups: node.groups
                return
        if not matched:
            return
        by_node: dict[int, list[str]] = {}
        for sub in matched:
            ids = by_node.get(sub.access_node)
            if ids is None:
                by_node[sub.access_node] = [sub.id]
            else:
                ids.append(sub.id)
        for node, ids in by_node.items():
            if node == self.id:
                # This node is the subscribers' access node: straight to their
                # clients, exactly as a Notification to ourselves would go.
                self.notifier.notify_clients(msg.event_id, msg.event_exp, ids, msg.publish_time, out)
            else:
                out.append(
                    ToPeer(node, pm.Notification(msg.event_id, msg.event_exp, tuple(ids), ch.id, msg.publish_time))
                )
        stats["notifications_out"] += len(matched)

    def _subscriptions_failed(self, ch: Channel, msg: pm.Event, subs: Sequence[Any], what: str) -> None:
        """Rule 5's exception: these subscriptions could not be served this
        event; counted per subscription, logged with the traceback, and the
        event goes on to every other match."""
        self.stats["subscription_errors"] += max(1, len(subs))
        log.exception(
            "node %d: %s event %s on channel %s failed for %s; the other subscriptions are served",
            self.id,
            what,
            msg.event_id,
            ch.id,
            [getattr(s, "id", s) for s in subs] or "an unknown subscription",
        )

    def _reroute_event(self, msg: pm.Event, out: list[Action]) -> None:
        chid = self.routing.lookup_event(msg.event_exp)
        if chid is None or msg.hops >= MAX_HOPS:
            self.stats["events_unroutable"] += 1
            log.error("node %d: event %s has no route (hops %d); dropped", self.id, msg.event_id, msg.hops)
            return
        self.stats["events_rerouted"] += 1
        fwd = msgspec.structs.replace(
            msg, ch_id=chid, dispatch_sign=pm.DispatchSign.EVENT_DISPATCHED, hops=msg.hops + 1
        )
        self._dispatch_event(fwd, out)

    def _dispatch_event(self, msg: pm.Event, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        entry = self.routing[chid]
        owner = entry.owner if not entry.replicated else _pick(entry.owners, msg.event_id)
        if owner == self.id:
            self._on_event(msg, out)
        else:
            out.append(ToPeer(owner, msg))

    def _on_notification(self, msg: pm.Notification, out: list[Action], src: int = -1) -> None:
        notifier = self.notifier
        if msg.key or notifier.has_groups:  # acks go back to the owner (node.notify)
            notifier.notify(msg.event_id, msg.event_exp, msg.sub_ids, msg.publish_time, src, msg.key, msg.rank, out)
            return
        notifier.notify_clients(msg.event_id, msg.event_exp, msg.sub_ids, msg.publish_time, out)

    # -- subscriptions (rules 2, 3, 4) -------------------------------------------------

    def _on_subscription(self, msg: pm.Subscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        if self._stale_sub(msg.sub_id, msg.access_node):  # rule 7: a late copy from a dead client
            self.stats["subscriptions_of_dead_clients_removed"] += 1
            return
        mig = self.migration.reforwarding.get(chid)
        if mig is not None:
            self.migration.reforward(mig, chid, pm.ReforwardSign.SUBSCRIBE, msg, out)
            if not mig.replicate:
                return
        ch = self.local.get(chid)
        if ch is None or (self.migration.incoming and self.migration.unfilled(chid)):
            self._reroute_sub(msg, msg.sub_exp, out, subscribe=True)
            return
        if self._to_first_replica(chid, msg, out):
            return
        if ch.add(msg.stored()):
            self.stats["subscriptions_applied"] += 1
        if mig is None and not self._relay(chid, msg, out):  # a new replica answers a Reforward itself
            self._applied(msg.sub_id, chid, msg.access_node, True, (), out)

    def _on_unsubscription(self, msg: pm.UnSubscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        mig = self.migration.reforwarding.get(chid)
        if mig is not None:
            self.migration.reforward(mig, chid, pm.ReforwardSign.UNSUBSCRIBE, msg, out)
            if not mig.replicate:
                return
        ch = self.local.get(chid)
        if ch is None or (self.migration.incoming and self.migration.unfilled(chid)):
            self._reroute_sub(msg, msg.unsub_exp, out, subscribe=False)
            return
        if self._to_first_replica(chid, msg, out):
            return
        if ch.remove(msg.sub_id) is not None:
            self.stats["unsubscriptions_applied"] += 1
        if mig is None and not self._relay(chid, msg, out):  # a new replica answers a Reforward itself
            self._applied(msg.sub_id, chid, msg.access_node, False, (), out)

    def _relay(self, chid: ChannelId, msg: pm.Subscription | pm.UnSubscription, out: list[Action]) -> bool:
        """A replicated channel's (un)subscriptions reach its first owner and go
        along its owners in order, as Reforwards (each link FIFO); the last one
        answers the access node, so a SubAck means every replica holds it
        (SPEC §8.3), and one that reached the first owner by an old table still
        reaches all."""
        entry = self.routing.get(chid)
        if entry is None or not entry.replicated or self.id not in entry.owners:
            return False
        i = entry.owners.index(self.id)
        if i + 1 == len(entry.owners):
            return False
        sign = pm.ReforwardSign.SUBSCRIBE if isinstance(msg, pm.Subscription) else pm.ReforwardSign.UNSUBSCRIBE
        out.append(ToPeer(entry.owners[i + 1], pm.Reforward(chid, (pm.ReforwardItem(sign, msg),))))
        return True

    def _to_first_replica(self, chid: ChannelId, msg: pm.Subscription | pm.UnSubscription, out: list[Action]) -> bool:
        """A later replica got an (un)subscription straight, not along the chain
        (an old route from when it owned the channel alone): to the first owner."""
        if self.migration.in_reforward:
            return False
        entry = self.routing.get(chid)
        if entry is None or not entry.replicated or entry.owner == self.id or self.id not in entry.owners:
            return False
        out.append(ToPeer(entry.owner, msg))
        return True

    def _reroute_sub(
        self, msg: pm.Subscription | pm.UnSubscription, f: Filter, out: list[Action], *, subscribe: bool
    ) -> None:
        old = msg.ch_id
        assert old is not None
        if msg.hops >= MAX_HOPS:
            self.stats["subscriptions_unroutable"] += 1
            log.error("node %d: (un)subscription %s bounced %d times; dropped", self.id, msg.sub_id, msg.hops)
            return
        entry = self.routing.get(old)
        if entry is not None and self.id not in entry.owners:
            chans = [old]  # it moved: only its new owner(s), not every channel of the filter again
        else:
            chans = self.routing.lookup_subscription(f)
            heirs = self.updates.heirs(old)  # split or merged: only what replaced it
            if heirs:
                chans = [c for c in chans if c in heirs]
        self.stats["subscriptions_rerouted"] += 1
        # Tell the access node which channels replace the one it waits on, then send on.
        self._applied(msg.sub_id, old, msg.access_node, subscribe, tuple(chans), out)
        for chid in chans:
            fwd = msgspec.structs.replace(msg, ch_id=chid, hops=msg.hops + 1)
            self._dispatch_sub(fwd, out)

    def _dispatch_sub(self, msg: pm.Subscription | pm.UnSubscription, out: list[Action]) -> None:
        chid = msg.ch_id
        assert chid is not None
        owner = self.routing[chid].owner  # replicas: the first, which relays it to the others
        if owner == self.id:
            if isinstance(msg, pm.Subscription):
                self._on_subscription(msg, out)
            else:
                self._on_unsubscription(msg, out)
        else:
            out.append(ToPeer(owner, msg))

    def _applied(
        self,
        gid: str,
        chid: ChannelId,
        access: int,
        subscribe: bool,
        rerouted: tuple[ChannelId, ...],
        out: list[Action],
    ) -> None:
        note = pm.SubscriptionApplied(gid, chid, subscribe, rerouted)
        if access == self.id:
            self._on_applied(note, out)
        else:
            out.append(ToPeer(access, note))

    def _on_applied(self, msg: pm.SubscriptionApplied, out: list[Action]) -> None:
        p = self._pending.get(msg.sub_id)
        if p is None or p.subscribe != msg.subscribe:
            return
        # Signed count of copies per channel: below zero while an answer has
        # overtaken the reroute notice that announces its copy (a Reforward
        # travels on the high queue, the notice on the normal one).
        p.waiting[msg.ch_id] -= 1
        if msg.rerouted_to:
            # One copy went on to each of these; wait for every one, so none is
            # still on its way when the client hears back (and unsubscribes).
            p.waiting.update(msg.rerouted_to)
            p.channels += len(msg.rerouted_to) - 1
        else:
            p.applied.add(msg.ch_id)
        if any(p.waiting.values()):
            return
        del self._pending[msg.sub_id]
        if self.capture is not None:
            self.capture.applied(msg.sub_id, p.subscribe)
        if p.then is not None:  # an unsubscribe waited for this subscribe: no SubAck, send it now
            self._send_unsubscribe(*p.then, out)
            return
        if p.session not in self.sessions:
            return
        if p.subscribe:
            out.append(ToClient(p.session, cm.SubAck(p.seq, p.local_id, len(p.applied))))
        else:
            out.append(ToClient(p.session, cm.UnsubAck(p.seq, p.local_id)))

    # -- table updates ------------------------------------------------------------------

    def _on_update_reply(self, src: int, msg: pm.ReplyUpdateGlobal, now: float, out: list[Action]) -> None:
        if not self.migration.on_update_reply(src, msg, now, out):
            self.updates.on_reply(src, msg.session, out)

    def peer_link(self, node: int, up: bool, now: float) -> list[Action]:
        """The shell reports a peer link's state (SPEC §10 rule 1: homes move at
        once); a link that went down fails the deliveries tracked with it."""
        out: list[Action] = []
        self.now = now
        if self.ordering.link_changed(node, up, out):
            self.groups.peer_down(node, now, out)
        return out

    def end_batch(self) -> list[Action]:
        """After each batch of inbound messages: the batched notes (SPEC §10 rule 8)."""
        return self.ordering.end_batch()

    def home_of(self, key: str) -> int:
        return self.ordering.home_of(key)

    # -- peers' liveness, migration and balancing (overlay.node.migration, .balancing) ------------

    def peer_unreachable(self, node: int, now: float) -> list[Action]:
        """The shell lost its link to ``node`` for longer than the peer timeout."""
        self.unreachable.add(node)
        self.now = now
        out: list[Action] = []
        self.migration.peer_gone(node, f"no answer from node {node}: unreachable for {self.timeout}s", out)
        return out

    def peer_reachable(self, node: int) -> None:
        self.unreachable.discard(node)

    def _stop_waiting_for(self, node: int, out: list[Action]) -> None:
        self.migration.stop_waiting_for(node, out)

    def _reapply(self, msg: pm.Event | pm.Subscription | pm.UnSubscription, out: list[Action]) -> None:
        """A message handled as if it had just come (a Reforward's, a rollback's)."""
        match msg:
            case pm.Event():
                self._on_event(msg, out)
            case pm.Subscription():
                self._on_subscription(msg, out)
            case pm.UnSubscription():
                self._on_unsubscription(msg, out)

    @property
    def rng(self) -> random.Random:
        """The core's one random source (balancing's draws): the simulator reseeds it."""
        return self.balancing.rng

    @property
    def monitor(self) -> Monitor:
        return self.balancing.monitor

    @property
    def last_report(self) -> SliceReport | None:
        """The monitor's report of the last slice (SPEC §6), None before the first."""
        return self.balancing.last_report

    @property
    def index_wanted(self) -> bool:
        """Subscriptions wait to be indexed: the shell runs ``background_step``."""
        return self.indexing.wanted

    @property
    def background_last(self) -> str:
        return self.balancing.background_last

    def background_step(self, limit: int, now: float) -> tuple[bool, list[Action]]:
        return self.balancing.background_step(limit, now)

    def index_pending(self, limit: int) -> int:
        return self.indexing.step(limit, self.migration.leaving())

    # Until the integration tests move to overlay.testing (issue 15): what they read.
    @property
    def outgoing(self) -> dict[int, OutgoingMigration]:
        return self.migration.outgoing

    @property
    def incoming(self) -> dict[tuple[int, int], IncomingMigration]:
        return self.migration.incoming

    @property
    def _channel_load(self) -> Mapping[ChannelId, float]:
        return self.loads.all()

    @property
    def acks(self) -> AwaitedAcks:
        return self.notifier.acks

    @property
    def _dispatchers(self) -> dict[tuple[ChannelId, str], GroupDispatcher]:
        return self.groups._dispatchers

    def _groups_tick(self, now: float, out: list[Action]) -> None:
        """SPEC §11 on time: the access node's acks, the owner's deadlines, housekeeping."""
        self.notifier.tick(now, out)
        self.groups.tick(now, out)
        self.groups.prune(now)
        self.notifier.prune(now)

    def _on_notification_ack(self, src: int, msg: pm.NotificationAck, out: list[Action]) -> None:
        """To the component of the leg ``msg.code`` names (see ``pm.NotificationAck``)."""
        code = msg.code
        if not msg.event_id and code in (COMPLETE, SEQUENCED, ACKED):
            self.ordering.on_batched(msg, out)
        elif code == "":
            self.groups.on_delivery_ack(msg, out)
        elif code == COMPLETE:
            self.ordering.on_complete_ack(msg.event_id, out)
        elif code == UNDELIVERABLE:
            self.notifier.on_returned(msg, out)
        elif code == SEQUENCED or msg.failed:
            self.ordering.on_verdict(msg, out)
        else:
            self.stats["notification_acks_unknown"] += 1

    def tick(self, now: float) -> list[Action]:
        """Time-driven work: the table at start (node_boot), slices (SPEC §6),
        key and delivery timeouts, drains, session timeouts (migration rule 2).
        Each part runs even when another one failed (rule 8)."""
        out: list[Action] = []
        self.now = now
        if self.capture is not None:
            self.capture.now = now
        parts = (
            ("boot", lambda: out.extend(self._boot_check(now))),
            ("slice", lambda: self.balancing.tick(now, out)),
            ("ordering", lambda: self.ordering.tick(now, out)),
            ("groups", lambda: self._groups_tick(now, out)),
            ("drain", lambda: self._drain_tick(now, out)),  # node_membership rule 1
            ("sessions", lambda: self.migration.tick(now, out)),
        )
        for name, part in parts:
            try:
                part()
            except Exception:  # rule 8: logged with the state, counted; the node keeps serving
                self.stats["tick_errors"] += 1
                log.exception("node %d: the %s part of a tick failed; state: %s", self.id, name, self._state_summary())
        return out

    def _state_summary(self) -> str:
        """What an operator needs to read a failure in the log (rule 8)."""
        return (
            f"ready={self.ready} state={self.monitor.state.value} channels={[str(c) for c in self.local.ids()]} "
            f"outgoing={[(m.session, m.receiver, m.state.value) for m in self.migration.outgoing.values()]} "
            f"incoming={[(k, m.state.value) for k, m in self.migration.incoming.items()]} "
            f"splitting={self.balancing.splitting()} unreachable={sorted(self.unreachable)}"
        )


def _pick(owners: tuple[int, ...], key: str) -> int:
    """A replica for an event (SPEC §8.3): random-looking but stable per event."""
    return owners[zlib.crc32(key.encode()) % len(owners)]
