"""What must hold after a simulated run (SPEC §8.2, §15).

Each check takes a finished ``SimCluster`` and returns the violations it found
as readable lines (empty: the invariant holds).  The expectations are
computed from what the *clients* did and saw, with the simulator's own
matcher (``SubSpec.matches``), not from the cores' bookkeeping.

1. Deliveries — for every published event and every subscription whose
   filter matches it:
   * never more than one notification (exactly-once's "at most");
   * every event matched by exactly one channel, once — or, for an event its
     access node sent again (``node.outbox`` rule 3), at least once and at
     most once per send;
   * exactly one when the event was published after the client got the SubAck
     and the subscription was never given up — or it was given up
     (Unsubscribe, closed session) only after the event was matched and its
     notification reached the subscriber's access node.  An event published
     before the Unsubscribe but matched, or notified to the access node, only
     after it may be dropped (the client no longer wants it; the access node
     forgets the subscription at once): counted as a race, not a failure;
   * events published while the subscribe was in flight (before the SubAck)
     may or may not match;
   * no notification for an event the filter does not match, for an unknown
     event or subscription, or after the client unsubscribed (checked as it
     happens, in ``SimCluster._to_client``).
2. Requests — every Publish, Subscribe, Unsubscribe and operator command of a
   session still open got its answer (a Subscribe superseded by an
   Unsubscribe before its SubAck is answered by the UnsubAck instead).
3. Subscriptions, once quiet — a subscription the client still holds is
   stored exactly in every channel its filter belongs to, on every owner of
   that channel, and nowhere else; one given up (UnsubAck, closed session,
   refused) is stored nowhere: no id is resurrected.
4. Tables, once quiet — every routingTable is equal; every channel of the
   table is in the localTable of exactly its owners (one node, or each of its
   replicas) with the same space, and no localTable holds a channel the table
   does not name; the spaces partition the event space (sampled points,
   including every interval boundary, lie in exactly one entry, the one
   ``lookup_event`` finds).
5. Quiet — no node BUSY, no migration session active on either side, no
   Reforward left armed, no table update or (un)subscription waiting, no
   operator command unanswered, nothing dropped as unroutable.
6. The promise (SPEC §16), instead of rule 1 when the run had node faults
   (``sim.faults``): for every PubAck'd event e and every subscription s
   whose SubAck the client received before e's first Publish was sent, that
   was still active when e was PubAcked (not unsubscribed, its session not
   closed or lost) and that matches e, e is delivered to s exactly once —
   unless s was never notified and its session was lost (its access node,
   the only one, crashed or sent it away: "other than the subscriber's only
   access node"), or its access node's run had begun to die when e was
   PubAcked (crashed, or paused or cut off and then declared dead: dead to
   the cluster while the client still held the session).  A keyed event's
   PubAck says its home and the home's backup hold it; it is owed to the
   subscriptions still active at its first match (its turn may come long
   after).  Every PubAck'd event was matched.  As in rule 1, never
   two notifications of one event to one subscription, none for an event it
   does not match, an unknown event or subscription; and, where keys are
   used, a subscription sees a key's events in rank order.  Rules 2–5 hold
   as they are, over the nodes that are up at the end (a node crashed for
   good is out of every table: every channel on exactly one live node, or
   its replicas), with rule 2 counting only the clients' current sessions.
7. Groups (SPEC §11, with node faults): a group's instances share its
   filter, and the group is one subscriber.  For every PubAck'd event e
   that the filter matches and every group one of whose instances was
   SubAck'd before e's first Publish and still active when e was PubAck'd,
   e reaches exactly one instance — unless every one of those instances
   left the group at some point (unsubscribed, closed, or lost its session
   with its only access node: the owner's fault surveillance chases
   instances that leave, and one that takes the event as its access node
   dies may leave a second instance to take it, SPEC §11), or e's publisher
   was told no instance could take it (``undeliverable``).
   Whenever it is, never to two instances that both kept their sessions.
   Instances are left out of rule 6's per-subscription check.
8. Notifies, as they are sent (``check_notifies``): one ``Notifies``
   action is one event's untagged Notify to each of its sessions, once —
   the Notify per session a shell without the shortcut would send
   (``Notifies.each``): a ``sub_ids`` per session, none empty or listing
   a subscription twice, the message listing the first's, no session
   twice, no tag (a tracked copy's tag is its session's own), and each
   session's frame, encoded once (``messages.codec`` rule 4), decodes to
   exactly that session's Notify.  Rule 1's checks then apply to each.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from overlay.actions import Notifies
from overlay.channels.schema import Value
from overlay.channels.space import RangeConstraint, SetConstraint
from overlay.config import ClusterConfig
from overlay.messages.client import ClientMessage
from overlay.messages.codec import NotifyFrames, client_reader
from overlay.node import NodeCore

from .records import EventRec, SimClient, SubRec
from .setup import SimParams


class SimCluster(Protocol):
    """What the checks read of a finished run (``cluster.SimCluster``);
    ``cores`` holds the nodes that are up, in id order."""

    config: ClusterConfig
    seed: int
    params: SimParams
    ids: list[int]
    cores: dict[int, NodeCore]
    arrivals: dict[tuple[str, str], int]
    matched: dict[str, list[int]]
    sent: Counter[str]
    events: dict[str, EventRec]
    event_names: dict[str, EventRec]
    notes: Counter[tuple[str, str, str]]
    subs: list[SubRec]
    clients: list[SimClient]
    admins: dict[int, SimClient]
    key_ranks: dict[tuple[str, str, str], list[int]]
    races: int
    exempt: int

    def unsettled(self) -> list[str]: ...


__all__ = [
    "check_all",
    "check_deliveries",
    "check_groups",
    "check_notifies",
    "check_ownership",
    "check_partition",
    "check_promise",
    "check_quiet",
    "check_requests_answered",
    "check_routing_equal",
    "check_subscriptions",
]


def check_all(sim: SimCluster) -> list[str]:
    out: list[str] = []
    out += check_promise(sim) if sim.params.node_faults else check_deliveries(sim)
    out += check_requests_answered(sim)
    out += check_quiet(sim)
    tables_ok = not (eq := check_routing_equal(sim))
    out += eq
    out += check_ownership(sim)
    out += check_partition(sim)
    if tables_ok:
        out += check_subscriptions(sim)
    return out


def _check_notes(sim: SimCluster) -> tuple[list[str], Counter[tuple[str, str, str]]]:
    """Rules 1 and 6: what each notification was (unknown, not matching, a
    second one); and the notifications per (event as recorded, client, subscription)."""
    out: list[str] = []
    by_key = {(r.client.name, r.local_id): r for r in sim.subs}
    counts: Counter[tuple[str, str, str]] = Counter()
    reported: set[tuple[str, str, str]] = set()  # membership only
    for (eid, cname, lid), n in sim.notes.items():
        ev = sim.events.get(eid) or sim.event_names.get(eid)
        if ev is not None:
            counts[(ev.event_id, cname, lid)] += n  # one event may be known by two ids (the client's, the node's)
    for eid, cname, lid in sim.notes:
        ev = sim.events.get(eid) or sim.event_names.get(eid)
        rec = by_key.get((cname, lid))
        if ev is None:
            out.append(f"{cname} notified of unknown event {eid} on {lid}")
            continue
        if rec is None:
            out.append(f"{cname} notified of {eid} on unknown subscription {lid}")
            continue
        if not rec.spec.matches(ev.values):
            out.append(f"{cname}/{lid} [{rec.spec.text()}] notified of non-matching event {eid} {ev.values}")
        total = counts[(ev.event_id, cname, lid)]
        if total > 1 and (ev.event_id, cname, lid) not in reported:
            reported.add((ev.event_id, cname, lid))
            out.append(f"{cname}/{lid} [{rec.spec.text()}] notified {total} times of event {eid} {ev.values}")
    return out, counts


def check_deliveries(sim: SimCluster) -> list[str]:
    """Rule 1."""
    out, _ = _check_notes(sim)
    races = 0
    for ev in sim.events.values():
        m = sim.matched.get(ev.event_id, [])
        if not m or len(m) > max(1, sim.sent[ev.event_id]):
            out.append(
                f"event {ev.event_id} {ev.values} (published at step {ev.pub_at}, sent "
                f"{sim.sent[ev.event_id]} times) matched {len(m)} times, at steps {m}"
            )
        for rec in sim.subs:
            if rec.gid is None or rec.failed or rec.acked_at is None or rec.acked_at >= ev.pub_at:
                continue  # never stored, or the event raced the subscribe: at most once (above)
            end = rec.ended_at
            if end is not None and ev.pub_at > end:
                continue  # published after the client gave it up: checked as it happened
            if not rec.spec.matches(ev.values):
                continue
            n = sim.notes.get((ev.event_id, rec.client.name, rec.local_id), 0)
            if end is not None:
                arrived = sim.arrivals.get((ev.event_id, rec.gid))
                matched_at = m[0] if m else None
                if (arrived is not None and arrived > end) or (arrived is None and (matched_at or 0) > end):
                    races += n == 0  # the unsubscribe overtook the notification, or the event
                    continue
            if n != 1:
                out.append(
                    f"event {ev.event_id} {ev.values} (published at step {ev.pub_at} on {ev.publisher}) delivered "
                    f"{n} times to {rec.client.name}/{rec.local_id} [{rec.spec.text()}] (gid {rec.gid}, acked at step "
                    f"{rec.acked_at}, ended at {end}, arrived at {sim.arrivals.get((ev.event_id, rec.gid))})"
                )
    sim.races += races
    return out


def check_promise(sim: SimCluster) -> list[str]:
    """Rule 6."""
    out, counts = _check_notes(sim)
    out += check_key_order(sim)
    exempt = 0
    for ev in sim.events.values():
        if ev.acked_at is None:
            continue  # never acknowledged: nothing promised (at most once, above)
        if not any(sim.matched.get(i) for i in ev.ids()):
            out.append(f"event {ev.event_id} {ev.values} was PubAck'd (step {ev.acked_at}) but never matched")
        for rec in sim.subs:
            if rec.group or rec.acked_at is None or rec.acked_at >= ev.pub_at:
                continue  # a group's instance (rule 7), or not acknowledged before the event's first Publish
            due = _due(sim, ev, rec)
            end = rec.ended_at
            if end is not None and end < due:
                continue  # no longer active when the event was acknowledged (a keyed one: matched)
            if not rec.spec.matches(ev.values):
                continue
            n = counts.get((ev.event_id, rec.client.name, rec.local_id), 0)
            if n == 0 and (rec.lost_at is not None or (rec.died_at is not None and rec.died_at <= due)):
                exempt += 1  # its only access node went before delivering it
                continue
            if n == 0:
                out.append(
                    f"event {ev.event_id} {ev.values} (published at step {ev.pub_at} by {ev.publisher}, "
                    f"{ev.sends} send(s), PubAck at step {ev.acked_at}) lost for {rec.client.name}/{rec.local_id} "
                    f"[{rec.spec.text()}] (gid {rec.gid} at node.run {_node_of(rec)}, SubAck at step {rec.acked_at}, "
                    f"ended at {end}; reached its access node at step {_arrival(sim, ev, rec)}"
                    + (f"; its access node's run dying from step {rec.died_at}" if rec.died_at is not None else "")
                    + ")"
                )
    sim.exempt += exempt
    return out + check_groups(sim, counts)


NEVER = 1 << 62


def _due(sim: SimCluster, ev: EventRec, rec: SubRec | None = None) -> int:
    """The step from which ``ev`` is owed to a subscription still active: its
    PubAck — for a keyed event, when its notification reached the
    subscription's access node (the PubAck says its home holds it; its turn
    comes when the ranks before it are delivered, and a subscription given
    up meanwhile is owed nothing: the client left); for a group (``rec``
    None), its first match."""
    assert ev.acked_at is not None
    if not ev.key:
        return ev.acked_at
    if rec is not None:
        arrived = _arrival(sim, ev, rec)
        return max(ev.acked_at, arrived) if arrived is not None else NEVER
    steps = [s for i in ev.ids() for s in sim.matched.get(i, ())]
    return max(ev.acked_at, min(steps)) if steps else NEVER


def check_groups(sim: SimCluster, counts: Counter[tuple[str, str, str]]) -> list[str]:
    """Rule 7."""
    out: list[str] = []
    groups: dict[str, list[SubRec]] = {}
    for rec in sim.subs:
        if rec.group:
            groups.setdefault(rec.group, []).append(rec)
    for ev in sim.events.values():
        for group, insts in sorted(groups.items()):
            if not insts[0].spec.matches(ev.values):
                continue
            got = [(r, counts.get((ev.event_id, r.client.name, r.local_id), 0)) for r in insts]
            got = [(r, n) for r, n in got if n]
            kept = [r for r, _ in got if r.lost_at is None and r.died_at is None]
            if len(kept) > 1:
                out.append(
                    f"event {ev.event_id} {ev.values} reached {len(kept)} instances of group {group}: "
                    + ", ".join(f"{r.client.name}/{r.local_id}" for r in kept)
                )
            if got or ev.acked_at is None or ev.returned:
                continue
            due = _due(sim, ev)
            active = [
                r
                for r in insts
                if r.acked_at is not None and r.acked_at < ev.pub_at and (r.ended_at is None or r.ended_at >= due)
            ]
            if any(r.ended_at is None and r.died_at is None for r in active):
                out.append(
                    f"event {ev.event_id} {ev.values} (published at step {ev.pub_at} by {ev.publisher}, PubAck at "
                    f"step {ev.acked_at}) lost for group {group}: no instance got it of "
                    + ", ".join(
                        f"{r.client.name}/{r.local_id} (SubAck {r.acked_at}, ended {r.ended_at})" for r in active
                    )
                )
    return out


def _node_of(rec: SubRec) -> str:
    """The access node (and its run) of ``rec``'s session, from its global id (``node.incarnation:…``)."""
    return (rec.gid or "?").split(":", 1)[0]


