"""Strict per-key ordered release of events (SPEC §10, seed 004).

Theory of operation:

1. Every sequence key has a context: a status, the **sequence rank** (the rank
   of the next event to release), the last rank assigned, and an **overflow
   store** of held events by rank.  A plain dict is enough: a completion asks
   for exactly the next rank (a lookup); only expiry, which is rare, needs
   more (the lowest held rank for a skip, every held event for a drop).
   Contexts are created on first use.
2. Status table (the per-key mutex is the PROCESSING status: at most one event
   of a key is in flight)::

       WAITING    --arrive(rank == seq)-->        PROCESSING  (released)
       WAITING    --arrive(rank >  seq)-->        PENDING     (held)
       PENDING    --arrive(rank == seq)-->        PROCESSING  (released)
       PENDING    --arrive(rank >  seq)-->        PENDING     (held)
       PROCESSING --arrive(any new rank)-->       PROCESSING  (held)
       PROCESSING --complete-->  PROCESSING (next rank held: released)
                               | PENDING    (other ranks held)
                               | WAITING    (nothing held)

3. Without an explicit rank the key assigns ``last_assigned + 1`` in arrival
   order.  A rank below the sequence rank, equal to the one in flight, or
   already held is a duplicate: refused with ``DuplicateRank`` and counted.
4. Nothing is held forever without a counted expiry.  A held event expires
   ``hold_ttl`` seconds after it arrived; a key stuck on a missing rank with
   held events expires when its oldest held event does.  The policy decides:
   * ``drop`` — the expired held events are discarded (counted as
     ``expired_dropped``); the key keeps waiting for the missing rank;
   * ``skip`` — the gap is skipped (counted as ``gaps_skipped`` with the ranks
     skipped): the sequence rank jumps to the lowest held rank and it is
     released.
   An in-flight event not completed within ``processing_ttl`` is completed by
   expiry (counted as ``processing_timeouts``) so a lost ack cannot block a key.
   An idle key (nothing held or in flight) is forgotten after ``key_ttl``.
5. Memory is bounded: at most ``max_keys`` contexts and ``max_held`` held
   events per key; past either bound an arrival is refused with
   ``SequencerFull`` and counted.
6. The class never reads a clock: every call takes ``now``.  A key's deadline
   is one function of its state (``_deadline``: in flight → released at +
   ``processing_ttl``; held → oldest arrival + ``hold_ttl``; idle → last
   touched + ``key_ttl``), the same float where a timer is set and where the
   expiry is decided, so an expiry never happens without its condition holding.
7. Timers are lazy: a key has at most one live entry in the timer heap
   (``_Context.timer``), never later than its deadline.  A state change arms a
   new entry only when it brings the deadline earlier (a release after an idle
   spell); otherwise the entry already there fires first, and firing
   re-evaluates the key and re-arms it at its real deadline.  So the heap
   holds about one entry per key, not one per event, and a busy key costs no
   heap work per event.
8. **A key's state can move** (``node.keyhome``: a home that dies or hands a
   key over): ``state(key)`` is a ``KeyState`` — the sequence rank, the
   last rank assigned, and every event not yet complete by rank (held, and
   the one in flight, whose rank is the sequence rank) — and
   ``adopt(state)`` installs one where the key has no context, releasing
   the event of the sequence rank again if the state holds it: whether it
   had been released or was still held, it was not complete.  Whatever an
   expiry changed (a skip, a drop, a processing timeout, a key forgotten) is
   named in ``expired_keys`` for the caller to copy on.
"""

from __future__ import annotations

import enum
from collections import Counter
from heapq import heappop, heappush
from typing import Any, Final

import msgspec

from overlay.errors import OverlayError

__all__ = [
    "DuplicateRank",
    "ExpiryPolicy",
    "InvalidRank",
    "KeyState",
    "Release",
    "SeqStatus",
    "Sequencer",
    "SequencerConfig",
    "SequencerFull",
]


MAX_KEY_LENGTH: Final = 256


class SeqStatus(enum.StrEnum):
    WAITING = "WAITING"
    PROCESSING = "PROCESSING"
    PENDING = "PENDING"


class ExpiryPolicy(enum.StrEnum):
    DROP = "drop"
    SKIP = "skip"


