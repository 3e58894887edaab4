"""A deterministic simulated cluster of ``NodeCore``s (SPEC §15).

Theory of operation:

1. One process holds ``n`` real node cores, a simulated clock ``now`` and one
   in-memory link per ordered pair of nodes.  A link has a high and a normal
   queue (SPEC §1.1): while its high queue holds anything, the next message it
   delivers is the head of the high queue (``overlay.messages.peer.is_high``),
   so a high-priority message overtakes the normal ones still queued; within a
   level the order is FIFO.  Every peer message is encoded with msgpack,
   framed, and decoded by the real ``FrameReader`` of its link; every client
   message likewise with the client codec; one event's Notify to several
   sessions (``Notifies``) is encoded once, as the shell does.
2. A ``random.Random(seed)`` scheduler drives everything.  At each step it
   picks one of: deliver the head of one *ready* link (chosen at random
   among them, so interleavings across links vary with the seed) — or, as
   the real dispatcher hands them over, a run of a peer's Events or of a
   session's Publishes its node read together, in one call (``sim.inbox``;
   how many is drawn too); let a
   simulated client act (publish, subscribe, unsubscribe, an operator's
   ``split``/``place``, close its session, a new client connects); or advance
   the clock and ``tick`` the nodes (each node skips a tick now and then, and
   sometimes pauses its ticks for most of a slice: slices stretch and drift
   apart, LIEMs cross).  A run is a pure function of ``(config, seed,
   params)``: nothing reads the wall clock, sets are never iterated for
   decisions, and the node cores' own random sources are reseeded from the
   seed.  ``trace_hash`` digests every delivery, client message and tick.
3. Faults.  Links are reliable (TCP): without node faults the design never
   loses a message silently, so a fault is a *delay*, never a loss:
   * per-message jitter (each message is ready a random few ms after it is
     sent, never before the one queued ahead of it);
   * a slow link: one direction holds everything for 0.2 s up to 2.5× the
     peer timeout (congestion, retransmissions);
   * a stalled node: for up to 2× the peer timeout a node receives nothing,
     ticks nothing and serves no client (a GC or swap pause); its peers'
     sessions with it time out and roll back, and it then processes the
     backlog late — late replies, late RequestLoadBalance, late transfers;
   * tick jitter and pauses (slices that last longer on one node).
   The failure detector must not read these delays as deaths: those runs'
   config suspects a peer only after 3× the peer timeout (``sim.setup``).
   *Node faults* (``SimParams.node_faults``, ``fault_config``; rules in
   ``sim.faults``) add crashes and restarts, partitions and pauses longer
   than the suspicion, one node at a time, with real losses; the delays
   above then stay below the suspicion, and the clients reconnect, retry
   and re-send (``sim.client_faults``).  Those runs start with a hello on
   every link, so that a restart is a new incarnation to every peer.
4. A run has three phases: *active* (every client operation, forced moves,
   faults, natural balancing under a moving hot spot); *subscriptions only*
   (no more events for several slices: channels go cold and merge while
   subscriptions and unsubscriptions continue); *drain* (no client action:
   deliver everything and tick until no message is queued, no session,
   table update, (un)subscription or tracked delivery is pending, and every
   node's peers' latest heartbeats carry its table digest — ``node.table_sync``).  ``invariants``
   then checks the outcome.  With node faults the active phase lasts at
   least ``active_seconds`` of simulated time (the client operations spread
   over it), and the drain also waits for the last fault's recovery: every
   node that is up ready, every client answered, ``recovery_gap`` past the
   last fault.
"""

from __future__ import annotations

import random
import traceback
from collections import Counter
from typing import Final

from overlay.config import ClusterConfig

from .clients import SimClients
from .faults import NodeFaults
from .invariants import check_all
from .network import SimNetwork
from .records import EventRec, SimResult
from .setup import SimParams, fault_config, quiet_logs

__all__ = ["SimCluster"]

# Stats of the cores summed into SimResult.stats.
_STATS: Final = (
    "migrations",
    "migrations_aborted",
    "replications",
    "splits",
    "split_steps",
    "split_changes_replayed",
    "splits_cancelled",
    "merges",
    "reforwards",
    "events_rerouted",
    "subscriptions_rerouted",
    "notifications_orphaned",
    "events_unroutable",
    "subscriptions_unroutable",
    "events_resent",
    "duplicates_dropped",
    # ordered keys and groups across deaths (node.keyhome, node.groups rule 9, node.notify rule 5)
    "ordered_in",
    "ordered_keys_taken_over",
    "ordered_keys_handed_over",
    "ordered_released_again",
    "ordered_redispatched",
    "ordered_late_dropped",
    "group_dispatched",
    "group_sticky",
    "tracked_duplicates_dropped",
)


