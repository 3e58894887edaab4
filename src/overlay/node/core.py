"""The node core: one node's protocol logic with no sockets and no clock.

``NodeCore`` composes the components of this package (each owns its state;
the README's table maps every SPEC section to its module) and dispatches
each message to the one that handles it.

A decoded message and ``now`` go in; the actions to perform come out
(``ToPeer``, ``ToClient``, ``CloseClient``).  The asyncio shell in
``overlay.net.node`` reads frames, calls the core, and carries out what it
returns; the simulator of SPEC §15 drives the same core with in-memory links.

The node's rules, numbered as the other modules cite them (SPEC §3, §4, §8):

1. Initialisation and readiness: ``node.boot``.
2. One hop, 3. re-routing, 5. one match and one Notification per access
   node, 8. one subscription's error is its own: ``node.router``.
4. An (un)subscription is acknowledged once every copy is applied, and an
   unsubscribe never overtakes its subscribe: ``node.sessions``.
6. Ids never repeat: subscription ids ``node.incarnation:session:local_id:n``
   (a re-subscribe never revives an old one), event ids
   ``node-incarnation-n``; the incarnation is the process's start time,
   given by the shell (``node.context``).
7. A peer whose hello carries a new incarnation restarted: what this node
   held for its old run is dropped — its dead clients' subscriptions
   (``node.peers``), sessions with it and waits for its replies
   (``node.migration``) — as when a peer is unreachable past the timeout;
   and, as on a death, the keys this node is home of release their events
   in flight again (``node.keyhome`` rule 9): one the old run held died
   with it, and a restart before anyone declared it dead brings no
   recovery update to release it again (fault seed 1132).
8. One bad state never stops a node: each part of ``tick`` runs in its own
   guard, logged with the state and counted (here).
9. A replica that sees its first owner take a replicated channel back alone
   drops its copy (``node.updates``; operators: ``node.admin``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from overlay.actions import Action, AddPeer, CloseClient, Rejoin, ToClient, ToPeer
from overlay.auth.tokens import Verifier
from overlay.balance.monitor import Monitor, SliceReport
from overlay.capture import CaptureBuffer
from overlay.channels.channel import ChannelId
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.admin import Admin
from overlay.node.arrivals import Arrivals
from overlay.node.balancing import Balancing
from overlay.node.boot import Boot
from overlay.node.clients import Clients
from overlay.node.context import NodeContext
from overlay.node.dedup import SeenEvents
from overlay.node.failures import Failures
from overlay.node.groups import Groups
from overlay.node.indexing import Indexing
from overlay.node.liveness import Liveness
from overlay.node.loads import ChannelLoads
from overlay.node.membership import DrainState, Membership
from overlay.node.migration import Migration
from overlay.node.notify import Notifier
from overlay.node.observer import CoreObserver
from overlay.node.ordering import Ordering
from overlay.node.outbox import Outbox, Receipts
from overlay.node.peer_messages import PeerMessages
from overlay.node.peers import PeerRuns
from overlay.node.recovery import Recovery
from overlay.node.router import Router
from overlay.node.sessions import Session, Sessions
from overlay.node.splits import Splits
from overlay.node.status import node_status, state_summary
from overlay.node.table_sync import TableSync
from overlay.node.updates import TableUpdates

__all__ = ["Action", "AddPeer", "CloseClient", "NodeCore", "Rejoin", "ToClient", "ToPeer"]

log = logging.getLogger("overlay.node")


class NodeCore:
    """One node's components, and the dispatch of what comes in to them.

    Invariant: a channel is in ``local`` iff the routing table names this node
    as its owner, except inside a migration session between <1> and <3> on
    either side (SPEC §8.1).
    """

    def __init__(
        self,
        config: ClusterConfig,
        node_id: int,
        *,
        incarnation: int = 0,
        admin_token: str | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.ctx = ctx = NodeContext(config, node_id, incarnation)
        self.id = node_id
        self.incarnation = incarnation
        # The shared tables and lists, never replaced (membership grows ``peers`` in place).
        self.schema, self.routing, self.local, self.peers = ctx.schema, ctx.routing, ctx.local, ctx.peers
        self.stats, self.journal = ctx.stats, ctx.journal.entries  # counters; the decision journal (SPEC §14)
        self.admin_token = config.cluster.admin_token if admin_token is None else admin_token  # "" = none needed
        # Client tokens (overlay.auth): the shell reads the [auth] keys and hands
        # the verifier in (no file is read here); None: auth is off.
        self.verifier = verifier
        # Components in the order they depend on each other; one that needs one built
        # later gets a lambda (ordering/groups/migration hand messages back to the router).
        self.peer_runs = PeerRuns(ctx)
        self.liveness = Liveness.configured(node_id, incarnation, ctx.peers, config.cluster)
        self.updates = TableUpdates(ctx, admin_done=lambda admin, result, out: self.admin.done(admin, result, out))
        self.sessions = Sessions(
            ctx,
            dispatch_sub=lambda msg, out: self.router.dispatch_sub(msg, out),
            fail_acks=lambda sid, out: self.notifier.fail_session_acks(sid, out),
        )
        self.ordering = Ordering(
            ctx,
            dispatch_event=lambda ev, out: self.router.dispatch_event(ev, out),
            deliveries_acked=lambda pairs, out: self.groups.deliveries_acked(pairs, out),
            sessions=self.sessions,
            dead=self.liveness.dead,
        )
        # Nothing acknowledged is lost (node.outbox): the events this access node
        # keeps until confirmed, the receipts it owes other nodes' outboxes, and
        # the event ids its clients got lately (node.dedup).
        self.outbox = Outbox(
            ctx, dispatch=lambda ev, out: self.router.dispatch_event(ev, out), sessions=self.sessions.open_ids
        )
        self.receipts = Receipts(ctx, self.outbox)
        self.notifier = Notifier(
            ctx,
            self.ordering,
            owners=self.sessions.owners,
            base_of=self.sessions.base_of,
            sessions=self.sessions.open_ids,
            owner_ack=lambda ack, out: self.groups.on_delivery_ack(ack, out),
            close_session=self.sessions.close,
            seen=SeenEvents(config.cluster.dedup_window, config.cluster.dedup_max, ctx.stats),
            defer_error=lambda eid, code, text: (
                self.outbox.defer_error(eid, code, text) or self.ordering.defer_error(eid, code, text)
            ),
        )
        self.groups = Groups(
            ctx,
            self.notifier,
            self.ordering,
            replaced=self.updates.replaced,
            subscriptions_failed=lambda ch, msg, subs, what: self.router.subscriptions_failed(ch, msg, subs, what),
            events_matched=self.receipts.matched,
        )
        self.indexing = Indexing(ctx)
        self.loads = ChannelLoads(node_id)
        self.splits = Splits(ctx, self.loads, self.updates, self.indexing)
        self.arrivals = Arrivals(
            ctx,
            self.groups,
            self.indexing,
            self.loads,
            reapply=lambda msg, out: self.router.reapply(msg, out),
            stale_sub=self.peer_runs.stale_sub,
        )
        self.migration = Migration(
            ctx,
            self.updates,
            self.groups,
            self.arrivals,
            self.loads,
            reapply=lambda msg, out: self.router.reapply(msg, out),
            admin_done=lambda admin, result, out: self.admin.done(admin, result, out),
            rebuilding=lambda: self.recovery.rebuilding,
        )
        self.startup = Boot(ctx, self.updates, recreated=lambda chids, out: self.recovery.restarted(chids, out))
        self.balancing = Balancing(
            ctx,
            self.migration,
            self.splits,
            self.loads,
            self.indexing,
            ready=lambda: self.startup.ready,
            draining=lambda: self.membership.draining,
            damped=self.liveness.damped,
        )
        self.monitor: Monitor = self.balancing.monitor  # SPEC §6
        self.rng: random.Random = self.balancing.rng  # the core's one random source: the simulator reseeds it
        self._close_turn = False  # background_step: whose turn it is when both have work
        self._background_last = ""
        # The two sides of a session and balancing need each other.
        self.migration.planner = self.arrivals.planner = self.balancing
        ctx.journal.slice_no = lambda: self.balancing.monitor.slice_no
        self.recovery = Recovery(
            ctx,
            self.liveness,
            self.updates,
            self.sessions,
            match=lambda ch, ev, out: self.router.match(ch, ev, out),
            peer_gone=lambda node, out: self.failures.peer_dead(node, out),
            resend=lambda now, out: self.outbox.resend_all(now, out),
            redispatch=lambda now, out: self.ordering.home.redispatch(out),
            loads=lambda: self.failures.loads(),
            dead_load=lambda node: getattr(self.monitor.loads.get(node), "d", 0.0),
            damped=self.liveness.damped,
            arriving=lambda: self.arrivals.arriving(),
            group_choices=self.notifier.group_choices,
            learn_choices=self.groups.choices.learn,
        )
        # Tables re-converge (node.table_sync); the local table follows the
        # routing table's changes (node.updates rule 3).
        self.table_sync = TableSync(ctx, self.updates, self.startup, self.liveness)
        self.updates.engaged = self._table_engaged
        self.updates.recreate = self.recovery.recreate
        self.updates.dropped = self.recovery.dropped
        self.failures = Failures(
            ctx,
            self.liveness,
            self.recovery,
            tables=self.table_sync,
            peers=ctx.peers,
            monitor=self.balancing.monitor,
            gone=(
                lambda node, out: self.migration.peer_gone(node, f"node {node} was declared dead", out),
                self.ordering.node_dead,  # its keys get new homes (node.keyhome rule 5)
                lambda node, out: self.groups.peer_down(node, self.ctx.now, out),  # what it owed us failed
                lambda node, out: self.peer_runs.drop_subscriptions_of(node),  # its clients died with it
                self.outbox.node_dead,  # its receipts will not come (node.outbox rule 2)
                lambda node, out: self.sessions.retry_all(out),  # copies it held or forwarded (sessions rule 6)
            ),
            node_back=self.outbox.node_back,
            peer_runs=self.peer_runs,
            new_run=self.ordering.peer_run,  # back from the dead: keys move to it (node.ordering rule 7)
            restarted=(
                lambda node, out: self.migration.peer_gone(node, f"node {node} restarted", out),
                lambda node, out: self.ordering.home.redispatch(out),  # what its old run held (rule 7)
                lambda node, out: self.peer_runs.drop_subscriptions_of_old_run(node),
                self.recovery.peer_restarted,
                lambda node, out: self.sessions.retry_all(out),
            ),
        )
        self.router = Router(
            ctx,
            migration=self.migration,
            arrivals=self.arrivals,
            ordering=self.ordering,
            groups=self.groups,
            notifier=self.notifier,
            updates=self.updates,
            sessions=self.sessions,
            peers=self.peer_runs,
            recovery=self.recovery,
            receipts=self.receipts,
        )
        self.outbox.dispatch, self.outbox.unsent = self.router.dispatch_event, self.notifier.seen.unsee  # hot path
        self.membership = Membership(
            ctx,
            self.startup,
            self.sessions,
            self.migration,
            self.balancing,
            self.loads,
            self.updates,
            peer_left=(  # node.membership rule 6: it closed its clients when it left
                lambda node, out: self.peer_runs.drop_subscriptions_of(node, f"node {node}'s clients (it left)"),
                self.outbox.node_dead,  # its receipts will not come (node.outbox rule 2)
            ),
            peer_joined=(self.outbox.node_back,),
        )
        self.admin = Admin(
            ctx,
            self.sessions,
            self.migration,
            self.balancing,
            self.splits,
            self.updates,
            status=self.status,
            drain=lambda now, admin: self.membership.drain(now, admin),
        )
        self.clients = Clients(
            ctx,
            self.sessions,
            self.router,
            self.ordering,
            self.notifier,
            self.outbox,
            tracks=self.groups.tracks,
            ready=lambda: self.startup.ready,
            left=lambda: self.membership.left,
            quorum=lambda: self.liveness.has_quorum(self.ctx.now),
            admin=self.admin.handle,
            admin_token=self.admin_token,
            verifier=verifier,
            auth_required=config.auth.required,
        )
        self.peer_messages = PeerMessages(
            ctx,
            arrivals=self.arrivals,
            balancing=self.balancing,
            failures=self.failures,
            migration=self.migration,
            notifier=self.notifier,
            outbox=self.outbox,
            receipts=self.receipts,
            recovery=self.recovery,
            router=self.router,
            sessions=self.sessions,
            startup=self.startup,
            updates=self.updates,
            ordering=self.ordering,
            groups=self.groups,
            tables=self.table_sync,
            peer_hello=self.peer_hello,
        )
        self.hello = self.membership.hello  # this node's PeerHello (node.membership)
        self.client_opened = self.sessions.open  # a new client session's id

    # -- what the shell and the simulator read ---------------------------------------------------

    @property
    def config(self) -> ClusterConfig:
        return self.ctx.config  # membership grows it when a node joins

    @property
    def now(self) -> float:
        return self.ctx.now

    @property
    def capture(self) -> CaptureBuffer | None:
        return self.ctx.capture

    @capture.setter
    def capture(self, capture: CaptureBuffer | None) -> None:
        self.ctx.set_capture(capture)

    @property
    def ready(self) -> bool:
        return self.startup.ready

    @property
    def has_table(self) -> bool:
        return self.startup.has_table

    @property
    def epoch(self) -> int:
        return self.startup.epoch

    @property
    def is_initializer(self) -> bool:
        return self.startup.is_initializer

    @property
    def draining(self) -> bool:
        return self.membership.draining

    @property
    def drain_state(self) -> DrainState | None:
        return self.membership.drain_state

    @property
    def last_report(self) -> SliceReport | None:  # the monitor's report of the last slice (SPEC §6), or None
        return self.balancing.last_report

    @property
    def index_wanted(self) -> bool:
        """Subscriptions wait to be indexed, or closed sessions' to be
        unsubscribed (``node.sessions`` rule 4): the shell runs ``background_step``."""
        return self.indexing.wanted or self.sessions.closing > 0

    @property
    def background_last(self) -> str:
        """What the last background step did (the shell's slow log)."""
        return self._background_last

    def background_step(self, limit: int, now: float) -> tuple[bool, list[Action]]:
        """The shell's background work, one bounded step: the balancer's (a
        split a session waits on, indexing: ``node.balancing``) and the
        unsubscriptions of closed sessions (``limit`` of them:
        ``node.sessions`` rule 4), taking turns when both have work.
        Whether work is left, and what to send."""
        sessions = self.sessions
        balancing = self.balancing
        if sessions.closing and (self._close_turn or not (self.indexing.wanted or balancing.splitting() is not None)):
            self._close_turn = False
            out: list[Action] = []
            left = sessions.close_step(max(limit, 1), out)
            self._background_last = f"unsubscribing closed sessions ({left} left)"
            return bool(left) or self.indexing.wanted or balancing.splitting() is not None, out
        self._close_turn = True
        more, out = balancing.background_step(limit, now)
        self._background_last = balancing.background_last
        return more or sessions.closing > 0, out

    def status(self) -> dict[str, Any]:
        return node_status(
            self.ctx,
            self.startup,
            self.balancing,
            self.membership,
            self.sessions,
            self.liveness,
            self.outbox,
            self.table_sync,
        )

    def session(self, sid: int) -> Session | None:
        return self.sessions.get(sid)

    def observe(self, observer: CoreObserver | None) -> None:
        """Report matches, notifications and the outbox's sends to ``observer``
        (None: to no one), the simulator's white-box view (``node.observer``)."""
        self.router.observer = self.notifier.observer = self.outbox.observer = observer

    def settled(self) -> bool:
        """No migration session on either side and no (un)subscription waiting."""
        return not self.migration.busy() and not self.sessions.pending()

    def start(self, now: float) -> list[Action]:
        """Rule 1 for a cluster known to be new (core tests, the simulator)."""
        return self.startup.start(now)

    def boot(self, now: float) -> list[Action]:
        """Start as a process does (the shell): the table comes from the peers,
        and the keys' states from their copies (node.keyhome rule 6)."""
        asks = self.ordering.home.booted(self.ordering.live_nodes())
        return [*self.startup.boot(now), *asks]

    def peer_hello(self, node: int, msg: pm.PeerHello, now: float) -> list[Action]:
        """A peer (re)connected to us: it may have joined (node.membership), or
        restarted (rule 7); one without our table gets it (node.boot rule 1)."""
        cluster = self.ctx.config.cluster.name
        if msg.cluster != cluster:
            raise RemoteProtocolError(f"node {node} belongs to cluster {msg.cluster!r}, not {cluster!r}")
        self.ctx.now = now
        out = self.membership.on_hello(node, msg)  # an unknown node joins (node.membership rule 5)
        self.failures.hello(node, msg.incarnation, now, out)  # a restart (rule 7), a dead node back
        self.startup.hello(node, msg, now, out)
        return out

    # -- clients (overlay.node.clients, .sessions) -----------------------------------------------

    def client_closed(self, sid: int) -> list[Action]:
        """Drop the session's subscriptions everywhere (the client re-subscribes on reconnect)."""
        self.clients.closed(sid)  # it no longer counts for its client id (node.clients rule L1)
        return self.sessions.close(sid)

    def handle_client(self, sid: int, msg: cm.ClientMessage, now: float) -> list[Action]:
        self._clock(now)
        return self.clients.handle(sid, msg, now)

    def handle_publishes(self, sid: int, msgs: list[cm.Publish], now: float) -> list[Action]:
        """Publishes of one session in a row, in order: as ``handle_client``
        with each, in one call (``Clients.publish_many``)."""
        self._clock(now)
        return self.clients.publish_many(sid, msgs, now)

    def client_ack(self, sid: int, msg: cm.Ack) -> bool:
        return self.clients.ack(sid, msg)

    def notify_dropped(self, sid: int, tag: int) -> list[Action]:
        """The shell dropped the tracked Notify ``tag`` (the session's queue was full)."""
        return self.notifier.notify_dropped(sid, tag)

    def drain(self, now: float, admin: tuple[int, int] | None = None) -> list[Action]:
        return self.membership.drain(now, admin)

    # -- peers ------------------------------------------------------------------------------------

    def handle_peer(self, src: int, msg: pm.PeerMessage, now: float) -> list[Action]:
        out: list[Action] = []
        self._clock(now)
        if self.failures.heard(src, msg, now):  # not from a run declared dead (node.failures rule 3)
            self.peer_messages.handle(src, msg, now, out)
        return out

    def handle_peer_events(self, src: int, msgs: list[pm.Event], now: float) -> list[Action]:
        """Events from ``src`` in a row, in order: as ``handle_peer`` with
        each, in one call (``PeerMessages.events``)."""
        out: list[Action] = []
        self._clock(now)
        failures = self.failures
        if failures.heard(src, msgs[0], now):
            self.peer_messages.events(src, msgs, out)
        else:  # a run declared dead: each dropped and counted (node.failures rule 3)
            for msg in msgs[1:]:
                failures.heard(src, msg, now)
        return out

    def peer_link(self, node: int, up: bool, now: float) -> list[Action]:
        """The shell reports a peer link's state.  Links lose nothing while both
        runs live: a key's home and a tracked delivery wait for the link to
        come back, or for the peer's death (node.ordering rule 1)."""
        out: list[Action] = []
        self.ctx.now = now
        self.ordering.link_changed(node, up, out)  # counted; nothing moves until a death (SPEC §16)
        return out

    def peer_unreachable(self, node: int, now: float) -> list[Action]:
        """The shell lost its link to ``node`` for longer than the peer timeout."""
        self.ctx.unreachable.add(node)
        self.ctx.now = now
        out: list[Action] = []
        why = f"no answer from node {node}: unreachable for {self.ctx.config.cluster.peer_timeout}s"
        self.migration.peer_gone(node, why, out)
        return out

    def peer_reachable(self, node: int) -> None:
        if not self.liveness.is_dead(node):  # a dead run stays unreachable until a new one says hello
            self.ctx.unreachable.discard(node)

    def end_batch(self, *, idle: bool = True) -> list[Action]:
        """After each batch of inbound messages: the batched notes (SPEC §10
        rule 8), and the receipts once the node is ``idle`` or they are due
        (node.outbox rule 5; ``receipts_due_in`` says when)."""
        out = self.ordering.end_batch()
        receipts = self.receipts
        if receipts.pending and (idle or receipts.due(self.ctx.now)):
            out.extend(receipts.end_batch())
        return out

    def receipts_due_in(self, now: float) -> float | None:
        """Seconds until the receipts waiting must go (``end_batch``); None: none wait."""
        receipts = self.receipts
        return receipts.wait_left(now) if receipts.pending else None

    def _clock(self, now: float) -> None:
        self.ctx.now = now
        capture = self.ctx.capture
        if capture is not None:
            capture.now = now

    def index_pending(self, limit: int) -> int:
        return self.indexing.step(limit, self.migration.leaving())

    def tick(self, now: float) -> list[Action]:
        """Time-driven work: the table at start (node.boot), slices (SPEC §6),
        key and delivery timeouts, drains, session timeouts (migration rule 2).
        Each part runs even when another one failed (rule 8)."""
        out: list[Action] = []
        self._clock(now)
        parts: tuple[tuple[str, Callable[[], None]], ...] = (
            ("liveness", lambda: self.failures.tick(now, out)),
            ("tables", lambda: self.table_sync.tick(now, out)),
            ("boot", lambda: out.extend(self.startup.check(now))),
            ("slice", lambda: self.balancing.tick(now, out)),
            ("ordering", lambda: self.ordering.tick(now, out)),
            ("groups", lambda: self._groups_tick(now, out)),
            ("drain", lambda: self.membership.tick(now, out)),  # node.membership rule 1
            ("sessions", lambda: self.migration.tick(now, out)),
            ("outbox", lambda: self._outbox_tick(now, out)),
            ("auth", lambda: self.clients.expire(now, out)),  # node.clients rule A3
            ("limits", lambda: self.clients.sweep(now)),  # overlay.limits.quotas rule 6
        )
        for name, part in parts:
            try:
                part()
            except Exception:
                self.ctx.stats["tick_errors"] += 1
                log.exception(
                    "node %d: the %s part of a tick failed; state: %s",
                    self.id,
                    name,
                    state_summary(self.ctx, self.startup, self.balancing, self.migration, self.arrivals),
                )
        return out

    def _table_engaged(self) -> set[ChannelId]:
        """Channels a session or a split is changing: the local table leaves
        them to it (node.updates rule 3)."""
        out = self.migration.leaving() | self.arrivals.arriving()
        split = self.balancing.splitting()
        if split is not None:
            out.add(split)
        return out

    def tables_agree(self, now: float) -> bool:
        """Every live peer's latest heartbeat carried this node's table digest (node.table_sync rule 6)."""
        return self.table_sync.agreed(now)

    def _outbox_tick(self, now: float, out: list[Action]) -> None:
        """SPEC §16: re-sends, expiries (node.outbox rules 3, 4), the receipts of a driver without end_batch."""
        self.outbox.tick(now, out)
        out.extend(self.receipts.end_batch())

    def _groups_tick(self, now: float, out: list[Action]) -> None:
        """SPEC §11 on time: the access node's acks, the owner's deadlines; housekeeping (old ids too)."""
        self.notifier.tick(now, out)
        self.groups.tick(now, out)
        self.groups.prune(now)
        self.notifier.prune(now)
        self.notifier.seen.expire(now)
