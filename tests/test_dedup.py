"""overlay.node.dedup: the event ids an access node delivered lately (window, bound, eviction order)."""

from __future__ import annotations

from collections import Counter

import pytest

from overlay.node.dedup import RankMarks, Recent, SeenEvents, TrackedCopies


def test_an_id_is_new_once_and_seen_after_within_the_window() -> None:
    seen = SeenEvents(window=10.0, limit=100)
    assert not seen.seen("a", 0.0)
    assert seen.seen("a", 1.0)
    assert seen.seen("a", 9.9)
    assert not seen.seen("b", 9.9)
    assert "a" in seen and "b" in seen and len(seen) == 2


def test_unsee_undoes_only_the_mark_the_last_call_made() -> None:
    """node.outbox rule 6: a failed Publish's dedup mark is undone, so its
    retry is delivered; a mark made by an earlier copy (delivered) stays."""
    seen = SeenEvents(window=10.0, limit=100)
    seen.seen("a", 0.0)
    assert not seen.seen("b", 1.0)
    seen.unsee("b", 1.0)
    assert "b" not in seen and len(seen) == 1
    assert not seen.seen("b", 2.0)  # delivered, recorded again: forgotten once, in its own time
    assert seen.seen("a", 2.0)
    seen.unsee("a", 2.0)  # the last call found "a" recorded before: it stays
    seen.unsee("b", 2.0)  # and "b" was not the last call's
    assert "a" in seen and "b" in seen
    seen.expire(10.0)  # "a" goes at its time, "b" stays: the order is kept
    assert "a" not in seen and "b" in seen and len(seen) == 1
    seen.expire(12.0)
    assert len(seen) == 0


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


def test_recent_keeps_a_value_per_id_for_the_window_and_the_bound() -> None:
    stats: Counter[str] = Counter()
    r: Recent[int] = Recent(10.0, 2, stats, name="x")
    r.put("a", 1, 0.0)
    r.put("a", 2, 5.0)  # a known id keeps its place in time
    assert r.get("a") == 2
    r.put("b", 3, 6.0)
    r.put("c", 4, 7.0)  # past the bound: the oldest goes, counted
    assert "a" not in r and stats["x_evicted_early"] == 1
    r.expire(16.5)
    assert "b" not in r and r.get("c") == 4


def test_a_tracked_copy_is_answered_as_the_first_and_one_not_taken_is_forgotten() -> None:
    t = TrackedCopies(60.0, 100)
    t.delivered("e1", "g1", 3, "ch", "workers", 0.0)
    t.delivered("e1", "p1", 3, "ch", "", 0.0)
    copies = t.of("e1")
    assert copies is not None and copies["g1"].acked is None
    copies["g1"].also = [4]
    assert t.waited_on("e1", ("g1",)) and not t.waited_on("e1", ("p1",))
    assert t.resolved("e1", "g1", True, 0.5) == [4]
    assert copies["g1"].acked and copies["g1"].lf == 0.5
    assert t.resolved("e1", "p1", False) == [] and "p1" not in copies
    assert t.group_choices(3, "ch") == [("e1", "workers", "g1", True)]
    assert t.group_choices(2, "ch") == []


def test_a_keyed_copy_at_or_below_a_rank_delivered_is_late() -> None:
    m = RankMarks(30.0, 100)
    assert not m.stale("g1", "k", 3)
    m.delivered("g1", "k", 3, 0.0)
    m.delivered("g1", "k", 2, 0.0)  # never backwards
    assert m.stale("g1", "k", 3) and m.stale("g1", "k", 1) and not m.stale("g1", "k", 4)
    assert not m.stale("g2", "k", 1) and not m.stale("g1", "j", 1)  # per subscription and key
    m.expire(31.0)
    assert not m.stale("g1", "k", 3)  # a key forgotten since may start again at 1