class SimCluster:
    """Module rules 1–4.  ``run()`` plays the whole scenario once: ``net``
    (cores, links, clock, faults) and ``users`` (the clients) draw from one
    seeded stream; what the invariants read is named here too."""

    def __init__(
        self,
        config: ClusterConfig,
        seed: int,
        params: SimParams | None = None,
        *,
        keep_trace: bool = False,
    ) -> None:
        self.config = config
        self.seed = seed
        self.params = params or SimParams.for_seed(seed)
        self.rng = random.Random(seed)
        self.slice = config.cluster.slice_seconds
        self.phase = "init"
        self.net = net = SimNetwork(config, seed, self.params, self.rng, keep_trace=keep_trace)
        self.users = users = SimClients(net, self.params, self.rng)
        net.to_client = users.receive
        net.frame_to_client = users.receive_frame
        net.on_advance = lambda: users.shift_hot_spot(self.phase == "active")
        self.node_faults: NodeFaults | None = None
        if self.params.node_faults:
            assert users.faults is not None
            client_faults = users.faults
            self.node_faults = nf = NodeFaults(net, self.params, self.rng)
            net.node_faults = nf
            nf.on_sessions_lost = client_faults.node_down
            nf.on_restarted = client_faults.node_up
            net.closed_by_node = client_faults.closed_by_node

            def on_advance() -> None:
                users.shift_hot_spot(self.phase == "active")
                client_faults.run_due()

            net.on_advance = on_advance
        # What the invariants read (``invariants``).
        self.ids, self.cores, self.arrivals, self.matched = net.ids, net.cores, net.arrivals, net.matched
        self.sent = net.sent
        self.failures, self.trace = net.failures, net.trace
        self.clients, self.admins, self.events = users.clients, users.admins, users.events
        self.event_names = users.event_names
        self.subs, self.notes, self.key_ranks = users.subs, users.notes, users.key_ranks
        self.races = 0  # (event, subscription) pairs an unsubscribe legitimately overtook
        self.exempt = 0  # (event, subscription) pairs whose session was lost before delivery (invariants rule 6)

    @classmethod
    def for_fault_seed(cls, seed: int, *, keep_trace: bool = False) -> SimCluster:
        """The run of a node-fault seed (``tests/test_simulation_faults.py``)."""
        return cls(fault_config(seed), seed, SimParams.for_fault_seed(seed), keep_trace=keep_trace)

    # == the scenario =====================================================================

    def run(self) -> SimResult:
        with quiet_logs():
            return self._run()

    def _run(self) -> SimResult:
        try:
            self.start()
            self.phase = "active"
            self._active_phase()
            self.phase = "subs-only"
            self._subs_only_phase()
            self.phase = "drain"
            self._drain()
            self._unacknowledged_events()
            self.failures.extend(check_all(self))
        except Exception as exc:  # noqa: BLE001 - a crash of a core is a finding, reported with the seed
            self.failures.append(
                f"crash at step {self.net.step_no} ({self.phase}, t={self.net.now:.3f}): {exc!r}\n"
                + "".join(traceback.format_exception(exc)[-6:])
            )
        return self.result()

    def result(self) -> SimResult:
        stats: Counter[str] = Counter()
        for core in [*self.net.retired, *self.cores.values()]:
            for k in _STATS:
                if core.stats.get(k):
                    stats[k] += core.stats[k]
        stats.update(self.net.runs)
        if self.node_faults is not None and self.users.faults is not None:
            stats.update(self.users.faults.counts)
            stats["messages_lost"] += sum(self.node_faults.lost.values())
        return SimResult(
            seed=self.seed,
            nodes=len(self.ids),
            trace_hash=self.net.hash.hexdigest(),
            failures=list(self.failures),
            steps=self.net.step_no,
            deliveries=self.net.deliveries,
            sim_seconds=self.net.now,
            events=len(self.events),
            notifies=self.users.notifies,
            subscriptions=len(self.subs),
            stats=stats,
            faults=self.net.faults,
            races=self.races,
            exempt=self.exempt,
            admin=self.users.admin_results,
            journal=list(self.net.journal),
        )

    def start(self) -> None:
        """Rule 4's beginning: the cores start, clients connect, until every node is ready."""
        if self.node_faults is not None:  # every link opens with a hello each way (sim.faults rule 3)
            for a in self.ids:
                for b in self.ids:
                    if a != b:
                        self.net.hello(a, b)
        for i in self.ids:
            self.net.execute(i, self.cores[i].start(self.net.now))
        for i in self.ids:
            self.admins[i] = self.users.open(i, admin=True)
            for _ in range(self.params.clients_per_node):
                self.users.open(i)
        # Clients may act before the cluster is ready: they get not_ready.
        while not all(c.ready for c in self.cores.values()):
            self.net.count_step()
            ready = self.net.ready_links()
            if ready and self.rng.random() < 0.8:
                self.net.deliver(self.rng.choice(ready))
            elif self.rng.random() < 0.5:
                self.users.act(only=("publish", "subscribe"))
            else:
                self.net.advance(faults=False)

    def _active_phase(self) -> None:
        p = self.params
        done = 0
        for _ in range(p.initial_subs):
            self.users.act(only=("subscribe",))
        start = self.net.now
        if self.node_faults is not None:
            self.node_faults.begin(start)
        while done < p.ops or self.net.now < start + p.active_seconds:
            self.net.count_step()
            r = self.rng.random()
            ready = self.net.ready_links()
            if ready and (r < p.p_deliver or self.net.lagging()):
                self.net.deliver(self.rng.choice(ready))
            elif (r < p.p_deliver + p.p_client or (not ready and r < p.p_deliver)) and self._ops_due(done, start):
                if self.users.act():
                    done += 1
            else:
                self.net.advance(faults=p.faults)

    def _ops_due(self, done: int, start: float) -> bool:
        """Spread the operations over ``active_seconds`` (rule 4): one may go
        while fewer are done than the elapsed share of the phase asks (else
        the clock moves on)."""
        p = self.params
        if not p.active_seconds:
            return True
        return done < min(p.ops, p.ops * (self.net.now - start) / p.active_seconds + 5)

    def _subs_only_phase(self) -> None:
        p = self.params
        end = self.net.now + p.subs_only_slices * self.slice
        while self.net.now < end:
            self.net.count_step()
            r = self.rng.random()
            ready = self.net.ready_links()
            if ready and (r < 0.75 or self.net.lagging()):
                self.net.deliver(self.rng.choice(ready))
            elif r < 0.8:
                self.users.act(only=("subscribe", "unsubscribe"))
            else:
                self.net.advance(faults=False, dt_scale=3.0)

    def _drain(self) -> None:
        deadline = self.net.now + self.params.max_drain_seconds
        while True:
            self.net.count_step()
            ready = self.net.ready_links()
            if ready:
                self.net.deliver(self.rng.choice(ready))
                continue
            if self.settled():
                return
            if self.net.now > deadline:
                self.failures.append(
                    f"not quiet {self.params.max_drain_seconds:.0f} s into the drain: {self.unsettled()}"
                )
                return
            nxt = self.net.next_ready()
            target = nxt if nxt is not None and nxt > self.net.now else self.net.now + self.slice / 4
            self.net.advance(faults=False, to=target)

    def _unacknowledged_events(self) -> None:
        """Events are recorded at their PubAck, which comes once they are
        confirmed (``node.outbox``); a publisher that closed before it never
        learnt the id: its accepted events are recorded here, and judged as
        every other (an accepted event is delivered all the same).  Runs with
        node faults record each event at its first Publish (``sim.client_faults``)."""
        if self.params.node_faults:
            return
        for eid, (node, sid, step, values) in self.net.accepted.items():
            c = self.users.by_session.get((node, sid))
            if eid not in self.events and c is not None and c.closed_at is not None:
                self.events[eid] = EventRec(eid, values, step, c.name)

    def unsettled(self) -> list[str]:
        """Why the cluster is not quiet yet (empty when it is)."""
        why = []
        if self.net.pending_messages():
            why.append(f"{self.net.pending_messages()} messages queued")
        nf = self.node_faults
        if nf is not None:
            since = nf.quiet_since()
            if since is None:
                why.append("a node fault is under way")
            elif self.net.now < since + nf.recovery_floor():
                why.append(f"recovering from the last fault (until t={since + nf.recovery_floor():.2f})")
            assert self.users.faults is not None
            why += self.users.faults.unsettled()
        for i, c in self.cores.items():
            active = [m.session for m in c.migration.outgoing.values() if m.active]
            if active:
                why.append(f"node {i}: outgoing sessions {active} active")
            if c.arrivals.incoming:
                why.append(f"node {i}: incoming sessions {sorted(c.arrivals.incoming)}")
            if c.updates.waiting():
                why.append(f"node {i}: table updates {c.updates.waiting()} waiting")
            if c.has_table and not c.tables_agree(self.net.now):  # anti-entropy still at work (node.table_sync)
                why.append(f"node {i}: a live peer's latest heartbeat carried another table digest")
            if c.sessions.pending():
                why.append(
                    f"node {i}: {c.sessions.pending()} (un)subscriptions waiting: {c.sessions.pending_ids()[:5]}"
                )
            if c.monitor.busy:
                why.append(f"node {i}: BUSY")
            if len(c.outbox):
                why.append(f"node {i}: {len(c.outbox)} events not confirmed yet: {c.outbox.ids()[:5]}")
            keyed = c.ordering.status()
            held = c.ordering.sequencer.held
            if any(keyed[k] for k in ("waiting", "waiting_for_backups", "in_flight")) or held:
                why.append(f"node {i}: keyed events under way {keyed}, {held} held")
            if c.ordering.home.awaiting is not None:
                why.append(f"node {i}: waits for the handovers of {sorted(c.ordering.home.awaiting)}")
            if c.receipts.pending:
                why.append(f"node {i}: receipts not sent yet")
            if c.groups.pending():  # a group copy whose answer is awaited may still go to another instance
                why.append(f"node {i}: {c.groups.pending()} tracked deliveries waiting for answers")
        return why

    def settled(self) -> bool:
        return not self.unsettled()
