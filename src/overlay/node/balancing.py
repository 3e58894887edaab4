"""The balancing half of the node core: slices, LIEMs, scheduling, splits and merges.

Theory of operation (SPEC §5–§8):

1. Every ``T`` seconds (``tick`` sees the time pass) each local channel closes
   its slice; the node's load ``d`` is the sum of the closed slices' costs.
   The ``Monitor`` turns it into ``dc``, ``dc̄`` and a state, and the node sends
   its LIEM to every peer on the high-priority queue.
2. An OVERLOADED node that the monitor lets schedule (probability p) waits
   a random part of ``START_SPREAD`` of a slice, then (still OVERLOADED and
   free) becomes BUSY, ranks receivers with rank1 and asks the best with
   RequestLoadBalance; a refusal moves on to the next candidate, an empty
   list returns the node to its previous state.  A receiver accepts only
   when UNDERLOADED and not BUSY, and becomes BUSY.
3. On acceptance the node ranks its channels with rank2 and takes the prefix
   closest to φ.  When a channel must be cut first, the split is worked out
   in the background (``balance.split_job``: the cut from its last slice's
   records, its subscriptions sorted into the children), a bounded step at a
   time between message batches (``background_step``), while the parent
   keeps serving; one split at a time, and nothing else may split, merge or
   move the parent meanwhile.  The split is then **committed** on this node
   before the transfer — children replace the parent in both tables and are
   announced with UpdateRoutingTable, exactly like any table change — and the
   cut-off part joins the transfer, or the choice is made again (at most
   ``MAX_REPLANS`` times in all).  A session that is later refused or rolled
   back undoes the moves, not the split: the tables stay a valid partition,
   and idle merges fold cold children back; one that ends while its split is
   being worked out cancels it, leaving the parent as it was.
4. A channel whose slice records all lie on one point cannot be cut; it is
   **replicated** to the receiver instead (§8.3 degenerate case).
5. Channels whose load stays at or below ``MERGE_THRESHOLD`` for
   ``MERGE_SLICES`` slices merge with an adjacent cold local channel (§8.4).
6. Every decision (candidates with rank1/f2/f3, channels with
   rank2/f1/f3/f4, the choice), split, merge, migration and state change is
   appended to the node's journal as a JSON-ready dict.
7. A channel does not go back to a node it left less than ``RETURN_SLICES``
   slices ago (an operator's move or a drain may): the nodes it left travel
   with it (``ChannelSpec.past_owners``), split children inherit them, merges
   join them.  Without it, load noise after convergence moved a small channel
   to and fro between two nodes, or round three (found by the simulator).
"""

from __future__ import annotations

import logging
import math
import random
import zlib
from collections.abc import Callable
from typing import Any, Final

from overlay.actions import Action, ToPeer
from overlay.balance.migration import OutgoingMigration
from overlay.balance.monitor import Monitor, NodeState, SliceReport
from overlay.balance.scheduler import ChannelChoice, ChannelLoad, Weights, choose_channels, rank_receivers
from overlay.balance.split_job import SplitJob
from overlay.channels.channel import ChannelId
from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.indexing import Indexing
from overlay.node.loads import ChannelLoads
from overlay.node.migration import Migration
from overlay.node.splits import Splits

__all__ = ["Balancing"]

log = logging.getLogger("overlay.balance")

MAX_REPLANS: Final = 3
# Longest wait, in slices, for the peers' LIEMs of a slice before deciding
# without them: slices close together to a tick, so they come within ms.
DECIDE_GRACE: Final = 0.25
# Slices close together on every node, so every node that schedules would
# start its session in the same few milliseconds: on shared cores their
# splits, moves and table updates then contend, and events published just
# then waited for all of them (measured: p99 during migrations 4-5x steady).
# Each start waits a random fraction of this share of a slice instead.
START_SPREAD: Final = 0.1
# A cut-off part that brings the moved load within this fraction of φ is
# taken as cut; any load in (0, 2φ) lowers S (SPEC §7), closer is better.
SPLIT_ACCEPT: Final = 0.5


