"""Balancing judged in virtual time (SPEC §5–§8, §15): steady skewed traffic on
``n`` real ``NodeCore``s, S/dc̄ per slice, and what a converged run must show.

Theory of operation:

1. One process holds the cores of a cluster config and a virtual clock.  A
   time-ordered queue of happenings drives them, as the asyncio shell
   (``overlay.net.node``) would on an idle machine:
   * a peer message is handed over ``HOP`` plus a seeded jitter after it was
     sent, never before the one sent ahead of it on the same link (links are
     FIFO; both priority levels share that order, one legal schedule);
   * every node ticks each ``TICK_SECONDS``, each at its own seeded phase
     (the shells' tickers drift apart), so slices close on the common grid
     within a tick of each other, as on real nodes;
   * a background step (``background_step(INDEX_STEP)``) runs each
     ``INDEX_PAUSE`` while a core wants one, as the shell's indexer does;
   * one publisher per node publishes at ``rate / n`` events per second,
     evenly spaced (``workload.skewed_price``: a golden-ratio sequence, so a
     slice's load carries no sampling noise); clients talk to their access
     node directly.
   Handling costs no virtual time: the run shows what the protocol decides,
   not how fast a machine is.  Messages are handed over as objects (the
   seeded runs of ``sim.cluster`` put every one through the codec).
2. A run is a pure function of ``(config, seed, settings)``: the cores'
   random sources (the draw of p, the session start spread) are reseeded
   from the seed, jitter and phases come from ``random.Random(seed)``, and
   nothing reads the wall clock.  The same seed gives the same series.
3. Measured exactly as on real nodes: ``spread_series`` over the nodes'
   journal ``slice`` entries, natural migrations from the journals.  Every
   Notify is counted per (subscription, event) and compared with the
   expectation of ``Filter.matches`` over the subscriptions, all SubAck'ed
   before the first publish: each matching pair exactly once.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from overlay.actions import Action, CloseClient, Notifies, ToClient, ToPeer
from overlay.channels import parse_subscription
from overlay.channels.schema import Value
from overlay.config import ClusterConfig
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import NotifyFrames, client_reader
from overlay.net.node import INDEX_PAUSE, INDEX_STEP, TICK_SECONDS
from overlay.node import NodeCore
from overlay.testing._traffic import range_subscriptions, skewed_price

from .invariants import check_notifies
from .setup import quiet_logs

__all__ = [
    "SPREAD_TARGET",
    "ConvergenceRun",
    "ConvergenceSim",
    "converged_from",
    "oscillations",
    "ratio",
    "spread_series",
]

SPREAD_TARGET: Final = 0.10
HOP: Final = 0.0005  # s: loopback TCP plus a dispatch turn
JITTER: Final = 0.002  # s: the most a message is delayed on top of HOP
# Nodes close their slices on a common grid, each on its next tick, so a
# node's report of the same slice is at most a tick (plus lag) apart.
SLICE_SKEW: Final = 0.1
# Quiet for this long after publishing stops: late notifications are in.
DRAIN_SECONDS: Final = 3.0


# -- S/dc̄ (SPEC §5), from journals: shared with the real-node tests --------------------


def ratio(dcs: Sequence[float]) -> float:
    """``S / dc̄`` (SPEC §5); 0 when nothing is loaded."""
    n = len(dcs)
    mean = sum(dcs) / n
    if mean <= 0:
        return 0.0
    spread: float = (sum((d - mean) ** 2 for d in dcs) / n) ** 0.5
    return spread / mean


def spread_series(
    journals: Mapping[int, Sequence[Mapping[str, Any]]], ref: int, t0: float = 0.0
) -> list[tuple[float, float, list[float]]]:
    """``(time since t0, S/dc̄, dc per node)`` at the end of each slice of node
    ``ref``, with what every node reported last by then (``slice`` journal
    entries, in time order, per node).  A node whose T is stretched
    (anti-jitter) reports less often, so its last report may be up to one of
    its slices old; a slice some node has no report for yet is left out."""
    out = []
    for e in journals[ref]:
        dcs = []
        for entries in journals.values():
            prior = [x for x in entries if x["time"] <= e["time"] + SLICE_SKEW]
            if not prior or e["time"] - prior[-1]["time"] > prior[-1]["slice_seconds"] + SLICE_SKEW:
                break
            dcs.append(prior[-1]["dc"])
        else:
            out.append((e["time"] - t0, ratio(dcs), dcs))
    return out


def converged_from(ratios: Sequence[float], target: float = SPREAD_TARGET) -> int | None:
    """The first index from which every ratio is below ``target``; None if the
    last one is not."""
    at = None
    for k in range(len(ratios) - 1, -1, -1):
        if ratios[k] >= target:
            break
        at = k
    return at


def oscillations(migrations: Iterable[Mapping[str, Any]], after: float, nodes: int) -> list[str]:
    """Moves after ``after`` (convergence) may fine-tune, not ping-pong: no
    channel goes back to a node it left (a hand-on, A→B→C, is fine-tuning),
    and there are no more of them than nodes.  What breaks that, as lines."""
    late = sorted((m for m in migrations if m["time"] > after), key=lambda m: m["time"])
    out = []
    left: dict[str, set[int]] = {}
    for m in late:
        for c in m["channels"]:
            if m["receiver"] in left.get(c, ()):
                out.append(f"{c} moved back to node {m['receiver']} at {m['time']:.2f}")
            left.setdefault(c, set()).add(m["node"])
    if len(late) > nodes:
        out.append(f"{len(late)} migrations after convergence (at most {nodes})")
    return out


# -- the run ------------------------------------------------------------------------------


@dataclass
class ConvergenceRun:
    """What one run showed.  ``series`` holds whole slices of steady traffic
    only (from the first one that started after publishing began, to the
    last that ended before it stopped)."""

    seed: int
    series: list[tuple[float, float, list[float]]]
    migrations: list[dict[str, Any]]  # natural migrations and replications while publishing, in time order
    loads: list[float]  # d per node, last slice of traffic
    lost: list[str]  # (subscription, event) pairs not delivered exactly once
    pairs: int  # matching pairs checked
    stats: Counter[str] = field(default_factory=Counter)

    @property
    def ratios(self) -> list[float]:
        return [r for _, r, _ in self.series]

    @property
    def converged_at(self) -> int | None:
        return converged_from(self.ratios)

    def describe(self) -> str:
        rows = "\n".join(f"  {t:6.2f}s  S/dc̄ {r:5.3f}  dc {[round(x) for x in dcs]}" for t, r, dcs in self.series)
        moves = ", ".join(f"{m['time']:.2f}s {m['node']}->{m['receiver']} {m['channels']}" for m in self.migrations)
        return (
            f"seed {self.seed}: converged at slice {self.converged_at} of {len(self.series)}; "
            f"loads {[round(d) for d in self.loads]}; {dict(self.stats)}\n{rows}\n  migrations: {moves}"
        )


class ConvergenceSim:
    """Module rules 1–3.  ``run()`` plays the scenario once."""

    def __init__(
        self,
        config: ClusterConfig,
        seed: int,
        *,
        rate: float = 1000.0,
        live_subscriptions: int = 20,
        load_subscriptions: int = 240,
    ) -> None:
        self.config = config
        self.seed = seed
        self.rate = rate
        self.rng = random.Random(f"convergence:{seed}")
        self.ids = list(config.node_ids)
        self.cores: dict[int, NodeCore] = {}
        for i in self.ids:
            core = NodeCore(config, i)
            core.rng.seed(f"convergence:{seed}:{i}")
            self.cores[i] = core
        self.now = 0.0
        self._queue: list[tuple[float, int, str, int, Any]] = []
        self._order = itertools.count()
        self._link_ready: dict[tuple[int, int], float] = {}
        self._indexing: set[int] = set()
        # Sessions: one subscriber and one publisher per node.
        self.subscriber = {i: self.cores[i].client_opened() for i in self.ids}
        self.publisher = {i: self.cores[i].client_opened() for i in self.ids}
        self._seq = itertools.count(1)
        self._pending: set[int] = set()  # seqs of Subscribe and Publish not yet answered
        live = range_subscriptions(live_subscriptions, seed=7 + 1000 * seed)
        dead = range_subscriptions(load_subscriptions, seed=8 + 1000 * seed, venue="zz")
        schema = config.schema
        # (access node, local id) -> (expression, filter)
        self.subs = {
            (self.ids[k % len(self.ids)], f"s{k}"): (e, parse_subscription(e, schema))
            for k, e in enumerate(live + dead)
        }
        self.live = list(self.subs)[: len(live)]
        self.notified: Counter[tuple[int, str, int]] = Counter()  # (node, local id, qty)
        self.published: dict[int, dict[str, Any]] = {}  # qty -> values
        self.errors: list[str] = []
        self._reader = client_reader()  # the subscribers' (every frame whole: one reader serves them all)
        self._stop_publishing = 0.0  # set by run()

    # -- the queue (rule 1) ---------------------------------------------------------------

    def _at(self, when: float, kind: str, node: int, what: Any = None) -> None:
        heapq.heappush(self._queue, (when, next(self._order), kind, node, what))

    def _send(self, src: int, dst: int, msg: pm.PeerMessage) -> None:
        ready = max(self.now + HOP + self.rng.random() * JITTER, self._link_ready.get((src, dst), 0.0))
        self._link_ready[(src, dst)] = ready
        self._at(ready, "peer", dst, (src, msg))

    def _execute(self, node: int, acts: list[Action]) -> None:
        for act in acts:
            if type(act) is ToPeer:
                self._send(node, act.node, act.msg)
            elif type(act) is ToClient:
                self._to_client(node, act.session, act.msg)
            elif type(act) is Notifies:  # as the shell sends it: encoded once (messages.codec rule 4)
                frames = NotifyFrames(act.msg, self.config.cluster.max_frame_size)
                self.errors += (f"node {node}: {bad}" for bad in check_notifies(act, frames))
                for sid, ids in zip(act.sessions, act.sub_ids, strict=False):  # a mismatch is an error (above)
                    for msg in self._reader.feed(frames.frame(ids)):
                        self._to_client(node, sid, msg)
            elif type(act) is CloseClient:
                self.errors.append(f"node {node} closed client session {act.session}: {act.reason}")
        core = self.cores[node]
        if core.index_wanted and node not in self._indexing:
            self._indexing.add(node)
            self._at(self.now + INDEX_PAUSE, "background", node)

    def _to_client(self, node: int, sid: int, msg: cm.ClientMessage) -> None:
        match msg:
            case cm.Notify():
                qty = msg.event["qty"]
                for lid in msg.sub_ids:
                    self.notified[(node, lid, qty)] += 1  # type: ignore[index]
            case cm.SubAck() | cm.PubAck():
                self._pending.discard(msg.seq)
            case cm.Error():
                self.errors.append(f"node {node} session {sid}: {msg.code} {msg.message}")
                self._pending.discard(msg.seq)
            case _:
                pass

    def _step(self, until: float) -> bool:
        """Handle the next happening due by ``until``; False when there is none."""
        if not self._queue or self._queue[0][0] > until:
            return False
        when, _, kind, node, what = heapq.heappop(self._queue)
        self.now = when
        core = self.cores[node]
        if kind == "peer":
            src, msg = what
            self._execute(node, core.handle_peer(src, msg, when))
        elif kind == "tick":
            self._execute(node, core.tick(when))
            self._at(when + TICK_SECONDS, "tick", node)
        elif kind == "background":
            self._indexing.discard(node)
            more, acts = core.background_step(INDEX_STEP, when)
            if more:
                core.indexing.want()
            self._execute(node, acts)
        elif kind == "publish":
            self._publish(node, what)
        return True

    def _run_until(self, t: float) -> None:
        while self._step(t):
            pass
        self.now = t

    def _settle(self, what: str, limit: float = 30.0) -> None:
        deadline = self.now + limit
        while self._pending:
            if not self._step(deadline):
                raise AssertionError(
                    f"seed {self.seed}: {what}: {len(self._pending)} requests unanswered at t={self.now:.2f}"
                )

    # -- traffic --------------------------------------------------------------------------

    def _publish(self, node: int, k: int) -> None:
        n = len(self.ids)
        qty = k * n + self.ids.index(node)
        values: dict[str, Value] = {
            "price": skewed_price(k, offset=self.ids.index(node) / n),
            "sym": "A",
            "qty": qty,
            "venue": "x",
        }
        self.published[qty] = values
        seq = next(self._seq)
        self._pending.add(seq)
        self._execute(
            node,
            self.cores[node].handle_client(
                self.publisher[node], cm.Publish(seq, values, publish_time=self.now), self.now
            ),
        )
        if self.now < self._stop_publishing:
            self._at(self.now + n / self.rate, "publish", node, k + 1)

    # -- the scenario ---------------------------------------------------------------------

    def run(self, seconds: float) -> ConvergenceRun:
        """Start the cluster, subscribe, publish for ``seconds`` of virtual time,
        let it go quiet, and measure (rule 3)."""
        with quiet_logs():
            return self._run(seconds)

    def _run(self, seconds: float) -> ConvergenceRun:
        rng = self.rng
        for i in self.ids:
            self._execute(i, self.cores[i].start(0.0))
        for i in self.ids:
            for sid, name in ((self.subscriber[i], f"sub-{i}"), (self.publisher[i], f"pub-{i}")):
                self._execute(i, self.cores[i].handle_client(sid, cm.Hello(name), 0.0))
            self._at(rng.uniform(0, TICK_SECONDS), "tick", i)
        self._run_until(0.5)
        assert all(c.ready for c in self.cores.values()), f"seed {self.seed}: cluster not ready"
        for (i, lid), (expr, _) in self.subs.items():
            seq = next(self._seq)
            self._pending.add(seq)
            self._execute(i, self.cores[i].handle_client(self.subscriber[i], cm.Subscribe(seq, lid, expr), self.now))
        self._settle("subscribe")
        start = self.now + rng.uniform(0, 0.1)
        self._stop_publishing = start + seconds
        for j, i in enumerate(self.ids):
            self._at(start + j / self.rate, "publish", i, 0)
        self._run_until(self._stop_publishing)
        stop = self.now
        self._settle("publish", limit=30.0)
        self._run_until(self.now + DRAIN_SECONDS)

        journals = {i: [e for e in self.cores[i].journal if e["kind"] == "slice"] for i in self.ids}
        slice_seconds = self.config.cluster.slice_seconds
        series = [
            s for s in spread_series(journals, self.config.cluster.initializer) if start + slice_seconds < s[0] <= stop
        ]
        # Moves while traffic flowed: once it stops, the two-slice loads decay
        # unevenly for a slice or two and what follows is not balancing.
        moves = [
            e
            for c in self.cores.values()
            for e in c.journal
            if e["kind"] in ("migration", "replication") and not e["forced"] and e["time"] <= stop
        ]
        moves.sort(key=lambda e: e["time"])
        last_slice = {i: [e for e in journals[i] if e["time"] <= stop + SLICE_SKEW][-1]["d"] for i in self.ids}
        lost, pairs = self._check_deliveries()
        stats: Counter[str] = Counter()
        for c in self.cores.values():
            for k in ("migrations", "migrations_aborted", "replications", "splits", "merges", "reforwards"):
                stats[k] += c.stats.get(k, 0)
        return ConvergenceRun(
            self.seed, series, moves, [last_slice[i] for i in self.ids], self.errors + lost, pairs, stats
        )

    def _check_deliveries(self) -> tuple[list[str], int]:
        """Rule 3.  The load subscriptions (``venue prefix "zz"``) can match no
        event (every event has venue "x"): only their notifications are checked."""
        bad: list[str] = []
        for (node, lid, qty), n in sorted(self.notified.items()):
            sub, values = self.subs.get((node, lid)), self.published.get(qty)
            if sub is None or values is None:
                bad.append(f"notification of event {qty} to {lid}@{node} names no subscription or event")
            elif not sub[1].matches(values):
                bad.append(f"event {qty} {values} delivered {n}x to {lid}@{node} ({sub[0]}), which it does not match")
        pairs = 0
        for key in self.live:
            expr, f = self.subs[key]
            for qty, values in self.published.items():
                if f.matches(values):
                    pairs += 1
                    if (n := self.notified.get((*key, qty), 0)) != 1:
                        bad.append(f"event {qty} {values} delivered {n}x to {key[1]}@{key[0]} ({expr})")
        return bad, pairs
