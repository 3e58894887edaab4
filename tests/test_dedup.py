"""overlay.node.dedup: the event ids an access node delivered lately (window, bound, eviction order)."""

from __future__ import annotations

from collections import Counter

import pytest

from overlay.node.dedup import SeenEvents


def test_an_id_is_new_once_and_seen_after_within_the_window() -> None:
    seen = SeenEvents(window=10.0, limit=100)
    assert not seen.seen("a", 0.0)
    assert seen.seen("a", 1.0)
    assert seen.seen("a", 9.9)
    assert not seen.seen("b", 9.9)
    assert "a" in seen and "b" in seen and len(seen) == 2


def test_ids_older_than_the_window_are_forgotten_as_new_ones_come() -> None:
    seen = SeenEvents(window=10.0, limit=100)
    seen.seen("a", 0.0)
    seen.seen("b", 5.0)
    assert not seen.seen("c", 10.0)  # "a" is exactly one window old: gone
    assert "a" not in seen and "b" in seen
    assert not seen.seen("a", 10.5)  # new again, recorded again
    assert seen.seen("a", 11.0)
    seen.expire(15.0)  # a quiet node's tick: "b" goes, the rest stays
    assert "b" not in seen and "c" in seen and "a" in seen


def test_the_bound_evicts_the_oldest_first_and_counts_it() -> None:
    stats: Counter[str] = Counter()
    seen = SeenEvents(window=60.0, limit=3, stats=stats)
    for i, eid in enumerate("abcd"):
        assert not seen.seen(eid, float(i))
    assert len(seen) == 3 and "a" not in seen and all(e in seen for e in "bcd")
    assert stats["dedup_evicted_early"] == 1
    assert not seen.seen("a", 5.0)  # forgotten early: it would be delivered again
    assert "b" not in seen and stats["dedup_evicted_early"] == 2


def test_eviction_keeps_time_order_across_many_ids() -> None:
    seen = SeenEvents(window=1.0, limit=1000)
    for i in range(5000):
        seen.seen(str(i), i * 0.01)  # 100 per second: a window holds 100
    assert len(seen) == 100
    assert all(str(i) in seen for i in range(4900, 5000)) and "4899" not in seen


def test_a_duplicate_does_not_refresh_the_id() -> None:
    """An id is forgotten one window after it was first seen, copies or not:
    the window only has to outlast the re-sends of one event."""
    seen = SeenEvents(window=10.0, limit=100)
    seen.seen("a", 0.0)
    assert seen.seen("a", 9.0)
    seen.seen("b", 10.0)
    assert "a" not in seen


@pytest.mark.parametrize(("window", "limit"), [(0.0, 10), (-1.0, 10), (1.0, 0)])
def test_absurd_settings_are_refused(window: float, limit: int) -> None:
    with pytest.raises(ValueError, match="dedup window"):
        SeenEvents(window, limit)
