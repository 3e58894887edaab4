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
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, cast

from overlay.actions import Action, CloseClient, Notifies, Rejoin, ToClient, ToPeer
from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import NotifyFrames
from overlay.net.dispatch import DISPATCH_BATCH
from overlay.node import NodeCore
from overlay.testing.memory_link import MemoryLink

from .inbox import P_HOLD, ClientInbox, ClientLink, run_length
from .invariants import check_notifies
from .setup import SimParams


class FaultModel(Protocol):
    """What the network asks of its node faults (``sim.faults.NodeFaults``),
    named here so that module and this one do not import each other."""

    suspect: float

    def drops(self, src: int, dst: int, msg: pm.PeerMessage) -> bool: ...

    def rejoin(self, node: int, reason: str) -> None: ...

    def had_fault(self, node: int) -> bool: ...

    def step(self, *, allow_new: bool) -> None: ...


__all__ = ["MAX_STEPS", "SimNetwork", "Source"]

# What the scheduler delivers from: a peer link (src, dst), or a client's
# connection to its node (``sim.inbox`` rule 3).
Source = tuple[int, int] | ClientLink

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
        # How many messages arrive together (``sim.inbox`` rule 2), and which
        # Publishes wait in their node's inbox: a stream of its own too.
        self.batch_rng = random.Random(f"batch:{seed}")
        self.inbox = ClientInbox()
        self.hold_all = False  # a pipelining publisher's burst: every Publish waits (``SimClients.act``)
        # Runs of several messages handed over in one call, and Notifies actions (``SimResult.stats``).
        self.runs: Counter[str] = Counter()
        # Calls of ``execute`` under way per node (nested: a client answers
        # as it reads), and the sessions a client left during one (``left``).
        self._depth: Counter[int] = Counter()
        self._left: dict[tuple[int, int], int] = {}
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
        # One session's frame of a ``Notifies`` (``overlay.messages.codec`` rule 4).
        self.frame_to_client: Callable[[int, int, bytes], None] = lambda node, sid, frame: None
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

    def ready_links(self) -> list[Source]:
        """The sources with a message ready: peer links, then the sessions
        whose node read messages it has not dispatched (``sim.inbox`` rule 3)."""
        now = self.now
        stall = self.stall_until
        out: list[Source] = []
        for key, link in self.links.items():
            if len(link):
                t = link.head_ready()
                if t is not None and t <= now and stall[key[1]] <= now:
                    out.append(key)
        for client, _ in self.inbox.links():
            if stall[client.node] <= now:
                out.append(client)
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
        return any(t <= limit and stall[client.node] <= self.now for client, t in self.inbox.links())

    def next_ready(self) -> float | None:
        best = None
        for key, link in self.links.items():
            t = link.head_ready()
            if t is not None and not math.isinf(t):  # a link held by a partition waits for its heal
                t = max(t, self.stall_until[key[1]])
                if best is None or t < best:
                    best = t
        for client, t in self.inbox.links():
            t = max(t, self.stall_until[client.node])
            if best is None or t < best:
                best = t
        return best

    def deliver(self, key: Source) -> None:
        """The next message of ``key`` — or the next run of them, as the real
        dispatcher hands it over (``sim.inbox`` rules 1 and 2) — to its node."""
        if type(key) is ClientLink:
            self.deliver_client(key)
            return
        assert isinstance(key, tuple)
        src, dst = key
        link = self.links[key]
        msg = self._carry(key, link.pop())
        if msg is None:
            return
        run: list[pm.Event] = []
        if type(msg) is pm.Event and self.params.batching:
            run.append(msg)
            # The Events ready behind it on this link, up to the dispatcher's batch:
            # a peer's Events in a row in the inbox (nothing high is queued: an Event was next).
            now, n = self.now, 1
            for stamp, queued in link.normal:
                if type(queued) is not pm.Event or stamp > now or n == DISPATCH_BATCH:
                    break
                n += 1
            for _ in range(run_length(self.batch_rng, n) - 1):
                more = self._carry(key, link.pop())
                if type(more) is not pm.Event:  # it did not survive the codec (a failure): the run ends
                    break
                run.append(more)
        try:
            if len(run) > 1:
                self.hash.update(b"R%d" % len(run))
                self.runs["event_runs"] += 1
                self.runs["events_in_runs"] += len(run)
                acts = self.cores[dst].handle_peer_events(src, run, self.now)
            else:
                acts = self.cores[dst].handle_peer(src, msg, self.now)
        except RemoteProtocolError as exc:
            self.failures.append(f"step {self.step_no}: node {dst} rejected {type(msg).__name__} from {src}: {exc}")
            self.send(dst, src, pm.PeerError("protocol_error", str(exc)))
            return
        self.execute(dst, acts)
        self.end_batch(dst)
        self.background(dst)

    def _carry(self, key: tuple[int, int], msg: pm.PeerMessage) -> pm.PeerMessage | None:
        """``msg``, popped from link ``key``, through the codec and into the
        trace: what its receiver decodes (None: it did not survive, a failure)."""
        src, dst = key
        body, decoded = self.links[key].carry(msg)
        if len(body) > self.config.cluster.max_frame_size:
            self.failures.append(f"{type(msg).__name__} {src}->{dst} is {len(body)} bytes, over the frame limit")
        if decoded != [msg]:
            self.failures.append(f"{type(msg).__name__} did not survive the codec: {decoded!r} != {msg!r}")
            return None
        self.deliveries += 1
        h = self.hash
        h.update(b"P%d>%d:" % key)
        h.update(body)
        if self.keep_trace:
            self.trace.append(f"{self.step_no} t={self.now:.3f} {src}->{dst} {decoded[0]!r}")
        return decoded[0]

    def from_client(self, client: ClientLink, msg: cm.ClientMessage) -> None:
        """``msg``, sent by the client of ``client``: dispatched at once, or
        left in its node's inbox (``sim.inbox`` rule 3)."""
        if client in self.inbox or (
            type(msg) is cm.Publish and self.params.batching and (self.hold_all or self.batch_rng.random() < P_HOLD)
        ):
            self.inbox.hold(client, self.now, msg)
            return
        self.execute(client.node, self.cores[client.node].handle_client(client.sid, msg, self.now))
        self.end_batch(client.node)

    def deliver_client(self, client: ClientLink) -> None:
        """The next run of what ``client``'s node read from it (``sim.inbox`` rules 1, 2)."""
        run = self.inbox.take_run(client, self.batch_rng)
        node, sid = client.node, client.sid
        self.hash.update(b"D%d:%d:%d" % (node, sid, len(run)))
        if self.keep_trace:
            self.trace.append(f"{self.step_no} t={self.now:.3f} node {node} dispatches {len(run)} of session {sid}")
        core = self.cores[node]
        if len(run) > 1:
            self.runs["publish_runs"] += 1
            self.runs["publishes_in_runs"] += len(run)
            acts = core.handle_publishes(sid, cast(list[cm.Publish], run), self.now)  # a run: Publishes only
        else:
            acts = core.handle_client(sid, run[0], self.now)
        self.execute(node, acts)
        self.end_batch(node)

    def flush(self, client: ClientLink) -> None:
        """Everything ``client``'s node read from it, dispatched now (``sim.inbox`` rule 3)."""
        while client in self.inbox:
            self.deliver_client(client)

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
        self.runs["client_messages_lost"] += self.inbox.drop_node(node)

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
        """Carry out what ``node``'s core asked (``late_for`` says which of
        these a client that left meanwhile may miss)."""
        depth = self._depth
        depth[node] += 1
        try:
            self._carry_out(node, acts)
        finally:
            depth[node] -= 1
            if self._left:  # the calls that answered before a client left are done
                for key in [k for k, d in self._left.items() if k[0] == node and d > depth[node]]:
                    del self._left[key]

    def left(self, node: int, sid: int) -> None:
        """The client of session ``sid`` closed it, and ``node`` hears of it now
        (``client_closed``) — maybe while it carries out what it answered that
        client before: the rest of that goes to a closed connection, unread
        (``late_for``)."""
        if self._depth[node]:
            self._left[(node, sid)] = self._depth[node]

    def late_for(self, node: int, sid: int) -> bool:
        """Whether a message ``node`` sends the closed session ``sid`` now was
        asked for before the client left (``left``): not the core's fault."""
        at = self._left.get((node, sid))
        return at is not None and self._depth[node] <= at

    def _carry_out(self, node: int, acts: list[Action]) -> None:
        for act in acts:
            if type(act) is ToPeer:
                self.send(node, act.node, act.msg)
            elif type(act) is ToClient:
                self.to_client(node, act.session, act.msg)
            elif type(act) is Notifies:
                self.notifies(node, act)
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

    def notifies(self, node: int, act: Notifies) -> None:
        """One event's Notify to several sessions, as the shell sends it: the
        frames encoded once (``overlay.messages.codec`` rule 4), each session
        reading its own; what the action must be to mean a Notify per
        session is ``invariants`` rule 8."""
        frames = NotifyFrames(act.msg, self.config.cluster.max_frame_size)
        for bad in check_notifies(act, frames):
            self.failures.append(f"step {self.step_no}: node {node}: {bad}")
        self.runs["notifies_actions"] += 1
        for sid, ids in zip(act.sessions, act.sub_ids, strict=False):  # a length mismatch is a failure (above)
            self.frame_to_client(node, sid, frames.frame(ids))

    def spy(self, core: NodeCore) -> None:
        """Record when a channel matches each event, and when each notification
        reaches the subscriber's access node; what the outbox accepts and how
        often it sends each event (white-box: the core's observer, ``node.observer``)."""
        core.observe(_Spy(self, core.id))

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
        """Messages on the links, and read by a node from its clients but not dispatched."""
        return sum(len(link) for link in self.links.values()) + len(self.inbox)

    def count_step(self) -> None:
        self.step_no += 1
        if self.step_no > MAX_STEPS:
            raise RuntimeError(f"no progress after {MAX_STEPS} steps")


class _Spy:
    """What ``SimNetwork.spy`` records of one core (``overlay.node.observer``): the
    step each event was matched at and each notification arrived at, what the
    outbox accepted and how many times it dispatched each event."""

    __slots__ = ("_net", "_node")

    def __init__(self, net: SimNetwork, node: int) -> None:
        self._net = net
        self._node = node

    def matched(self, event_id: str) -> None:
        net = self._net
        net.matched.setdefault(event_id, []).append(net.step_no)

    def notified(self, event_id: str, gids: Sequence[str]) -> None:
        net = self._net
        arrivals, step = net.arrivals, net.step_no
        for gid in gids:
            arrivals.setdefault((event_id, gid), step)

    def accepted(self, ev: pm.Event, sid: int) -> None:
        net = self._net
        net.accepted[ev.event_id] = (self._node, sid, net.step_no, dict(ev.event_exp))

    def dispatched(self, ev: pm.Event) -> None:
        self._net.sent[ev.event_id] += 1
