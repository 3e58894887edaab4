"""overlay.limits.budget: the node-wide budget of queued bytes and the slow-consumer policy, without a loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.limits.budget import FRAME_OVERHEAD, QueueBudget

pytestmark = pytest.mark.timeout(30)


def test_bytes_are_counted_from_queued_to_sent() -> None:
    b = QueueBudget(limit=10_000, grace=5.0)
    a = b.open(1)
    assert not b.add(a, 100)
    assert not b.add(a, 200)
    assert a.bytes == b.total == 300 + 2 * FRAME_OVERHEAD
    b.sent(a, 300, 2)
    assert a.bytes == b.total == 0


def test_add_says_when_the_budget_is_exceeded_and_the_largest_holders_go_first() -> None:
    b = QueueBudget(limit=1000, grace=5.0)
    big, mid, small = b.open(1), b.open(2), b.open(3)
    b.add(small, 100)
    b.add(mid, 300)
    assert b.add(big, 600)  # 1000 + 3 overheads: past the limit
    assert [a.sid for a in b.over_share()] == [1]  # the rest fit once it is gone
    share = b.share()
    assert big.bytes > share
    b.close(1)
    assert b.over_share() == [] and b.total == mid.bytes + small.bytes


def test_a_closed_account_is_inert() -> None:
    b = QueueBudget(limit=1000, grace=5.0)
    a = b.open(1)
    b.add(a, 100)
    assert b.close(1) == 100 + FRAME_OVERHEAD
    assert b.close(1) == 0
    b.sent(a, 100, 1)  # the writer's late report
    assert not b.add(a, 10_000)
    assert b.total == 0 and not b.accounts


def test_a_session_is_stalled_only_after_waiting_the_whole_grace() -> None:
    b = QueueBudget(limit=1000, grace=5.0)
    a, c, d = b.open(1), b.open(2), b.open(3)
    b.waiting(a, 10.0)
    b.waiting(c, 12.0)
    assert b.stalled(14.9) == []
    assert [x.sid for x in b.stalled(15.0)] == [1]
    assert [x.sid for x in b.stalled(20.0)] == [1, 2]  # longest first
    b.moving(a)  # its drain returned: it reads
    assert [x.sid for x in b.stalled(20.0)] == [2]
    assert d.waiting_since == 0.0


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=50), st.integers(1000, 50_000))
def test_cutting_the_largest_until_the_rest_fit_only_cuts_those_over_their_share(sizes: list[int], limit: int) -> None:
    b = QueueBudget(limit=limit, grace=5.0)
    for sid, n in enumerate(sizes):
        b.add(b.open(sid), n)
    share = b.share()
    cut = b.over_share()
    assert all(a.bytes > share for a in cut)
    for a in cut:
        b.close(a.sid)
    assert b.total <= limit
