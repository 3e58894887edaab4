"""A key's home, and the copy of it its backup keeps: ordered delivery across any one death (SPEC §10, §16).

The sequencer is ``overlay.seq.Sequencer``; ``KeyHome`` runs it on the
home of each key, routes what it releases, and keeps every key's state on a
second node so that the death of the home — or of any other one node —
loses no acknowledged event, delivers none twice, and keeps each key's
order.

Rules this module keeps:

1. **Home and backup.**  A key's home is the first node of its rendezvous
   order over the members not declared dead (``node.ordering`` rule 1), its
   *backup* the second.  Every node computes both itself.
2. **The backup holds an arrival before anything leaves the home about
   it.**  An accepted arrival goes to the backup (``KeySync``, batched per
   ``end_batch``, answered ``KeySynced``) and its effects — the
   ``sequenced`` verdict that becomes the publisher's PubAck, and its
   release when it is the next rank — wait for that answer.  A later
   release of the same key (its predecessor completed, a gap skipped) waits
   behind whatever of the key still waits.  So a PubAck'd event is on two
   nodes, and an event released is on the backup with its rank: the backup
   that takes over re-assigns no rank a subscriber saw.
3. **Completions, skips, drops, forgotten keys** go to the backup in the
   same stream, not waited for: a backup that missed one releases again an
   event already complete — its subscribers' access nodes deliver nothing
   twice (``node.notify`` rule 5) and answer at once — or waits a skipped
   gap out again.
4. **A backup that changes** (a death, a node back, a join, a leave) gets
   the whole state of each key it now backs (``KeyCopy``; a long one in
   several messages), and what waited for the old backup waits for it.
5. **The home dies**: its backup is now first in the key's order.  It takes
   its copy (``Sequencer.adopt``: ranks continue from the last assigned,
   held events stay held) and releases the event of the sequence rank
   again — in flight or not, it was not complete — then copies the key to
   its own new backup (rule 4).
6. **A new run of a node** (a restart, a node back from the dead, a node
   that joins) asks every member at its start (``KeyAsk``), and sequences
   nothing until every member not dead answered: every node that holds a
   state or copy of a key whose home the new run now is sends it
   (``KeySync`` marked ``handover``, ``last`` on the final one, empty if it
   has none), and a home hands the key over for good.  Arrivals wait
   meanwhile (at most ``MAX_EARLY``, then dropped, counted: their access
   nodes send them again); the states it got are united
   (``KeyCopies.merge``) and taken as in rule 5.
7. **A key handed over** goes on where it now lives.  A home that lives on
   marks the state ``released`` when its event in flight is out: the new
   home keeps it in flight instead of releasing it again, and the old home
   passes its completion on when it comes (to a copy not taken yet, it
   advances the copy); should the old home die first, the new one sends it
   again with every event in flight (rule 9).  A state from a copy (its
   home died or restarted) is released again (rule 5).  An arrival for a
   key this node is not the home of is forwarded to the home it sees, at
   most ``MAX_HOPS`` times.  What waited here for its sync: verdicts wait
   for the new home's answer, a release not sent yet is the new home's.
8. **Ids.**  The home remembers for ``event_ttl`` the event ids it
   sequenced or holds copies of (``Recent``, bounded by ``dedup_max``): an
   event sent again under its id — its access node re-sent it, or its
   publisher did through another node — is answered ``sequenced`` again,
   once the key's state is synced, and not sequenced twice.
9. **In flight across an owner's death.**  When a node dies or restarts,
   the home dispatches every event it has in flight again to its channel's
   current owner (``redispatch``, after the recovery's table update): an
   owner that died with it loses nothing; one that still tracks it only
   learns the event's latest home (``node.groups`` rule 9).  So does an old
   home with the events whose completions it passes on (rule 7): their new
   home holds them in flight on its word and sends nothing — the owner
   they went to may be the dead old run of that very home (fault seed 785).

Not covered: two homes at once while nodes disagree about a death or a
join (the majority's heartbeats end it within a heartbeat or two); a key
whose home and backup die together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Final

import msgspec

from overlay.actions import Action, ToPeer
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.dedup import Recent
from overlay.node.inflight import InFlight
from overlay.node.keysync import Out, Syncs
from overlay.seq import (
    DuplicateRank,
    ExpiryPolicy,
    InvalidRank,
    KeyCopies,
    KeyState,
    Release,
    SeqStatus,
    Sequencer,
    SequencerConfig,
    SequencerFull,
)

__all__ = ["MAX_EARLY", "MAX_HOPS", "KeyHome"]

log = logging.getLogger("overlay.node")

# Arrivals a new run holds while it waits for the handovers (rule 6): past
# this, an arrival is dropped unanswered and its access node sends it again.
MAX_EARLY: Final = 20_000
# Forwards of one arrival between nodes whose views of the homes differ (rule 7).
MAX_HOPS: Final = 4

_EVENT_DISPATCHED: Final = pm.DispatchSign.EVENT_DISPATCHED
_PROCESSING: Final = SeqStatus.PROCESSING
_replace: Final = msgspec.structs.replace

Roles = Callable[[str], tuple[int, int | None]]  # key -> (home, backup)
Route = Callable[[pm.Event, list[Action]], None]
Verdict = Callable[[pm.Event, list[Action]], None]
Refuse = Callable[[pm.Event, str, str, list[Action]], None]
Note = Callable[[int, pm.AckCode, str], None]


class KeyHome:
    """Rules 1–9 on one node: the sequencer of the keys it is home of, the
    copies of the keys it backs, and the syncs in flight.

    ``roles`` gives a key's home and backup (``Ordering.roles``); ``route``
    dispatches a released event to its channel's owner; ``verdict`` tells an
    arrival's access node it is sequenced, ``refuse`` that it is not;
    ``note`` batches a completion passed on (rule 7); ``dead`` holds the
    runs declared dead."""

    def __init__(
        self,
        ctx: NodeContext,
        *,
        roles: Roles,
        route: Route,
        verdict: Verdict,
        refuse: Refuse,
        note: Note,
        dead: Container[int],
    ) -> None:
        self._ctx = ctx
        self._roles = roles
        self._verdict = verdict
        self._refuse = refuse
        self._note = note
        self._dead = dead
        s = ctx.config.sequencer
        self.sequencer = Sequencer(
            SequencerConfig(ExpiryPolicy(s.policy), s.hold_ttl, s.processing_ttl, s.key_ttl, s.max_keys, s.max_held)
        )
        self.copies = KeyCopies(s.max_keys, s.max_held)
        cl = ctx.config.cluster
        self.ids: Recent[tuple[str, int]] = Recent(cl.event_ttl, cl.dedup_max, ctx.stats, name="ordered_ids")
        self.in_flight = InFlight(ctx, route=route)
        self._syncs = Syncs(ctx.config.cluster.max_frame_size)
        self._synced_to: dict[str, int] = {}  # key -> the backup holding its state
        self._view: tuple[int, ...] = ()
        self.awaiting: set[int] | None = None  # rule 6: members whose last handover this new run waits for
        self._early: list[pm.Event] = []
        self._timeouts_seen = 0
        self._noted = False

    # -- arrivals (rules 2, 7, 8) ------------------------------------------------------------

    def sequence(self, ev: pm.Event, out: list[Action]) -> None:
        """An arrival (``EVENT_NEW``) for a key this node may be the home of."""
        ctx = self._ctx
        if self.awaiting is not None:  # rule 6
            if len(self._early) >= MAX_EARLY:
                ctx.stats["ordered_early_dropped"] += 1
            else:
                self._early.append(ev)
            return
        key = ev.key
        home = self._roles(key)[0]
        if home != ctx.id:  # rule 7
            if ev.hops >= MAX_HOPS:
                ctx.stats["ordered_unroutable"] += 1
                return
            ctx.stats["ordered_forwarded"] += 1
            out.append(ToPeer(home, _replace(ev, home=home, hops=ev.hops + 1)))
            return
        seen = self.ids.get(ev.event_id)
        if seen is not None and seen[0] == key:  # rule 8: sent again; answered, not sequenced twice
            ctx.stats["ordered_duplicates"] += 1
            self._stage(key, out, verdict=ev)
            return
        seq = self.sequencer
        try:
            release = seq.arrive(key, ev.rank or None, ev, ctx.now)
        except DuplicateRank as exc:
            self._refuse(ev, cm.ErrorCode.DUPLICATE_RANK, str(exc), out)
            return
        except InvalidRank as exc:
            self._refuse(ev, cm.ErrorCode.BAD_RANK, str(exc), out)
            return
        except SequencerFull as exc:
            self._refuse(ev, cm.ErrorCode.SEQUENCER_FULL, str(exc), out)
            return
        rank = seq.assigned
        self.ids.put(ev.event_id, (key, rank), ctx.now)
        ranked = ev if ev.rank == rank else _replace(ev, rank=rank)
        self._stage(key, out, op=pm.KeyOp(key, ranked), verdict=ev, release=release, hold=True)

    # -- what waits for the backup (rules 2, 4) ----------------------------------------------

    def _stage(
        self,
        key: str,
        out: list[Action],
        *,
        op: pm.KeyOp | None = None,
        verdict: pm.Event | None = None,
        release: Release | None = None,
        hold: bool = False,
    ) -> None:
        """Send ``op`` to the key's backup with this batch; let ``verdict`` and
        ``release`` out once the backup answered it when ``hold`` (an arrival),
        else once nothing of the key waits any more — at once if nothing does,
        or if the key has no backup."""
        backup = self._roles(key)[1]
        if backup is None:  # alone: nobody to keep a copy (SPEC §16 needs three nodes)
            self._emit((key, verdict, release), out)
            return
        link = self._syncs.link(backup)
        if op is not None:
            if self._synced_to.get(key) != backup:  # a backup new to the key: its whole state (rule 4)
                self._synced_to[key] = backup
                self._syncs.add_state(link, key, self.sequencer.state(key))
            else:
                link.ops.append(op)
            self._noted = True
        if verdict is None and release is None:
            return
        if not hold and not link.keys[key]:
            self._emit((key, verdict, release), out)
            return
        link.stage((key, verdict, release))
        self._noted = True

    def on_synced(self, src: int, msg: pm.KeySynced, out: list[Action]) -> None:
        """Rule 2: ``src`` holds every sync up to ``msg.no``: what waited goes out."""
        for item in self._syncs.answered(src, msg.no):
            self._emit(item, out)

    def _emit(self, item: Out, out: list[Action]) -> None:
        key, verdict, release = item
        if verdict is not None:
            self._verdict(verdict, out)
        if release is not None:
            c = self.sequencer.context(key)
            if c is not None and c[0] is _PROCESSING and c[1] == release.rank and self._roles(key)[0] == self._ctx.id:
                self.in_flight.release(release, out)
            else:  # handed over (rule 7) or timed out meanwhile: not this node's to send
                self._ctx.stats["ordered_releases_superseded"] += 1

    # -- a backup's side (rules 3, 6) -----------------------------------------------------------

    def on_sync(self, src: int, msg: pm.KeySync, out: list[Action]) -> None:
        """Ops of a home this node backs — or, ``handover``, states of keys it is
        (about to be) the home of: kept as copies, taken by ``_claim``."""
        ctx = self._ctx
        copies, now = self.copies, ctx.now
        for op in msg.ops:
            key = op.key
            if op.copy is not None:
                events = {e.rank: e for e in op.copy.events}
                st = KeyState(key, op.copy.seq, op.copy.last_assigned, events, op.copy.released)
                (copies.merge if msg.handover else copies.put)(st)
                for e in op.copy.events:
                    self.ids.put(e.event_id, (key, e.rank), now)
            if op.event is not None:
                copies.arrived(key, op.event.rank, op.event)
                self.ids.put(op.event.event_id, (key, op.event.rank), now)
            if op.seq:
                copies.advanced(key, op.seq)
            if op.forget:
                copies.forget(key)
        self._syncs.applied(src, msg.no)
        self._noted = True
        if msg.handover:
            ctx.stats["ordered_handovers_in"] += 1
            if msg.last and self.awaiting is not None:
                self.awaiting.discard(src)
                self._check_awaiting(out)
            elif self.awaiting is None:
                self._claim(out)

    # -- views, deaths and new runs (rules 4–7, 9) --------------------------------------------

    def booted(self, members: list[int]) -> list[Action]:
        """Rule 6: this run started in a running cluster (or may have): it asks
        every member for the states of its keys, and waits for them."""
        self.awaiting = set(members) - {self._ctx.id} or None
        return [ToPeer(n, pm.KeyAsk(self._ctx.incarnation)) for n in sorted(self.awaiting or ())]

    def _check_awaiting(self, out: list[Action]) -> None:
        awaiting = self.awaiting
        if awaiting is None:
            return
        awaiting -= {n for n in awaiting if n in self._dead}
        if awaiting:
            return
        self.awaiting = None
        log.info("node %d: every handover of the keys it is home of is in; sequencing", self._ctx.id)
        self._claim(out)
        early, self._early = self._early, []
        for ev in early:
            self.sequence(ev, out)

    def view_changed(self, view: tuple[int, ...], out: list[Action]) -> None:
        """The members not dead changed: homes and backups move (rules 4, 5, 7)."""
        if view == self._view:
            return
        self._view = view
        me = self._ctx.id
        handed: dict[int, list[str]] = {}
        for key in self.sequencer.key_list():
            home, backup = self._roles(key)
            if home != me:
                handed.setdefault(home, []).append(key)
            elif backup != self._synced_to.get(key):
                self._rebackup(key, backup, out)
        for node, keys in handed.items():
            self._hand_over(node, keys, out, last=False)
        for key in self.copies.key_list():
            home, backup = self._roles(key)
            if home != me and backup != me:
                self.copies.forget(key)  # another node backs it now
        self._check_awaiting(out)
        if self.awaiting is None:
            self._claim(out)

    def _rebackup(self, key: str, backup: int | None, out: list[Action]) -> None:
        """Rule 4: the key's whole state to its new backup; what waited, waits for it."""
        outs = self._syncs.take(key)
        self._copy_to_backup(key, again=True)
        for o in outs:
            if backup is None:
                self._emit(o, out)
            else:
                self._syncs.link(backup).stage(o)

    def _hand_over(self, node: int, keys: list[str], out: list[Action], *, last: bool) -> None:
        """Rules 6, 7: these keys' states to their new home ``node``, for good;
        verdicts waiting here wait for its answer, releases are its own now."""
        ctx = self._ctx
        link = self._syncs.link(node)
        if link.ops:  # what was sent before goes first
            self._syncs.flush(node, link, out)
        moved: list[Out] = []
        unsent: list[str] = []
        for key in keys:
            c = self.sequencer.context(key)
            taken = self._syncs.take(key)
            moved.extend(o for o in taken if o[1] is not None)
            # Its event in flight is out unless its release still waited here.
            out_now = c is not None and c[0] is _PROCESSING and not any(o[2] is not None for o in taken)
            if not out_now:
                unsent.append(key)
            st = self.sequencer.forget(key)
            self._synced_to.pop(key, None)
            if st is None:
                continue
            st = KeyState(key, st.seq, st.last_assigned, st.events, out_now)
            ctx.stats["ordered_keys_handed_over"] += 1
            self._syncs.add_state(link, key, st)
            if self._roles(key)[1] == ctx.id:
                self.copies.put(st)  # this node backs it now
        for key in [k for k in self.copies.key_list() if k not in keys and self._roles(k)[0] == node]:
            self._syncs.add_state(link, key, self.copies.state(key))  # a copy of a key the new run is home of
            if self._roles(key)[1] != ctx.id:
                self.copies.forget(key)
        self.in_flight.forget(unsent)  # the others' completions are passed on (rule 7) for a while
        self.in_flight.passing(keys, ctx.now + ctx.config.sequencer.processing_ttl)
        for o in moved:
            link.stage((o[0], o[1], None))
        self._syncs.flush(node, link, out, handover=True, last=last)

    def on_ask(self, src: int, out: list[Action]) -> None:
        """Rule 6: a new run of ``src`` asks for what this node holds of the keys
        it is home of: they go to it, with ``last``."""
        self._ctx.stats["ordered_asks_answered"] += 1
        keys = [k for k in self.sequencer.key_list() if self._roles(k)[0] == src]
        self._hand_over(src, keys, out, last=True)

    def peer_gone(self, node: int, out: list[Action]) -> None:
        """A death (after ``view_changed``), or a new run of ``node`` its peers
        did not declare dead first (a quick restart): nothing waits for that
        run any more, and what it held is gone.  What waited for its answer is
        staged again — behind the key's backup when this node is still the
        key's home, else dropped (the arrival's access node sends it again:
        rule 8 answers it) — and every key it backed gets its whole state
        again (rule 4)."""
        if self.awaiting is not None:
            self.awaiting.discard(node)
        for key in [k for k, b in self._synced_to.items() if b == node]:
            del self._synced_to[key]
        for key, verdict, release in self._syncs.drop(node):
            if key in self.sequencer:
                self._copy_to_backup(key)
                self._stage(key, out, verdict=verdict, release=release, hold=True)
            else:
                self._ctx.stats["ordered_verdicts_dropped"] += 1
        for key in self.sequencer.key_list():
            self._copy_to_backup(key)  # no-op unless it was synced to ``node``
        self._check_awaiting(out)

    def _copy_to_backup(self, key: str, *, again: bool = False) -> None:
        """Rule 4: the key's whole state (or that it is forgotten) to its backup,
        unless the backup holds it already and not ``again``."""
        backup = self._roles(key)[1]
        if backup is None:
            self._synced_to.pop(key, None)
        elif again or self._synced_to.get(key) != backup:
            st = self.sequencer.state(key)
            if st is None:
                self._synced_to.pop(key, None)
            else:
                self._synced_to[key] = backup
            self._syncs.add_state(self._syncs.link(backup), key, st)
            self._noted = True

    def _claim(self, out: list[Action]) -> None:
        """Rules 5, 6: take the copies of the keys this node is the home of now."""
        ctx = self._ctx
        for key in self.copies.key_list():
            if self._roles(key)[0] != ctx.id:
                continue
            st = self.copies.take(key)
            if st is None:
                continue
            ctx.stats["ordered_keys_taken_over"] += 1
            log.debug("node %d: key %r is home here now, at rank %d", ctx.id, key, st.seq)
            release = self.sequencer.adopt(st, ctx.now)
            if release is not None and st.released:  # out already: its completion is passed on (rule 7)
                self.in_flight.track(release)
                release = None
            self._copy_to_backup(key, again=True)
            backup = self._roles(key)[1]
            if release is not None:
                ctx.stats["ordered_released_again"] += 1
                self._stage(key, out, release=release, hold=backup is not None)

    def redispatch(self, out: list[Action]) -> None:
        """Rule 9: every event in flight again, to its channel's current owner."""
        self.in_flight.again(self.sequencer, out)

    def on_complete(self, event_id: str, out: list[Action]) -> None:
        """The released event was delivered everywhere it matched: the next rank."""
        ctx = self._ctx
        r = self.in_flight.pop(event_id)
        if r is None:
            seen = self.ids.get(event_id)
            if seen is not None and seen[0] in self.copies:  # passed on before the state was taken (rule 7)
                self.copies.advanced(seen[0], seen[1] + 1)
            ctx.stats["ordered_stale_completions"] += 1
            return
        if r.key not in self.sequencer:  # handed over since: passed on to its home (rule 7)
            home = self._roles(r.key)[0]
            if home != ctx.id:
                ctx.stats["ordered_completions_passed_on"] += 1
                self._note(home, pm.AckCode.COMPLETE, event_id)
            return
        ctx.stats["ordered_completed"] += 1
        nxt = self.sequencer.complete(r.key, r.rank, ctx.now)
        self._stage(r.key, out, op=pm.KeyOp(r.key, seq=r.rank + 1), release=nxt)

    def tick(self, now: float, out: list[Action]) -> None:
        """Expiry (``Sequencer.expire``): what it changed goes to the backups (rule 3)."""
        seq = self.sequencer
        deadline = seq.next_deadline()
        if deadline is not None and deadline <= now:
            releases = seq.expire(now)
            keys, seq.expired_keys = seq.expired_keys, []
            for key in dict.fromkeys(keys):  # what expiry changed: the whole key, small and rare
                self._copy_to_backup(key, again=True)
            for r in releases:
                self._stage(r.key, out, release=r)
        if seq.counters["processing_timeouts"] != self._timeouts_seen:  # moved on without an ack
            self._timeouts_seen = seq.counters["processing_timeouts"]
            self.in_flight.prune(seq)
        if self.awaiting is not None:
            self._check_awaiting(out)
        self.ids.expire(now)
        self.in_flight.expire(now)
        self.in_flight.retry(out)

    def end_batch(self) -> list[Action]:
        """The syncs of this batch, and the answers to those that came."""
        if not self._noted:
            return []
        self._noted = False
        out: list[Action] = []
        self._syncs.end_batch(out)
        return out

    def status(self) -> dict[str, int]:
        seq, copies, waiting = len(self.sequencer), len(self.copies), self._syncs.waiting()
        return {"keys": seq, "copies": copies, "in_flight": len(self.in_flight), "waiting_for_backups": waiting}
