"""Ordered delivery in the cluster (SPEC §10): key homes, sequencing, completion.

The sequencer itself is the pure ``overlay.seq.Sequencer``; ``Ordering`` puts it
on the key's home node and wires it to routing, matching and acks.

Rules this module keeps:

1. **Home.** A key's home is the member with the highest rendezvous hash
   ``blake2b(node, key)`` among those a majority has not declared dead
   (``node.liveness``), its backup the second (``node.keyhome``).  Every
   node computes both itself; no directory.  A peer whose link is only down
   stays home: links lose nothing while both runs live (``net.peer_link``
   rule 6), and a home that moved on a link's blink would leave two homes
   sequencing one key.
2. **Access node.** A Publish with a ``key`` becomes an Event with
   ``dispatch_sign = EVENT_NEW`` sent to the home (or sequenced here when
   this node is the home).  A ``rank`` without a key is refused
   (``bad_rank``).  Its id is the publisher's when the Publish names one
   (``client_id/event_id``, as ``node.clients`` checks it), so a publish
   sent again through another node is the same event; the same id
   published again while it waits here waits with it.  The PubAck waits for
   the home's verdict (a ``NotificationAck`` with code ``sequenced``): a
   PubAck of a keyed event means its home and the home's backup hold it
   (``node.keyhome`` rule 2); a refusal (``duplicate_rank``, ``bad_rank``,
   ``sequencer_full``) is an ``Error`` carrying the publish's ``seq``.
   Until the verdict the access node keeps the event (at most
   ``outbox_limit``, then ``Choke``) and sends it again to the key's
   current home every ``resend_after`` seconds (doubling), at once when its
   home dies or restarts, and gives up after ``event_ttl`` (an
   ``undeliverable`` Error, counted ``ordered_expired``).
3. **Home.** ``node.keyhome``: the sequencer of the keys this node is home
   of, the copies of the keys it backs, their syncs and handovers.
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
7. **Home change.**  A death, a new run, a join or a leave changes the
   members not dead (``view_changed``): keys move with their states
   (``node.keyhome`` rules 4–7), and the events waiting here for a verdict
   go to their keys' new homes.
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

import heapq
import itertools
import logging
from collections.abc import Callable, Container, Sequence
from typing import Any, Final

import msgspec

from overlay.actions import Action, ToClient, ToPeer
from overlay.channels.channel import ChannelId
from overlay.channels.schema import Value
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.homes import rendezvous_home, rendezvous_pair
from overlay.node.keyhome import KeyHome
from overlay.seq import Sequencer

__all__ = [
    "ACKED",
    "COMPLETE",
    "FULL_DELAY",
    "MAX_TIME",
    "SEQUENCED",
    "Ordering",
    "publish_time_of",
    "rendezvous_home",
    "rendezvous_pair",
]

log = logging.getLogger("overlay.node")

# Publishes whose (session, seq) an access node remembers, to tell a publisher
# about an event returned later (undeliverable): far more than are in flight.
# Kept as two generations (the newer fills, then replaces the older), so
# forgetting costs O(1) per publish: evicting one dict's oldest entry per
# publish made each ``next(iter(d))`` skip every slot deleted since the dict's
# last resize, some 20 µs a publish once the bound was reached.  A generation
# is replaced when it holds RECENT_PUBLISHES or is RECENT_PUBLISH_SECONDS old:
# by count alone, a node at a hundred publishes a second took half an hour to
# reach the bound, its memory growing by ~25 MB meanwhile (bench/soak.py).
# Two minutes at least: a group event comes back once every instance failed it
# in turn, each within 2·ack_timeout (4 s by default); one returned later is
# logged and counted (``returned_publisher_gone``).
RECENT_PUBLISHES: Final = 65_536
RECENT_PUBLISH_SECONDS: Final = 120.0

# Keys whose home an access node caches (cleared whenever the live set changes).
HOME_CACHE: Final = 100_000

# Seconds since the epoch past which a publisher's clock is absurd (the year 5138).
MAX_TIME: Final = 1e11

# Seconds a publisher refused for a full wait list waits before sending again
# (rule 2): about one verdict round trip under load, when room is likely.
FULL_DELAY: Final = 0.1

_EVENT_NEW: Final = pm.DispatchSign.EVENT_NEW
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


class _Waiting:
    """A keyed event at its access node until its home's verdict (rule 2)."""

    __slots__ = ("errors", "ev", "expires", "more", "resend_at", "seq", "sid", "tries")

    def __init__(self, ev: pm.Event, sid: int, seq: int, resend_at: float, expires: float) -> None:
        self.ev = ev
        self.sid = sid
        self.seq = seq
        self.more: list[tuple[int, int]] | None = None  # other (session, seq) of the same id
        self.resend_at = resend_at
        self.expires = expires
        self.tries = 0
        self.errors: list[tuple[str, str]] | None = None  # (code, text) told after the PubAck