def _arrival(sim: SimCluster, ev: EventRec, rec: SubRec) -> int | None:
    """When ``ev``'s notification for ``rec`` reached its access node (None: never)."""
    steps = [sim.arrivals[(i, rec.gid)] for i in ev.ids() if rec.gid is not None and (i, rec.gid) in sim.arrivals]
    return min(steps) if steps else None


def check_key_order(sim: SimCluster) -> list[str]:
    """Rule 6: per subscription and key, ranks rise (``SimClients`` keeps each
    keyed notification's rank in ``key_ranks``)."""
    out: list[str] = []
    for (cname, lid, key), ranks in sorted(sim.key_ranks.items()):
        if any(b <= a for a, b in itertools.pairwise(ranks)):
            out.append(f"{cname}/{lid} saw key {key!r} out of rank order: {ranks[:20]}")
    return out


def check_requests_answered(sim: SimCluster) -> list[str]:
    """Rule 2 (with node faults: of the sessions the clients hold at the end)."""
    out: list[str] = []
    for c in [*sim.clients, *sim.admins.values()]:
        if c.closed_at is not None:
            continue
        if not c.connected:
            out.append(f"{c.name} is still reconnecting, carrying {len(c.carry)} requests")
            continue
        for seq, (kind, data) in sorted(c.pending.items()):
            if kind == "sub" and data.unsub_sent_at is not None:
                continue  # superseded by the unsubscribe
            what = data.spec.text() if kind in ("sub", "unsub") else data.event_id if kind == "event" else data
            out.append(f"{c.name}@{c.node}: {kind} seq {seq} ({what}) never answered")
        for kind, data in c.waiting.values():
            what = data.spec.text() if kind in ("sub", "unsub") else data.event_id if kind == "event" else data
            out.append(f"{c.name}@{c.node}: {kind} ({what}) still waits to be sent again")
    return out


