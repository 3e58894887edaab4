"""Request correlation: each request, by its id, until its final answer (sans-IO).

No clock is read here: every call that depends on time is given ``now``
(seconds on the caller's monotonic clock).  Rules (SPEC §12; Client rules 2, 3):

1. A request has a stable ``id`` (the caller's handle) and, while it is on
   the wire, a ``seq`` (the node's correlation number).  Each send uses a new
   seq, so a late answer to an earlier attempt is never taken for the current
   one; an answer to a seq that is not on the wire is not ours (``answer``
   returns None).
2. A **one-shot** request's first answer — PubAck, SubAck, UnsubAck,
   AdminReply, Choke or Error — is its result: the caller interprets it.  It
   fails with ``ConnectionLost`` if the connection goes while it is on the wire.
3. A **retrying** request is sent again, never dropped: after ``Choke(delay)``
   once the delay has passed; after ``not_ready`` once ``NOT_READY_RETRY`` has
   passed — or it fails with ``NotReady`` if that would reach its deadline;
   after a lost connection, on the next one.  Any other Error fails it with
   ``RequestError``.
4. Every request fails with ``TimeoutError`` at its deadline, wherever it
   stands: waiting for a connection, paused, or on the wire.  A request made
   while no connection is open waits for one, within that deadline.
5. An **internal** request (a re-subscription after a reconnect) is the
   protocol's own: it is dropped when its connection goes (the re-subscribe
   list makes it again on the next one).
6. A request given up while on the wire (timed out, or cancelled by its
   caller) leaves its seq among the last ``ABANDONED`` ones (``abandoned``):
   its answer may still come, and is nobody's — not an error of the node's
   to report (a routing agent's ping answered after its timeout was handed
   to ``error_cb`` as an ``unknown_subscription`` error).

Invariant: a pending request is in exactly one of ``_idle`` (not on the wire)
and ``_wire`` (by its seq); ``_timers`` holds a wake-up for every deadline and
every pause, plus stale ones for requests already gone (skipped, compacted).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Final

import msgspec

from overlay.client.limits import NOT_READY_RETRY
from overlay.errors import ConnectionLost, NotReady, RequestError
from overlay.messages import client as cm

__all__ = ["Outcome", "Request", "RequestMessage", "Requests"]

# Messages that are requests: each carries a ``seq`` the answer brings back.
RequestMessage = cm.Publish | cm.Subscribe | cm.Unsubscribe | cm.Admin
# Stale wake-ups kept before the timer heap is rebuilt: a few per pending request.
COMPACT_RATIO: Final = 4
COMPACT_MIN: Final = 64
# Rule 6: seqs of requests given up on the wire that are remembered.
ABANDONED: Final = 1024

# What an answer did to its request: the final reply, the failure, or the
# time it will be sent again (paused by Choke or not_ready).
Outcome = cm.ClientMessage | Exception | float


class Request:
    """One request until its final answer (rules 1–5)."""

    __slots__ = ("conn", "deadline", "id", "internal", "message", "resend_at", "retry", "seq")

    def __init__(self, rid: int, message: RequestMessage, *, deadline: float, retry: bool, internal: bool, conn: int):
        self.id = rid
        self.message = message  # the template: each send gives it a fresh seq
        self.deadline = deadline
        self.retry = retry
        self.internal = internal
        self.conn = conn  # the connection count when it was made (0: before the first)
        self.seq = 0  # on the wire under this seq; 0: not on the wire
        self.resend_at = 0.0  # not sent before this (a Choke or not_ready pause)

    @property
    def sub_id(self) -> str:
        """The subscription a Subscribe or Unsubscribe names (``""`` otherwise)."""
        msg = self.message
        return msg.sub_id if isinstance(msg, (cm.Subscribe, cm.Unsubscribe)) else ""

    def __repr__(self) -> str:
        return f"Request({self.id}, {type(self.message).__name__}, seq={self.seq}, retry={self.retry})"


class Requests:
    """The pending requests of one client (rules 1–5)."""

    def __init__(self) -> None:
        self._next_id = 0
        self._idle: dict[int, Request] = {}  # by id: not on the wire
        self._wire: dict[int, Request] = {}  # by seq
        self._by_id: dict[int, Request] = {}
        self._timers: list[tuple[float, int]] = []  # (when, request id): deadlines and pauses
        self._abandoned: set[int] = set()  # rule 6: seqs given up on the wire ...
        self._abandoned_order: deque[int] = deque()  # ... oldest first

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, seq: int) -> bool:
        """Whether ``seq`` is a request of ours on the wire."""
        return seq in self._wire

    def get(self, rid: int) -> Request | None:
        return self._by_id.get(rid)

    def abandoned(self, seq: int) -> bool:
        """Rule 6: whether ``seq`` was a request of ours given up while on the wire."""
        return seq in self._abandoned

    def pending(self) -> list[Request]:
        """Every pending request, oldest first."""
        return sorted(self._by_id.values(), key=lambda r: r.id)

    def add(
        self, message: RequestMessage, *, now: float, timeout: float, retry: bool, internal: bool = False, conn: int = 0
    ) -> Request:
        """A new request, idle until it is sent (``on_wire``)."""
        self._next_id += 1
        req = Request(self._next_id, message, deadline=now + timeout, retry=retry, internal=internal, conn=conn)
        self._by_id[req.id] = req
        self._idle[req.id] = req
        self._push(req.deadline, req.id)
        return req

    def on_wire(self, req: Request, seq: int) -> RequestMessage:
        """``req`` is sent now under ``seq``: the message to send."""
        del self._idle[req.id]
        req.seq = seq
        self._wire[seq] = req
        return msgspec.structs.replace(req.message, seq=seq)

    def ready(self, now: float) -> list[Request]:
        """Idle requests that may be sent now (no pause, or one that is over), oldest first."""
        return sorted((r for r in self._idle.values() if r.resend_at <= now), key=lambda r: r.id)

    def answer(self, seq: int, msg: cm.ClientMessage, now: float) -> tuple[Request, Outcome] | None:
        """Rules 1–3: what ``msg``, an answer to ``seq``, does to its request."""
        req = self._wire.pop(seq, None)
        if req is None:
            return None
        req.seq = 0
        if req.retry:
            if isinstance(msg, cm.Choke):
                return req, self._pause(req, now + msg.delay)
            if isinstance(msg, cm.Error):
                if msg.code != cm.ErrorCode.NOT_READY:
                    return req, self._finish(req, RequestError(msg.code, msg.message, msg.position))
                if now + NOT_READY_RETRY >= req.deadline:
                    return req, self._finish(req, NotReady(msg.message))
                return req, self._pause(req, now + NOT_READY_RETRY)
        return req, self._finish(req, msg)

    def _pause(self, req: Request, until: float) -> float:
        req.resend_at = until
        self._idle[req.id] = req
        self._push(until, req.id)
        return until

    def _finish(self, req: Request, result: Outcome) -> Outcome:
        self._forget(req)
        return result

    def cancel(self, rid: int) -> Request | None:
        """The caller gave up on ``rid``: forget it (a late answer is ignored)."""
        req = self._by_id.get(rid)
        if req is not None:
            self._forget(req)
        return req

    def _forget(self, req: Request) -> None:
        del self._by_id[req.id]
        self._idle.pop(req.id, None)
        if req.seq:
            if self._wire.pop(req.seq, None) is not None:  # given up on the wire (rule 6)
                self._abandoned.add(req.seq)
                self._abandoned_order.append(req.seq)
                if len(self._abandoned_order) > ABANDONED:
                    self._abandoned.discard(self._abandoned_order.popleft())
            req.seq = 0

    def connection_lost(self) -> list[tuple[Request, Exception]]:
        """Rules 2, 3, 5: one-shot requests on the wire fail; retrying ones go
        back to idle (sent again on the next connection); internal ones go."""
        failed: list[tuple[Request, Exception]] = []
        for req in list(self._by_id.values()):
            if req.internal:
                self._forget(req)
            elif req.seq:
                if req.retry:
                    self._wire.pop(req.seq)
                    req.seq = 0
                    req.resend_at = 0.0
                    self._idle[req.id] = req
                else:
                    self._forget(req)
                    failed.append((req, ConnectionLost("connection to the access node lost")))
        return failed

    def close(self, reason: str) -> list[tuple[Request, Exception]]:
        """Every pending request fails with ``ConnectionLost(reason)``."""
        failed: list[tuple[Request, Exception]] = [(r, ConnectionLost(reason)) for r in self.pending()]
        self._by_id.clear()
        self._idle.clear()
        self._wire.clear()
        self._timers.clear()
        return failed

    def next_timer(self) -> float | None:
        """The earliest deadline or end of a pause (possibly one already void)."""
        timers = self._timers
        while timers and timers[0][1] not in self._by_id:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def tick(self, now: float) -> tuple[list[Request], list[Request]]:
        """Rules 3, 4 at ``now``: the paused requests whose pause is over (to
        send), and the requests past their deadline (forgotten: they fail)."""
        resume: list[Request] = []
        expired: list[Request] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, rid = heapq.heappop(timers)
            req = self._by_id.get(rid)
            if req is None:
                continue
            if req.deadline <= now:
                self._forget(req)
                expired.append(req)
            elif not req.seq and req.resend_at and req.resend_at <= now and req not in resume:
                resume.append(req)
        return resume, expired

    def _push(self, when: float, rid: int) -> None:
        timers = self._timers
        heapq.heappush(timers, (when, rid))
        if len(timers) > COMPACT_MIN and len(timers) > COMPACT_RATIO * len(self._by_id):
            self._timers = [t for t in timers if t[1] in self._by_id]
            heapq.heapify(self._timers)
