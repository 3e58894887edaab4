"""The publisher's access node keeps what it accepted until it is confirmed (SPEC §16).

Nothing acknowledged is lost: an access node acknowledges an unkeyed event
(``PubAck``) only once the event is at every access node of a subscription
it matches, and until then keeps it, to send it again if an owner or a link
died with it.  (A keyed event waits for its home's verdict instead,
``node.ordering`` rule 2.)

Rules this module keeps:

1. **Keep.** Every accepted unkeyed event is kept — the ``pm.Event``, the
   publishers waiting for it (``(session, seq)``; more than one when the
   same publisher-chosen id is published again while it is kept: it is
   not dispatched again, ``attach``), when to send it again and when to
   give up — until it is *complete*.  At ``outbox_limit`` kept events a new
   publish is answered ``Choke`` (``node.clients``): backpressure, the
   client sends it again after the delay; counted ``choked_outbox_full``.
   Likewise at ``outbox_bytes`` of kept payloads (``bytes``): events with
   large payloads cannot make the kept ones exhaust memory.
2. **Complete.** The owner's match is reported (``EventsMatched``, naming
   the other access nodes its notifications went to; no match names none),
   and each node named confirmed that its notification arrived
   (``EventsDelivered``) — or is dead (``node_dead``: no kept event waits
   for it, nor does any reported later, until ``node_back``).  The owner
   reports it itself only when it notified no other node; otherwise it
   leaves the report to the nodes it notified (``Notification.confirm``),
   and a report from a node it names is that node's confirmation too — so
   an event with one subscribers' access node costs one receipt, and is
   complete on it.  A confirmation may come before the report: it is kept
   for it.  An event sent twice may be reported by two owners: the first
   report whose every node confirmed completes it.  Then each waiting publisher whose session
   is open gets its ``PubAck``, and an ``undeliverable`` error a group
   returned meanwhile (``defer_error``) after it: a PubAck means the event
   reached every matching subscription's access node.
3. **Re-send.** An event not complete ``resend_after`` seconds after it was
   sent is dispatched again to its channel's *current* owner (looked up in
   the routing table again, hops reset), counted ``events_resent``; the
   wait doubles after each re-send, within the event's life.
   ``resend_all`` re-sends every kept event at once (after a dead node's
   channels got new owners, ``node.recovery``).  A second match is
   harmless: subscribers' access nodes drop what they delivered already
   (``node.dedup``) and confirm it all the same.
4. **Give up.** An event still not complete ``event_ttl`` seconds after it
   was accepted leaves the outbox: each waiting publisher gets an
   ``undeliverable`` Error naming it (it may have reached some
   subscribers), counted ``events_expired`` and logged — never silent.
5. **Receipts** (``Receipts``, on every node): the ``EventsMatched``
   entries (an owner's, or a subscribers' access node's that reports for
   its owner) and the ``EventsDelivered`` ids are
   collected per destination and sent by ``end_batch`` in messages of a
   bounded size — after a batch of inbound messages that left the node
   idle, once the oldest has waited ``RECEIPT_DELAY`` or ``RECEIPTS_BATCH``
   are waiting, and on every tick: under load, one frame per destination
   carries many batches' receipts (each frame costs both ends more than the
   ids it carries), and an idle node answers at once.  Those for this
   node's own outbox are a call, not a message.
6. **A failed send leaves nothing.** Its Publish is answered ``internal_error``, the actions
   it added dropped (``node.clients``): no record, re-send or PubAck, its counts and (``unsent``)
   its dedup mark undone, so a retry under its id is new (docs/client.md).

Timing: first re-send deadlines come in the order events were accepted
(now + a fixed wait), so they sit in two parallel deques — no tuple per
event; only re-sent events, rare, go through a heap.

An event is kept from the start of its ``send``, but its record is made
only when something needs it: while ``send`` dispatches it, the event is
``_sending``, and an event that a local owner completes within that call
(nothing matched, or only this node's clients: the common event of a
one-node cluster) gets its PubAck without a record made and torn down.
Whatever else the dispatch tells the outbox about it — a match naming
other nodes, a confirmation, a deferred error — makes the record then,
and it is kept as any other (``_held``); so is one whose dispatch returns
before it completes (one whose dispatch fails is not: rule 6).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable, Container
from typing import Any, Final

import msgspec

from overlay.actions import Action, ToClient, ToPeer
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.observer import CoreObserver

__all__ = ["FULL_DELAY", "Outbox", "Receipts"]

log = logging.getLogger("overlay.node")

# Seconds a publisher refused for a full outbox waits before sending again
# (rule 1): about one confirmation round trip under load, when room is likely.
FULL_DELAY: Final = 0.1
# Bytes one receipt entry may take in a frame: the longest event id (a client
# id of 128 characters, "/", a publisher's id of 128) plus msgpack framing.
# Batches are cut so a message stays under half the frame limit.
ENTRY_BYTES: Final = 280
NODE_BYTES: Final = 3  # a node id in EventsMatched.nodes
# Receipts that go out even while more inbound messages wait (rule 5): a
# frame's worth, or the oldest this many seconds old — a busy node's PubAcks
# come at most that much later, for a frame per destination every 2 ms, not
# per batch of inbound messages.
RECEIPTS_BATCH: Final = 1024
RECEIPT_DELAY: Final = 0.002

_EVENT_DISPATCHED: Final = pm.DispatchSign.EVENT_DISPATCHED
_replace: Final = msgspec.structs.replace
# Per event, read from C statics when compiled (a global's lookup and its
# attribute's were dict lookups each time: issue 19).
_PubAck: Final = cm.PubAck
_ToClient: Final = ToClient

DispatchEvent = Callable[[pm.Event, list[Action]], None]


class _Kept:
    """One event in the outbox (rules 1–4)."""

    __slots__ = (
        "confirmed",
        "done",
        "errors",
        "ev",
        "expires",
        "more",
        "resend_at",
        "rounds",
        "seq",
        "sid",
        "tries",
        "waiting",
    )

    def __init__(self, ev: pm.Event, sid: int, seq: int, resend_at: float, expires: float) -> None:
        self.ev = ev
        self.sid = sid  # the first publisher waiting for it ...
        self.seq = seq
        self.more: list[tuple[int, int]] | None = None  # ... and any other (session, seq)
        self.resend_at = resend_at
        self.expires = expires
        self.tries = 0  # re-sends so far
        self.waiting: set[int] | None = None  # the first owner report: nodes still to confirm ...
        self.rounds: list[set[int]] | None = None  # ... and any later one's (the event was sent again)
        self.confirmed: set[int] | None = None  # nodes that confirmed (or died)
        self.errors: list[tuple[str, str]] | None = None  # (code, text) deferred until the PubAck
        self.done = False


class Outbox:
    """Rules 1–4 at the publisher's access node.

    ``dispatch`` routes an event to its channel's owner (``Router.dispatch_event``;
    ``observer`` hears of each send, ``node.observer``); ``sessions`` tells which client
    sessions are open.  Invariant: an event
    id is in ``_kept`` iff its entry is not ``done``, and every entry not
    done has a pending deadline (in the deques until its first re-send, in
    the heap after) — but while ``send`` dispatches: the event it sends is
    ``_sending`` until its record is made or it completed (module doc).
    """

    def __init__(self, ctx: NodeContext, *, dispatch: DispatchEvent, sessions: Container[int]) -> None:
        self._ctx = ctx
        self.dispatch = dispatch
        self.observer: CoreObserver | None = None  # node.observer rule 1
        self._sessions = sessions
        self.unsent: Callable[[str, float], None] | None = None  # rule 6: the dedup's unsee (node.core)
        cl = ctx.config.cluster
        self.limit = cl.outbox_limit
        self.byte_limit = cl.outbox_bytes
        self.bytes = 0  # rule 1: the payload bytes of the kept events
        self.resend_after = cl.resend_after
        self.ttl = cl.event_ttl
        self._kept: dict[str, _Kept] = {}
        self._dead: set[int] = set()  # nodes no event waits for (rule 2)
        self._first_at: deque[float] = deque()  # first re-send deadlines ...
        self._first: deque[_Kept] = deque()  # ... of these entries
        self._later: list[tuple[float, int, _Kept]] = []  # (deadline, tie, entry) after a re-send
        self._tie = itertools.count()
        # The event ``send`` is dispatching before any record of it is made,
        # and its publisher (module doc).
        self._sending: pm.Event | None = None
        self._sending_sid = 0
        self._sending_seq = 0
        self.resent = 0
        self.expired = 0
        self.completed = 0

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._kept

    @property
    def full(self) -> bool:
        """Rule 1: no room for one more event."""
        return len(self._kept) >= self.limit or self.bytes >= self.byte_limit

    def ids(self) -> list[str]:
        """The kept event ids, oldest first (status, tests)."""
        return list(self._kept)

    def waiting(self, event_id: str) -> list[tuple[int, int]]:
        """The publishers ``(session, seq)`` a kept event's PubAck is for ([] if not kept)."""
        k = self._kept.get(event_id)
        return [] if k is None else [(k.sid, k.seq), *(k.more or ())]

    def status(self) -> dict[str, Any]:
        return {
            "kept": len(self._kept),
            "limit": self.limit,
            "payload_bytes": self.bytes,
            "byte_limit": self.byte_limit,
            "completed": self.completed,
            "resent": self.resent,
            "expired": self.expired,
        }

    # -- rule 1 ------------------------------------------------------------------------------

    def send(self, ev: pm.Event, sid: int, seq: int, out: list[Action]) -> bool:
        """Keep ``ev`` for publisher ``(sid, seq)``, then dispatch it (kept first:
        a local owner may complete it before ``dispatch`` returns).  True when
        it did: the event is complete already, its PubAck in ``out``.  Its
        record is made only if it is not (module doc)."""
        obs = self.observer
        if obs is not None:
            obs.accepted(ev, sid)
            obs.dispatched(ev)
        self._sending, self._sending_sid, self._sending_seq = ev, sid, seq
        self.bytes += len(ev.payload)
        try:
            self.dispatch(ev, out)
        except Exception:  # rule 6: kept, it would be re-sent and PubAck'd after its internal_error
            self._unsent(ev)
            raise
        sending, self._sending = self._sending, None
        if sending is not None:  # nothing about it came back: kept as sent (a remote owner, mostly)
            k: _Kept | None = self._record(ev, sid, seq)
        else:  # its record made during the dispatch (_held), or complete
            k = self._kept.get(ev.event_id)
        if k is not None:
            self._first_at.append(k.resend_at)
            self._first.append(k)
        return k is None  # complete at once (a local owner, local subscribers): no deadline

    def _unsent(self, ev: pm.Event) -> None:
        stats, k = self._ctx.stats, self._kept.pop(ev.event_id, None)  # a record made during the dispatch
        if self._sending is None and k is None:  # it completed (_acked), its PubAck dropped with the rest
            self.completed -= 1
            stats["events_confirmed"] -= 1
        else:  # kept still (no deadline yet: nothing else refers to the record)
            self.bytes -= len(ev.payload)
        self._sending = None
        stats["events_in"] -= 1  # node.clients counted it in as it sent it
        if self.unsent is not None:
            self.unsent(ev.event_id, self._ctx.now)

    def _record(self, ev: pm.Event, sid: int, seq: int) -> _Kept:
        """The record of a kept event (rule 1)."""
        now = self._ctx.now
        k = self._kept[ev.event_id] = _Kept(ev, sid, seq, now + self.resend_after, now + self.ttl)
        return k

    def _held(self, event_id: str) -> _Kept | None:
        """The record of a kept event, made now if it is the one being sent (module doc)."""
        k = self._kept.get(event_id)
        if k is None:
            ev = self._sending
            if ev is not None and ev.event_id == event_id:
                self._sending = None
                k = self._record(ev, self._sending_sid, self._sending_seq)
        return k

    def attach(self, event_id: str, sid: int, seq: int) -> bool:
        """Rule 1: the same id published again while kept waits with the first."""
        k = self._held(event_id)
        if k is None:
            return False
        if k.more is None:
            k.more = [(sid, seq)]
        else:
            k.more.append((sid, seq))
        return True

    # -- rule 2 ------------------------------------------------------------------------------

    def on_matched(self, src: int, msg: pm.EventsMatched, out: list[Action]) -> None:
        if len(msg.event_ids) != len(msg.nodes):
            raise RemoteProtocolError(
                f"EventsMatched lists {len(msg.event_ids)} events but {len(msg.nodes)} node lists"
            )
        matched = self.matched
        for event_id, nodes in zip(msg.event_ids, msg.nodes):
            matched(event_id, nodes, out, src)

    def on_delivered(self, src: int, msg: pm.EventsDelivered, out: list[Action]) -> None:
        held, confirm = self._held, self._confirm
        for event_id in msg.event_ids:
            k = held(event_id)
            if k is None:
                self._ctx.stats["receipts_stale"] += 1
                continue
            w = k.waiting
            if w is not None and len(w) == 1 and src in w and k.rounds is None:  # the common case, inline
                self._complete(k, out)
                continue
            confirm(k, src, out)

    def matched(self, event_id: str, nodes: tuple[int, ...], out: list[Action], by: int = -1) -> None:
        """An owner matched the event; ``nodes`` are to confirm it.  ``by``: the
        node that reported it, which confirms it too when named (a report the
        owner left to the access nodes it notified, ``Notification.confirm``)."""
        sending = self._sending
        if sending is not None and not nodes and sending.event_id == event_id:
            # Complete within its own send: no record to make (module doc).
            self._sending = None
            self._acked(sending, self._sending_sid, self._sending_seq, None, None, out)
            return
        k = self._held(event_id)
        if k is None:
            self._ctx.stats["receipts_stale"] += 1  # complete, expired, or not ours
            return
        if not nodes:  # nothing matched, or only the owner's own clients
            self._complete(k, out)
            return
        if len(nodes) == 1 and nodes[0] == by and k.waiting is None:  # the common case: one access node
            self._complete(k, out)
            return
        missing = {nodes[0]} if len(nodes) == 1 else set(nodes)
        if k.confirmed is not None:
            missing -= k.confirmed
        if self._dead:
            missing -= self._dead
        if not missing:
            self._complete(k, out)
            return
        if k.waiting is None:
            k.waiting = missing
        elif k.rounds is None:
            k.rounds = [missing]
        else:
            k.rounds.append(missing)
        if by in missing:
            self._confirm(k, by, out)

    def delivered(self, event_id: str, node: int, out: list[Action]) -> None:
        """``node`` got the event's notification (``EventsDelivered``)."""
        k = self._held(event_id)
        if k is None:
            self._ctx.stats["receipts_stale"] += 1  # a group's re-dispatch, a re-sent copy ...
            return
        self._confirm(k, node, out)

    def _confirm(self, k: _Kept, node: int, out: list[Action]) -> None:
        w = k.waiting
        if w is not None:
            w.discard(node)
            if not w:
                self._complete(k, out)
                return
        rounds = k.rounds
        if rounds:
            for r in rounds:
                r.discard(node)
                if not r:
                    self._complete(k, out)
                    return
        # Not complete yet: kept for a report still to come (a set made only then).
        if k.confirmed is None:
            k.confirmed = {node}
        else:
            k.confirmed.add(node)

    def node_dead(self, node: int, out: list[Action]) -> None:
        """``node`` is dead: no kept event waits for it, nor one reported later."""
        self._dead.add(node)
        for k in list(self._kept.values()):
            if not k.done:
                self._confirm(k, node, out)

    def node_back(self, node: int) -> None:
        """A new run of ``node`` is up: its confirmations are waited for again."""
        self._dead.discard(node)

    def defer_error(self, event_id: str, code: str, text: str) -> bool:
        """Rule 2: an error about a kept event goes to its publishers after its PubAck."""
        k = self._held(event_id)
        if k is None:
            return False
        if k.errors is None:
            k.errors = [(code, text)]
        else:
            k.errors.append((code, text))
        return True

    def _complete(self, k: _Kept, out: list[Action]) -> None:
        del self._kept[k.ev.event_id]
        k.done = True
        self._acked(k.ev, k.sid, k.seq, k.more, k.errors, out)

    def _acked(
        self,
        ev: pm.Event,
        sid: int,
        seq: int,
        more: list[tuple[int, int]] | None,
        errors: list[tuple[str, str]] | None,
        out: list[Action],
    ) -> None:
        """Rule 2's end: PubAcks to the publishers still here, then the deferred errors."""
        event_id = ev.event_id
        self.bytes -= len(ev.payload)
        self.completed += 1
        self._ctx.stats["events_confirmed"] += 1
        sessions = self._sessions
        if sid in sessions:
            out.append(_ToClient(sid, _PubAck(seq, event_id)))
        if more is not None:
            out.extend(ToClient(s, cm.PubAck(q, event_id)) for s, q in more if s in sessions)
        if errors is not None:
            for code, text in errors:
                self._tell(sid, seq, more, code, text, out)

    def _tell(
        self, sid: int, seq: int, more: list[tuple[int, int]] | None, code: str, text: str, out: list[Action]
    ) -> None:
        for s, q in ((sid, seq), *(more or ())):
            if s in self._sessions:
                out.append(ToClient(s, cm.Error(q, code, text)))

    # -- rules 3 and 4 -----------------------------------------------------------------------

    def tick(self, now: float, out: list[Action]) -> None:
        """Re-send what is due, give up what is past its life."""
        at, first = self._first_at, self._first
        while at and at[0] <= now:
            at.popleft()
            k = first.popleft()
            if not k.done and not k.tries:  # else complete, or re-sent meanwhile (in the heap)
                self._due(k, now, out)
        later = self._later
        while later and later[0][0] <= now:
            when, _, k = heapq.heappop(later)
            if not k.done and k.resend_at == when:  # else complete, or its deadline moved
                self._due(k, now, out)

    def resend_all(self, now: float, out: list[Action]) -> None:
        """Rule 3: every kept event to its channel's current owner, now."""
        for k in list(self._kept.values()):
            if not k.done:
                self._resend(k, now, out)

    def _due(self, k: _Kept, now: float, out: list[Action]) -> None:
        if now >= k.expires:
            self._expire(k, out)
        else:
            self._resend(k, now, out)

    def _resend(self, k: _Kept, now: float, out: list[Action]) -> None:
        k.tries += 1
        self.resent += 1
        self._ctx.stats["events_resent"] += 1
        k.resend_at = min(now + self.resend_after * (1 << min(k.tries, 16)), k.expires)
        heapq.heappush(self._later, (k.resend_at, next(self._tie), k))
        ev = k.ev
        chid = self._ctx.routing.lookup_event(ev.event_exp)
        if chid is None:  # no channel holds it now (a table in flux): tried again later
            self._ctx.stats["events_resent_unroutable"] += 1
            return
        if self.observer is not None:
            self.observer.dispatched(ev)
        self.dispatch(_replace(ev, ch_id=chid, dispatch_sign=_EVENT_DISPATCHED, hops=0), out)

    def _expire(self, k: _Kept, out: list[Action]) -> None:
        event_id = k.ev.event_id
        del self._kept[event_id]
        self.bytes -= len(k.ev.payload)
        k.done = True
        self.expired += 1
        self._ctx.stats["events_expired"] += 1
        waiting = sorted({n for r in (k.waiting or (), *(k.rounds or ())) for n in r})
        log.warning(
            "node %d: event %s not confirmed within %gs (%d re-sends; %s); its publisher is told it is undeliverable",
            self._ctx.id,
            event_id,
            self.ttl,
            k.tries,
            f"waiting for nodes {waiting}" if waiting else "never reported matched",
        )
        self._tell(
            k.sid,
            k.seq,
            k.more,
            cm.ErrorCode.UNDELIVERABLE,
            f"event {event_id}: not confirmed within {self.ttl:g}s; it may have reached some subscribers",
            out,
        )
        for code, text in k.errors or ():
            self._tell(k.sid, k.seq, k.more, code, text, out)