class DuplicateRank(OverlayError):
    """Rule 3: the rank was already released, is in flight, or is held."""

    def __init__(self, key: str, rank: int, next_rank: int) -> None:
        super().__init__(f"rank {rank} of key {key!r} is a duplicate (next rank to release is {next_rank})")
        self.key = key
        self.rank = rank


class InvalidRank(OverlayError):
    """A rank that is not a positive integer, or a key that is empty or too long."""


class SequencerFull(OverlayError):
    """Rule 5: too many keys, or too many held events for one key."""


class SequencerConfig(msgspec.Struct, frozen=True):
    policy: ExpiryPolicy = ExpiryPolicy.SKIP
    hold_ttl: float = 5.0
    processing_ttl: float = 10.0
    key_ttl: float = 300.0
    max_keys: int = 100_000
    max_held: int = 10_000


class Release(msgspec.Struct, frozen=True):
    """An event that may go to routing/matching now."""

    key: str
    rank: int
    event: Any


class KeyState(msgspec.Struct, frozen=True):
    """Rule 8: where one key stands, to move it to another sequencer.  ``events``
    are the key's events not complete, by rank: held ones, and the one in
    flight (its rank is ``seq``)."""

    key: str
    seq: int
    last_assigned: int
    events: dict[int, Any]
    # The event of ``seq`` is out, released by a home that lives on and passes
    # its completion on: ``adopt`` keeps it in flight rather than release it again.
    released: bool = False


_WAITING: Final = SeqStatus.WAITING
_PROCESSING: Final = SeqStatus.PROCESSING
_PENDING: Final = SeqStatus.PENDING


class _Context:
    """One key (rule 1).  ``held`` and ``arrived`` hold the same ranks;
    ``in_flight`` is the rank being delivered (``released_at`` its
    release time) or None; ``timer`` is the deadline of the key's live entry
    in the timer heap (rule 7)."""

    __slots__ = (
        "arrived",
        "flying",
        "held",
        "in_flight",
        "last_assigned",
        "released_at",
        "seq",
        "status",
        "timer",
        "touched",
    )

    def __init__(self, now: float) -> None:
        self.status = _WAITING
        self.seq = 1
        self.last_assigned = 0
        self.held: dict[int, Any] = {}  # rank -> event
        self.arrived: dict[int, float] = {}  # rank -> arrival time
        self.in_flight: int | None = None
        self.flying: Any = None  # the event in flight (rule 8: a state carries it)
        self.released_at = 0.0
        self.touched = now
        self.timer: float | None = None

    def take(self, rank: int) -> Any:
        """Remove the held ``rank`` and return its event."""
        del self.arrived[rank]
        return self.held.pop(rank)


