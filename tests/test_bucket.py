"""overlay.limits.bucket: the token bucket that paces a publisher, without a loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.limits.bucket import MAX_DELAY, TokenBucket

pytestmark = pytest.mark.timeout(30)


def test_a_new_bucket_lets_its_burst_through_then_refuses() -> None:
    b = TokenBucket(rate=10.0, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.1)


def test_refused_requests_get_turns_spread_at_the_rate() -> None:
    """Rule 2: a window refused together comes back one by one, not as a herd."""
    b = TokenBucket(rate=10.0, burst=1, now=0.0)
    assert b.take(0.0) == 0.0
    delays = [b.take(0.0) for _ in range(5)]
    assert delays == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    # Each comes back at its turn and passes: the bucket refilled one token per turn.
    assert [b.take(d) for d in delays] == [0.0] * 5


def test_the_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    b = TokenBucket(rate=100.0, burst=5, now=0.0)
    for _ in range(5):
        b.take(0.0)
    assert b.take(0.02) == 0.0  # two tokens back after 20 ms
    assert b.take(0.02) == 0.0
    assert b.take(0.02) > 0.0
    assert b.idle(10.0)  # full again, with no turn promised: as a new one
    assert [b.take(10.0) for _ in range(5)] == [0.0] * 5 and b.take(10.0) > 0.0


def test_a_rate_of_zero_is_no_limit() -> None:
    b = TokenBucket(rate=0.0, burst=0, now=0.0)
    assert all(b.take(0.0) == 0.0 for _ in range(10_000))
    assert b.idle(0.0)


def test_a_clock_going_backwards_is_no_time_passing() -> None:
    b = TokenBucket(rate=1.0, burst=1, now=100.0)
    assert b.take(100.0) == 0.0
    assert b.take(50.0) > 0.0  # no refill from the past
    assert b.tokens >= 0.0


def test_no_delay_exceeds_the_cap() -> None:
    b = TokenBucket(rate=1.0, burst=1, now=0.0)
    delays = [b.take(0.0) for _ in range(500)]
    assert max(delays) == MAX_DELAY
    assert b.next_turn <= MAX_DELAY + 1.0  # the promised turns stop growing


@given(
    rate=st.floats(0.5, 1000.0),
    burst=st.integers(1, 100),
    steps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=200),
)
def test_over_any_span_no_more_pass_than_the_burst_and_the_rate_allow(
    rate: float, burst: int, steps: list[float]
) -> None:
    b = TokenBucket(rate, burst, now=0.0)
    now, passed = 0.0, 0
    for dt in steps:
        now += dt
        if b.take(now) == 0.0:
            passed += 1
        assert 0.0 <= b.tokens <= b.burst
    assert passed <= burst + rate * now + 1e-6
