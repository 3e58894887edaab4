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
from typing import TYPE_CHECKING, Any, Final

from overlay.actions import Action, ToPeer
from overlay.balance.merge import merge_pair, mergeable_pairs
from overlay.balance.migration import OutgoingMigration
from overlay.balance.monitor import Monitor, NodeState
from overlay.balance.scheduler import (
    ChannelChoice,
    ChannelLoad,
    Weights,
    choose_channels,
    rank_receivers,
)
from overlay.balance.split import Cut
from overlay.balance.split_job import SplitJob
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.messages import peer as pm

if TYPE_CHECKING:
    from overlay.node_core import NodeCore

__all__ = ["BalancingMixin"]

log = logging.getLogger("overlay.balance")

MAX_REPLANS: Final = 3
MERGE_THRESHOLD: Final = 0
MERGE_SLICES: Final = 5
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
# Rule 7: a channel stays away from a node it left for this many slices, and
# remembers this many of the nodes it left.
RETURN_SLICES: Final = 30
MAX_PAST_OWNERS: Final = 8


class BalancingMixin:
    """Mixed into ``NodeCore``; uses its tables and emits through its action lists."""

    def _init_balancing(self: NodeCore) -> None:
        cl = self.config.cluster
        seed = zlib.crc32(f"{cl.name}:{self.id}".encode())
        self.rng = random.Random(seed)
        self.monitor = Monitor(
            self.id,
            self.me.capacity,
            list(self.peers),
            delta=cl.delta,
            slice_seconds=cl.slice_seconds,
            probability=cl.probability,
            rng=self.rng,
            min_load=cl.min_load,
        )
        self.weights = Weights(cl.omega, cl.alpha, cl.beta, cl.gamma, cl.levels)
        self.balancing_enabled = cl.balancing
        self.next_slice_at: float | None = None
        # Loads are per configured T (SPEC §5): a slice ends on the first tick
        # past its end, and anti-jitter stretches T, so a raw slice sum would
        # grow with the slice's real length and make nodes incomparable.
        self._slice_started = 0.0
        self.load_scale = 1.0  # configured T / the last slice's real length
        self._channel_load: dict[ChannelId, float] = {}  # per configured T, two-slice mean (rule 1)
        self._slice_load: dict[ChannelId, float] = {}  # per configured T, last slice alone
        # Slices close on a common grid, so a peer's LIEM for the slice just
        # closed comes a few ms after ours: the state and the decision to
        # schedule wait for them (or DECIDE_GRACE of a slice), not to judge
        # by the previous slice's loads (rule 1).
        self._now = 0.0  # the last tick's clock: when a LIEM came, to a tick
        self._liem_at: dict[int, float] = {}
        self._decide: tuple[float, float, NodeState] | None = None  # (closed at, decide by, state before)
        self._start_at: float | None = None  # when a drawn session starts (rule 2)
        self._cold: dict[ChannelId, int] = {}
        self._candidates: list[Any] = []
        self.last_report: Any = None
        # Set when a split, merge or SubscriptionMove left subscriptions to index
        # (Channel rule 5); the shell then runs index_pending between batches.
        self.index_wanted = False
        # The split a session waits on (rule 3), with that session and its choice.
        self._split: tuple[SplitJob, OutgoingMigration, ChannelChoice] | None = None
        self.background_last = ""  # what the last background_step did (for the shell's slow log)
        # Rule 7: the nodes each local channel left lately, oldest first.
        self._past_owners: dict[ChannelId, tuple[pm.PastOwner, ...]] = {}

    def index_pending(self: NodeCore, limit: int) -> int:
        """Index up to ``limit`` pending (or drop stale) subscriptions over the
        local channels; how many are left.  The shell calls it in small steps
        between message batches, so no event waits behind a whole rebuild.

        Pending subscriptions go first, everywhere: each one indexed makes
        later events cheaper, while a stale one is rarely even a candidate.  A
        channel on its way out is left alone: its subscriptions are indexed by
        its receiver, and doing it here too took the sender's CPU in the very
        middle of the session (measured)."""
        leaving = set(self._reforward) | {c for m in self.outgoing.values() if m.active for c in m.channels}
        channels = [ch for ch in self.local if ch.unindexed]
        work = [ch for ch in channels if ch.id not in leaving]
        for ch in work:
            if limit > 0 and ch.pending:
                before = ch.pending
                ch.index_step(limit, drop_stale=False)
                limit -= before - ch.pending
        for ch in work:
            if limit > 0 and ch.stale and not ch.pending:
                before = ch.stale
                ch.index_step(limit)
                limit -= before - ch.stale
        left = sum(ch.unindexed for ch in channels)  # a leaving one's too: a rollback keeps it here
        if not left:
            self.index_wanted = False
        return left

    # -- slices (rule 1) --------------------------------------------------------------

    def _slice_tick(self: NodeCore, now: float, out: list[Action]) -> None:
        self._now = now
        if not self.ready:
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
            self._slice_started = now
            return
        if now < self.next_slice_at:
            return
        self.next_slice_at = _slice_boundary(now, self.monitor.slice_seconds)
        self._end_slice(now, out)

    def _end_slice(self: NodeCore, now: float, out: list[Action]) -> None:
        if self._decide is not None:  # a tick so late it skipped the grace: decide first
            self._end_decision(now, out)
        raw = {ch.id: ch.roll_slice().load for ch in self.local}
        for gone in [c for c in self._past_owners if c not in raw]:  # rule 7: only local channels
            del self._past_owners[gone]
        elapsed, self._slice_started = now - self._slice_started, now
        self.load_scale = self.monitor.base_slice / elapsed if elapsed > 0 else 1.0
        # A channel's load is the mean of its last two slices here (one for a
        # channel new here): which slice an event falls in depends on how far
        # the node is behind when the slice closes, and the two-slice window
        # cancels that ±10 % swing, which Δd would otherwise take for load.
        loads = {c: v * self.load_scale for c, v in raw.items()}
        # The mean of this slice and the last one (not of the last mean: that
        # decays geometrically, and an idle channel kept a load of 6e-61).
        # A channel without a last slice here (a split child) counts its share.
        last = self._slice_load
        self._channel_load = {c: (v + last.get(c, self._channel_load.get(c, v))) / 2 for c, v in loads.items()}
        self._slice_load = loads
        d = sum(self._channel_load.values())
        before = self.monitor.state
        report = self.monitor.end_slice(d, decide=False)
        self.last_report = report
        self._send_liem(report, out)
        self._decide = (now, now + DECIDE_GRACE * self.monitor.slice_seconds, before)
        self.record(
            "slice",
            now,
            d=report.d,
            dc=report.dc,
            mean=report.mean,
            spread=report.spread,
            state=report.state.value,
            channels={str(c.id): c.last.load for c in self.local},
            slice_seconds=report.slice_seconds,
            elapsed=round(elapsed, 4),
            d_slice=sum(loads.values()),
        )
        if self.capture is not None:  # the sequencer's counters, so the replay can account for expiries (SPEC §10)
            seq = {k[4:]: v for k, v in self.stats.items() if k.startswith("seq_")}
            if seq:
                self.capture.journal(
                    {"kind": "sequencer", "node": self.id, "time": round(now, 4), "slice": report.slice_no, **seq}
                )

    def _send_liem(self: NodeCore, report: Any, out: list[Action]) -> None:
        liem = pm.LIEM(self.id, report.state.value, report.d, report.dc, self.me.capacity, report.slice_no)
        for p in self.peers:
            out.append(ToPeer(p, liem))

    def _end_decision(self: NodeCore, now: float, out: list[Action]) -> None:
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
            self.record("state", closed, old=before.value, new=report.state.value, mean=report.mean)
        if not self.balancing_enabled or self.draining:  # draining: no merges, no scheduling
            return
        self._idle_merges(now, out)
        if report.schedule and self._may_schedule():
            self._start_at = now + self.rng.uniform(0, START_SPREAD * self.monitor.slice_seconds)

    def _may_schedule(self: NodeCore) -> bool:
        return (
            self.balancing_enabled
            and not self.draining
            and self.monitor.state is NodeState.OVERLOADED
            and not self.monitor.busy
            and not any(m.active for m in self.outgoing.values())
        )

    def _on_liem(self: NodeCore, src: int, msg: pm.LIEM) -> None:
        self._liem_at[msg.broker_id] = self._now
        try:
            self.monitor.on_liem(msg.broker_id, msg.broker_status, msg.broker_d, msg.broker_dc, msg.capacity)
        except LocalProtocolError as exc:  # the peer sent a state we do not know
            raise RemoteProtocolError(str(exc)) from exc
        if self.capture is not None:
            self.capture.liem(msg.broker_id, msg.broker_status, msg.broker_d, msg.broker_dc, msg.capacity, msg.slice_no)

    # -- scheduling (rules 2, 3) ----------------------------------------------------------

    def _start_balancing(self: NodeCore, now: float, out: list[Action]) -> None:
        mon = self.monitor
        cands = rank_receivers(
            self.id, mon.d, mon.dc, self.me.capacity, max(len(self.local), 1), mon.live(), self.config.bw, self.weights
        )
        self.record(
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
        if not cands or not len(self.local):
            return
        mon.enter_busy(as_sender=True)
        self._candidates = list(cands)
        self._request_next(now, out)

    def _request_next(self: NodeCore, now: float, out: list[Action]) -> None:
        while self._candidates:
            cand = self._candidates.pop(0)
            if cand.node not in self.peers or cand.node in self.unreachable:
                continue
            mig = OutgoingMigration(self.updates.next_session(), cand.node, (), started=now, timeout=self.timeout)
            mig.candidate = cand
            self.outgoing[mig.session] = mig
            req = pm.RequestLoadBalance(self.monitor.d, self.monitor.dc, mig.session)
            out.append(ToPeer(cand.node, req))
            return
        self.monitor.leave_busy(completed=False)
        self.record("decision", now, phase="gave_up", reason="no candidate accepted")

    def _accepts(self: NodeCore, msg: pm.RequestLoadBalance) -> tuple[bool, str]:
        """Rule 2, receiver side."""
        if self.draining:  # node_membership rule 1: nothing moves onto a draining node
            return False, f"node {self.id} is draining"
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

    def _channel_loads(self: NodeCore, receiver: int | None = None, now: float = 0.0) -> list[ChannelLoad]:
        """The channels that may move (to ``receiver``: not back to a node they left, rule 7)."""
        moving = self._engaged()
        out = []
        for ch in self.local:
            if ch.id in moving or self.routing[ch.id].replicated:
                continue
            if receiver is not None and self._returns_to(ch.id, receiver, now):
                continue
            last = ch.last
            access = {n: cnt / last.events for n, cnt in last.access.items()} if last.events else {}
            load = self._channel_load.get(ch.id, last.load * self.load_scale)  # a new split child: its share
            out.append(ChannelLoad(ch.id, round(load), len(ch), access, splittable=True))
        return out

    def _returns_to(self: NodeCore, chid: ChannelId, node: int, now: float) -> bool:
        """Rule 7: ``chid`` left ``node`` less than RETURN_SLICES slices ago."""
        horizon = now - RETURN_SLICES * self.monitor.base_slice
        return any(p.node == node and p.left > horizon for p in self._past_owners.get(chid, ()))

    def past_owners_leaving(self: NodeCore, chid: ChannelId, now: float) -> tuple[pm.PastOwner, ...]:
        """What travels with ``chid`` when it leaves this node now (rule 7)."""
        return (*self._past_owners.get(chid, ()), pm.PastOwner(self.id, now))[-MAX_PAST_OWNERS:]

    def _plan_transfer(self: NodeCore, mig: OutgoingMigration, now: float, out: list[Action]) -> bool | None:
        """Rule 3: choose the channels to move.  True: ``mig.channels`` are
        chosen; False: nothing can go (``mig.reason`` says why); None: a split
        is being worked out, and the plan goes on when it is ready."""
        mon = self.monitor
        peer = next((p for p in mon.live() if p.node == mig.receiver), None)
        if peer is None or mon.mean is None:
            mig.reason = "receiver load unknown"
            return False
        n = len(mon.live()) + 1
        bw_ij = self.config.bw(self.id, mig.receiver)
        while mig.replans <= MAX_REPLANS:
            mig.replans += 1
            loads = self._channel_loads(mig.receiver, now)
            if not loads:
                mig.reason = f"no channel that may go to node {mig.receiver}"
                return False
            under = [p.node for p in mon.live() if p.state is NodeState.UNDERLOADED] or [mig.receiver]
            min_cost = min(c.subscriptions / self.config.bw(self.id, j) for c in loads for j in under)
            choice = choose_channels(
                loads,
                dc=mon.dc,
                capacity=self.me.capacity,
                receiver=mig.receiver,
                receiver_dc=peer.dc,
                receiver_capacity=peer.capacity,
                mean=mon.mean,
                n=n,
                bw_ij=bw_ij,
                min_mig_cost=min_cost,
                weights=self.weights,
            )
            self.record(
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
            ch = self.local[choice.split]
            # Cut off the same share of the last slice's records as of the load ranked.
            share = choice.split_load / max(1, next(s.load for s in choice.scores if s.ch_id == ch.id))
            job = SplitJob(ch, (self.local.new_id(), self.local.new_id()), self.schema, delta_ld=share * ch.last.load)
            self._split = (job, mig, choice)
            self.index_wanted = True
            return None
        mig.reason = "no good cut found"
        return False

    def background_step(self: NodeCore, limit: int, now: float) -> tuple[bool, list[Action]]:
        """One bounded piece of background work: a step of the split a session
        waits on (rule 3), else of indexing (``index_pending(limit)``).
        Whether work is left, and what to send."""
        out: list[Action] = []
        if self._split is None:
            if self.incoming or any(m.active for m in self.outgoing.values()):
                # A session in progress: events go an extra hop (Reforward)
                # just now and the peers are busy with it too; indexing waits
                # (pending subscriptions are matched exactly meanwhile) and the
                # next batch after the session wakes it again.
                self.background_last = "indexing deferred"
                return False, out
            self.background_last = "indexing"
            return self.index_pending(limit) > 0, out
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
        self.index_wanted = True
        return True, out

    def _splitting(self: NodeCore) -> ChannelId | None:
        """The channel a split is being worked out for (rule 3)."""
        return self._split[0].parent.id if self._split is not None else None

    def _engaged(self: NodeCore) -> set[ChannelId]:
        """Channels leaving, arriving or being split: none may be chosen to
        move, merged or split meanwhile (rules 3, 5)."""
        out = {c for m in self.outgoing.values() if m.active for c in m.channels} | self._arriving()
        if self._split is not None:
            out.add(self._split[0].parent.id)
        return out

    def _cancel_split(self: NodeCore) -> None:
        """The session the split was for has ended: the parent stays as it was."""
        assert self._split is not None
        job = self._split[0]
        self.background_last = f"split of {job.parent.id} cancelled"
        job.cancel()
        self._split = None
        self.stats["splits_cancelled"] += 1

    def _split_ready(
        self: NodeCore, job: SplitJob, mig: OutgoingMigration, choice: ChannelChoice, now: float, out: list[Action]
    ) -> None:
        """Rule 3: the split a session waited on is worked out; commit it and
        go on with the plan."""
        parent = job.parent
        planned: bool | None
        if job.replicate:
            mig.channels = (parent.id,)
            mig.replicate = True
            self.record("replicate", now, channel=str(parent.id), receiver=mig.receiver, load=parent.last.load)
            planned = True
        else:
            children = self._commit_split(job, now, out)
            mig.split_infos[parent.id] = tuple(c.id for c in children)
            # The cut-off part completes the prefix (SPEC §8.1 step 5): take it.
            # Re-ranking instead can put the parent's rest (f1 = 0 like the small
            # part, but heavier) first and cut it again, and again.
            total = choice.moved_load + self._channel_load[children[0].id]
            movable = {c.ch_id for c in self._channel_loads(mig.receiver, now)}
            if abs(total - choice.phi) <= SPLIT_ACCEPT * choice.phi and all(c in movable for c in choice.transfer):
                mig.channels = choice.transfer + (children[0].id,)
                planned = True
            else:
                planned = self._plan_transfer(mig, now, out)
        if planned is None:
            return
        if planned:
            self._send_transfer(mig, out)
        else:
            mig.abort(mig.reason or "nothing to move")
            self._abort_outgoing(mig, mig.reason, out)

    # -- splits and merges (rules 3–5) ---------------------------------------------------------

    def _split_local(
        self: NodeCore, ch: Channel, cut: Cut, now: float, out: list[Action], admin: tuple[int, int] | None = None
    ) -> list[Channel]:
        """Split ``ch`` at ``cut`` at once (an operator's split: nobody waits on it)."""
        job = SplitJob(ch, (self.local.new_id(), self.local.new_id()), self.schema, cut=cut)
        job.run()
        return self._commit_split(job, now, out, admin)

    def _commit_split(
        self: NodeCore, job: SplitJob, now: float, out: list[Action], admin: tuple[int, int] | None = None
    ) -> list[Channel]:
        ch, cut = job.parent, job.cut
        assert cut is not None
        # The children get the parent's slices, divided by the cut, so the
        # scheduler can rank them before their own first slice ends.
        children = job.commit()
        # Their two-slice load: the parent's, in proportion to the last slice.
        whole = ch.last.load or 1
        parent_load = self._channel_load.pop(ch.id, ch.last.load * self.load_scale)
        for c in children:
            self._channel_load[c.id] = parent_load * c.last.load / whole
        self.local.remove(ch.id)
        self._past_owners.pop(ch.id, None)  # rule 7: a child is a channel of its own
        for c in children:
            self.local.add(c)
        self.index_wanted = True
        entries = [(c.id, RouteEntry(c.space, (self.id,))) for c in children]
        self.routing.apply([ch.id], entries)
        self.stats["splits"] += 1
        self.stats["split_steps"] += job.steps
        self.stats["split_changes_replayed"] += job.replayed
        kids = [{"id": str(c.id), "space": c.space.text(self.schema), "subscriptions": len(c)} for c in children]
        self.record(
            "split",
            now,
            parent=str(ch.id),
            attr=cut.attr,
            children=kids,
            low_load=cut.low_load,
            high_load=cut.high_load,
            steps=job.steps,
            replayed=job.replayed,
        )
        log.info("node %d: split %s on %s into %s", self.id, ch.id, cut.attr, ", ".join(str(c.id) for c in children))
        # What an operator who asked for it is told: the new ids and spaces.
        self.updates.broadcast(
            [ch.id],
            entries,
            out,
            admin=admin,
            result={"split": str(ch.id), "attr": cut.attr, "node": self.id, "children": kids},
        )
        return children

    def _idle_merges(self: NodeCore, now: float, out: list[Action]) -> None:
        moving = self._engaged()
        for ch in self.local:
            if ch.last.load <= MERGE_THRESHOLD:
                self._cold[ch.id] = self._cold.get(ch.id, 0) + 1
            else:
                self._cold.pop(ch.id, None)
        cold = [
            ch
            for ch in self.local
            if self._cold.get(ch.id, 0) >= MERGE_SLICES and ch.id not in moving and not self.routing[ch.id].replicated
        ]
        for a, b, space in mergeable_pairs(cold, self.schema)[:1]:
            self._merge_local(a, b, space, now, out)

    def _merge_local(self: NodeCore, a: Channel, b: Channel, space: Any, now: float, out: list[Action]) -> Channel:
        merged = merge_pair(a, b, self.local.new_id(), space, consume=True)
        self.local.remove(a.id)
        self.local.remove(b.id)
        self.local.add(merged)
        past = sorted({*self._past_owners.pop(a.id, ()), *self._past_owners.pop(b.id, ())}, key=lambda p: p.left)
        if past:
            self._past_owners[merged.id] = tuple(past[-MAX_PAST_OWNERS:])  # rule 7
        self.index_wanted = True
        self._cold.pop(a.id, None)
        self._cold.pop(b.id, None)
        entry = RouteEntry(merged.space, (self.id,))
        self.routing.apply([a.id, b.id], [(merged.id, entry)])
        self.stats["merges"] += 1
        self.record(
            "merge",
            now,
            parts=[str(a.id), str(b.id)],
            merged=str(merged.id),
            space=merged.space.text(self.schema),
            subscriptions=len(merged),
        )
        self.updates.broadcast([a.id, b.id], [(merged.id, entry)], out)
        return merged


def _slice_boundary(now: float, length: float) -> float:
    """The next slice end on the clock's grid of multiples of ``length``, at
    least half a slice away: nodes with the same T close their slices together
    (to a tick), so their LIEMs describe the same stretch of traffic."""
    end = (math.floor(now / length) + 1) * length
    return end + length if end - now < length / 2 else end