def check_subscriptions(sim: SimCluster) -> list[str]:
    """Rule 3."""
    out: list[str] = []
    actual: dict[str, set[tuple[int, object]]] = {}
    for i, core in sim.cores.items():
        for ch in core.local:
            for sub in ch:
                actual.setdefault(sub.id, set()).add((i, ch.id))
    table = _first(sim).routing
    known = set()
    for rec in sim.subs:
        if rec.gid is None:
            continue
        known.add(rec.gid)
        have = actual.get(rec.gid, set())
        gone = (
            rec.failed or rec.unsub_sent_at is not None or rec.client.closed_at is not None or rec.lost_at is not None
        )
        if gone:
            if have:
                lost = f", session lost at {rec.lost_at}" if rec.lost_at is not None else ""
                out.append(
                    f"{rec.client.name}/{rec.local_id} ({rec.gid}) [{rec.spec.text()}] was given up "
                    f"(unsubscribe sent at {rec.unsub_sent_at}, acked at {rec.unsub_acked_at}, closed at "
                    f"{rec.client.closed_at}{lost}) but is still stored in {_places(have)}"
                )
            continue
        assert rec.filter is not None
        want = {(o, c) for c in table.lookup_subscription(rec.filter) for o in table[c].owners}
        if have != want:
            out.append(
                f"{rec.client.name}/{rec.local_id} ({rec.gid}) [{rec.spec.text()}] stored in {_places(have)}, "
                f"should be in {_places(want)}"
            )
    for gid in sorted(set(actual) - known):
        out.append(f"unknown subscription {gid} stored in {_places(actual[gid])}")
    return out


