"""overlay.histograms: the core's fixed-bucket counts behind /metrics' histograms."""

from __future__ import annotations

import pytest

from overlay.errors import LocalProtocolError
from overlay.histograms import LATENCY_BOUNDS, TESTED_BOUNDS, BucketCounts


def test_a_value_on_a_bound_counts_in_that_bucket_and_cumulative_reads_as_le() -> None:
    h = BucketCounts((1, 5, 10))
    for v in (0, 1, 2, 5, 6, 10, 11, 1000):
        h.observe(v)
    assert h.counts == [2, 2, 2, 2]
    assert h.cumulative() == [(1, 2), (5, 4), (10, 6), (float("inf"), 8)]
    assert h.count == 8 and h.sum == 1035


def test_an_empty_histogram_reads_zero_everywhere() -> None:
    h = BucketCounts(LATENCY_BOUNDS)
    assert h.count == 0 and h.sum == 0
    assert [n for _, n in h.cumulative()] == [0] * (len(LATENCY_BOUNDS) + 1)


@pytest.mark.parametrize("bounds", [(1, 1, 2), (3, 2), (0.5, 0.1)])
def test_bounds_must_increase_strictly(bounds: tuple[float, ...]) -> None:
    with pytest.raises(LocalProtocolError, match="increase strictly"):
        BucketCounts(bounds)


def test_the_core_bounds_are_valid() -> None:
    BucketCounts(TESTED_BOUNDS)
    BucketCounts(LATENCY_BOUNDS)


def test_observe_puts_every_value_where_bisect_left_does() -> None:
    """observe's written-out search against the standard library's, on the
    bounds, between them, outside them, negative, infinite and NaN values."""
    from bisect import bisect_left

    for bounds in (TESTED_BOUNDS, LATENCY_BOUNDS, (1,), (0.5, 2)):
        values: list[float] = [-1.0, float("inf"), float("-inf"), float("nan"), 0, 1e9]
        for b in bounds:
            values += [b, b - 1e-9, b + 1e-9, b * 2, b / 2]
        for v in values:
            h = BucketCounts(bounds)
            h.observe(v)
            expected = [0] * (len(bounds) + 1)
            expected[bisect_left(bounds, v)] = 1
            assert h.counts == expected, (bounds, v)


def test_bounds_that_a_float_cannot_hold_exactly_are_refused() -> None:
    with pytest.raises(LocalProtocolError, match="exact as floats"):
        BucketCounts((1, 2**53 + 1))
