"""Node faults of the simulated cluster: crash and restart, partition, pause (SPEC §15, §16).

``NodeFaults`` is driven by the run's seeded scheduler (``SimNetwork.advance``
calls ``step`` each time the clock moves) and models what the shell
(``overlay.net.node``, ``.peer_link``) sees of each fault.  Rules:

1. **One node at a time.**  A fault takes one node; the next one starts no
   sooner than ``recovery_gap()`` after the previous one ended (the promise
   of SPEC §16 is for one failure at a time).  A crashed node that is never
   restarted ends the faults of the run.  Only the active phase starts faults;
   one under way ends on time in any phase.
2. **Crash.**  The node's core is gone: every message queued to or from it
   is lost, in-flight frames too; whatever is sent to it while it is down is
   lost (the shell queues it, then discards it at the new run's hello); its
   clients' sessions end (``on_sessions_lost``: they reconnect elsewhere,
   told since which step the run was dying);
   it ticks no more.  Each peer's link reports down at once (``peer_link``)
   and, past ``peer_timeout``, unreachable (``peer_unreachable``), as the
   shell's ticker does.
3. **Restart** (after a crash, or when a core asks to ``Rejoin``): a new
   ``NodeCore`` of the node with the next incarnation starts with ``boot``
   (it fetches the table from its peers and joins empty), then every link
   to and from it opens with a hello each way (``peer_hello``), before any
   other message: hellos are handed over at once, through the codec.  Peers
   that had reported it unreachable hear it is back (``peer_reachable``),
   and every link reports up.
4. **Partition.**  For a while nothing passes between the node and the
   others, either way.  Nothing is lost while both runs live (the shell's
   ``net.peer_link`` rule 6: a frame stays unacknowledged until the peer
   counts it, and what the peer lacks goes again first on reconnect): what
   was in flight at the cut and what is sent during it is held, and
   delivered in order after the heal.  Each direction's link notices the
   break at a random moment of the cut (``peer_link`` down, unreachable past
   the timeout).  At the heal every link reconnects with a hello each way
   (rule 3's hand-over), then reports up.  A node that rejoins as a new run
   loses what it held and what was held for it (rule 3).  The cut node keeps
   its clients.  A *lossy* cut (``p_lossy_cut``; off in the fault seeds)
   models a shell without that rule: everything across the cut is lost, in
   flight at the cut too, and the links notice only at the heal.
5. **Pause** (SIGSTOP/SIGCONT; the "stalled node" of ``sim.cluster`` rule 3):
   the node receives nothing, ticks nothing and serves no client; what is
   sent to it waits on its links and is processed late.  Longer than
   ``suspect_timeout``, it is declared dead meanwhile and, once it resumes
   and hears so, asks to rejoin (rule 3).
6. **Journal.**  Every fault, its end and every rejoin is a line of the
   network's ``journal`` (``SimResult.journal``, shown by ``describe``), and
   is hashed into the trace; nothing here reads a clock or iterates a set.
"""

from __future__ import annotations

import enum
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from overlay.actions import Action
from overlay.messages import peer as pm

from .setup import SimParams

if TYPE_CHECKING:
    from .network import SimNetwork

__all__ = ["Fault", "NodeFaults"]

Pair = tuple[int, int]  # (the node whose link it is, its peer), or (sender, receiver)


class Fault(enum.Enum):
    CRASH = "crash"
    PARTITION = "partition"
    PAUSE = "pause"
    REJOIN = "rejoin"  # a core asked for a new run (declared dead): a crash and a quick restart (rule 3)


@dataclass
class Cut:
    """A partition of ``node`` from every other node until ``until`` (rule 4)."""

    node: int
    until: float
    lossy: bool
    notice: dict[Pair, float] = field(default_factory=dict)  # (sender, receiver) -> when its link notices
    noticed: dict[Pair, bool] = field(default_factory=dict)

    def across(self, src: int, dst: int) -> bool:
        return (src == self.node) != (dst == self.node)


