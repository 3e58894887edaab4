"""overlay.security.refusals: the bound on refusals' log lines (RefusalLog), without a clock.

A stranger is refused as fast as it connects; every refusal is counted, but
only the first of each kind is logged at once, then one line per ``every``
seconds saying how many were only counted since.
"""

from __future__ import annotations

import logging

import pytest

from overlay.security.refusals import LOG_EVERY, Refusal, RefusalLog, stats_key


def test_the_first_refusal_of_a_kind_is_logged_and_the_next_ones_within_the_period_are_only_counted() -> None:
    rl = RefusalLog(every=10.0)
    assert rl.admit("bad_proof", 100.0) == 0
    assert [rl.admit("bad_proof", 100.0 + i / 10) for i in range(1, 50)] == [None] * 49
    # A period after the last line: logged, with the 49 only counted since.
    assert rl.admit("bad_proof", 110.0) == 49
    assert rl.admit("bad_proof", 110.5) is None
    assert rl.admit("bad_proof", 125.0) == 1
    assert rl.admit("bad_proof", 200.0) == 0


def test_kinds_are_bounded_apart() -> None:
    rl = RefusalLog(every=10.0)
    assert rl.admit(Refusal.NOT_TLS.value, 0.0) == 0
    assert rl.admit(Refusal.BAD_PROOF.value, 1.0) == 0  # another kind: its own first line
    assert rl.admit(Refusal.NOT_TLS.value, 2.0) is None
    assert rl.admit(Refusal.BAD_PROOF.value, 11.0) == 0
    assert rl.admit(Refusal.NOT_TLS.value, 10.0) == 1


def test_warn_logs_what_admit_lets_through(caplog: pytest.LogCaptureFixture) -> None:
    rl = RefusalLog(every=10.0)
    log = logging.getLogger("overlay.test")
    caplog.set_level(logging.WARNING, logger="overlay.test")
    for t in (0.0, 1.0, 2.0, 12.0):
        rl.warn(log, "unauthorized", t, "client %r refused: %s", "x", "bad token")
    assert [r.getMessage() for r in caplog.records] == [
        "client 'x' refused: bad token",
        "client 'x' refused: bad token (2 more since the last line, counted only)",
    ]


def test_what_a_line_says_about_the_refusals_held_back() -> None:
    assert RefusalLog.more(0) == ""
    assert RefusalLog.more(7) == " (7 more since the last line, counted only)"
    assert RefusalLog().every == LOG_EVERY > 0
    assert stats_key(Refusal.BAD_PROOF) == "peer_refused_bad_proof"