class Ordering:
    """Rules 1, 2, 7, 8 for one node: the key homes it computes, the keyed
    publishes it waits on as access node, and the batched notes of the
    current batch; ``home`` is its side as a key's home (``node.keyhome``).

    ``dispatch_event`` routes a released event (``node.events``);
    ``deliveries_acked`` takes the plain subscribers' acks an owner gets
    (``node.groups``); ``sessions`` tells which client sessions are open;
    ``dead`` holds the runs a majority declared dead (``node.liveness``).
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
        self._dead = dead
        self._deliveries_acked = deliveries_acked
        self._sessions = sessions
        self.home = KeyHome(
            ctx,
            roles=self.roles,
            route=dispatch_event,
            verdict=self._verdict,
            refuse=self._refuse,
            note=self.note,
            dead=dead,
        )
        cl = ctx.config.cluster
        self.limit = cl.outbox_limit
        self.byte_limit = cl.outbox_bytes
        self.bytes = 0  # the payload bytes of the events in _waiting (node.outbox rule 1's bound)
        self.resend_after = cl.resend_after
        self.ttl = cl.event_ttl
        self._waiting: dict[str, _Waiting] = {}  # access: event id -> the keyed event waiting for its verdict
        self._resends: list[tuple[float, int, str]] = []  # (when, tie, event id), lazily superseded
        self._tie = itertools.count()
        self._recent_pubs: dict[str, tuple[int, int]] = {}  # access: event id -> (session, seq)
        self._recent_pubs_old: dict[str, tuple[int, int]] = {}  # the generation before
        self._roles: dict[str, tuple[int, int | None]] = {}
        self._view: tuple[int, ...] = tuple(self.live_nodes())
        self._view_peers: list[int] = list(ctx.peers)
        self._runs: dict[int, int] = {}  # peer -> the incarnation of its last hello
        self._recent_since = 0.0  # when the current generation started
        # Rule 8: the notes of the current batch per code, then per destination
        # node (nested dicts: no key tuple to build per note); end_batch() sends them.
        self._notes: dict[pm.AckCode, dict[int, list[str]]] = {SEQUENCED: {}, ACKED: {}, COMPLETE: {}}
        self._noted = False

    @property
    def sequencer(self) -> Sequencer:
        """The home's sequencer (``node.keyhome``)."""
        return self.home.sequencer

    def __len__(self) -> int:
        """Keyed events waiting here for their home's verdict."""
        return len(self._waiting)

    # -- homes (rules 1, 7) ---------------------------------------------------------------

    def live_nodes(self) -> list[int]:
        """This node and its peers (as membership changes them), minus the runs declared dead."""
        dead = self._dead
        return sorted(n for n in {self._ctx.id, *self._ctx.peers} if n not in dead)

    def roles(self, key: str) -> tuple[int, int | None]:
        """``key``'s home and backup in this node's view (rule 1)."""
        if self._view_peers != self._ctx.peers:  # a node joined or left the membership
            self._view_peers = list(self._ctx.peers)
            self._roles.clear()
        pair = self._roles.get(key)
        if pair is None:
            if len(self._roles) >= HOME_CACHE:
                self._roles.clear()
            pair = self._roles[key] = rendezvous_pair(key, self.live_nodes())
        return pair

    def home_of(self, key: str) -> int:
        return self.roles(key)[0]

    def link_changed(self, node: int, up: bool, out: list[Action]) -> bool:
        """The shell reports a peer link's state: counted, nothing moves (rule 1).
        (Always False: no delivery is failed for a link that only dropped.)"""
        if node in self._ctx.peers:
            self._ctx.stats["peers_up" if up else "peers_down"] += 1
        return False

    def view_changed(self, out: list[Action]) -> None:
        """Rule 7: the members not dead may have changed (a death, a join, a leave)."""
        view = tuple(self.live_nodes())
        if view == self._view and self._view_peers == self._ctx.peers:
            return
        self._view = view
        self._view_peers = list(self._ctx.peers)
        self._roles.clear()
        self.home.view_changed(view, out)
        self._rehome(out)

    def node_dead(self, node: int, out: list[Action]) -> None:
        """``node`` was declared dead: its keys move, what waited for it goes on."""
        self.view_changed(out)
        self.home.peer_gone(node, out)
        self._rehome(out, node)

    def peer_run(self, node: int, incarnation: int, out: list[Action]) -> None:
        """A run of ``node`` said hello (it may be back from the dead: homes
        move); a restarted home lost what was sent to its previous run."""
        self.view_changed(out)
        if self._runs.get(node, incarnation) != incarnation:  # a restart: its previous run's state is gone
            self.home.peer_gone(node, out)
            self._rehome(out, node)
        self._runs[node] = incarnation

    def _rehome(self, out: list[Action], node: int = -1) -> None:
        """Rule 7: a waiting event whose home changed, or was ``node``, goes to its home now."""
        for w in list(self._waiting.values()):
            home = self.home_of(w.ev.key)
            if home != w.ev.home or home == node:
                self._ctx.stats["ordered_rehomed"] += 1
                self._send(w, out)

    # -- access node (rule 2) ---------------------------------------------------------------

    def remember_publish(self, event_id: str, sid: int, seq: int, now: float) -> None:
        recent = self._recent_pubs
        recent[event_id] = (sid, seq)
        if len(recent) >= RECENT_PUBLISHES or now - self._recent_since >= RECENT_PUBLISH_SECONDS:
            self._recent_pubs_old = recent
            self._recent_pubs = {}
            self._recent_since = now

    def recent_publish(self, event_id: str) -> tuple[int, int] | None:
        """``(session, seq)`` of a publish here among the last ``RECENT_PUBLISHES``
        or within the last ``RECENT_PUBLISH_SECONDS``, whichever is fewer (at least)."""
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
        event_id: str = "",
    ) -> None:
        """Rule 2; ``event_id`` is the publisher's (checked), "" to name it here."""
        stats = self._ctx.stats
        if not msg.key or msg.rank > cm.MAX_RANK:
            stats["rejected_bad_rank"] += 1
            why = "given without a sequence key" if not msg.key else f"is above the largest rank {cm.MAX_RANK}"
            out.append(ToClient(sid, cm.Error(msg.seq, cm.ErrorCode.BAD_RANK, f"rank {msg.rank} {why}")))
            return
        if event_id:
            w = self._waiting.get(event_id)
            if w is not None:  # sent again while it waits: one event, two PubAcks
                stats["publishes_rejoined"] += 1
                if w.more is None:
                    w.more = []
                w.more.append((sid, msg.seq))
                return
        if (
            len(self._waiting) >= self.limit or self.bytes >= self.byte_limit
        ):  # backpressure: the client sends it again after the delay
            stats["choked_outbox_full"] += 1
            out.append(ToClient(sid, cm.Choke(msg.seq, FULL_DELAY)))
            return
        if not event_id:
            event_id = self._ctx.next_event_id()
        stats["events_in"] += 1
        stats["ordered_in"] += 1
        seq, key = msg.seq, msg.key
        self.remember_publish(event_id, sid, seq, now)
        if self._ctx.capture is not None:  # SPEC §13; the home assigns the rank when none is given
            self._ctx.capture.publish(event_id, chid, values, key, msg.rank or None, payload=msg.payload)
        home = self.home_of(key)
        ev = pm.Event(
            event_id,
            values,
            self._ctx.id,
            _EVENT_NEW,
            chid,
            publish_time_of(msg, now),
            0,
            key,
            msg.rank,
            home,
            payload=msg.payload,
        )
        w = _Waiting(ev, sid, seq, now + self.resend_after, now + self.ttl)
        self._waiting[event_id] = w
        self.bytes += len(msg.payload)
        heapq.heappush(self._resends, (w.resend_at, next(self._tie), event_id))
        self._send(w, out)

    def _send(self, w: _Waiting, out: list[Action]) -> None:
        """To the key's home as this node sees it now."""
        home = self.home_of(w.ev.key)
        if home != w.ev.home:
            w.ev = _replace(w.ev, home=home, hops=0)
        if home == self._ctx.id:
            self.home.sequence(w.ev, out)
        else:
            out.append(ToPeer(home, w.ev))

    def on_verdict(self, msg: pm.NotificationAck, out: list[Action]) -> None:
        if not msg.failed:
            self._sequenced(msg.event_id, out)
            return
        w = self._waiting.pop(msg.event_id, None)
        if w is not None:
            self.bytes -= len(w.ev.payload)
            for sid, seq in self._publishers(w):
                out.append(ToClient(sid, cm.Error(seq, msg.code, msg.detail)))

    def _publishers(self, w: _Waiting) -> list[tuple[int, int]]:
        sessions = self._sessions
        return [(sid, seq) for sid, seq in ((w.sid, w.seq), *(w.more or ())) if sid in sessions]

    def _sequenced(self, event_id: str, out: list[Action]) -> None:
        """The home and its backup hold the event: the publisher's PubAck, then
        any error about it that came first (rule 2)."""
        w = self._waiting.pop(event_id, None)
        if w is not None:
            self.bytes -= len(w.ev.payload)
            pubs = self._publishers(w)
            out.extend(ToClient(sid, cm.PubAck(seq, event_id)) for sid, seq in pubs)
            for code, text in w.errors or ():
                out.extend(ToClient(sid, cm.Error(seq, code, text)) for sid, seq in pubs)

    def defer_error(self, event_id: str, code: str, text: str) -> bool:
        """An error about a keyed event still waiting for its verdict (a group
        returned it: its home released it before the verdict came) goes to its
        publishers after its PubAck, as ``node.outbox`` rule 2 does it."""
        w = self._waiting.get(event_id)
        if w is None:
            return False
        if w.errors is None:
            w.errors = []
        w.errors.append((code, text))
        return True

    def _verdict(self, ev: pm.Event, out: list[Action]) -> None:
        """``node.keyhome``'s verdict on an arrival: to its access node (batched)."""
        if ev.access_node == self._ctx.id:
            self._sequenced(ev.event_id, out)
        else:
            self.note(ev.access_node, SEQUENCED, ev.event_id)

    def _refuse(self, ev: pm.Event, code: str, text: str, out: list[Action]) -> None:
        """Rule 2: a refusal goes to the access node at once, not batched."""
        self._ctx.stats["ordered_rejected"] += 1
        verdict = pm.NotificationAck(ev.event_id, (), failed=True, code=code, detail=text)
        if ev.access_node == self._ctx.id:
            self.on_verdict(verdict, out)
        else:
            out.append(ToPeer(ev.access_node, verdict))

    def _resend_due(self, now: float, out: list[Action]) -> None:
        """Rule 2: sent again, or given up."""
        heap = self._resends
        while heap and heap[0][0] <= now:
            when, _, eid = heapq.heappop(heap)
            w = self._waiting.get(eid)
            if w is None or w.resend_at != when:
                continue  # answered, or re-armed
            if now >= w.expires:
                del self._waiting[eid]
                self.bytes -= len(w.ev.payload)
                self._ctx.stats["ordered_expired"] += 1
                log.warning(
                    "node %d: keyed event %s not sequenced within %gs; undeliverable", self._ctx.id, eid, self.ttl
                )
                text = f"event {eid}: its key's home did not take it within {self.ttl:g}s"
                out.extend(
                    ToClient(sid, cm.Error(seq, cm.ErrorCode.UNDELIVERABLE, text)) for sid, seq in self._publishers(w)
                )
                continue
            w.tries += 1
            w.resend_at = min(now + self.resend_after * (1 << min(w.tries, 16)), w.expires)
            heapq.heappush(heap, (w.resend_at, next(self._tie), eid))
            self._ctx.stats["ordered_resent"] += 1
            self._send(w, out)

    # -- home (rules 3-5): node.keyhome ----------------------------------------------------------

    def sequence(self, ev: pm.Event, out: list[Action]) -> None:
        self.home.sequence(ev, out)

    def on_complete_ack(self, event_id: str, out: list[Action]) -> None:
        """Rule 4: the released event was delivered everywhere it matched."""
        self.home.on_complete(event_id, out)

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
        destination for the whole batch, ``event_id = ""`` and the ids in
        ``sub_ids``; and the home's syncs (``node.keyhome``)."""
        out = self.home.end_batch()
        if not self._noted:
            return out
        self._noted = False
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
            complete = self.home.on_complete
            for eid in ids:
                complete(eid, out)
        else:  # sequenced: the publishers' PubAcks
            sequenced = self._sequenced
            for eid in ids:
                sequenced(eid, out)

    def tick(self, now: float, out: list[Action]) -> None:
        """Rules 2, 5, 7."""
        self.view_changed(out)  # a join or a leave (deaths and new runs come as calls)
        if self._resends and self._resends[0][0] <= now:
            self._resend_due(now, out)
        self.home.tick(now, out)
        counters = self.home.sequencer.counters
        if counters:
            stats = self._ctx.stats
            for k, v in counters.items():
                stats["seq_" + k] = v
        out.extend(self.end_batch())

    def status(self) -> dict[str, Any]:
        return {"waiting": len(self._waiting), **self.home.status()}
