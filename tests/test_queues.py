"""overlay.net.queues.TwoLevelQueue: priority, FIFO, bounds, backpressure (SPEC §1.1)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.net.queues import TwoLevelQueue

# Bound every await in this module: a queue bug shows as a timeout, not a hang.
WAIT = 2.0


async def _settle() -> None:
    """Let every ready task run to its next suspension point."""
    for _ in range(5):
        await asyncio.sleep(0)


# -- order -----------------------------------------------------------------------------------


async def test_get_takes_high_before_normal():
    q: TwoLevelQueue[str] = TwoLevelQueue(10)
    for item in ("n1", "n2"):
        assert q.put_nowait(item, False)
    for item in ("h1", "h2"):
        assert q.put_nowait(item, True)
    got = [await asyncio.wait_for(q.get(), WAIT) for _ in range(4)]
    assert got == [("h1", True), ("h2", True), ("n1", False), ("n2", False)]
    assert len(q) == 0


async def test_high_put_later_overtakes_queued_normal_items():
    q: TwoLevelQueue[int] = TwoLevelQueue(100)
    for i in range(50):
        q.put_nowait(i, False)
    assert (await q.get()) == (0, False)
    q.put_nowait(-1, True)
    assert (await q.get()) == (-1, True)
    assert (await q.get()) == (1, False)


def test_drain_takes_high_first_and_fifo_within_each_level():
    q: TwoLevelQueue[str] = TwoLevelQueue(10)
    for item in ("n1", "h1", "n2", "h2", "n3"):
        q.put_nowait(item, item.startswith("h"))
    assert q.drain(100) == ["h1", "h2", "n1", "n2", "n3"]
    assert len(q) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(), st.booleans()), max_size=60), st.integers(min_value=1, max_value=7))
def test_drain_in_batches_is_high_fifo_then_normal_fifo(items, batch):
    q: TwoLevelQueue[int] = TwoLevelQueue(1000)
    for item, high in items:
        assert q.put_nowait(item, high)
    out: list[int] = []
    while len(q):
        got = q.drain(batch)
        assert 1 <= len(got) <= batch
        out += got
    assert out == [i for i, h in items if h] + [i for i, h in items if not h]


def test_drain_honours_its_limit_and_leaves_the_rest():
    q: TwoLevelQueue[int] = TwoLevelQueue(10)
    for i in range(3):
        q.put_nowait(i, True)
    for i in range(10, 15):
        q.put_nowait(i, False)
    assert q.drain(2) == [0, 1]
    assert q.drain(2) == [2, 10]
    assert q.drain(0) == []
    assert len(q) == 4
    assert q.drain(100) == [11, 12, 13, 14]
    assert q.drain(5) == []


# -- bounds --------------------------------------------------------------------------------------


def test_put_nowait_refuses_when_the_level_is_full_and_changes_nothing():
    q: TwoLevelQueue[int] = TwoLevelQueue(3)
    for i in range(3):
        assert q.put_nowait(i, False)
    assert q.full(False) and not q.full(True)
    before = (list(q.high), list(q.normal))
    assert q.put_nowait(99, False) is False
    assert (list(q.high), list(q.normal)) == before
    assert len(q) == 3
    # The other level has its own bound.
    assert q.put_nowait(7, True)
    assert q.drain(10) == [7, 0, 1, 2]


def test_each_level_is_bounded_separately():
    q: TwoLevelQueue[int] = TwoLevelQueue(2)
    assert q.put_nowait(1, True) and q.put_nowait(2, True)
    assert q.put_nowait(3, True) is False
    assert q.put_nowait(4, False) and q.put_nowait(5, False)
    assert q.put_nowait(6, False) is False
    assert len(q) == 4
    assert q.drain(10) == [1, 2, 4, 5]


def test_put_force_goes_past_the_bound_in_order():
    q: TwoLevelQueue[int] = TwoLevelQueue(1)
    assert q.put_nowait(1, False)
    q.put_force(2, False)
    assert len(q) == 2
    assert q.put_nowait(3, False) is False
    assert q.drain(10) == [1, 2]


# -- waiting -----------------------------------------------------------------------------------------


async def test_get_waits_for_an_item():
    q: TwoLevelQueue[str] = TwoLevelQueue(2)
    getter = asyncio.ensure_future(q.get())
    await _settle()
    assert not getter.done()
    q.put_nowait("x", False)
    assert await asyncio.wait_for(getter, WAIT) == ("x", False)


async def test_wait_returns_once_something_is_queued():
    q: TwoLevelQueue[str] = TwoLevelQueue(2)
    waiter = asyncio.ensure_future(q.wait())
    await _settle()
    assert not waiter.done()
    q.put_nowait("x", True)
    await asyncio.wait_for(waiter, WAIT)
    assert len(q) == 1  # wait() does not take


async def test_put_waits_for_room_then_enqueues_in_order():
    q: TwoLevelQueue[int] = TwoLevelQueue(2)
    await q.put(1, False)
    await q.put(2, False)
    putter = asyncio.ensure_future(q.put(3, False))
    await _settle()
    assert not putter.done()  # backpressure: no room, nothing dropped
    assert list(q.normal) == [1, 2]
    assert (await q.get()) == (1, False)
    await asyncio.wait_for(putter, WAIT)
    assert list(q.normal) == [2, 3]


async def test_put_waits_after_drain_too():
    q: TwoLevelQueue[int] = TwoLevelQueue(1)
    q.put_nowait(1, False)
    putter = asyncio.ensure_future(q.put(2, False))
    await _settle()
    assert not putter.done()
    assert q.drain(1) == [1]
    await asyncio.wait_for(putter, WAIT)
    assert q.drain(5) == [2]


async def test_several_blocked_putters_all_get_in():
    q: TwoLevelQueue[int] = TwoLevelQueue(1)
    q.put_nowait(0, False)
    putters = [asyncio.ensure_future(q.put(i, False)) for i in range(1, 6)]
    got = []
    for _ in range(6):
        item, _high = await asyncio.wait_for(q.get(), WAIT)
        got.append(item)
    await asyncio.wait_for(asyncio.gather(*putters), WAIT)
    assert sorted(got) == list(range(6))
    assert got[0] == 0


async def test_high_put_is_not_held_back_by_a_full_normal_level():
    # Both levels full; a high put waits.  Taking one high item makes room on
    # the high level, so the high put must go in although normal is still full.
    q: TwoLevelQueue[str] = TwoLevelQueue(2)
    for item in ("h1", "h2"):
        q.put_nowait(item, True)
    for item in ("n1", "n2"):
        q.put_nowait(item, False)
    putter = asyncio.ensure_future(q.put("h3", True))
    await _settle()
    assert not putter.done()
    assert (await q.get()) == ("h1", True)
    await asyncio.wait_for(putter, WAIT)
    assert list(q.high) == ["h2", "h3"]
    assert list(q.normal) == ["n1", "n2"]


async def test_normal_put_is_not_held_back_by_a_full_high_level():
    q: TwoLevelQueue[str] = TwoLevelQueue(1)
    q.put_nowait("h1", True)
    q.put_nowait("n1", False)
    putter = asyncio.ensure_future(q.put("n2", False))
    await _settle()
    assert not putter.done()
    # Drain takes h1 and n1; both levels then have room.
    assert q.drain(2) == ["h1", "n1"]
    await asyncio.wait_for(putter, WAIT)
    assert list(q.normal) == ["n2"]


async def test_cancelled_put_enqueues_nothing():
    q: TwoLevelQueue[int] = TwoLevelQueue(1)
    q.put_nowait(1, False)
    putter = asyncio.ensure_future(q.put(2, False))
    await _settle()
    putter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await putter
    assert q.drain(5) == [1]
    assert len(q) == 0
