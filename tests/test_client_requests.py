"""overlay.client.requests: request correlation, with explicit times (rules 1–5)."""

from __future__ import annotations

from overlay.client.limits import NOT_READY_RETRY
from overlay.client.requests import COMPACT_MIN, COMPACT_RATIO, Requests
from overlay.errors import ConnectionLost, NotReady, RequestError
from overlay.messages import client as cm

PUB = cm.Publish(0, {"price": 1.0})


def test_each_send_gets_its_seq_and_only_an_answer_to_it_counts() -> None:
    r = Requests()
    req = r.add(PUB, now=0.0, timeout=5.0, retry=True)
    assert r.on_wire(req, 7) == cm.Publish(7, {"price": 1.0}) and 7 in r
    assert r.answer(8, cm.PubAck(8, "x"), 0.0) is None  # not ours
    assert r.answer(7, cm.Choke(7, 0.5), 1.0) == (req, 1.5)  # paused until 1.5
    assert 7 not in r and r.ready(1.4) == [] and r.ready(1.5) == [req]
    assert r.on_wire(req, 9).seq == 9
    assert r.answer(7, cm.PubAck(7, "late"), 2.0) is None  # the first attempt's answer
    assert r.answer(9, cm.PubAck(9, "0-1"), 2.0) == (req, cm.PubAck(9, "0-1"))
    assert len(r) == 0 and r.next_timer() is None


def test_a_retrying_request_turns_errors_into_exceptions() -> None:
    r = Requests()
    req = r.add(PUB, now=0.0, timeout=1.0, retry=True)
    r.on_wire(req, 1)
    assert r.answer(1, cm.Error(1, cm.ErrorCode.NOT_READY, "wait"), 0.5) == (req, 0.5 + NOT_READY_RETRY)
    r.on_wire(req, 2)
    _, outcome = r.answer(2, cm.Error(2, cm.ErrorCode.NOT_READY, "wait"), 1.0 - NOT_READY_RETRY) or (req, None)
    assert isinstance(outcome, NotReady)
    req = r.add(PUB, now=0.0, timeout=1.0, retry=True)
    r.on_wire(req, 3)
    _, outcome = r.answer(3, cm.Error(3, cm.ErrorCode.BAD_EVENT, "no", 2), 0.0) or (req, None)
    assert isinstance(outcome, RequestError) and outcome.position == 2


def test_a_lost_connection_fails_one_shots_requeues_retries_and_drops_internal_ones() -> None:
    r = Requests()
    once = r.add(PUB, now=0.0, timeout=5.0, retry=False)
    again = r.add(PUB, now=0.0, timeout=5.0, retry=True)
    mine = r.add(cm.Subscribe(0, "s", "price < 1"), now=0.0, timeout=5.0, retry=True, internal=True)
    paused = r.add(PUB, now=0.0, timeout=5.0, retry=True)
    for seq, req in enumerate((once, again, mine, paused), 1):
        r.on_wire(req, seq)
    r.answer(4, cm.Choke(4, 2.0), 1.0)
    (failed,) = r.connection_lost()
    assert failed[0] is once and isinstance(failed[1], ConnectionLost)
    assert r.get(mine.id) is None
    assert r.ready(1.5) == [again]  # the paused one waits out its pause
    assert r.ready(3.0) == [again, paused]


def test_every_request_times_out_at_its_deadline_wherever_it_stands() -> None:
    r = Requests()
    idle = r.add(PUB, now=0.0, timeout=1.0, retry=True)
    wire = r.add(PUB, now=0.0, timeout=2.0, retry=True)
    r.on_wire(wire, 1)
    paused = r.add(PUB, now=0.0, timeout=3.0, retry=True)
    r.on_wire(paused, 2)
    r.answer(2, cm.Choke(2, 10.0), 0.0)
    assert r.next_timer() == 1.0
    assert r.tick(0.5) == ([], [])
    assert r.tick(2.0) == ([], [idle, wire])
    assert r.tick(3.0) == ([], [paused]) and len(r) == 0


def test_a_pause_that_ends_before_the_deadline_resumes_the_request() -> None:
    r = Requests()
    req = r.add(PUB, now=0.0, timeout=5.0, retry=True)
    r.on_wire(req, 1)
    r.answer(1, cm.Choke(1, 0.25), 1.0)
    assert r.next_timer() == 1.25
    assert r.tick(1.25) == ([req], [])


def test_the_timers_of_answered_requests_do_not_pile_up() -> None:
    r = Requests()
    for seq in range(1, 10_001):
        req = r.add(PUB, now=float(seq), timeout=10.0, retry=True)
        r.on_wire(req, seq)
        r.answer(seq, cm.PubAck(seq, "e"), float(seq))
    assert len(r) == 0 and r.next_timer() is None
    assert len(r._timers) <= max(COMPACT_MIN, COMPACT_RATIO * len(r)) + 1


def test_cancel_and_close() -> None:
    r = Requests()
    a = r.add(PUB, now=0.0, timeout=5.0, retry=True)
    b = r.add(PUB, now=0.0, timeout=5.0, retry=True)
    r.on_wire(a, 1)
    assert r.cancel(a.id) is a and 1 not in r and r.cancel(a.id) is None
    (failed,) = r.close("closed")
    assert failed[0] is b and str(failed[1]) == "closed" and len(r) == 0
