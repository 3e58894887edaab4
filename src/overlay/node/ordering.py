"""Ordered delivery in the cluster (SPEC §10): key homes, sequencing, completion.

The sequencer itself is the pure ``overlay.seq.Sequencer``; ``Ordering`` puts it
on the key's home node and wires it to routing, matching and acks.

Rules this module keeps:

1. **Home.** A key's home is the live node with the highest rendezvous hash
   ``blake2b(node, key)``.  *Live* is this node's view: every node of the
   config except the peers whose link the shell reported down
   (``peer_link``) — a link loss is seen at once (EOF), long before LIEMs go
   stale — plus nodes that joined the membership (``peers``).  Every access
   node computes the home itself; no directory.
2. **Access node.** A Publish with a ``key`` becomes an Event with
   ``dispatch_sign = EVENT_NEW`` sent to the home (or sequenced here when this
   node is the home).  A ``rank`` without a key is refused (``bad_rank``).
   The PubAck waits for the home's verdict (a ``NotificationAck`` with code
   ``sequenced``): a PubAck of a keyed event means the home's sequencer holds
   it; a refusal (``duplicate_rank``, ``bad_rank``, ``sequencer_full``) is an
   ``Error`` carrying the publish's ``seq``.  Until the verdict the access
   node keeps the event; if the home's link goes down it sends it to the new
   home, so a home crash loses no event that was not yet sequenced.
3. **Home.** ``Sequencer.arrive`` holds or releases; a released event is
   routed with the home's routing table as ``EVENT_DISPATCHED`` carrying
   ``key``/``rank``/``home``.  Releases are queued and drained iteratively,
   so a chain of completions never recurses.
4. **Completion.** The owner that matches a keyed event tracks it
   (``overlay.node.groups``): once every matched subscriber's client acked —
   or failed / timed out — or nothing matched, it sends ``NotificationAck``
   with code ``complete`` to the home, which calls ``Sequencer.complete`` and
   releases the next rank.  Acks arrive as messages like any other, so a slow
   subscriber holds back only the keys whose events it matched.
5. **Expiry.** ``Sequencer.expire(now)`` runs on every tick; its counters are
   mirrored into ``stats`` as ``seq_*`` (held, released, gaps_skipped,
   ranks_skipped, expired_dropped, processing_timeouts, rejected_* …).
6. **Migration and splits.** At most one event of a key is in flight and the
   next is released only after the previous one was delivered everywhere, so
   a key's order does not depend on which node owns its channel: a Reforward
   or a reroute delays an event, it cannot let the next one overtake it.
7. **Home change** (a node leaves or joins): keys whose home changes start a
   fresh context at the new home.  See the README ("Ordered delivery") for
   what a subscriber may see in that window.
8. **Batching.** The home's ``sequenced`` verdicts and the owner's
   ``complete`` notes, and the access nodes' acks of plain (non-group)
   subscribers of keyed events (code ``acked``, ``(event id, sub id)`` pairs),
   are collected per destination while the shell hands the core one batch of
   inbound messages, and sent as one ``NotificationAck`` (``event_id = ""``,
   the ids in ``sub_ids``) by ``end_batch()``: under load an ordered event
   costs about one peer message more than an unordered one, not four.
   Refusals, failures and group acks (they carry an LF) go at once.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Callable, Container, Sequence
from typing import Final

import msgspec

from overlay.actions import Action, ToClient, ToPeer
from overlay.channels.channel import ChannelId
from overlay.channels.schema import Value
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.seq import DuplicateRank, ExpiryPolicy, InvalidRank, Release, Sequencer, SequencerConfig, SequencerFull

__all__ = ["ACKED", "COMPLETE", "MAX_TIME", "SEQUENCED", "Ordering", "publish_time_of", "rendezvous_home"]

log = logging.getLogger("overlay.node")

# Publishes whose (session, seq) an access node remembers, to tell a publisher
# about an event returned later (undeliverable): far more than are in flight.
# Kept as two generations of this many (the newer fills, then replaces the
# older), so forgetting costs O(1) per publish: evicting one dict's oldest
# entry per publish made each ``next(iter(d))`` skip every slot deleted since
# the dict's last resize, some 20 µs a publish once the bound was reached.
RECENT_PUBLISHES: Final = 65_536

# Keys whose home an access node caches (cleared whenever the live set changes).
HOME_CACHE: Final = 100_000

# Seconds since the epoch past which a publisher's clock is absurd (the year 5138).
MAX_TIME: Final = 1e11

_EVENT_NEW: Final = pm.DispatchSign.EVENT_NEW
_EVENT_DISPATCHED: Final = pm.DispatchSign.EVENT_DISPATCHED
_replace: Final = msgspec.structs.replace

DispatchEvent = Callable[[pm.Event, list[Action]], None]
DeliveriesAcked = Callable[[Sequence[str], list[Action]], None]


# The codes of the batched notes (rule 8).
SEQUENCED: Final = pm.AckCode.SEQUENCED
ACKED: Final = pm.AckCode.ACKED
COMPLETE: Final = pm.AckCode.COMPLETE


def publish_time_of(msg: cm.Publish, now: float) -> float:
    """The publisher's clock, for latency figures only: one that is not a
    plausible time (NaN, inf, 0, negative) is replaced by ours."""
    t = msg.publish_time
    return t if 0 < t < MAX_TIME else now


def rendezvous_home(key: str, nodes: list[int]) -> int:
    """Rule 1: the node with the highest ``blake2b(node, key)``."""
    best, best_h = -1, -1
    data = key.encode()
    for n in nodes:
        h = int.from_bytes(hashlib.blake2b(data, digest_size=8, salt=n.to_bytes(8, "little")).digest(), "little")
        if h > best_h:
            best, best_h = n, h
    return best


class Ordering:
    """Rules 1–8 for one node: the key homes it computes, the sequencer of
    the keys it is home of, the keyed publishes it waits on as access node,
    and the batched notes of the current batch.

    ``dispatch_event`` routes a released event (``node.events``);
    ``deliveries_acked`` takes the plain subscribers' acks an owner gets
    (``node.groups``); ``sessions`` tells which client sessions are open.
    """

    def __init__(
        self,
        ctx: NodeContext,
        *,
        dispatch_event: DispatchEvent,
        deliveries_acked: DeliveriesAcked,
        sessions: Container[int],
        dead: Container[int] = frozenset(),
    ) -> None:
        self._ctx = ctx
        self._dead = dead  # runs a majority declared dead (node.liveness): never a home
        self._dispatch_event = dispatch_event
        self._deliveries_acked = deliveries_acked
        self._sessions = sessions
        s = ctx.config.sequencer
        self.sequencer = Sequencer(
            SequencerConfig(ExpiryPolicy(s.policy), s.hold_ttl, s.processing_ttl, s.key_ttl, s.max_keys, s.max_held)
        )
        self._down: set[int] = set()  # peers whose link is down (rule 1)
        self._released: dict[str, Release] = {}  # home: event id -> its release (key, rank), in flight
        self._seq_waiting: dict[str, tuple[int, int, pm.Event]] = {}  # access: event id -> (session, seq, event)
        self._recent_pubs: dict[str, tuple[int, int]] = {}  # access: event id -> (session, seq)
        self._recent_pubs_old: dict[str, tuple[int, int]] = {}  # the generation before
        self._home_cache: dict[str, int] = {}
        self._home_peers: list[int] = list(ctx.peers)
        # Rule 8: the notes of the current batch per code, then per destination
        # node (nested dicts: no key tuple to build per note); end_batch() sends them.
        self._notes: dict[pm.AckCode, dict[int, list[str]]] = {SEQUENCED: {}, ACKED: {}, COMPLETE: {}}
        self._noted = False
        self._rel_queue: deque[Release] = deque()
        self._releasing = False
        self._seq_timeouts_seen = 0

    # -- homes (rule 1) -------------------------------------------------------------------

    def live_nodes(self) -> list[int]:
        """This node and its peers (as membership changes them), minus links
        down and nodes declared dead (a dead run's link may come back up)."""
        dead = self._dead
        return sorted(n for n in {self._ctx.id, *self._ctx.peers} - self._down if n not in dead)

    def home_of(self, key: str) -> int:
        if self._home_peers != self._ctx.peers:  # a node joined or left the membership
            self._home_peers = list(self._ctx.peers)
            self._home_cache.clear()
        home = self._home_cache.get(key)
        if home is None:
            if len(self._home_cache) >= HOME_CACHE:
                self._home_cache.clear()
            home = self._home_cache[key] = rendezvous_home(key, self.live_nodes())
        return home

    def link_changed(self, node: int, up: bool, out: list[Action]) -> bool:
        """The shell reports a peer link's state; a home that went down hands its
        not-yet-sequenced keyed events to the new homes (rule 2).  True when
        the link just went down."""
        if node not in self._ctx.peers:
            return False
        if up:
            if node in self._down:
                self._down.discard(node)
                self._home_cache.clear()
                self._ctx.stats["peers_up"] += 1
            return False
        if node in self._down:
            return False
        # (A death declared while the link is up — a paused or cut-off node —
        # comes here too, from node.recovery: homes move at once.)
        self._down.add(node)
        self._home_cache.clear()
        self._ctx.stats["peers_down"] += 1
        for eid, (sid, seq, ev) in list(self._seq_waiting.items()):
            if ev.home == node:
                fwd = msgspec.structs.replace(ev, home=self.home_of(ev.key))
                self._seq_waiting[eid] = (sid, seq, fwd)
                self._ctx.stats["ordered_rehomed"] += 1
                self._to_home(fwd, out)
        return True

    # -- access node (rule 2) ---------------------------------------------------------------

    def remember_publish(self, event_id: str, sid: int, seq: int) -> None:
        recent = self._recent_pubs
        recent[event_id] = (sid, seq)
        if len(recent) >= RECENT_PUBLISHES:
            self._recent_pubs_old = recent
            self._recent_pubs = {}

    def recent_publish(self, event_id: str) -> tuple[int, int] | None:
        """``(session, seq)`` of one of the last ``RECENT_PUBLISHES`` (at least) publishes here."""
        pub = self._recent_pubs.get(event_id)
        return pub if pub is not None else self._recent_pubs_old.get(event_id)

    def publish_keyed(
        self,
        sid: int,
        msg: cm.Publish,
        values: dict[str, Value],
        now: float,
        out: list[Action],
        chid: ChannelId | None = None,
    ) -> None:
        if not msg.key or msg.rank > cm.MAX_RANK:
            self._ctx.stats["rejected_bad_rank"] += 1
            why = "given without a sequence key" if not msg.key else f"is above the largest rank {cm.MAX_RANK}"
            out.append(ToClient(sid, cm.Error(msg.seq, cm.ErrorCode.BAD_RANK, f"rank {msg.rank} {why}")))
            return
        event_id = self._ctx.next_event_id()
        stats = self._ctx.stats
        stats["events_in"] += 1
        stats["ordered_in"] += 1
        seq, key = msg.seq, msg.key
        self.remember_publish(event_id, sid, seq)
        if self._ctx.capture is not None:  # SPEC §13; the home assigns the rank when none is given
            self._ctx.capture.publish(event_id, chid, values, key, msg.rank or None)
        home = self._home_cache.get(key) if self._home_peers == self._ctx.peers else None
        if home is None:
            home = self.home_of(key)
        ev = pm.Event(
            event_id, values, self._ctx.id, _EVENT_NEW, chid, publish_time_of(msg, now), 0, key, msg.rank, home
        )
        self._seq_waiting[event_id] = (sid, seq, ev)
        if home == self._ctx.id:
            self.sequence(ev, out)
        else:
            out.append(ToPeer(home, ev))

    def _to_home(self, ev: pm.Event, out: list[Action]) -> None:
        if ev.home == self._ctx.id:
            self.sequence(ev, out)
        else:
            out.append(ToPeer(ev.home, ev))

    def on_verdict(self, msg: pm.NotificationAck, out: list[Action]) -> None:
        if not msg.failed:
            self._sequenced(msg.event_id, out)
            return
        waiting = self._seq_waiting.pop(msg.event_id, None)
        if waiting is not None and waiting[0] in self._sessions:
            out.append(ToClient(waiting[0], cm.Error(waiting[1], msg.code, msg.detail)))

    def _sequenced(self, event_id: str, out: list[Action]) -> None:
        """The home's sequencer holds the event: the publisher's PubAck."""
        waiting = self._seq_waiting.pop(event_id, None)
        if waiting is not None and waiting[0] in self._sessions:
            out.append(ToClient(waiting[0], cm.PubAck(waiting[1], event_id)))

    # -- home (rules 3–5) -------------------------------------------------------------------

    def sequence(self, ev: pm.Event, out: list[Action]) -> None:
        try:
            release = self.sequencer.arrive(ev.key, ev.rank or None, ev, self._ctx.now)
        except DuplicateRank as exc:
            self._refuse(ev, cm.ErrorCode.DUPLICATE_RANK, str(exc), out)
            return
        except InvalidRank as exc:
            self._refuse(ev, cm.ErrorCode.BAD_RANK, str(exc), out)
            return
        except SequencerFull as exc:
            self._refuse(ev, cm.ErrorCode.SEQUENCER_FULL, str(exc), out)
            return
        if ev.access_node == self._ctx.id:
            self._sequenced(ev.event_id, out)
        else:
            self.note(ev.access_node, SEQUENCED, ev.event_id)
        if release is not None:
            self._release(release, out)

    def _refuse(self, ev: pm.Event, code: str, text: str, out: list[Action]) -> None:
        """Rule 2: a refusal goes to the access node at once, not batched."""
        self._ctx.stats["ordered_rejected"] += 1
        verdict = pm.NotificationAck(ev.event_id, (), failed=True, code=code, detail=text)
        if ev.access_node == self._ctx.id:
            self.on_verdict(verdict, out)
        else:
            out.append(ToPeer(ev.access_node, verdict))

    # -- batching (rule 8) -------------------------------------------------------------------

    def note(self, node: int, code: pm.AckCode, item: str) -> None:
        self._noted = True
        to = self._notes[code]
        ids = to.get(node)
        if ids is None:
            to[node] = [item]
        else:
            ids.append(item)

    def note_acks(self, owner: int, event_id: str, sub_ids: tuple[str, ...]) -> None:
        """Plain subscribers' acks of a keyed event: ``(event id, sub id)`` pairs."""
        self._noted = True
        to = self._notes[ACKED]
        ids = to.get(owner)
        if ids is None:
            ids = to[owner] = []
        for g in sub_ids:
            ids.append(event_id)
            ids.append(g)

    def end_batch(self) -> list[Action]:
        """The shell calls this after each batch of messages it handed the core
        (and ``tick`` does too): one ``sequenced`` / ``complete`` note per
        destination for the whole batch, ``event_id = ""`` and the ids in ``sub_ids``."""
        if not self._noted:
            return []
        self._noted = False
        out: list[Action] = []
        for code, to in self._notes.items():
            if to:
                out.extend(ToPeer(node, pm.NotificationAck("", tuple(ids), code=code)) for node, ids in to.items())
                to.clear()
        return out

    def on_batched(self, msg: pm.NotificationAck, out: list[Action]) -> None:
        ids = msg.sub_ids
        if msg.code == ACKED:  # (event id, sub id) pairs: plain subscribers' acks (node.groups rule 3)
            self._deliveries_acked(ids, out)
        elif msg.code == COMPLETE:
            complete = self.on_complete_ack
            for eid in ids:
                complete(eid, out)
        else:  # sequenced: the publishers' PubAcks
            waiting, sessions = self._seq_waiting, self._sessions
            for eid in ids:
                w = waiting.pop(eid, None)
                if w is not None and w[0] in sessions:
                    out.append(ToClient(w[0], cm.PubAck(w[1], eid)))

    def _release(self, release: Release, out: list[Action]) -> None:
        """Rule 3: route a released event; those it releases in turn (a local
        completion releases the next rank) wait in a queue, so nothing recurses."""
        queue = self._rel_queue
        queue.append(release)
        if self._releasing:
            return
        self._releasing = True
        try:
            while queue:
                r = queue.popleft()
                ev: pm.Event = r.event
                # A channel id names one space for life: the access node's lookup
                # holds while the channel exists (a split or merge replaces the id).
                chid = ev.ch_id
                if chid is None or chid not in self._ctx.routing:
                    chid = self._ctx.routing.lookup_event(ev.event_exp)
                self._released[ev.event_id] = r  # not a (key, rank) tuple: one allocation fewer
                self._ctx.stats["ordered_released"] += 1
                if chid is None:  # checked at publish; the table changed meanwhile
                    self._ctx.stats["events_unroutable"] += 1
                    self.on_complete_ack(ev.event_id, out)
                    continue
                self._dispatch_event(
                    _replace(ev, ch_id=chid, dispatch_sign=_EVENT_DISPATCHED, rank=r.rank, home=self._ctx.id), out
                )
        finally:
            self._releasing = False

    def on_complete_ack(self, event_id: str, out: list[Action]) -> None:
        """Rule 4: the released event was delivered everywhere it matched."""
        r = self._released.pop(event_id, None)
        if r is None:
            self._ctx.stats["ordered_stale_completions"] += 1
            return
        self._ctx.stats["ordered_completed"] += 1
        nxt = self.sequencer.complete(r.key, r.rank, self._ctx.now)
        if nxt is not None:
            self._release(nxt, out)

    def tick(self, now: float, out: list[Action]) -> None:
        """Rule 5."""
        out.extend(self.end_batch())
        seq = self.sequencer
        if seq.next_deadline() is not None and seq.next_deadline() <= now:  # type: ignore[operator]
            for r in seq.expire(now):
                self._release(r, out)
        counters = seq.counters
        if counters:
            stats = self._ctx.stats
            for k, v in counters.items():
                stats["seq_" + k] = v
        if counters["processing_timeouts"] != self._seq_timeouts_seen:
            # The sequencer moved on without an ack: forget those in-flight records.
            self._seq_timeouts_seen = counters["processing_timeouts"]
            for eid, r in list(self._released.items()):
                ctx = seq.context(r.key)
                if ctx is None or ctx[0].value != "PROCESSING" or ctx[1] != r.rank:
                    del self._released[eid]