class Receipts:
    """Rule 5: the ``EventsMatched`` and ``EventsDelivered`` of the current
    batch, per destination; ``outbox`` is this node's own."""

    def __init__(self, ctx: NodeContext, outbox: Outbox) -> None:
        self._ctx = ctx
        self._outbox = outbox
        self._matched: dict[int, tuple[list[str], list[tuple[int, ...]]]] = {}
        self._delivered: dict[int, list[str]] = {}
        self._noted = 0  # receipts waiting
        self._since = 0.0  # when the oldest of them was noted

    @property
    def pending(self) -> bool:
        """Receipts wait for ``end_batch``."""
        return self._noted > 0

    def due(self, now: float) -> bool:
        """Rule 5: enough wait, or long enough, to go out even while the node is busy."""
        return self._noted >= RECEIPTS_BATCH or now - self._since >= RECEIPT_DELAY

    def wait_left(self, now: float) -> float:
        """Seconds until the receipts waiting are due (0: now)."""
        return max(0.0, self._since + RECEIPT_DELAY - now)

    def matched(self, ev: pm.Event, nodes: tuple[int, ...], out: list[Action]) -> None:
        """The owner matched ``ev``; ``nodes`` (not this one) got its notifications."""
        access = ev.access_node
        if access == self._ctx.id:
            self._outbox.matched(ev.event_id, nodes, out)
            return
        if not self._noted:
            self._since = self._ctx.now
        self._noted += 1
        batch = self._matched.get(access)
        if batch is None:
            self._matched[access] = ([ev.event_id], [nodes])
        else:
            batch[0].append(ev.event_id)
            batch[1].append(nodes)

    def reported(self, origin: int, event_id: str, nodes: tuple[int, ...], out: list[Action]) -> None:
        """A notification of ``event_id`` arrived here, and its owner left the
        report of its match (to ``nodes``, this one among them) to us."""
        me = self._ctx.id
        if origin == me:
            self._outbox.matched(event_id, nodes, out, me)
            return
        if not self._noted:
            self._since = self._ctx.now
        self._noted += 1
        batch = self._matched.get(origin)
        if batch is None:
            self._matched[origin] = ([event_id], [nodes])
        else:
            batch[0].append(event_id)
            batch[1].append(nodes)

    def delivered(self, origin: int, event_id: str, out: list[Action]) -> None:
        """A notification of ``event_id``, published through ``origin``, arrived here."""
        if origin == self._ctx.id:
            self._outbox.delivered(event_id, origin, out)
            return
        if not self._noted:
            self._since = self._ctx.now
        self._noted += 1
        ids = self._delivered.get(origin)
        if ids is None:
            self._delivered[origin] = [event_id]
        else:
            ids.append(event_id)

    def end_batch(self) -> list[Action]:
        if not self._noted:
            return []
        self._noted = 0
        out: list[Action] = []
        frame = self._ctx.config.cluster.max_frame_size // 2
        if self._matched:
            size = max(1, frame // (ENTRY_BYTES + NODE_BYTES * (len(self._ctx.peers) + 1)))
            for node, (ids, nodes) in self._matched.items():
                for i in range(0, len(ids), size):
                    out.append(ToPeer(node, pm.EventsMatched(tuple(ids[i : i + size]), tuple(nodes[i : i + size]))))
            self._matched.clear()
        if self._delivered:
            size = max(1, frame // ENTRY_BYTES)
            for node, eids in self._delivered.items():
                for i in range(0, len(eids), size):
                    out.append(ToPeer(node, pm.EventsDelivered(tuple(eids[i : i + size]))))
            self._delivered.clear()
        return out
