"""The simulated network of ``SimCluster`` (rules 1–3 of ``overlay.testing.sim.cluster``):
node cores, one ``MemoryLink`` per ordered pair, the simulated clock, ticks,
faults, and the trace hash that digests every delivery, client message and tick.

With node faults (``node_faults``, ``sim.faults``) a core can be gone
(``retire``) and come back as a new run (``new_core``), a message can be lost
(``send`` asks the faults), hellos are handed over on (re)connection
(``hello``), and the cores' ``CloseClient`` and ``Rejoin`` are carried out
instead of being findings.  Without them nothing of that runs and no random
number is drawn for it: the traces of those runs stay what they were.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable
from typing import Any, Final, Protocol

from overlay.actions import Action, CloseClient, Notifies, Rejoin, ToClient, ToPeer
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node import NodeCore
from overlay.testing.memory_link import MemoryLink

from .setup import SimParams


class FaultModel(Protocol):
    """What the network asks of its node faults (``sim.faults.NodeFaults``),
    named here so that module and this one do not import each other."""

    suspect: float

    def drops(self, src: int, dst: int, msg: pm.PeerMessage) -> bool: ...

    def rejoin(self, node: int, reason: str) -> None: ...

    def had_fault(self, node: int) -> bool: ...

    def step(self, *, allow_new: bool) -> None: ...


__all__ = ["MAX_STEPS", "SimNetwork"]

# A run that takes more steps than this is looping, not progressing.
MAX_STEPS: Final = 400_000
# With node faults, the longest a ready message waits for the driver (simulated
# seconds; ``lagging``): far above a loopback hop, far below the suspicion.
MAX_LAG: Final = 0.05


class SimNetwork:
    """Cores, links, clock and faults, driven by the scenario's ``rng``.
    ``to_client`` takes what a core sends a client (``SimClients.receive``);
    ``on_advance`` runs each time the clock moves, before the ticks."""

    def __init__(
        self, config: ClusterConfig, seed: int, params: SimParams, rng: random.Random, *, keep_trace: bool
    ) -> None:
        self.config = config
        self.params = params
        self.rng = rng
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
        # event id -> steps at which a channel matched it (exactly one; at most
        # one per dispatch by its access node's outbox, which re-sends).
        self.matched: dict[str, list[int]] = {}
        # event id -> dispatches by its access node's outbox (the first and each re-send).
        self.sent: Counter[str] = Counter()
        # event id -> (node, session, step, values) of the unkeyed events the
        # access nodes accepted (their publisher may close before the PubAck).
        self.accepted: dict[str, tuple[int, int, int, dict[str, Any]]] = {}
        self.seed = seed
        # Runs with node faults number the runs of each node from 1 (0 is
        # "unknown" to the cores: a restart would go unnoticed).
        first_run = 1 if params.node_faults else 0
        for i in self.ids:
            core = NodeCore(config, i, incarnation=first_run)
            core.rng.seed(f"node:{seed}:{i}")  # the monitor's p draws vary with the seed
            self.spy(core)
            self.cores[i] = core
        self.retired: list[NodeCore] = []  # crashed runs (their stats still count)
        self.node_faults: FaultModel | None = None
        self.links: dict[tuple[int, int], MemoryLink] = {
            (a, b): MemoryLink() for a in self.ids for b in self.ids if a != b
        }
        self.stall_until = dict.fromkeys(self.ids, 0.0)
        self.tick_pause_until = dict.fromkeys(self.ids, 0.0)
        self.failures: list[str] = []
        self.faults: Counter[str] = Counter()
        self.journal: list[str] = []  # node faults as they happened (``sim.faults``; stalls here)
        self.deliveries = 0
        self.hash = hashlib.sha256()
        self.keep_trace = keep_trace
        self.trace: list[str] = []
        self.to_client: Callable[[int, int, cm.ClientMessage], None] = lambda node, sid, msg: None
        self.on_advance: Callable[[], None] = lambda: None
        # A node closed a client's session (only with node faults: a run declared dead closes them).
        self.closed_by_node: Callable[[int, int, str], None] = lambda node, sid, reason: None

    def send(self, src: int, dst: int, msg: pm.PeerMessage) -> None:
        if src == dst:
            self.failures.append(f"node {src} sent {type(msg).__name__} to itself")
            return
        if self.node_faults is not None and self.node_faults.drops(src, dst, msg):
            return
        ready = self.now + (self.rng.random() * self.params.jitter if self.params.jitter else 0.0)
        self.links[(src, dst)].push(ready, msg)  # FIFO within a level

    def ready_links(self) -> list[tuple[int, int]]:
        now = self.now
        stall = self.stall_until
        out = []
        for key, link in self.links.items():
            if len(link):
                t = link.head_ready()
                if t is not None and t <= now and stall[key[1]] <= now:
                    out.append(key)
        return out

    def lagging(self) -> bool:
        """With node faults: a message has been ready for ``MAX_LAG`` without
        being delivered — the clock must not move on before it goes.  A link
        carries far more than the heartbeats of every node (4 per peer per
        second); without this bound the driver's random choice delivered
        fewer messages per simulated second than the cores sent, the high
        level (heartbeats) never emptied, and normal messages waited on it
        for tens of seconds — a network no shell runs on."""
        if self.node_faults is None:
            return False
        limit = self.now - MAX_LAG
        stall = self.stall_until
        for key, link in self.links.items():
            t = link.head_ready()
            if t is not None and t <= limit and stall[key[1]] <= self.now:
                return True
        return False

    def next_ready(self) -> float | None:
        best = None
        for key, link in self.links.items():
            t = link.head_ready()
            if t is not None and not math.isinf(t):  # a link held by a partition waits for its heal
                t = max(t, self.stall_until[key[1]])
                if best is None or t < best:
                    best = t
        return best

    def deliver(self, key: tuple[int, int]) -> None:
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
        h = self.hash
        h.update(b"P%d>%d:" % key)
        h.update(body)
        if self.keep_trace:
            self.trace.append(f"{self.step_no} t={self.now:.3f} {src}->{dst} {msg!r}")
        try:
            acts = self.cores[dst].handle_peer(src, msg, self.now)
        except RemoteProtocolError as exc:
            self.failures.append(f"step {self.step_no}: node {dst} rejected {type(msg).__name__} from {src}: {exc}")
            self.send(dst, src, pm.PeerError("protocol_error", str(exc)))
            return
        self.execute(dst, acts)
        self.end_batch(dst)
        self.background(dst)

    def end_batch(self, node: int) -> None:
        """With node faults, after each message a core handled: what the shell's
        dispatcher does after each batch (``NodeCore.end_batch``) — batched
        notes, key syncs and receipts go out then, not at the next tick (a
        death within that tick lost what a shell had sent microseconds after)."""
        if self.node_faults is None:
            return
        core = self.cores.get(node)
        if core is not None:
            self.execute(node, core.end_batch())

    def hello(self, src: int, dst: int) -> None:
        """A link from ``src`` to ``dst`` (re)connected: ``src``'s hello, handed
        to ``dst`` before anything else on it (``sim.faults`` rule 3)."""
        msg = self.cores[src].hello()
        body, decoded = self.links[(src, dst)].carry(msg)
        if decoded != [msg]:
            self.failures.append(f"PeerHello did not survive the codec: {decoded!r} != {msg!r}")
            return
        h = self.hash
        h.update(b"H%d>%d:" % (src, dst))
        h.update(body)
        if self.keep_trace:
            self.trace.append(f"{self.step_no} t={self.now:.3f} {src}->{dst} (connect) {msg!r}")
        try:
            acts = self.cores[dst].peer_hello(src, msg, self.now)
        except RemoteProtocolError as exc:
            self.failures.append(f"step {self.step_no}: node {dst} rejected the hello of {src}: {exc}")
            return
        self.execute(dst, acts)

    def new_core(self, node: int, incarnation: int) -> NodeCore:
        """A new run of ``node`` (``sim.faults`` rule 3); the cores stay in id order."""
        core = NodeCore(self.config, node, incarnation=incarnation)
        core.rng.seed(f"node:{self.seed}:{node}:{incarnation}")
        self.spy(core)
        self.cores[node] = core
        ordered = sorted(self.cores.items())
        self.cores.clear()
        self.cores.update(ordered)  # in place: SimCluster shares this dict
        return core

    def retire(self, node: int) -> None:
        """``node``'s core is gone (a crash): nothing reaches it, nothing it held survives."""
        self.retired.append(self.cores.pop(node))

    def serving(self) -> list[int]:
        """The nodes a client can reach now: up, and not paused."""
        now = self.now
        return [i for i in self.ids if i in self.cores and self.stall_until[i] <= now]

    def background(self, node: int) -> None:
        """The shell's background task, sometimes: a step of the split a session
        waits on, or of indexing (node.balancing rule 3, Channel rule 5)."""
        core = self.cores.get(node)
        if core is None:  # it asked for a new run meanwhile (Rejoin)
            return
        if core.index_wanted and self.index_rng.random() < 0.5:
            _more, acts = core.background_step(self.index_rng.randint(1, 6), self.now)
            self.execute(node, acts)

    def execute(self, node: int, acts: list[Action]) -> None:
        for act in acts:
            if type(act) is ToPeer:
                self.send(node, act.node, act.msg)
            elif type(act) is ToClient:
                self.to_client(node, act.session, act.msg)
            elif type(act) is Notifies:
                for one in act.each():
                    self.to_client(node, one.session, one.msg)
            elif type(act) is CloseClient:
                nf = self.node_faults
                if nf is not None and nf.had_fault(node):  # a run declared dead sends its clients away
                    self.closed_by_node(node, act.session, act.reason)
                else:
                    self.failures.append(
                        f"step {self.step_no}: node {node} closed client session {act.session}: {act.reason}"
                    )
            elif type(act) is Rejoin:
                if self.node_faults is not None:
                    self.node_faults.rejoin(node, act.reason)
                    return  # the run is gone: the rest of what it asked dies with it
                self.failures.append(f"step {self.step_no}: node {node} was declared dead: {act.reason}")
            else:  # pragma: no cover
                raise AssertionError(f"unknown action {act!r}")

    def spy(self, core: NodeCore) -> None:
        """Record when a channel matches each event, and when each notification
        reaches the subscriber's access node; what the outbox accepts and how
        often it sends each event (white-box: wraps five methods)."""
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

        def notify_clients(
            event_id: str, event: Any, sub_ids: Any, publish_time: float, out: list[Action], payload: bytes = b""
        ) -> None:
            for gid in sub_ids:
                arrivals.setdefault((event_id, gid), self.step_no)
            orig_notify(event_id, event, sub_ids, publish_time, out, payload)

        orig_tracked = notifier.notify  # tracked copies (keyed, group instances'): node.notify rule 3

        def notify(event_id: str, event: Any, sub_ids: Any, *args: Any, **kw: Any) -> None:
            for gid in sub_ids:
                arrivals.setdefault((event_id, gid), self.step_no)
            orig_tracked(event_id, event, sub_ids, *args, **kw)

        notifier.notify = notify  # type: ignore[method-assign]

        notifier.notify_clients = notify_clients  # type: ignore[method-assign]
        outbox = core.outbox
        orig_send, orig_dispatch = outbox.send, outbox.dispatch
        sent, accepted, node = self.sent, self.accepted, core.id

        def send(ev: pm.Event, sid: int, seq: int, out: list[Action]) -> bool:
            accepted[ev.event_id] = (node, sid, self.step_no, dict(ev.event_exp))
            return orig_send(ev, sid, seq, out)

        def dispatch(ev: pm.Event, out: list[Action]) -> None:
            sent[ev.event_id] += 1
            orig_dispatch(ev, out)

        outbox.send = send  # type: ignore[method-assign]
        outbox.dispatch = dispatch

    def advance(self, *, faults: bool, to: float | None = None, dt_scale: float = 1.0) -> None:
        rng = self.rng
        if to is None:
            to = self.now + rng.expovariate(1.0 / (self.params.dt_mean * self.slice * dt_scale))
        self.now = to
        self.hash.update(b"T%r" % to)
        self.on_advance()  # the workload's hot spot may move (it draws from the same stream)
        nf = self.node_faults
        if nf is not None:
            nf.step(allow_new=faults)
        if faults and rng.random() < self.params.p_fault:
            self._inject_fault()
        order = list(self.ids)
        rng.shuffle(order)
        for i in order:
            if self.stall_until[i] > self.now or self.tick_pause_until[i] > self.now:
                continue
            core = self.cores.get(i)
            if core is None:  # crashed
                continue
            if rng.random() < 0.9:
                self.hash.update(b"t%d" % i)
                self.execute(i, core.tick(self.now))
                if i in self.cores:  # a tick may ask for a new run (Rejoin)
                    self.background(i)
            elif faults and rng.random() < 0.2:
                pause = rng.uniform(0.3, 1.2) * self.slice
                if nf is not None:  # below the suspicion: a late slice, not a silent node
                    pause = min(pause, 0.4 * nf.suspect)
                self.tick_pause_until[i] = self.now + pause
                self.faults["tick_pause"] += 1

    def _inject_fault(self) -> None:
        rng = self.rng
        nf = self.node_faults
        if nf is not None:  # with node faults a delay stays below the suspicion; pauses are node faults
            key = rng.choice(sorted(self.links))
            link = self.links[key]
            link.blocked_until = max(link.blocked_until, self.now + rng.uniform(0.05, 0.4) * nf.suspect)
            self.faults["slow_link"] += 1
            return
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
            self.journal.append(f"step {self.step_no} t={self.now:.3f}: node {node} stalls for {hold:.2f}s")
            if self.keep_trace:
                self.trace.append(f"t={self.now:.3f} node {node} stalls for {hold:.2f}s")

    def pending_messages(self) -> int:
        return sum(len(link) for link in self.links.values())

    def count_step(self) -> None:
        self.step_no += 1
        if self.step_no > MAX_STEPS:
            raise RuntimeError(f"no progress after {MAX_STEPS} steps")
