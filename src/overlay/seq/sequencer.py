"""Strict per-key ordered release of events (SPEC §10, seed 004).

Theory of operation:

1. Every sequence key has a context: a status, the **sequence rank** (the rank
   of the next event to release), the last rank assigned, and an **overflow
   store** of held events ordered by rank (``SortedDict``).  Contexts are
   created on first use.
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
6. The class never reads a clock: every call takes ``now``.  A deadline is
   always computed as ``start + ttl`` and compared ``deadline <= now`` — the
   same float both where a timer is set and where it is checked, so a timer
   never fires without its condition holding.
"""

from __future__ import annotations

import enum
import heapq
from collections import Counter
from typing import Any, Final

import msgspec
from sortedcontainers import SortedDict

from overlay.errors import OverlayError

__all__ = [
    "SeqStatus",
    "ExpiryPolicy",
    "SequencerConfig",
    "Release",
    "Sequencer",
    "DuplicateRank",
    "SequencerFull",
    "InvalidRank",
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


class _Context:
    __slots__ = ("status", "seq", "last_assigned", "held", "in_flight", "touched")

    def __init__(self, now: float) -> None:
        self.status = SeqStatus.WAITING
        self.seq = 1
        self.last_assigned = 0
        self.held: SortedDict = SortedDict()  # rank -> (event, arrived)
        self.in_flight: tuple[int, float] | None = None  # (rank, released at)
        self.touched = now


class Sequencer:
    """Rules 1–6. Invariants: a key has at most one event in flight; releases of
    a key are in strictly increasing rank; every held event leaves the store
    by release or by a counted expiry."""

    def __init__(self, config: SequencerConfig | None = None) -> None:
        self.config = config or SequencerConfig()
        self._keys: dict[str, _Context] = {}
        self._timers: list[tuple[float, str]] = []  # (deadline, key), lazily checked
        self.counters: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._keys)

    def context(self, key: str) -> tuple[SeqStatus, int, int] | None:
        """``(status, sequence rank, held count)`` of a key, or None."""
        ctx = self._keys.get(key)
        return None if ctx is None else (ctx.status, ctx.seq, len(ctx.held))

    @property
    def held(self) -> int:
        return sum(len(c.held) for c in self._keys.values())

    # -- arrivals (rules 2, 3, 5) --------------------------------------------------------

    def arrive(self, key: str, rank: int | None, event: Any, now: float) -> list[Release]:
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
        if rank is None:
            rank = max(ctx.last_assigned, ctx.seq - 1) + 1
            while rank in ctx.held or (ctx.in_flight is not None and ctx.in_flight[0] == rank):
                rank += 1
        if rank < ctx.seq or rank in ctx.held or (ctx.in_flight is not None and ctx.in_flight[0] == rank):
            self.counters["rejected_duplicate"] += 1
            raise DuplicateRank(key, rank, ctx.seq)
        ctx.last_assigned = max(ctx.last_assigned, rank)
        ctx.touched = now
        if ctx.status is not SeqStatus.PROCESSING and rank == ctx.seq:
            return [self._release(key, ctx, rank, event, now)]
        if len(ctx.held) >= self.config.max_held:
            self.counters["rejected_full"] += 1
            raise SequencerFull(f"key {key!r} holds {len(ctx.held)} events (limit {self.config.max_held})")
        ctx.held[rank] = (event, now)
        self.counters["held"] += 1
        if ctx.status is SeqStatus.WAITING:
            ctx.status = SeqStatus.PENDING
        heapq.heappush(self._timers, (now + self.config.hold_ttl, key))
        return []

    def _release(self, key: str, ctx: _Context, rank: int, event: Any, now: float) -> Release:
        ctx.status = SeqStatus.PROCESSING
        ctx.in_flight = (rank, now)
        self.counters["released"] += 1
        heapq.heappush(self._timers, (now + self.config.processing_ttl, key))
        return Release(key, rank, event)

    # -- completion (rule 2) ------------------------------------------------------------------

    def complete(self, key: str, rank: int, now: float) -> list[Release]:
        """The released event ``rank`` of ``key`` was delivered everywhere."""
        ctx = self._keys.get(key)
        if ctx is None or ctx.in_flight is None or ctx.in_flight[0] != rank:
            self.counters["stale_completions"] += 1
            return []
        self.counters["completed"] += 1
        return self._advance(key, ctx, now)

    def _advance(self, key: str, ctx: _Context, now: float) -> list[Release]:
        assert ctx.in_flight is not None
        ctx.seq = ctx.in_flight[0] + 1
        ctx.in_flight = None
        ctx.touched = now
        if ctx.held and ctx.held.keys()[0] == ctx.seq:
            event, _ = ctx.held.pop(ctx.seq)
            return [self._release(key, ctx, ctx.seq, event, now)]
        ctx.status = SeqStatus.PENDING if ctx.held else SeqStatus.WAITING
        if ctx.held:  # stuck on a gap: the oldest held event's expiry decides
            oldest = min(arrived for _, arrived in ctx.held.values())
            heapq.heappush(self._timers, (max(now, oldest + self.config.hold_ttl), key))
        else:
            heapq.heappush(self._timers, (now + self.config.key_ttl, key))
        return []

    # -- expiry (rule 4) --------------------------------------------------------------------------

    def expire(self, now: float) -> list[Release]:
        """Apply every expiry due at ``now``; returns events released by skips."""
        out: list[Release] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, key = heapq.heappop(timers)
            ctx = self._keys.get(key)
            if ctx is not None:
                out.extend(self._expire_key(key, ctx, now))
        return out

    def _expire_key(self, key: str, ctx: _Context, now: float) -> list[Release]:
        cfg = self.config
        if ctx.in_flight is not None and ctx.in_flight[1] + cfg.processing_ttl <= now:
            self.counters["processing_timeouts"] += 1
            return self._advance(key, ctx, now)
        if ctx.in_flight is None and ctx.held:
            oldest = min(arrived for _, arrived in ctx.held.values())
            if oldest + cfg.hold_ttl <= now:
                if cfg.policy is ExpiryPolicy.SKIP:
                    first = ctx.held.keys()[0]
                    self.counters["gaps_skipped"] += 1
                    self.counters["ranks_skipped"] += first - ctx.seq
                    ctx.seq = first
                    event, _ = ctx.held.pop(first)
                    return [self._release(key, ctx, first, event, now)]
                expired = [r for r, (_, arrived) in ctx.held.items() if arrived + cfg.hold_ttl <= now]
                for r in expired:
                    del ctx.held[r]
                self.counters["expired_dropped"] += len(expired)
                if not ctx.held:
                    ctx.status = SeqStatus.WAITING
                    heapq.heappush(self._timers, (now + cfg.key_ttl, key))
                else:
                    heapq.heappush(self._timers, (min(a for _, a in ctx.held.values()) + cfg.hold_ttl, key))
                return []
            heapq.heappush(self._timers, (oldest + cfg.hold_ttl, key))
            return []
        if ctx.in_flight is None and not ctx.held and ctx.touched + cfg.key_ttl <= now:
            del self._keys[key]
            self.counters["keys_expired"] += 1
        return []

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None