class Sequencer:
    """Rules 1–7. Invariants: a key has at most one event in flight; releases of
    a key are in strictly increasing rank; every held event leaves the store
    by release or by a counted expiry; every context has one live timer entry
    no later than its deadline; every rank held, in flight or released is at
    most ``last_assigned``, and every held one at least ``seq`` (so ``seq <=
    last_assigned + 1``, and ``last_assigned + 1`` is always a fresh rank)."""

    def __init__(self, config: SequencerConfig | None = None) -> None:
        self.config = config or SequencerConfig()
        self._keys: dict[str, _Context] = {}
        self._timers: list[tuple[float, str]] = []  # (deadline, key); rule 7
        self.counters: Counter[str] = Counter()
        self.expired_keys: list[str] = []  # rule 8: keys an expiry changed, for the caller to take
        self.assigned = 0  # the rank the last accepted arrival got (rule 3), for the caller to copy on

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def context(self, key: str) -> tuple[SeqStatus, int, int] | None:
        """``(status, sequence rank, held count)`` of a key, or None."""
        ctx = self._keys.get(key)
        return None if ctx is None else (ctx.status, ctx.seq, len(ctx.held))

    @property
    def held(self) -> int:
        return sum(len(c.held) for c in self._keys.values())

    # -- arrivals (rules 2, 3, 5) --------------------------------------------------------

    def arrive(self, key: object, rank: int | None, event: Any, now: float) -> Release | None:
        """The event ``rank`` of ``key`` (None: the next one, rule 3) arrived: it is
        released at once or held.  At most one event is released per arrival.
        A key that is not a string of 1 to ``MAX_KEY_LENGTH`` characters is
        refused and counted, whoever the caller (hence ``object``)."""
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
            self.counters["rejected_bad_key"] += 1
            raise InvalidRank(f"a sequence key must be 1 to {MAX_KEY_LENGTH} characters")
        if rank is not None and (type(rank) is not int or rank < 1):
            self.counters["rejected_bad_rank"] += 1
            raise InvalidRank(f"rank {rank!r} of key {key!r} is not a positive integer")
        ctx = self._keys.get(key)
        if ctx is None:
            if len(self._keys) >= self.config.max_keys:
                self.counters["rejected_full"] += 1
                raise SequencerFull(f"{len(self._keys)} sequence keys in use (limit {self.config.max_keys})")
            ctx = self._keys[key] = _Context(now)
        held = ctx.held
        if rank is None:  # rule 3: a fresh rank, past every one held, in flight or released
            rank = ctx.last_assigned + 1
        elif rank < ctx.seq or rank in held or rank == ctx.in_flight:
            self.counters["rejected_duplicate"] += 1
            raise DuplicateRank(key, rank, ctx.seq)
        ctx.last_assigned = max(ctx.last_assigned, rank)
        ctx.touched = now
        self.assigned = rank
        status = ctx.status
        if status is not _PROCESSING and rank == ctx.seq:
            return self._release(key, ctx, rank, event, now)
        if len(held) >= self.config.max_held:
            self.counters["rejected_full"] += 1
            raise SequencerFull(f"key {key!r} holds {len(held)} events (limit {self.config.max_held})")
        held[rank] = event
        ctx.arrived[rank] = now
        self.counters["held"] += 1
        if status is not _PROCESSING:  # stuck on a gap: the hold deadline (rules 4, 6)
            ctx.status = _PENDING
            self._arm(key, ctx, now + self.config.hold_ttl)
        return None

    def _release(self, key: str, ctx: _Context, rank: int, event: Any, now: float) -> Release:
        ctx.status = _PROCESSING
        ctx.in_flight = rank
        ctx.flying = event
        ctx.released_at = now
        self.counters["released"] += 1
        deadline = now + self.config.processing_ttl
        timer = ctx.timer
        if timer is None or deadline < timer:  # _arm, inline: once per event
            ctx.timer = deadline
            heappush(self._timers, (deadline, key))
        return Release(key, rank, event)

    # -- completion (rule 2) ------------------------------------------------------------------

    def complete(self, key: str, rank: int, now: float) -> Release | None:
        """The released event ``rank`` of ``key`` was delivered everywhere: the
        next rank, if held, is released (the only one a completion can release)."""
        ctx = self._keys.get(key)
        if ctx is None or ctx.in_flight != rank:
            self.counters["stale_completions"] += 1
            return None
        self.counters["completed"] += 1
        return self._advance(key, ctx, rank, now)

    def _advance(self, key: str, ctx: _Context, done: int, now: float) -> Release | None:
        """The in-flight event ``done`` (``ctx.in_flight``) is done (delivered or
        timed out): release the next rank if held."""
        nxt = ctx.seq = done + 1
        ctx.in_flight = ctx.flying = None
        ctx.touched = now
        if nxt in ctx.held:
            del ctx.arrived[nxt]
            return self._release(key, ctx, nxt, ctx.held.pop(nxt), now)
        ctx.status = _PENDING if ctx.held else _WAITING
        self._arm(key, ctx, self._deadline(ctx))  # stuck on a gap, or idle
        return None

    # -- timers and expiry (rules 4, 6, 7) ------------------------------------------------------

    def _deadline(self, ctx: _Context) -> float:
        """Rule 6: when this key's state next needs the expiry's attention."""
        cfg = self.config
        if ctx.in_flight is not None:
            return ctx.released_at + cfg.processing_ttl
        if ctx.held:  # stuck on a gap: the oldest held event's expiry decides
            return min(ctx.arrived.values()) + cfg.hold_ttl
        return ctx.touched + cfg.key_ttl

    def _arm(self, key: str, ctx: _Context, deadline: float) -> None:
        """Rule 7: a new heap entry only when it brings the key's timer earlier."""
        timer = ctx.timer
        if timer is None or deadline < timer:
            ctx.timer = deadline
            heappush(self._timers, (deadline, key))

    def expire(self, now: float) -> list[Release]:
        """Apply every expiry due at ``now``; returns events released by skips."""
        out: list[Release] = []
        timers = self._timers
        keys = self._keys
        while timers and timers[0][0] <= now:
            deadline, key = heappop(timers)
            ctx = keys.get(key)
            if ctx is None or ctx.timer != deadline:
                continue  # not the key's live entry: superseded (rule 7)
            ctx.timer = None
            before = (ctx.seq, len(ctx.held))
            r = self._expire_key(key, ctx, now)
            if r is not None or key not in keys or before != (ctx.seq, len(ctx.held)):
                self.expired_keys.append(key)  # rule 8
            if r is not None:
                out.append(r)
            if key in keys:
                self._arm(key, ctx, self._deadline(ctx))
        return out

    def _expire_key(self, key: str, ctx: _Context, now: float) -> Release | None:
        cfg = self.config
        if ctx.in_flight is not None:
            if ctx.released_at + cfg.processing_ttl <= now:
                self.counters["processing_timeouts"] += 1
                return self._advance(key, ctx, ctx.in_flight, now)
            return None
        if ctx.held:
            oldest = min(ctx.arrived.values())
            if oldest + cfg.hold_ttl > now:
                return None
            if cfg.policy is ExpiryPolicy.SKIP:
                first = min(ctx.held)
                self.counters["gaps_skipped"] += 1
                self.counters["ranks_skipped"] += first - ctx.seq
                ctx.seq = first
                return self._release(key, ctx, first, ctx.take(first), now)
            expired = [r for r, arrived in ctx.arrived.items() if arrived + cfg.hold_ttl <= now]
            for r in expired:
                del ctx.held[r]
                del ctx.arrived[r]
            self.counters["expired_dropped"] += len(expired)
            if not ctx.held:
                ctx.status = _WAITING
            return None
        if ctx.touched + cfg.key_ttl <= now:
            del self._keys[key]
            self.counters["keys_expired"] += 1
        return None

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    # -- moving a key (rule 8) ----------------------------------------------------------------

    def key_list(self) -> list[str]:
        return list(self._keys)

    def state(self, key: str) -> KeyState | None:
        """Where ``key`` stands, or None (no context)."""
        ctx = self._keys.get(key)
        if ctx is None:
            return None
        events = dict(ctx.held)
        if ctx.in_flight is not None:
            events[ctx.in_flight] = ctx.flying
        return KeyState(key, ctx.seq, ctx.last_assigned, events)

    def forget(self, key: str) -> KeyState | None:
        """Drop ``key``'s context (it moved to another home); its state."""
        st = self.state(key)
        self._keys.pop(key, None)  # its timer entry, if any, is found stale (rule 7)
        return st

    def adopt(self, state: KeyState, now: float) -> Release | None:
        """Install ``state`` as ``state.key``'s context and release its event of
        the sequence rank, if it holds it (``state.released``: already out —
        the Release is returned all the same, for the caller to track, not
        send); events of lower ranks are complete and left out.  A key that has a context already takes the state's
        events it lacks, past its own sequence rank, and the higher of the two
        last ranks assigned (two copies of one key agree on every rank they
        share: one home assigned it).  Bounds as for arrivals (rule 5),
        counted, never raised: a state comes from a peer, not a publisher."""
        key = state.key
        ctx = self._keys.get(key)
        if ctx is None:
            if len(self._keys) >= self.config.max_keys:
                self.counters["rejected_full"] += 1
                return None
            ctx = self._keys[key] = _Context(now)
            ctx.seq = max(1, state.seq)
        ctx.last_assigned = max(ctx.last_assigned, state.last_assigned, ctx.seq - 1)
        ctx.touched = now
        for rank in sorted(state.events):
            if rank < ctx.seq or rank in ctx.held or rank == ctx.in_flight:
                continue
            if len(ctx.held) >= self.config.max_held:
                self.counters["rejected_full"] += 1
                break
            ctx.held[rank] = state.events[rank]
            ctx.arrived[rank] = now
            ctx.last_assigned = max(ctx.last_assigned, rank)
        if ctx.status is not _PROCESSING and ctx.seq in ctx.held:
            return self._release(key, ctx, ctx.seq, ctx.take(ctx.seq), now)
        if ctx.status is not _PROCESSING:
            ctx.status = _PENDING if ctx.held else _WAITING
        self._arm(key, ctx, self._deadline(ctx))
        return None
