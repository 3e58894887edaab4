"""A token bucket that paces publishers (sans-IO: ``now`` is given).

Rules:

1. The bucket fills at ``rate`` tokens per second up to ``burst`` (at least
   one) and starts full.  ``rate == 0`` is no limit: every ``take`` passes.
2. ``take(now)`` passes (returns 0.0) and takes a token when one is there.
   Otherwise it returns the delay after which the request should come
   back, and takes nothing.  Refused requests are given turns ``1 / rate``
   apart from the moment the bucket next holds a token, so a window of
   publishes refused together comes back spread out at the rate, not as a
   herd that is refused again (``overlay.client.window`` re-sends each at
   its own delay).  A turn is a hint, not a reservation: the request is
   checked again when it comes back.  No delay exceeds ``MAX_DELAY``.
3. A clock that goes backwards counts as no time passing.
4. ``idle(now)``: the bucket is full again, as a new one would be, so
   forgetting it changes nothing (``overlay.limits.quotas`` drops it then).
5. ``take_all(n, now)``: n requests at once, when the bucket holds n whole
   tokens — exactly what n calls of ``take(now)`` would do then (each
   passes); otherwise (fewer, or n short of an ``EPSILON``) it takes
   nothing and says so, and the requests are asked one by one.  A run of
   publishes read together costs one call, not n.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_DELAY", "TokenBucket"]

# The longest a refused request is told to wait (rule 2): past it the turns
# of a huge refused window would say "come back in an hour"; a minute is
# long enough to pace, short enough that a client never looks hung.
MAX_DELAY: Final = 60.0
# A token short of one by less than this is a whole one: a request that comes
# back exactly at its turn must pass, whatever the float sums made of it.
EPSILON: Final = 1e-9


class TokenBucket:
    """Rules 1–4.  Invariant: ``0 <= tokens <= burst``; ``next_turn`` is the
    earliest time a refused request is told to come back."""

    __slots__ = ("burst", "next_turn", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, float(burst))
        self.tokens = self.burst
        self.stamp = now
        self.next_turn = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, now: float) -> float:
        """Rule 2: 0.0 when the request passes, else seconds until its turn."""
        rate = self.rate
        if not rate:
            return 0.0
        tokens = self.tokens
        if now > self.stamp:  # _refill, inline: this runs on every publish
            tokens = min(self.burst, tokens + (now - self.stamp) * rate)
            self.stamp = now
        if tokens >= 1.0 - EPSILON:
            self.tokens = tokens - 1.0 if tokens >= 1.0 else 0.0
            return 0.0
        self.tokens = tokens
        ready = now + (1.0 - self.tokens) / self.rate  # the bucket holds a token again
        turn = max(ready, self.next_turn)
        self.next_turn = min(turn, now + MAX_DELAY) + 1.0 / self.rate
        return min(turn - now, MAX_DELAY)

    def take_all(self, n: int, now: float) -> bool:
        """Rule 5: True when ``n`` requests at ``now`` all pass (their tokens
        taken); False, with nothing taken, when it cannot tell: ask ``take``."""
        if not self.rate:
            return True
        self._refill(now)  # what the first take would do; idempotent at the same now
        if self.tokens >= n:
            self.tokens -= n  # n takes of a whole token each: integer steps, exact in a float
            return True
        return False

    def idle(self, now: float) -> bool:
        """Rule 4."""
        if not self.rate:
            return True
        self._refill(now)
        return self.tokens >= self.burst - EPSILON and self.next_turn <= now
