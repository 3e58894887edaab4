"""overlay.client.window: pipelined publishes kept until their PubAck, with explicit times (rules 1–5)."""

from __future__ import annotations

from overlay.client.limits import NOT_READY_RETRY, PUBLISH_WINDOW_BYTES
from overlay.client.window import PublishWindow
from overlay.errors import RequestError
from overlay.messages import client as cm


def pub(seq: int) -> cm.Publish:
    return cm.Publish(seq, {"price": float(seq)})


def test_kept_until_acknowledged_within_the_window() -> None:
    w = PublishWindow()
    for seq in (1, 2, 3):
        w.add(pub(seq))
    assert len(w) == 3 and 2 in w and not w.room(3) and w.room(4)
    w.answer(cm.PubAck(2, "e"), 0.0)
    assert w.kept() == [pub(1), pub(3)] and w.room(3)


def test_a_choke_plans_a_resend_and_pauses_new_publishes() -> None:
    w = PublishWindow()
    w.add(pub(1))
    w.add(pub(2))
    w.answer(cm.Choke(1, 0.5), 10.0)
    w.answer(cm.Choke(2, 0.2), 10.1)  # the pause is the longest of them
    assert w.pause_left(10.2) == 0.3 or abs(w.pause_left(10.2) - 0.3) < 1e-9
    assert w.next_timer() == 10.1 + 0.2
    assert w.due(10.29) == [] and w.due(10.3) == [pub(2)]
    assert w.due(10.5) == [pub(1)] and w.next_timer() is None
    assert w.pause_left(10.5) == 0.0 and w.paused_until == 0.0


def test_not_ready_resends_after_the_retry_pause() -> None:
    w = PublishWindow()
    w.add(pub(1))
    w.answer(cm.Error(1, cm.ErrorCode.NOT_READY, "starting"), 1.0)
    assert w.due(1.0) == [] and w.due(1.0 + NOT_READY_RETRY) == [pub(1)] and len(w) == 1


def test_a_refusal_is_counted_and_the_first_one_kept_until_taken() -> None:
    w = PublishWindow()
    for seq in (1, 2):
        w.add(pub(seq))
    w.answer(cm.Error(1, cm.ErrorCode.BAD_EVENT, "first", 3), 0.0)
    w.answer(cm.Error(2, cm.ErrorCode.BAD_RANK, "second"), 0.0)
    assert w.errors == 2 and len(w) == 0
    err = w.take_error()
    assert isinstance(err, RequestError) and (err.code, err.position) == (cm.ErrorCode.BAD_EVENT, 3)
    assert w.take_error() is None


def test_a_lost_connection_voids_planned_resends_but_keeps_every_publish() -> None:
    w = PublishWindow()
    for seq in (1, 2):
        w.add(pub(seq))
    w.answer(cm.Choke(1, 0.5), 0.0)
    w.connection_lost()
    assert w.next_timer() is None and w.due(10.0) == [] and w.kept() == [pub(1), pub(2)]
    w.answer(cm.PubAck(1, "e"), 0.0)  # answered on the next connection, under the same seq
    assert w.kept() == [pub(2)]


def test_the_timers_of_acknowledged_resends_do_not_pile_up() -> None:
    w = PublishWindow()
    for seq in range(1, 5_001):
        w.add(pub(seq))
        w.answer(cm.Choke(seq, 1.0), float(seq))
        w.answer(cm.PubAck(seq, "e"), float(seq))
    assert len(w) == 0 and w.next_timer() is None and len(w._timers) <= 65


def test_payload_bytes_bound_the_window_and_one_publish_always_fits() -> None:
    w = PublishWindow()
    big = PUBLISH_WINDOW_BYTES // 2
    w.add(cm.Publish(1, {"price": 1.0}, payload=b"x" * big))
    assert w.bytes == big and w.room(100)
    w.add(cm.Publish(2, {"price": 2.0}, payload=b"y" * big))
    assert w.bytes == PUBLISH_WINDOW_BYTES and not w.room(100)  # full by bytes, not by count
    w.answer(cm.PubAck(1, "e1"), 0.0)
    assert w.bytes == big and w.room(100)
    w.answer(cm.Error(2, cm.ErrorCode.PAYLOAD_TOO_LARGE, "too large"), 0.0)
    assert w.bytes == 0 and len(w) == 0
    w.add(cm.Publish(3, {"price": 3.0}, payload=b"z" * (PUBLISH_WINDOW_BYTES + 1)))
    assert not w.room(100)  # over the bound alone: it went out, nothing more until it is answered
