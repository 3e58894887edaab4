"""A deterministic simulated cluster of ``NodeCore``s (SPEC §15).

Theory of operation:

1. One process holds ``n`` real node cores, a simulated clock ``now`` and one
   in-memory link per ordered pair of nodes.  A link has a high and a normal
   queue (SPEC §1.1): while its high queue holds anything, the next message it
   delivers is the head of the high queue (``overlay.messages.peer.is_high``),
   so a high-priority message overtakes the normal ones still queued; within a
   level the order is FIFO.  Every peer message is encoded with msgpack,
   framed, and decoded by the real ``FrameReader`` of its link; every client
   message likewise with the client codec.
2. A ``random.Random(seed)`` scheduler drives everything.  At each step it
   picks one of: deliver the head of one *ready* link (chosen at random
   among them, so interleavings across links vary with the seed); let a
   simulated client act (publish, subscribe, unsubscribe, an operator's
   ``split``/``place``, close its session, a new client connects); or advance
   the clock and ``tick`` the nodes (each node skips a tick now and then, and
   sometimes pauses its ticks for most of a slice: slices stretch and drift
   apart, LIEMs cross).  A run is a pure function of ``(config, seed,
   params)``: nothing reads the wall clock, sets are never iterated for
   decisions, and the node cores' own random sources are reseeded from the
   seed.  ``trace_hash`` digests every delivery, client message and tick.
3. Faults.  Links are reliable (TCP): the design never loses a message
   silently, so a fault is a *delay*, never a loss:
   * per-message jitter (each message is ready a random few ms after it is
     sent, never before the one queued ahead of it);
   * a slow link: one direction holds everything for 0.2 s up to 2.5× the
     peer timeout (congestion, retransmissions);
   * a stalled node: for up to 2× the peer timeout a node receives nothing,
     ticks nothing and serves no client (a GC or swap pause); its peers'
     sessions with it time out and roll back, and it then processes the
     backlog late — late replies, late RequestLoadBalance, late transfers;
   * tick jitter and pauses (slices that last longer on one node).
   Not modelled: crashes and cut links (the cores have no failure detector
   or resynchronisation yet: a lost message would be a certain, not a
   discovered, failure).
4. A run has three phases: *active* (every client operation, forced moves,
   faults, natural balancing under a moving hot spot); *subscriptions only*
   (no more events for several slices: channels go cold and merge while
   subscriptions and unsubscriptions continue); *drain* (no client action:
   deliver everything and tick until no message is queued and no session,
   table update or (un)subscription is pending).  ``tests.sim.invariants``
   then checks the outcome.
"""

from __future__ import annotations

import hashlib
import logging
import random
import traceback
from collections import Counter
from typing import Any, Final

import msgspec

from overlay.actions import Action, CloseClient, ToClient, ToPeer
from overlay.channels.space import RangeConstraint
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, client_reader
from overlay.node import NodeCore
from overlay.testing.memory_link import MemoryLink

from .invariants import check_all
from .records import EventRec, SimClient, SimResult, SubRec
from .setup import SimParams
from .workload import PRICE_MAX, QTY_MAX, SYMS, clamp_price, literal, random_spec

__all__ = ["SimCluster"]
# A run that takes more steps than this is looping, not progressing.
MAX_STEPS: Final = 400_000

# Deterministic: sets and dicts encode sorted, so the trace hash does not
# depend on PYTHONHASHSEED.  The bytes still go through the real decoder.
_encoder: Final = msgspec.msgpack.Encoder(order="deterministic")


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
)


