"""overlay.client.placement: where the routing agent may place a subscription next (rules 1–4)."""

from __future__ import annotations

from overlay.client.placement import MAX_PLACE_ATTEMPTS, PLACE_BACKOFF, PLACE_BACKOFF_MAX, Placements


def test_a_failed_node_waits_a_growing_pause_and_stops_after_its_attempts() -> None:
    p = Placements()
    now = 0.0
    pauses = []
    for attempt in range(1, MAX_PLACE_ATTEMPTS + 1):
        assert p.may_try("s", 1, 1, now)
        assert p.failed("s", 1, 1, now) == attempt
        pause = min(PLACE_BACKOFF_MAX, PLACE_BACKOFF * 2**attempt)
        assert not p.may_try("s", 1, 1, now + pause - 1e-6)
        pauses.append(pause)
        now += pause
    assert pauses == sorted(pauses) and pauses[-1] == PLACE_BACKOFF_MAX
    assert not p.may_try("s", 1, 1, now + 1_000.0)  # used up on this connection
    assert p.may_try("s", 2, 1, now)  # other nodes and subscriptions are not concerned
    assert p.may_try("t", 1, 1, now)


def test_a_new_connection_or_a_success_starts_afresh() -> None:
    p = Placements()
    for _ in range(MAX_PLACE_ATTEMPTS):
        p.failed("s", 1, 1, 0.0)
    assert p.may_try("s", 1, 2, 0.0)  # a new session
    p.failed("s", 1, 2, 0.0)
    p.succeeded("s", 1)
    assert p.may_try("s", 1, 2, 0.0)


def test_a_homeless_subscription_is_given_up_once_every_connected_node_is() -> None:
    p = Placements()
    assert not p.gave_up("s", [])  # no node connected: wait for one
    for _ in range(MAX_PLACE_ATTEMPTS):
        p.failed("s", 1, 1, 0.0)
    assert p.gave_up("s", [1]) and not p.gave_up("s", [1, 2])
    p.forget("s")
    assert not p.gave_up("s", [1]) and p.may_try("s", 1, 1, 0.0)
