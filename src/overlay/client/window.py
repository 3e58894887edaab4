"""The publish window: pipelined publishes, each kept until its PubAck (sans-IO).

No clock is read here; ``now`` is given.  Rules (Client rule 5):

1. Each pipelined publish is kept, by its seq, until its PubAck.  The caller
   keeps at most ``window`` of them unacknowledged (``room``), holding at
   most ``PUBLISH_WINDOW_BYTES`` of payload (one publish always fits): a
   fast publisher is paced by the node, and large payloads cannot pile up.
2. ``Choke(delay)`` for one: it is sent again once the delay has passed, and
   no new pipelined publish goes out before then (``pause_left``) — sending
   more would only be choked in turn.
3. ``not_ready`` for one: it is sent again after ``NOT_READY_RETRY``.
4. Any other Error: the publish is done; it is counted in ``errors`` and the
   first such error since the last ``take_error`` is kept for ``flush()``.
5. A lost connection: every kept publish is sent again on the next one (at
   least once); re-sends planned on the lost connection are void.  A
   re-sent publish keeps its seq, so whichever answer comes is its answer.

Invariant: ``_resend`` only names kept publishes; ``_timers`` holds a wake-up
for each entry of ``_resend``, plus stale ones (skipped, compacted).
"""

from __future__ import annotations

import heapq
from typing import Final

from overlay.client.limits import NOT_READY_RETRY, PUBLISH_WINDOW_BYTES
from overlay.errors import RequestError
from overlay.messages import client as cm

__all__ = ["PublishWindow"]

COMPACT_MIN: Final = 64


class PublishWindow:
    """Rules 1–5 for one client."""

    def __init__(self) -> None:
        self._kept: dict[int, cm.Publish] = {}  # by seq, in send order
        self.bytes = 0  # rule 1: the payload bytes of the kept publishes
        self._resend: dict[int, float] = {}  # seq -> not before
        self._timers: list[tuple[float, int]] = []
        self.paused_until = 0.0  # rule 2
        self.errors = 0  # rule 4: rejections so far
        self._error: RequestError | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, seq: int) -> bool:
        return seq in self._kept

    def room(self, window: int) -> bool:
        """Rule 1: whether one more may go out under a window of ``window``."""
        return len(self._kept) < window and (self.bytes < PUBLISH_WINDOW_BYTES or not self._kept)

    def pause_left(self, now: float) -> float:
        """Rule 2: seconds before a new pipelined publish may go out (0: now)."""
        if self.paused_until and now >= self.paused_until:
            self.paused_until = 0.0
        return max(0.0, self.paused_until - now)

    def add(self, msg: cm.Publish) -> None:
        self._kept[msg.seq] = msg
        self.bytes += len(msg.payload)

    def answer(self, msg: cm.PubAck | cm.Choke | cm.Error, now: float) -> None:
        """Rules 1–4 for the answer to a kept publish (the caller checked ``msg.seq in self``)."""
        seq = msg.seq
        match msg:
            case cm.PubAck():
                self._done(seq)
            case cm.Choke(delay=delay):
                self.paused_until = max(self.paused_until, now + delay)
                self._plan(seq, now + delay)
            case cm.Error(code=cm.ErrorCode.NOT_READY):
                self._plan(seq, now + NOT_READY_RETRY)
            case cm.Error():
                self.errors += 1
                if self._error is None:
                    self._error = RequestError(msg.code, msg.message, msg.position)
                self._done(seq)

    def acked(self, seq: int) -> None:
        """``answer`` for a PubAck of a kept publish, without the message (one of a ``PubAcks``)."""
        self._done(seq)

    def _done(self, seq: int) -> None:
        self.bytes -= len(self._kept.pop(seq).payload)
        self._resend.pop(seq, None)

    def _plan(self, seq: int, when: float) -> None:
        self._resend[seq] = when
        timers = self._timers
        heapq.heappush(timers, (when, seq))
        if len(timers) > COMPACT_MIN and len(timers) > 4 * len(self._resend):
            self._timers = [t for t in timers if self._resend.get(t[1]) == t[0]]
            heapq.heapify(self._timers)

    def next_timer(self) -> float | None:
        timers = self._timers
        while timers and self._resend.get(timers[0][1]) != timers[0][0]:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def due(self, now: float) -> list[cm.Publish]:
        """Rules 2, 3: the publishes to send again at ``now``."""
        out: list[cm.Publish] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, seq = heapq.heappop(timers)
            if self._resend.get(seq) == when:
                del self._resend[seq]
                out.append(self._kept[seq])
        return out

    def connection_lost(self) -> None:
        """Rule 5: re-sends planned on the lost connection are void."""
        self._resend.clear()
        self._timers.clear()

    def kept(self) -> list[cm.Publish]:
        """Rule 5: every kept publish, in send order (sent again on a new connection)."""
        return list(self._kept.values())

    def take_error(self) -> RequestError | None:
        """Rule 4: the first rejection since the last call, if any."""
        err, self._error = self._error, None
        return err