class SimCluster:
    """Module rules 1–4.  ``run()`` plays the whole scenario once."""

    def __init__(
        self,
        config: ClusterConfig,
        seed: int,
        params: SimParams | None = None,
        *,
        keep_trace: bool = False,
    ) -> None:
        logging.getLogger("overlay").setLevel(logging.CRITICAL)
        self.config = config
        self.seed = seed
        self.params = params or SimParams.for_seed(seed)
        self.rng = random.Random(seed)
        # Background indexing (Channel rule 5) in random steps, from its own
        # stream so the message schedule of a seed stays what it was.
        self.index_rng = random.Random(f"index:{seed}")
        self.now = 0.0
        self.step_no = 0
        self.slice = config.cluster.slice_seconds
        self.timeout = config.cluster.peer_timeout
        self.ids = list(config.node_ids)
        self.cores: dict[int, NodeCore] = {}
        # (event id, global sub id) -> step at which the subscriber's access
        # node first got the Notification (the race with an unsubscribe).
        self.arrivals: dict[tuple[str, str], int] = {}
        # event id -> steps at which a channel matched it (must be exactly one).
        self.matched: dict[str, list[int]] = {}
        for i in self.ids:
            core = NodeCore(config, i)
            core.rng.seed(f"node:{seed}:{i}")  # the monitor's p draws vary with the seed
            self._spy_notifications(core)
            self.cores[i] = core
        self.links: dict[tuple[int, int], MemoryLink] = {
            (a, b): MemoryLink() for a in self.ids for b in self.ids if a != b
        }
        self.stall_until = dict.fromkeys(self.ids, 0.0)
        self.tick_pause_until = dict.fromkeys(self.ids, 0.0)
        self.clients: list[SimClient] = []
        self.by_session: dict[tuple[int, int], SimClient] = {}
        self.admins: dict[int, SimClient] = {}
        self.events: dict[str, EventRec] = {}
        self.subs: list[SubRec] = []
        self.notes: Counter[tuple[str, str, str]] = Counter()
        self.failures: list[str] = []
        self.faults: Counter[str] = Counter()
        self.races = 0  # (event, subscription) pairs an unsubscribe legitimately overtook
        self.admin_results: Counter[str] = Counter()
        self.deliveries = 0
        self.notifies = 0
        self._hash = hashlib.sha256()
        self.keep_trace = keep_trace
        self.trace: list[str] = []
        self._sub_no = 0
        self._client_no = 0
        self._hot_center = 0.0
        self._hot_width = 100.0
        self._next_shift = 0.0
        self._hot_point = (clamp_price(self.rng.uniform(0, PRICE_MAX)), self.rng.choice(SYMS))
        self.phase = "init"

    # == the scenario =====================================================================

    def run(self) -> SimResult:
        try:
            self._start()
            self.phase = "active"
            self._active_phase()
            self.phase = "subs-only"
            self._subs_only_phase()
            self.phase = "drain"
            self._drain()
            self.failures.extend(check_all(self))
        except Exception as exc:  # noqa: BLE001 - a crash of a core is a finding, reported with the seed
            self.failures.append(
                f"crash at step {self.step_no} ({self.phase}, t={self.now:.3f}): {exc!r}\n"
                + "".join(traceback.format_exception(exc)[-6:])
            )
        return self.result()

    def result(self) -> SimResult:
        stats: Counter[str] = Counter()
        for core in self.cores.values():
            for k in _STATS:
                if core.stats.get(k):
                    stats[k] += core.stats[k]
        return SimResult(
            seed=self.seed,
            nodes=len(self.ids),
            trace_hash=self._hash.hexdigest(),
            failures=list(self.failures),
            steps=self.step_no,
            deliveries=self.deliveries,
            sim_seconds=self.now,
            events=len(self.events),
            notifies=self.notifies,
            subscriptions=len(self.subs),
            stats=stats,
            faults=self.faults,
            races=self.races,
            admin=self.admin_results,
        )

    def _start(self) -> None:
        for i in self.ids:
            self._execute(i, self.cores[i].start(self.now))
        for i in self.ids:
            self.admins[i] = self._open_client(i, admin=True)
            for _ in range(self.params.clients_per_node):
                self._open_client(i)
        # Clients may act before the cluster is ready: they get not_ready.
        while not all(c.ready for c in self.cores.values()):
            self._count_step()
            ready = self._ready_links()
            if ready and self.rng.random() < 0.8:
                self._deliver(self.rng.choice(ready))
            elif self.rng.random() < 0.5:
                self._client_op(only=("publish", "subscribe"))
            else:
                self._advance(faults=False)

    def _active_phase(self) -> None:
        p = self.params
        done = 0
        for _ in range(p.initial_subs):
            self._client_op(only=("subscribe",))
        while done < p.ops:
            self._count_step()
            r = self.rng.random()
            ready = self._ready_links()
            if ready and r < p.p_deliver:
                self._deliver(self.rng.choice(ready))
            elif r < p.p_deliver + p.p_client or (not ready and r < p.p_deliver):
                if self._client_op():
                    done += 1
            else:
                self._advance(faults=p.faults)

    def _subs_only_phase(self) -> None:
        p = self.params
        end = self.now + p.subs_only_slices * self.slice
        while self.now < end:
            self._count_step()
            r = self.rng.random()
            ready = self._ready_links()
            if ready and r < 0.75:
                self._deliver(self.rng.choice(ready))
            elif r < 0.8:
                self._client_op(only=("subscribe", "unsubscribe"))
            else:
                self._advance(faults=False, dt_scale=3.0)

    def _drain(self) -> None:
        deadline = self.now + self.params.max_drain_seconds
        while True:
            self._count_step()
            ready = self._ready_links()
            if ready:
                self._deliver(self.rng.choice(ready))
                continue
            if self.settled():
                return
            if self.now > deadline:
                self.failures.append(
                    f"not quiet {self.params.max_drain_seconds:.0f} s into the drain: {self.unsettled()}"
                )
                return
            nxt = self._next_ready()
            target = nxt if nxt is not None and nxt > self.now else self.now + self.slice / 4
            self._advance(faults=False, to=target)

    def _count_step(self) -> None:
        self.step_no += 1
        if self.step_no > MAX_STEPS:
            raise RuntimeError(f"no progress after {MAX_STEPS} steps")

    # == quiet ============================================================================

    def pending_messages(self) -> int:
        return sum(len(link) for link in self.links.values())

    def unsettled(self) -> list[str]:
        """Why the cluster is not quiet yet (empty when it is)."""
        why = []
        if self.pending_messages():
            why.append(f"{self.pending_messages()} messages queued")
        for i, c in self.cores.items():
            active = [m.session for m in c.migration.outgoing.values() if m.active]
            if active:
                why.append(f"node {i}: outgoing sessions {active} active")
            if c.arrivals.incoming:
                why.append(f"node {i}: incoming sessions {sorted(c.arrivals.incoming)}")
            if c.updates.waiting():
                why.append(f"node {i}: table updates {c.updates.waiting()} waiting")
            if c.sessions.pending():
                why.append(
                    f"node {i}: {c.sessions.pending()} (un)subscriptions waiting: {c.sessions.pending_ids()[:5]}"
                )
            if c.monitor.busy:
                why.append(f"node {i}: BUSY")
        return why

    def settled(self) -> bool:
        return not self.unsettled()

    # == links ============================================================================

    def _send(self, src: int, dst: int, msg: pm.PeerMessage) -> None:
        if src == dst:
            self.failures.append(f"node {src} sent {type(msg).__name__} to itself")
            return
        ready = self.now + (self.rng.random() * self.params.jitter if self.params.jitter else 0.0)
        self.links[(src, dst)].push(ready, msg)  # FIFO within a level

    def _ready_links(self) -> list[tuple[int, int]]:
        now = self.now
        stall = self.stall_until
        out = []
        for key, link in self.links.items():
            if len(link):
                t = link.head_ready()
                if t is not None and t <= now and stall[key[1]] <= now:
                    out.append(key)
        return out

    def _next_ready(self) -> float | None:
        best = None
        for key, link in self.links.items():
            t = link.head_ready()
            if t is not None:
                t = max(t, self.stall_until[key[1]])
                if best is None or t < best:
                    best = t
        return best

    def _deliver(self, key: tuple[int, int]) -> None:
        src, dst = key
        link = self.links[key]
        msg = link.pop()
        body, decoded = link.carry(msg)
        if len(body) > self.config.cluster.max_frame_size:
            self.failures.append(f"{type(msg).__name__} {src}->{dst} is {len(body)} bytes, over the frame limit")
        if decoded != [msg]:
            self.failures.append(f"{type(msg).__name__} did not survive the codec: {decoded!r} != {msg!r}")
            return
        msg = decoded[0]
        self.deliveries += 1
        h = self._hash
        h.update(b"P%d>%d:" % key)
        h.update(body)
        if self.keep_trace:
            self.trace.append(f"{self.step_no} t={self.now:.3f} {src}->{dst} {msg!r}")
        try:
            acts = self.cores[dst].handle_peer(src, msg, self.now)
        except RemoteProtocolError as exc:
            self.failures.append(f"step {self.step_no}: node {dst} rejected {type(msg).__name__} from {src}: {exc}")
            self._send(dst, src, pm.PeerError("protocol_error", str(exc)))
            return
        self._execute(dst, acts)
        self._background(dst)

    def _background(self, node: int) -> None:
        """The shell's background task, sometimes: a step of the split a session
        waits on, or of indexing (node.balancing rule 3, Channel rule 5)."""
        core = self.cores[node]
        if core.index_wanted and self.index_rng.random() < 0.5:
            _more, acts = core.background_step(self.index_rng.randint(1, 6), self.now)
            self._execute(node, acts)

    def _execute(self, node: int, acts: list[Action]) -> None:
        for act in acts:
            if type(act) is ToPeer:
                self._send(node, act.node, act.msg)
            elif type(act) is ToClient:
                self._to_client(node, act.session, act.msg)
            elif type(act) is CloseClient:
                self.failures.append(
                    f"step {self.step_no}: node {node} closed client session {act.session}: {act.reason}"
                )
            else:  # pragma: no cover
                raise AssertionError(f"unknown action {act!r}")

    def _spy_notifications(self, core: NodeCore) -> None:
        """Record when a channel matches each event, and when each notification
        reaches the subscriber's access node (white-box: wraps two methods)."""
        router = core.router  # every match goes through Router.match
        orig_match = router.match
        arrivals = self.arrivals
        matched = self.matched

        def match(ch: Any, msg: pm.Event, out: list[Action]) -> None:
            matched.setdefault(msg.event_id, []).append(self.step_no)
            orig_match(ch, msg, out)

        router.match = match  # type: ignore[method-assign]
        notifier = core.notifier  # local matches and Notifications both end in notify_clients
        orig_notify = notifier.notify_clients

        def notify_clients(event_id: str, event: Any, sub_ids: Any, publish_time: float, out: list[Action]) -> None:
            for gid in sub_ids:
                arrivals.setdefault((event_id, gid), self.step_no)
            orig_notify(event_id, event, sub_ids, publish_time, out)

        notifier.notify_clients = notify_clients  # type: ignore[method-assign]

    # == time and faults ==================================================================

    def _advance(self, *, faults: bool, to: float | None = None, dt_scale: float = 1.0) -> None:
        rng = self.rng
        if to is None:
            to = self.now + rng.expovariate(1.0 / (self.params.dt_mean * self.slice * dt_scale))
        self.now = to
        self._hash.update(b"T%r" % to)
        if self.phase == "active" and self.now >= self._next_shift:  # the hot spot moves
            self._hot_center = rng.uniform(0, PRICE_MAX)
            self._hot_width = rng.choice((10.0, 50.0, 200.0))
            self._next_shift = self.now + rng.uniform(2, 5) * self.slice
        if faults and rng.random() < self.params.p_fault:
            self._inject_fault()
        order = list(self.ids)
        rng.shuffle(order)
        for i in order:
            if self.stall_until[i] > self.now or self.tick_pause_until[i] > self.now:
                continue
            if rng.random() < 0.9:
                self._hash.update(b"t%d" % i)
                self._execute(i, self.cores[i].tick(self.now))
                self._background(i)
            elif faults and rng.random() < 0.2:
                self.tick_pause_until[i] = self.now + rng.uniform(0.3, 1.2) * self.slice
                self.faults["tick_pause"] += 1

    def _inject_fault(self) -> None:
        rng = self.rng
        if rng.random() < 0.6:
            key = rng.choice(sorted(self.links))
            hold = rng.choice((rng.uniform(0.2, 1.0), rng.uniform(1.0, 2.5 * self.timeout)))
            link = self.links[key]
            link.blocked_until = max(link.blocked_until, self.now + hold)
            self.faults["slow_link"] += 1
            if self.keep_trace:
                self.trace.append(f"t={self.now:.3f} slow link {key} for {hold:.2f}s")
        else:
            node = rng.choice(self.ids)
            hold = rng.uniform(0.5, 2.0 * self.timeout)
            self.stall_until[node] = max(self.stall_until[node], self.now + hold)
            self.faults["stall"] += 1
            if self.keep_trace:
                self.trace.append(f"t={self.now:.3f} node {node} stalls for {hold:.2f}s")

    # == clients ==========================================================================

    def _open_client(self, node: int, *, admin: bool = False) -> SimClient:
        self._client_no += 1
        sid = self.cores[node].client_opened()
        c = SimClient(f"{'admin' if admin else 'c'}{self._client_no}", node, sid, client_reader(), admin=admin)
        self.by_session[(node, sid)] = c
        if not admin:
            self.clients.append(c)
        self._client_send(c, cm.Hello(c.name))
        return c

    def _client_send(self, c: SimClient, msg: cm.ClientMessage) -> None:
        body = _encoder.encode(msg)
        h = self._hash
        h.update(b"C%d:%d>" % (c.node, c.sid))
        h.update(body)
        decoded = client_reader().feed(HEADER.pack(len(body)) + body)
        if decoded != [msg]:
            self.failures.append(f"client {type(msg).__name__} did not survive the codec: {decoded!r}")
            return
        if self.keep_trace:
            self.trace.append(f"{self.step_no} t={self.now:.3f} client {c.name}@{c.node} -> {msg!r}")
        self._execute(c.node, self.cores[c.node].handle_client(c.sid, decoded[0], self.now))

    def _to_client(self, node: int, sid: int, msg: cm.ClientMessage) -> None:
        c = self.by_session.get((node, sid))
        body = _encoder.encode(msg)
        self._hash.update(b"c%d:%d<" % (node, sid))
        self._hash.update(body)
        if c is None or c.closed_at is not None:
            self.failures.append(f"step {self.step_no}: node {node} sent {type(msg).__name__} to closed session {sid}")
            return
        (msg,) = c.reader.feed(HEADER.pack(len(body)) + body)
        if self.keep_trace:
            self.trace.append(f"{self.step_no} t={self.now:.3f} {node} -> client {c.name}: {msg!r}")
        match msg:
            case cm.Welcome():
                pass
            case cm.PubAck():
                kind, data = c.pending.pop(msg.seq, ("?", None))
                if kind != "pub":
                    self.failures.append(f"{c.name}: PubAck for seq {msg.seq} ({kind})")
                    return
                values, pub_at = data
                if msg.event_id in self.events:
                    self.failures.append(f"event id {msg.event_id} given twice")
                self.events[msg.event_id] = EventRec(msg.event_id, values, pub_at, c.name)
            case cm.SubAck():
                kind, rec = c.pending.pop(msg.seq, ("?", None))
                if kind != "sub" or rec.local_id != msg.sub_id:
                    self.failures.append(f"{c.name}: SubAck {msg!r} answers {kind}")
                    return
                if rec.acked_at is not None:
                    self.failures.append(f"{c.name}: second SubAck for {rec.local_id}")
                rec.acked_at = self.step_no
            case cm.UnsubAck():
                kind, rec = c.pending.pop(msg.seq, ("?", None))
                if kind != "unsub" or rec.local_id != msg.sub_id:
                    self.failures.append(f"{c.name}: UnsubAck {msg!r} answers {kind}")
                    return
                rec.unsub_acked_at = self.step_no
            case cm.Notify():
                self.notifies += 1
                if len(set(msg.sub_ids)) != len(msg.sub_ids):
                    self.failures.append(
                        f"{c.name}: Notify of {msg.event_id} lists a subscription twice: {msg.sub_ids}"
                    )
                for lid in msg.sub_ids:
                    self.notes[(msg.event_id, c.name, lid)] += 1
                    rec = c.subs.get(lid)
                    if rec is not None and rec.ended_at is not None:
                        self.failures.append(
                            f"step {self.step_no}: {c.name} notified of {msg.event_id} on {lid} after unsubscribing"
                        )
            case cm.Error():
                kind, data = c.pending.pop(msg.seq, ("?", None))
                if kind == "sub":
                    data.failed = True
                    if msg.code != cm.ErrorCode.NOT_READY:
                        self.failures.append(
                            f"{c.name}: subscribe {data.spec.text()!r} refused: {msg.code} {msg.message}"
                        )
                elif kind == "pub":
                    if msg.code != cm.ErrorCode.NOT_READY:
                        self.failures.append(f"{c.name}: publish {data[0]} refused: {msg.code} {msg.message}")
                elif kind == "admin":
                    self.admin_results[f"{data}:refused"] += 1
                else:
                    self.failures.append(f"{c.name}: unexpected {msg!r} ({kind})")
            case cm.AdminReply():
                kind, data = c.pending.pop(msg.seq, ("?", None))
                if kind != "admin":
                    self.failures.append(f"{c.name}: AdminReply {msg!r} answers {kind}")
                    return
                self.admin_results[f"{data}:ok"] += 1
            case _:
                self.failures.append(f"{c.name}: unexpected {msg!r}")

    def _next_seq(self, c: SimClient, kind: str, data: Any) -> int:
        c.seq += 1
        c.pending[c.seq] = (kind, data)
        return c.seq

    def _client_op(self, only: tuple[str, ...] | None = None) -> bool:
        """One client action; False when nobody could act."""
        rng = self.rng
        p = self.params
        kinds = ("publish", "subscribe", "unsubscribe", "admin", "close", "join")
        weights = (p.w_publish, p.w_subscribe, p.w_unsubscribe, p.w_admin, p.w_close, p.w_join)
        if only is not None:
            weights = tuple(w if k in only else 0.0 for k, w in zip(kinds, weights))
        kind = rng.choices(kinds, weights)[0]
        if kind == "join":
            self._open_client(rng.choice(self.ids))
            return True
        if kind == "admin":
            return self._admin_op()
        live = [c for c in self.clients if c.closed_at is None and self.stall_until[c.node] <= self.now]
        if not live:
            return False
        c = rng.choice(live)
        if kind == "publish":
            values = self._event_values()
            seq = self._next_seq(c, "pub", (values, self.step_no))
            event: Any = values
            if rng.random() < 0.2:
                event = "{" + ", ".join(f"{k}: {literal(v)}" for k, v in values.items()) + "}"
            self._client_send(c, cm.Publish(seq, event, publish_time=self.now))
        elif kind == "subscribe":
            self._sub_no += 1
            rec = SubRec(c, f"s{self._sub_no}", random_spec(rng), self.step_no)
            c.subs[rec.local_id] = rec
            self.subs.append(rec)
            seq = self._next_seq(c, "sub", rec)
            self._client_send(c, cm.Subscribe(seq, rec.local_id, rec.spec.text()))
            entry = self.cores[c.node].sessions[c.sid].subs.get(rec.local_id)
            if entry is not None:
                rec.gid, rec.filter = entry
        elif kind == "unsubscribe":
            cands = [r for r in c.subs.values() if r.unsub_sent_at is None and r.gid is not None and not r.failed]
            if not cands:
                return False
            rec = rng.choice(cands)
            rec.unsub_sent_at = self.step_no
            seq = self._next_seq(c, "unsub", rec)
            self._client_send(c, cm.Unsubscribe(seq, rec.local_id))
        elif kind == "close":
            c.closed_at = self.step_no
            self._hash.update(b"X%d:%d" % (c.node, c.sid))
            self._execute(c.node, self.cores[c.node].client_closed(c.sid))
        return True

    def _admin_op(self) -> bool:
        rng = self.rng
        nodes = [i for i in self.ids if self.stall_until[i] <= self.now and self.cores[i].ready]
        if not nodes:
            return False
        node = rng.choice(nodes)
        core = self.cores[node]
        chans = sorted(core.local.ids())
        if not chans:
            return False
        chid = rng.choice(chans)
        a = self.admins[node]
        if rng.random() < 0.5:
            ch = core.local[chid]
            if rng.random() < 0.7:
                c = ch.space.constraint("price")
                assert isinstance(c, RangeConstraint)
                lo, hi = float(c.interval.lo), float(c.interval.hi)
                at = clamp_price(rng.uniform(lo, hi))
                args: dict[str, Any] = {"channel": str(chid), "attr": "price", "at": at}
            else:
                args = {"channel": str(chid), "attr": "sym", "values": sorted(rng.sample(SYMS, rng.randint(1, 3)))}
            seq = self._next_seq(a, "admin", "split")
            self._client_send(a, cm.Admin(seq, "split", args))
        else:
            others = [i for i in self.ids if i != node]
            seq = self._next_seq(a, "admin", "place")
            self._client_send(a, cm.Admin(seq, "place", {"channel": str(chid), "node": rng.choice(others)}))
        return True

    def _event_values(self) -> dict[str, Any]:
        rng = self.rng
        p = self.params
        r = rng.random()
        if p.hot_point and r < 0.3:
            price, sym = self._hot_point
        elif p.hot_price and r < 0.5:
            price, sym = self._hot_point[0], rng.choice(SYMS)
        else:
            if rng.random() < 0.6:
                price = clamp_price(rng.gauss(self._hot_center, self._hot_width))
            else:
                price = clamp_price(rng.uniform(0, PRICE_MAX))
            sym = rng.choice(SYMS)
        return {"price": price, "sym": sym, "qty": rng.randint(0, QTY_MAX)}