def _places(p: Iterable[tuple[int, object]]) -> str:
    return "{" + ", ".join(f"{c}@{n}" for n, c in sorted(p, key=lambda x: (x[0], str(x[1])))) + "}"


def _first(sim: SimCluster) -> NodeCore:
    """The lowest-numbered node that is up: its table is the reference."""
    return next(iter(sim.cores.values()))


def check_routing_equal(sim: SimCluster) -> list[str]:
    """Rule 4: one routing table."""
    out: list[str] = []
    ref_id = next(iter(sim.cores))
    ref = sim.cores[ref_id].routing
    for i, core in sim.cores.items():
        if core.routing == ref:
            continue
        mine, theirs = core.routing.entries(), ref.entries()
        diff = sorted(str(c) for c in set(mine) | set(theirs) if mine.get(c) != theirs.get(c))
        out.append(f"routing table of node {i} differs from node {ref_id} on channels {diff}")
    return out


def check_ownership(sim: SimCluster) -> list[str]:
    """Rule 4: each channel on exactly its owners."""
    out: list[str] = []
    for i, core in sim.cores.items():
        for chid, entry in core.routing.items():
            holders = sorted(j for j, c in sim.cores.items() if chid in c.local)
            if holders != sorted(entry.owners):
                down = [o for o in sorted(entry.owners) if o not in sim.cores]
                gone = f" (nodes {down} are down)" if down else ""
                out.append(f"node {i}'s table says {chid} is on {sorted(entry.owners)}{gone}; localTables: {holders}")
                continue
            for j in holders:
                if sim.cores[j].local[chid].space != entry.space:
                    out.append(f"channel {chid} on node {j} has another space than node {i}'s table says")
        for ch in core.local:
            if ch.id not in core.routing:
                out.append(f"node {i} holds channel {ch.id} that its routing table does not name")
    return out