class Balancing:
    """Rules 1–4 and 6 for one node; splits and merges are ``node.splits``'s,
    loads and past owners ``node.loads``'s.  It is the ``Planner`` of
    ``node.migration``: sessions ask it what to accept and what to send.
    ``ready`` and ``draining`` say whether the node may balance at all."""

    def __init__(
        self,
        ctx: NodeContext,
        migration: Migration,
        splits: Splits,
        loads: ChannelLoads,
        indexing: Indexing,
        *,
        ready: Callable[[], bool],
        draining: Callable[[], bool],
        damped: Callable[[int, float], bool] = lambda node, now: False,
    ) -> None:
        self._ctx = ctx
        self._migration = migration
        self._splits = splits
        self._loads = loads
        self._indexing = indexing
        self._ready = ready
        self._draining = draining
        self._damped = damped  # a node back from the dead takes no load yet (node.liveness rule 7)
        cl = ctx.config.cluster
        seed = zlib.crc32(f"{cl.name}:{ctx.id}".encode())
        self.rng = random.Random(seed)
        self.monitor = Monitor(
            ctx.id,
            ctx.me.capacity,
            list(ctx.peers),
            delta=cl.delta,
            slice_seconds=cl.slice_seconds,
            probability=cl.probability,
            rng=self.rng,
            min_load=cl.min_load,
        )
        self.weights = Weights(cl.omega, cl.alpha, cl.beta, cl.gamma, cl.levels)
        self.balancing_enabled = cl.balancing
        self.next_slice_at: float | None = None
        # Slices close on a common grid, so a peer's LIEM for the slice just closed comes a few ms after
        # ours: the state and the decision to schedule wait for them (or DECIDE_GRACE of a slice), rule 1.
        self._now = 0.0  # the last tick's clock: when a LIEM came, to a tick
        self._liem_at: dict[int, float] = {}
        self._decide: tuple[float, float, NodeState] | None = None  # (closed at, decide by, state before)
        self._start_at: float | None = None  # when a drawn session starts (rule 2)
        self._candidates: list[Any] = []
        self.last_report: SliceReport | None = None
        # The split a session waits on (rule 3), with that session and its choice.
        self._split: tuple[SplitJob, OutgoingMigration, ChannelChoice] | None = None
        self.background_last = ""  # what the last background_step did (for the shell's slow log)

    # -- what a migration session asks (node.migration.Planner) ------------------------------------

    def session_ended(self, mig: OutgoingMigration) -> None:
        """The split a session waited on is not needed any more."""
        if self._split is not None and self._split[1] is mig:
            self._cancel_split()

    def leave_busy(self, *, completed: bool) -> None:
        self.monitor.leave_busy(completed=completed)

    def tick(self, now: float, out: list[Action]) -> None:
        self._now = now
        if not self._ready():
            return
        if self._decide is not None:
            closed, by, _ = self._decide
            fresh = all(
                self._liem_at.get(p.node, 0.0) >= closed - self.monitor.slice_seconds / 2 for p in self.monitor.live()
            )
            if fresh or now >= by:
                self._end_decision(now, out)
        if self._start_at is not None and now >= self._start_at:
            self._start_at = None
            if self._may_schedule():
                self._start_balancing(now, out)
        if self.next_slice_at is None:
            self.next_slice_at = _slice_boundary(now, self.monitor.slice_seconds)
            self._loads.start(now)
            return
        if now < self.next_slice_at:
            return
        self.next_slice_at = _slice_boundary(now, self.monitor.slice_seconds)
        self._end_slice(now, out)

    def _end_slice(self, now: float, out: list[Action]) -> None:
        if self._decide is not None:  # a tick so late it skipped the grace: decide first
            self._end_decision(now, out)
        raw = {ch.id: ch.roll_slice().load for ch in self._ctx.local}
        elapsed, d_slice = self._loads.end_slice(raw, now, self.monitor.base_slice)
        d = self._loads.total()
        before = self.monitor.state
        report = self.monitor.end_slice(d, decide=False)
        self.last_report = report
        self._send_liem(report, out)
        self._decide = (now, now + DECIDE_GRACE * self.monitor.slice_seconds, before)
        self._ctx.journal.record(
            "slice",
            now,
            d=report.d,
            dc=report.dc,
            mean=report.mean,
            spread=report.spread,
            state=report.state.value,
            channels={str(c.id): c.last.load for c in self._ctx.local},
            slice_seconds=report.slice_seconds,
            elapsed=round(elapsed, 4),
            d_slice=d_slice,
        )
        if self._ctx.capture is not None:  # the sequencer's counters, so the replay can account for expiries (SPEC §10)
            seq = {k[4:]: v for k, v in self._ctx.stats.items() if k.startswith("seq_")}
            if seq:
                self._ctx.capture.journal(
                    {"kind": "sequencer", "node": self._ctx.id, "time": round(now, 4), "slice": report.slice_no, **seq}
                )

    def _send_liem(self, report: Any, out: list[Action]) -> None:
        liem = pm.LIEM(self._ctx.id, report.state.value, report.d, report.dc, self._ctx.me.capacity, report.slice_no)
        for p in self._ctx.peers:
            out.append(ToPeer(p, liem))

    def _end_decision(self, now: float, out: list[Action]) -> None:
        """Rule 1's state and rule 2's draw, with the peers' LIEMs of the slice."""
        assert self._decide is not None
        closed, _, before = self._decide
        self._decide = None
        provisional = self.monitor.state
        report = self.monitor.refresh()
        self.last_report = report
        if report.state is not provisional:  # peers hear the state we act on
            self._send_liem(report, out)
        if report.state is not before:
            self._ctx.journal.record("state", closed, old=before.value, new=report.state.value, mean=report.mean)
        if not self.balancing_enabled or self._draining():  # draining: no merges, no scheduling
            return
        self._splits.idle_merges(now, out, self.engaged())
        if report.schedule and self._may_schedule():
            self._start_at = now + self.rng.uniform(0, START_SPREAD * self.monitor.slice_seconds)

    def _may_schedule(self) -> bool:
        return (
            self.balancing_enabled
            and not self._draining()
            and self.monitor.state is NodeState.OVERLOADED
            and not self.monitor.busy
            and not any(m.active for m in self._migration.outgoing.values())
        )

    def on_liem(self, src: int, msg: pm.LIEM) -> None:
        self._liem_at[msg.broker_id] = self._now
        try:
            self.monitor.on_liem(msg.broker_id, msg.broker_status, msg.broker_d, msg.broker_dc, msg.capacity)
        except LocalProtocolError as exc:  # the peer sent a state we do not know
            raise RemoteProtocolError(str(exc)) from exc
        if self._ctx.capture is not None:
            self._ctx.capture.liem(
                msg.broker_id, msg.broker_status, msg.broker_d, msg.broker_dc, msg.capacity, msg.slice_no
            )

    def _start_balancing(self, now: float, out: list[Action]) -> None:
        mon = self.monitor
        cands = rank_receivers(
            self._ctx.id,
            mon.d,
            mon.dc,
            self._ctx.me.capacity,
            max(len(self._ctx.local), 1),
            mon.live(),
            self._ctx.config.bw,
            self.weights,
        )
        self._ctx.journal.record(
            "decision",
            now,
            phase="receivers",
            d=mon.d,
            dc=mon.dc,
            mean=mon.mean,
            candidates=[
                {
                    "node": c.node,
                    "rank1": c.rank1,
                    "f2": c.f2,
                    "f3": c.f3_bw,
                    "rank_o": c.rank_o,
                    "rank_u": c.rank_u,
                    "dc": c.dc,
                }
                for c in cands
            ],
        )
        if not cands or not len(self._ctx.local):
            return
        mon.enter_busy(as_sender=True)
        self._candidates = list(cands)
        self.request_next(now, out)

    def request_next(self, now: float, out: list[Action]) -> None:
        while self._candidates:
            cand = self._candidates.pop(0)
            if cand.node not in self._ctx.peers or cand.node in self._ctx.unreachable or self._damped(cand.node, now):
                continue
            out.append(self._migration.request(cand.node, cand, self.monitor.d, self.monitor.dc, now))
            return
        self.monitor.leave_busy(completed=False)
        self._ctx.journal.record("decision", now, phase="gave_up", reason="no candidate accepted")

    def accepts(self, msg: pm.RequestLoadBalance) -> tuple[bool, str]:
        """Rule 2, receiver side."""
        if self._draining():  # node.membership rule 1: nothing moves onto a draining node
            return False, f"node {self._ctx.id} is draining"
        if msg.forced:
            return True, ""
        if not self.balancing_enabled:
            return False, "balancing is off"
        if self.monitor.busy:
            return False, "busy"
        if self.monitor.state is not NodeState.UNDERLOADED:
            return False, f"{self.monitor.state.value.lower()}, not underloaded"
        self.monitor.enter_busy(as_sender=False)
        return True, ""

    def channel_loads(self, receiver: int | None = None, now: float = 0.0) -> list[ChannelLoad]:
        """The channels that may move (to ``receiver``: not back to a node they left, rule 7)."""
        moving = self.engaged()
        out = []
        for ch in self._ctx.local:
            if ch.id in moving or self._ctx.routing[ch.id].replicated:
                continue
            if receiver is not None and self._loads.returns_to(ch.id, receiver, now, self.monitor.base_slice):
                continue
            last = ch.last
            access = {n: cnt / last.events for n, cnt in last.access.items()} if last.events else {}
            load = self._loads.of(ch)  # a new split child: its share
            out.append(ChannelLoad(ch.id, round(load), len(ch), access, splittable=True))
        return out

    def plan(self, mig: OutgoingMigration, now: float, out: list[Action]) -> bool | None:
        """Rule 3: choose the channels to move.  True: ``mig.channels`` are
        chosen; False: nothing can go (``mig.reason`` says why); None: a split
        is being worked out, and the plan goes on when it is ready."""
        mon = self.monitor
        peer = next((p for p in mon.live() if p.node == mig.receiver), None)
        if peer is None or mon.mean is None:
            mig.reason = "receiver load unknown"
            return False
        n = len(mon.live()) + 1
        bw_ij = self._ctx.config.bw(self._ctx.id, mig.receiver)
        while mig.replans <= MAX_REPLANS:
            mig.replans += 1
            loads = self.channel_loads(mig.receiver, now)
            if not loads:
                mig.reason = f"no channel that may go to node {mig.receiver}"
                return False
            under = [p.node for p in mon.live() if p.state is NodeState.UNDERLOADED] or [mig.receiver]
            min_cost = min(c.subscriptions / self._ctx.config.bw(self._ctx.id, j) for c in loads for j in under)
            choice = choose_channels(
                loads,
                dc=mon.dc,
                capacity=self._ctx.me.capacity,
                receiver=mig.receiver,
                receiver_dc=peer.dc,
                receiver_capacity=peer.capacity,
                mean=mon.mean,
                n=n,
                bw_ij=bw_ij,
                min_mig_cost=min_cost,
                weights=self.weights,
            )
            self._ctx.journal.record(
                "decision",
                now,
                phase="channels",
                session=mig.session,
                receiver=mig.receiver,
                phi=choice.phi,
                channels=[
                    {
                        "id": str(s.ch_id),
                        "load": s.load,
                        "subscriptions": s.subscriptions,
                        "f1": s.f1,
                        "f3": s.f3,
                        "f4": s.f4,
                        "rank2": s.rank2,
                    }
                    for s in choice.scores
                ],
                transfer=[str(c) for c in choice.transfer],
                split=str(choice.split) if choice.split else None,
                split_load=choice.split_load,
            )
            if choice.split is None:
                if not choice.transfer:
                    mig.reason = "no channel lowers the spread"
                    return False
                mig.channels = choice.transfer
                return True
            ch = self._ctx.local[choice.split]
            # Cut off the same share of the last slice's records as of the load ranked.
            share = choice.split_load / max(1, next(s.load for s in choice.scores if s.ch_id == ch.id))
            job = SplitJob(
                ch,
                (self._ctx.local.new_id(), self._ctx.local.new_id()),
                self._ctx.schema,
                delta_ld=share * ch.last.load,
            )
            self._split = (job, mig, choice)
            self._indexing.want()
            return None
        mig.reason = "no good cut found"
        return False

    def background_step(self, limit: int, now: float) -> tuple[bool, list[Action]]:
        """One bounded piece of background work: a step of the split a session
        waits on (rule 3), else of indexing (``index_pending(limit)``).
        Whether work is left, and what to send."""
        out: list[Action] = []
        if self._split is None:
            if self._migration.busy():
                # A session in progress: events go an extra hop (Reforward)
                # just now and the peers are busy with it too; indexing waits
                # (pending subscriptions are matched exactly meanwhile) and the
                # next batch after the session wakes it again.
                self.background_last = "indexing deferred"
                return False, out
            self.background_last = "indexing"
            return self._indexing.step(limit, self._migration.leaving()) > 0, out
        job, mig, choice = self._split
        if not mig.active:  # the session ended meanwhile
            self._cancel_split()
        elif job.done:  # the commit is a step of its own
            self.background_last = f"split of {job.parent.id} committed"
            self._split = None
            self._split_ready(job, mig, choice, now, out)
        else:
            self.background_last = f"split of {job.parent.id}, step {job.steps + 1}"
            job.step()
        self._indexing.want()
        return True, out

    def splitting(self) -> ChannelId | None:
        """The channel a split is being worked out for (rule 3)."""
        return self._split[0].parent.id if self._split is not None else None

    def engaged(self) -> set[ChannelId]:
        """Channels leaving, arriving or being split: none may be chosen to
        move, merged or split meanwhile (rules 3, 5)."""
        out = {
            c for m in self._migration.outgoing.values() if m.active for c in m.channels
        } | self._migration.arriving()
        if self._split is not None:
            out.add(self._split[0].parent.id)
        return out

    def _cancel_split(self) -> None:
        """The session the split was for has ended: the parent stays as it was."""
        assert self._split is not None
        job = self._split[0]
        self.background_last = f"split of {job.parent.id} cancelled"
        job.cancel()
        self._split = None
        self._ctx.stats["splits_cancelled"] += 1

    def _split_ready(
        self, job: SplitJob, mig: OutgoingMigration, choice: ChannelChoice, now: float, out: list[Action]
    ) -> None:
        """Rule 3: the split a session waited on is worked out; commit it and
        go on with the plan."""
        parent = job.parent
        planned: bool | None
        if job.replicate:
            mig.channels = (parent.id,)
            mig.replicate = True
            self._ctx.journal.record(
                "replicate", now, channel=str(parent.id), receiver=mig.receiver, load=parent.last.load
            )
            planned = True
        else:
            children = self._splits.commit(job, now, out)
            mig.split_infos[parent.id] = tuple(c.id for c in children)
            # The cut-off part completes the prefix (SPEC §8.1 step 5): take it.
            # Re-ranking instead can put the parent's rest (f1 = 0 like the small
            # part, but heavier) first and cut it again, and again.
            total = choice.moved_load + self._loads.of(children[0])
            movable = {c.ch_id for c in self.channel_loads(mig.receiver, now)}
            if abs(total - choice.phi) <= SPLIT_ACCEPT * choice.phi and all(c in movable for c in choice.transfer):
                mig.channels = (*choice.transfer, children[0].id)
                planned = True
            else:
                planned = self.plan(mig, now, out)
        if planned is None:
            return
        if planned:
            self._migration.send_transfer(mig, out)
        else:
            mig.abort(mig.reason or "nothing to move")
            self._migration.abort(mig, mig.reason, out)


def _slice_boundary(now: float, length: float) -> float:
    """The next slice end on the clock's grid of multiples of ``length``, at
    least half a slice away: nodes with the same T close their slices together
    (to a tick), so their LIEMs describe the same stretch of traffic."""
    end = (math.floor(now / length) + 1) * length
    return end + length if end - now < length / 2 else end