class NodeFaults:
    """Rules 1–6 for one run, on ``net`` (cores, links, clock) with the
    run's ``rng``.  ``on_sessions_lost(node, incarnation, since)`` ends the
    sessions of a node's clients when that run of it ends — ``since`` is the
    step its end began: the crash, or the start of the pause or cut that got
    it declared dead;
    ``on_restarted(node)`` runs once a new run of it is up."""

    def __init__(self, net: SimNetwork, params: SimParams, rng: random.Random) -> None:
        self.net = net
        self.params = params
        self.rng = rng
        cl = net.config.cluster
        self.suspect = cl.suspect_timeout
        self.resend = cl.resend_after
        self.incarnation = dict.fromkeys(net.ids, 1)
        self.crashed: dict[int, float] = {}  # node -> when it crashed (its core is gone)
        self.restart_at: dict[int, float] = {}  # crashed node -> when it restarts (inf: never)
        self.cut: Cut | None = None
        self.current: tuple[Fault, int] | None = None
        self.began = 0.0  # when the current fault started
        self.ends_at = math.inf
        self.next_at = math.inf  # set by ``begin``
        self.history: list[tuple[float, Fault, int]] = []  # (start, kind, node)
        self.spans: list[tuple[float, float, Fault, int]] = []  # (start, end, kind, node) of the faults that ended
        self.last_end = 0.0
        self.permanent = False  # a crashed node stays down (rule 1)
        self.rejoining: dict[int, float] = {}  # node -> when its new run starts (rule 3)
        # The shell's view of its links (rules 2 and 4): (node, peer) -> down since.
        self.down_since: dict[Pair, float] = {}
        self.reported: dict[Pair, bool] = {}
        self.lost: Counter[str] = Counter()  # messages lost, by type
        self.on_sessions_lost: Callable[[int, int, int], None] = lambda node, incarnation, since: None
        self.fault_steps: dict[int, tuple[int, float | None]] = {}  # node -> (step its last fault began, when it ended)
        self.on_restarted: Callable[[int], None] = lambda node: None

    # -- what the network asks ---------------------------------------------------------------

    def alive(self, node: int) -> bool:
        return node not in self.crashed

    def live_ids(self) -> list[int]:
        return [i for i in self.net.ids if i not in self.crashed]

    def drops(self, src: int, dst: int, msg: pm.PeerMessage) -> bool:
        """Whether a message sent now from ``src`` to ``dst`` is lost (rules 2, 4)."""
        lost = src in self.crashed or dst in self.crashed
        cut = self.cut
        if not lost and cut is not None and cut.across(src, dst):
            lost = cut.lossy  # else held on its link until the heal
        if lost:
            self.lost[type(msg).__name__] += 1
            net = self.net
            if net.keep_trace:
                net.trace.append(f"{net.step_no} t={net.now:.3f} {src}->{dst} LOST {msg!r}")
        return lost

    def recovery_floor(self) -> float:
        """How long after a fault the failure detector and the re-sends need at least."""
        return self.suspect + 2 * self.resend

    def recovery_gap(self) -> float:
        """Rule 1: the quiet time before the next fault (random above the floor)."""
        return self.recovery_floor() + self.rng.uniform(0.0, 2.0)

    def faulty(self) -> int | None:
        """The node under a fault now, if any."""
        return None if self.current is None else self.current[1]

    def had_fault(self, node: int) -> bool:
        return any(n == node for _, _, n in self.history)

    def quiet_since(self) -> float | None:
        """When the last fault ended, or the node that stays down crashed
        (None while a fault or a rejoin is under way)."""
        if self.current is not None or self.rejoining:
            return None
        return self.last_end

    # -- the schedule (rule 1) ---------------------------------------------------------------

    def begin(self, now: float) -> None:
        """The active phase starts: the first fault is due within ``first_fault``."""
        self.next_at = now + self.rng.uniform(0.2, 1.0) * self.params.first_fault

    def step(self, *, allow_new: bool) -> None:
        """The clock moved: end what is due, notice broken links, report
        unreachable peers, maybe start a fault."""
        now = self.net.now
        if self.current is not None and self.ends_at <= now:
            self._end()
        for node, at in sorted(self.rejoining.items()):
            if at <= now:
                del self.rejoining[node]
                self.restart(node)
        cut = self.cut
        if cut is not None and not cut.lossy:
            for pair, at in sorted(cut.notice.items()):
                if at <= now and not cut.noticed.get(pair):
                    cut.noticed[pair] = True
                    self._link_down(*pair)
        limit = self.net.timeout
        for pair, since in sorted(self.down_since.items()):
            viewer, peer = pair
            if not self.reported.get(pair) and now - since > limit and self.alive(viewer):
                self.reported[pair] = True
                self._call(viewer, lambda core, p=peer: core.peer_unreachable(p, now))
        if allow_new and self.current is None and not self.permanent and now >= self.next_at:
            self._start()

    def _start(self) -> None:
        rng, p = self.rng, self.params
        kind = rng.choices((Fault.CRASH, Fault.PARTITION, Fault.PAUSE), (p.w_crash, p.w_partition, p.w_pause))[0]
        node = rng.choice(self.net.ids)
        # Short faults end before anyone suspects the node; long ones get it declared dead.
        short = rng.random() < 0.4
        seconds = rng.uniform(0.2, 0.6) * self.suspect if short else rng.uniform(1.3, 3.5) * self.suspect
        if kind is Fault.CRASH:
            never = rng.random() < p.p_no_restart
            self.crash(node, math.inf if never else seconds)
        elif kind is Fault.PARTITION:
            self.partition(node, seconds, lossy=rng.random() < p.p_lossy_cut)
        else:
            self.pause(node, seconds)

    def _begun(self, kind: Fault, node: int, ends_at: float) -> None:
        self.current = (kind, node)
        self.began = self.net.now
        self.ends_at = ends_at
        self.history.append((self.net.now, kind, node))
        self.net.faults[kind.value] += 1
        self.fault_steps[node] = (self.net.step_no, None)

    def _end(self) -> None:
        assert self.current is not None
        kind, node = self.current
        self.spans.append((self.began, self.net.now, kind, node))
        self.fault_steps[node] = (self.fault_steps[node][0], self.net.now)
        if kind is Fault.CRASH:
            self.restart(node)
        elif kind is Fault.PARTITION:
            self.heal()
        else:
            self.note(f"node {node} resumes")
        self.current = None
        self.ends_at = math.inf
        self.last_end = self.net.now
        self.next_at = self.net.now + self.recovery_gap()

    # -- the faults --------------------------------------------------------------------------

    def crash(self, node: int, restart_after: float) -> None:
        """Rule 2; the node restarts ``restart_after`` seconds later (inf: never)."""
        net = self.net
        now = net.now
        self._begun(Fault.CRASH, node, now + restart_after)
        if math.isinf(restart_after):  # rule 1: the last fault of the run
            self.permanent = True
            self.current = None
            self.last_end = now
            self.note(f"node {node} crashes for good")
        else:
            self.note(f"node {node} crashes; restarts in {restart_after:.2f}s")
        self._go_down(node, net.step_no)

    def rejoin(self, node: int, reason: str) -> None:
        """A core asked for a new run (``Rejoin``: it was declared dead while
        paused or cut off): its process stops, its clients go, and the runner
        starts a new run shortly (rule 3).  Not a fault of its own: the
        aftermath of one, which delays the next (rule 1)."""
        if not self.alive(node):
            return
        delay = self.rng.uniform(0.05, 0.3)
        self.note(f"node {node} stops to rejoin as a new run in {delay:.2f}s: {reason}")
        since = self.net.step_no  # declared dead for no fault of its own, unless it had one lately:
        began, ended = self.fault_steps.get(node, (since, None))
        if ended is None or self.net.now - ended <= self.recovery_floor():
            since = began  # it began dying when that pause or cut began
        if self.current is not None and self.current[1] == node:
            self._end()  # its cut or pause ends with this run
        self.history.append((self.net.now, Fault.REJOIN, node))
        self.net.faults[Fault.REJOIN.value] += 1
        self.rejoining[node] = self.net.now + delay
        self.next_at = max(self.next_at, self.net.now + delay + self.recovery_gap())
        self._go_down(node, since)

    def _go_down(self, node: int, since: int) -> None:
        net = self.net
        now = net.now
        self.crashed[node] = now
        net.stall_until[node] = 0.0
        for key in self._links_of(node):
            self._lose_queued(key)
        net.retire(node)
        self.on_sessions_lost(node, self.incarnation[node], since)
        for pair in [p for p in self.down_since if node in p]:
            self.down_since.pop(pair)
            self.reported.pop(pair, None)
        for peer in self.live_ids():
            self._link_down(peer, node)

    def restart(self, node: int) -> None:
        """Rule 3."""
        net = self.net
        self.incarnation[node] += 1
        inc = self.incarnation[node]
        del self.crashed[node]
        core = net.new_core(node, inc)
        self.note(f"node {node} restarts as run {inc}")
        net.execute(node, core.boot(net.now))
        self._reconnect(node, [i for i in self.live_ids() if i != node])
        self.on_restarted(node)

    def partition(self, node: int, seconds: float, *, lossy: bool) -> None:
        """Rule 4."""
        net = self.net
        now = net.now
        self._begun(Fault.PARTITION, node, now + seconds)
        cut = Cut(node, now + seconds, lossy)
        for key in self._links_of(node):
            if lossy:
                self._lose_queued(key)
            else:
                net.links[key].blocked_until = math.inf  # held until the heal
                cut.notice[key] = now + self.rng.uniform(0.0, seconds)
        self.cut = cut
        how = "everything across it lost" if lossy else "what crosses it held"
        self.note(f"node {node} is cut off for {seconds:.2f}s ({how})")

    def heal(self) -> None:
        """Rule 4's end: links notice (if they had not), reconnect with hellos, come up."""
        cut = self.cut
        if cut is None:
            return
        self.cut = None
        node = cut.node
        self.note(f"node {node}'s partition heals")
        for key in self._links_of(node):
            if not cut.noticed.get(key):
                self._link_down(*key)
        self._reconnect(node, [i for i in self.live_ids() if i != node])

    def pause(self, node: int, seconds: float) -> None:
        """Rule 5: the stalled node of ``sim.cluster`` rule 3, as a node fault."""
        net = self.net
        self._begun(Fault.PAUSE, node, net.now + seconds)
        net.stall_until[node] = max(net.stall_until[node], net.now + seconds)
        self.note(f"node {node} pauses for {seconds:.2f}s")

    # -- helpers -----------------------------------------------------------------------------

    def note(self, what: str) -> None:
        net = self.net
        line = f"step {net.step_no} t={net.now:.3f}: {what}"
        net.journal.append(line)
        net.hash.update(b"F" + what.encode())
        if net.keep_trace:
            net.trace.append(line)

    def _links_of(self, node: int) -> list[Pair]:
        return [k for k in sorted(self.net.links) if node in k]

    def _lose_queued(self, key: Pair) -> None:
        net = self.net
        link = net.links[key]
        for msg in link.queued():
            self.lost[type(msg).__name__] += 1
            if net.keep_trace:
                net.trace.append(f"{net.step_no} t={net.now:.3f} {key[0]}->{key[1]} LOST (in flight) {msg!r}")
        link.high.clear()
        link.normal.clear()
        link.blocked_until = 0.0

    def _link_down(self, viewer: int, peer: int) -> None:
        """``viewer``'s link to ``peer`` broke (the shell's ``peer_link`` down)."""
        if not self.alive(viewer):
            return
        self.down_since.setdefault((viewer, peer), self.net.now)
        now = self.net.now
        self._call(viewer, lambda core: core.peer_link(peer, False, now))

    def _reconnect(self, node: int, peers: list[int]) -> None:
        """Rule 3's hand-over: a hello each way on every link of ``node``
        (in a random order), then each link reports up."""
        net, rng = self.net, self.rng
        order = list(peers)
        rng.shuffle(order)
        for peer in order:
            pairs = [(node, peer), (peer, node)]
            if rng.random() < 0.5:
                pairs.reverse()
            for src, dst in pairs:
                net.hello(src, dst)
        now = net.now
        for peer in order:
            for viewer, other in ((peer, node), (node, peer)):
                self.net.links[(other, viewer)].blocked_until = 0.0
                self.down_since.pop((viewer, other), None)
                if self.reported.pop((viewer, other), False):
                    net.cores[viewer].peer_reachable(other)
                self._call(viewer, lambda core, o=other: core.peer_link(o, True, now))

    def _call(self, node: int, call: Callable[..., list[Action]]) -> None:
        core = self.net.cores.get(node)
        if core is not None:
            self.net.execute(node, call(core))