def check_partition(sim: SimCluster, samples: int = 200) -> list[str]:
    """Rule 4: the spaces of the table partition the event space."""
    from .workload import PRICE_MAX, SYMS

    out: list[str] = []
    table = _first(sim).routing
    entries = list(table.items())
    schema = sim.config.schema
    for chid, e in entries:
        if e.space.is_empty(schema):
            out.append(f"channel {chid} has an empty space {e.space.text(schema)}")
    rng = random.Random(f"partition:{sim.seed}")
    prices = {0.0, PRICE_MAX}
    syms = set(SYMS) | {"Q", "ZZZZZZZZ"}
    for _, e in entries:
        for c in e.space.constraints:
            if isinstance(c, RangeConstraint):
                for v in (c.interval.lo, c.interval.hi):
                    prices.update(x for x in (v - 0.05, v, v + 0.05) if 0.0 <= x <= PRICE_MAX)
            elif isinstance(c, SetConstraint):
                syms.update(c.values)
    prices.update(rng.uniform(0, PRICE_MAX) for _ in range(samples // 4))
    points = [(p, s) for p in sorted(prices) for s in sorted(syms)]
    if len(points) > samples * 4:
        points = rng.sample(points, samples * 4)
    for price, sym in points:
        ev: dict[str, Value] = {"price": float(price), "sym": sym, "qty": 0}
        holders = [chid for chid, e in entries if e.space.contains(ev)]
        if len(holders) != 1:
            out.append(f"point {ev} lies in {len(holders)} channels: {[str(h) for h in holders]}")
        elif table.lookup_event(ev) != holders[0]:
            out.append(f"lookup_event({ev}) = {table.lookup_event(ev)}, but it lies in {holders[0]}")
        if len(out) > 20:
            break
    return out


def check_quiet(sim: SimCluster) -> list[str]:
    """Rule 5."""
    out = list(sim.unsettled())
    for i, core in sim.cores.items():
        if core.migration.reforwarding:
            out.append(f"node {i} still reforwards {sorted(str(c) for c in core.migration.reforwarding)}")
        if core.migration.operators_waiting():
            out.append(f"node {i} has operator commands waiting on sessions {core.migration.operators_waiting()}")
        for key in ("events_unroutable", "subscriptions_unroutable"):
            if core.stats.get(key):
                out.append(f"node {i}: {key} = {core.stats[key]}")
        if not core.ready:
            out.append(f"node {i} never became ready")
    return out


def check_notifies(act: Notifies, frames: NotifyFrames) -> list[str]:
    """Rule 8, for one action and the frames the shell makes of it."""
    msg, sessions, sub_ids = act.msg, act.sessions, act.sub_ids
    what = f"Notifies of {msg.event_id} to sessions {sessions}"
    if len(sessions) != len(sub_ids):
        return [f"{what} lists {len(sub_ids)} sub_ids"]
    out: list[str] = []
    if not sessions:
        out.append(f"{what}: no session")
    elif msg.sub_ids != sub_ids[0]:
        out.append(f"{what}: the message lists {msg.sub_ids}, its first session {sub_ids[0]}")
    if len(set(sessions)) != len(sessions):
        out.append(f"{what}: a session twice")
    if msg.tag:
        out.append(f"{what}: tagged {msg.tag} (one tag for several sessions)")
    decoded: dict[tuple[str, ...], list[ClientMessage]] = {}  # sessions with the same ids share a frame
    for one, ids in zip(act.each(), sub_ids, strict=True):
        sid = one.session
        if not ids or len(set(ids)) != len(ids):
            out.append(f"{what}: session {sid} gets sub_ids {ids}")
        got = decoded.get(ids)
        if got is None:
            got = decoded[ids] = client_reader().feed(frames.frame(ids))
        if got != [one.msg]:
            out.append(f"{what}: session {sid}'s frame decodes to {got!r}, not {one.msg!r}")
    return out
