"""overlay.client.load_factor: the subscriber's LF (SPEC §11), with explicit times."""

from __future__ import annotations

import pytest

from overlay.client.load_factor import LoadFactor, LoadFactorConfig


def test_idle_subscriber_reports_zero() -> None:
    lf = LoadFactor()
    assert lf.update(0, 100, 0.0) == 0.0


def test_queue_use_below_the_minimum_counts_as_zero() -> None:
    lf = LoadFactor()
    assert lf.lf_queue(5, 100) == 0.0  # 0.05/0.8 < min_pct 0.1
    assert lf.lf_queue(40, 100) == pytest.approx(0.5)


def test_queue_saturates_at_the_watermark_and_stays_until_it_falls() -> None:
    lf = LoadFactor()
    assert lf.lf_queue(80, 100) == 1.0  # reached HLFM
    assert lf.lf_queue(77, 100) == 1.0  # 0.9625 > max_pct 0.95: still saturated
    assert lf.lf_queue(70, 100) == pytest.approx(0.875)  # fell below max_pct


def test_processing_time_over_the_window() -> None:
    cfg = LoadFactorConfig(wq=0.0, wet=1.0, ttt=0.005, tts=0.050, window=2.0)
    lf = LoadFactor(cfg)
    lf.processed(0.030, 1.0)
    lf.processed(0.030, 1.5)
    assert lf.lf_time(1.5) == pytest.approx((0.030 - 0.005) / 0.050)
    assert lf.update(0, 10, 1.5) == pytest.approx(0.5)
    # Two seconds later the samples left the window.
    assert lf.update(0, 10, 4.0) == 0.0
    lf.processed(0.001, 4.1)  # below the threshold
    assert lf.lf_time(4.1) == 0.0


def test_lf_is_clamped_to_one() -> None:
    lf = LoadFactor()
    lf.processed(10.0, 0.0)
    assert lf.update(100, 100, 0.0) == 1.0
