"""Which peers are alive: heartbeats, suspicion, death by majority, quorum (SPEC §16).

Rules:

1. Every ``heartbeat_interval`` this node sends every peer a ``Heartbeat`` on
   the high queue, carrying its incarnation, whom it suspects and whom a
   majority declared dead.  Anything a peer sends counts as hearing from it.
2. A peer not heard from for ``suspect_timeout`` is *suspected* (logged
   once, with how long it has been silent).  Suspicion is only an opinion:
   nothing moves on it.
3. A peer is declared *dead* when a majority of the configured nodes
   (``len(peers) + 1``, this node included) suspect it: this node and every
   peer it does not suspect itself whose last heartbeat lists it.  A death
   is of one run: it is kept as ``(node, incarnation)`` and told to everyone
   in every heartbeat; a node learning a death from a peer it hears adopts
   it (the teller had its majority).  A dead node stays dead until a new run
   of it says hello (it restarted) — or it rejoins (rule 5).
4. *Quorum*: this node and the peers it neither suspects nor holds dead are
   a majority of the configured nodes.  Without it the node is cut off in a
   minority: it declares nobody dead on its own count.  Until
   ``suspect_timeout`` after start nobody is suspected (a node just started
   has heard nobody yet).  Serving (``has_quorum``: publishes and
   subscriptions, else ``no_quorum``) asks more — a *lease*: a majority
   must have echoed one of this node's heartbeats sent within the last
   ``LEASE`` × ``suspect_timeout`` (each heartbeat carries the time its
   sender sent it and the latest such time it had from the recipient).  A
   peer declares this node dead only ``suspect_timeout`` after it last
   heard from it, which is after that heartbeat was sent: a node cut off —
   both ways or only one — stops serving before the majority can take its
   channels over, so it never acknowledges anything against a stale table
   (fault seed 418).  Before any echo, the start-up grace above stands in.
5. A node that finds itself in a peer's dead list, in its current run, was
   declared dead while it was paused or cut off: its tables and channels are
   stale, and it must rejoin as a new, empty run (``rejoin`` is True; the
   node core then asks its shell to restart it).
6. The *coordinator* of a recovery is the lowest-numbered node that this
   node neither suspects nor holds dead: every node of the majority computes
   the same one once their views agree.
7. Damping: a node that comes back (a new run's hello) after being declared
   dead is given no channel by balancing or recovery for ``rejoin_damping``
   seconds, doubled for every further death of it within ``flap_window``
   seconds — a node that flaps takes load back ever more slowly instead of
   causing a storm of moves.
8. A node that notices it was not running itself — no check for more than
   half the suspect timeout (a pause, a loop held by something slow) — does
   not count its peers' silence meanwhile: it forgets what it heard and the
   reports it had, and starts listening afresh.  (Nodes sharing one process
   and one held loop then never declare each other dead.)

Nothing here reads a clock: ``now`` comes with every call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec

from overlay.config import ClusterSettings
from overlay.messages import peer as pm

__all__ = ["LEASE", "Liveness"]

log = logging.getLogger("overlay.node")

# Rule 4: the quorum lease, as a fraction of ``suspect_timeout``.  Below 1 by
# a margin for a heartbeat's delivery and a tick's lateness; above the
# heartbeat round trip (an interval plus the delays of the high queue).
LEASE = 2 / 3


class Liveness:
    """Rules 1–6 for one node.  ``peers`` is the node context's list of
    configured peers (membership grows and shrinks it in place)."""

    def __init__(
        self,
        node_id: int,
        incarnation: int,
        peers: Sequence[int],
        *,
        interval: float,
        timeout: float,
        damping: float = 0.0,
        flap_window: float = 0.0,
    ) -> None:
        self.id = node_id
        self.incarnation = incarnation
        self._peers = peers
        self.interval = interval
        self.timeout = timeout
        self._started: float | None = None
        self._last_check: float | None = None
        self._next_beat = 0.0
        self._heard: dict[int, float] = {}
        self._their_sent: dict[int, float] = {}  # peer -> its last heartbeat's ``sent`` (echoed back)
        self._echo: dict[int, float] = {}  # peer -> the latest of our ``sent`` it echoed (rule 4)
        self.lease = LEASE * timeout
        self._reports: dict[int, frozenset[int]] = {}  # peer -> whom its last heartbeat suspects
        self._incarnations: dict[int, int] = {}  # peer -> incarnation of its last heartbeat
        self.dead: dict[int, int] = {}  # node -> the incarnation it was declared dead in
        self._suspected: set[int] = set()  # logged as suspected (rule 2)
        self.deaths = 0  # deaths this node has seen (declared or adopted)
        self.rejoin = False  # rule 5
        self.rejoin_reason = ""
        # Rule 7: damping of nodes that came back.
        self.damping = damping
        self.flap_window = flap_window
        self._deaths_at: dict[int, list[float]] = {}
        self._damped_until: dict[int, float] = {}
        # has_quorum is asked on every publish: a True answer holds until the
        # moment enough peers' silence could pass the timeout (only a death
        # or a change of the configured peers can end it sooner).
        self._quorum_until = 0.0
        self._quorum_peers = -1

    @classmethod
    def configured(cls, node_id: int, incarnation: int, peers: Sequence[int], cluster: ClusterSettings) -> Liveness:
        """A detector with the ``[cluster]`` settings."""
        return cls(
            node_id,
            incarnation,
            peers,
            interval=cluster.heartbeat_interval,
            timeout=cluster.suspect_timeout,
            damping=cluster.rejoin_damping,
            flap_window=cluster.flap_window,
        )

    # -- what comes in ---------------------------------------------------------------------

    def start(self, now: float) -> None:
        if self._started is None:
            self._started = now
            self._next_beat = now

    def heard(self, node: int, now: float) -> None:
        """Rule 1: anything from ``node`` shows it alive."""
        self._heard[node] = now

    def on_heartbeat(self, node: int, msg: pm.Heartbeat, now: float) -> list[int]:
        """A peer's heartbeat; the deaths it taught this node (rule 3)."""
        self._heard[node] = now
        if msg.sent >= 0.0:
            self._their_sent[node] = msg.sent
        if msg.echo <= now and msg.echo > self._echo.get(node, -1.0):  # never from our future
            if node not in self._echo:
                self._quorum_until = 0.0  # the start-up grace gives way to the lease: recompute
            self._echo[node] = msg.echo
        if msg.incarnation:
            self._incarnations[node] = msg.incarnation
        self._reports[node] = frozenset(msg.suspects)
        learned: list[int] = []
        for d in msg.dead:
            if d.node == self.id:
                if d.incarnation == self.incarnation and not self.rejoin:
                    self.rejoin = True  # rule 5
                    self.rejoin_reason = f"node {node} says a majority declared this run of node {self.id} dead"
                    log.error("node %d: %s; rejoining as a new, empty run", self.id, self.rejoin_reason)
                continue
            if self._adopt(d.node, d.incarnation, f"told by node {node}", now):
                learned.append(d.node)
        return learned

    def revived(self, node: int, incarnation: int, now: float) -> bool:
        """A new run of ``node`` said hello: it is alive again (empty); True if it had been dead."""
        if incarnation > self._incarnations.get(node, 0):
            # Known from now on, dead or not: a death of an earlier run learned
            # later must not take this one for dead (rule 3, _adopt).
            self._incarnations[node] = incarnation
        dead = self.dead.get(node)
        if dead is None or (incarnation and incarnation == dead):
            return False
        del self.dead[node]
        self._reports.pop(node, None)
        self._suspected.discard(node)
        self._heard[node] = now
        if incarnation:
            self._incarnations[node] = incarnation
        # Rule 7: ``damping`` seconds, doubled for each earlier death in the window.
        flaps = len(self._deaths_at.get(node, []))
        hold = self.damping * 2 ** max(flaps - 1, 0) if self.damping else 0.0
        self._damped_until[node] = now + hold
        log.info(
            "node %d: node %d is back as a new run; no longer dead (no channel moves to it for %.1fs: %d deaths in %.0fs)",
            self.id,
            node,
            hold,
            flaps,
            self.flap_window,
        )
        return True

    def damped(self, node: int, now: float) -> bool:
        """Rule 7: ``node`` came back lately; balancing moves nothing onto it yet."""
        until = self._damped_until.get(node)
        return until is not None and now < until

    # -- what this node concludes ----------------------------------------------------------------

    def is_dead(self, node: int) -> bool:
        return node in self.dead

    def suspects(self, now: float) -> list[int]:
        """Rule 2, sorted."""
        if self._started is None or now - self._started < self.timeout:
            return []
        heard, limit = self._heard, self.timeout
        start = self._started
        return [p for p in sorted(self._peers) if p not in self.dead and now - heard.get(p, start) > limit]

    def majority(self) -> int:
        return (len(self._peers) + 1) // 2 + 1

    def live(self, now: float) -> list[int]:
        """This node and the peers it neither suspects nor holds dead, sorted."""
        sus = set(self.suspects(now))
        return sorted({self.id, *(p for p in self._peers if p not in sus and p not in self.dead)})

    def has_quorum(self, now: float) -> bool:
        """Rule 4: a majority live, and its lease held."""
        if not self._peers:  # a cluster of one
            return True
        if now < self._quorum_until and len(self._peers) == self._quorum_peers:
            return True
        need = self.majority() - 1
        if need <= 0:
            return True
        # Each peer counts until its deadline: its echo's lease, its silence's
        # suspicion, or (no echo yet) the start-up grace.  The quorum holds
        # until fewer than majority − 1 deadlines are still ahead.
        start = self._started if self._started is not None else now
        heard, echo, dead = self._heard, self._echo, self.dead
        timeout, lease = self.timeout, self.lease
        deadlines = []
        for p in self._peers:
            if p in dead:
                continue
            e = echo.get(p)
            until = start + timeout if e is None else e + lease
            deadlines.append(min(until, max(heard.get(p, start), start) + timeout))
        deadlines.sort(reverse=True)
        if len(deadlines) < need or deadlines[need - 1] <= now:
            return False
        self._quorum_until = deadlines[need - 1]
        self._quorum_peers = len(self._peers)
        return True

    def coordinator(self, now: float) -> int:
        """Rule 6."""
        return self.live(now)[0]

    def check(self, now: float) -> list[int]:
        """Rules 2, 3 and 8 on time: the peers declared dead by this call."""
        last, self._last_check = self._last_check, now
        if last is not None and now - last > self.timeout / 2:
            # Rule 8: this node itself was not running (paused, its loop held):
            # its peers' silence is its own; it starts listening afresh.
            log.warning(
                "node %d: no check for %.2fs (this node was paused or its loop held): peers' silence not counted",
                self.id,
                now - last,
            )
            for p in self._peers:
                self._heard[p] = now
            self._reports.clear()
        sus = self.suspects(now)
        for p in sus:
            if p not in self._suspected:
                self._suspected.add(p)
                silent = now - self._heard.get(p, self._started or now)
                log.warning(
                    "node %d: node %d suspected: silent for %.2fs (suspect_timeout %.2fs)",
                    self.id,
                    p,
                    silent,
                    self.timeout,
                )
        for p in [p for p in self._suspected if p not in sus]:
            self._suspected.discard(p)
            if p not in self.dead:
                log.info("node %d: node %d heard again; no longer suspected", self.id, p)
        if not sus:
            return []
        live = self.live(now)
        if len(live) < self.majority():
            return []  # rule 4: a minority declares nobody dead
        declared = []
        for p in sus:
            votes = 1 + sum(1 for q in live if q != self.id and p in self._reports.get(q, ()))
            if votes >= self.majority():
                silent = now - self._heard.get(p, self._started or now)
                why = f"{votes} of {len(self._peers) + 1} nodes suspect it"
                if self._adopt(p, self._incarnations.get(p, 0), why, now):
                    log.error("node %d: node %d declared dead after %.2fs of silence", self.id, p, silent)
                    declared.append(p)
        return declared

    def declare(self, node: int, incarnation: int, why: str, now: float) -> bool:
        """A death this node learned otherwise (a recovery update names it)."""
        return self._adopt(node, incarnation, why, now)

    def _adopt(self, node: int, incarnation: int, why: str, now: float) -> bool:
        if node in self.dead or node not in self._peers:
            return False
        known = self._incarnations.get(node, 0)
        if incarnation and known and incarnation < known:
            return False  # a death of an older run: this one is alive
        self.dead[node] = incarnation or known
        self._quorum_until = 0.0
        self.deaths += 1
        times = [t for t in self._deaths_at.get(node, []) if now - t <= self.flap_window]
        self._deaths_at[node] = [*times, now]
        log.warning("node %d: node %d is dead (%s)", self.id, node, why)
        return True

    # -- what goes out ------------------------------------------------------------------------------

    def due(self, now: float) -> bool:
        """Rule 1: time for a heartbeat round."""
        if self._started is None or now < self._next_beat:
            return False
        # On time: the next round one interval on; late (a pause): one from now.
        nxt = self._next_beat + self.interval
        self._next_beat = nxt if nxt > now else now + self.interval
        return True

    def heartbeat(self, now: float, *, table_digest: int = 0, table_clock: int = 0) -> pm.Heartbeat:
        """The round's heartbeat, without the per-peer echo (``to``); the
        table's digest and clock ride along (``node.table_sync`` rule 1)."""
        return pm.Heartbeat(
            self.incarnation,
            tuple(self.suspects(now)),
            tuple(pm.DeadNode(n, inc) for n, inc in sorted(self.dead.items())),
            self.deaths,
            now,
            table_digest=table_digest,
            table_clock=table_clock,
        )

    def to(self, peer: int, beat: pm.Heartbeat) -> pm.Heartbeat:
        """``beat`` for ``peer``: with the latest ``sent`` this node had from it (rule 4)."""
        return msgspec.structs.replace(beat, echo=self._their_sent.get(peer, -1.0))

    def status(self, now: float) -> dict[str, object]:
        return {
            "quorum": self.has_quorum(now),
            "majority": self.majority(),
            "live": self.live(now),
            "suspected": self.suspects(now),
            "dead": sorted(self.dead),
            "silent_for": {p: round(now - t, 3) for p, t in sorted(self._heard.items())},
        }
