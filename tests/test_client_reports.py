"""overlay.client.reports: errors waiting for the error callback (rules 1–3)."""

from __future__ import annotations

from overlay.client.reports import MAX_PENDING_ERRORS, ErrorReports
from overlay.errors import RequestError, SlowConsumerError


def test_drops_of_one_subscription_make_one_report_until_it_is_taken() -> None:
    r = ErrorReports()
    r.slow_consumer("a", 10, 10, "0-1")
    r.add(RequestError("undeliverable", "no instance"))
    r.slow_consumer("b", 5, 5, "0-2")
    r.slow_consumer("a", 10, 10, "0-3")
    r.slow_consumer("a", 10, 10, "0-4")
    a, other, b = r.take()
    assert isinstance(a, SlowConsumerError) and isinstance(b, SlowConsumerError)
    assert (a.subscriber, a.dropped, a.queued, a.limit, a.event_id) == ("a", 3, 10, 10, "0-1")
    assert (b.subscriber, b.dropped) == ("b", 1) and isinstance(other, RequestError)
    assert "'a'" in str(a) and "3 notification(s) dropped" in str(a)
    assert r.take() == [] and r.dropped == 4
    r.slow_consumer("a", 10, 10, "0-5")  # a new report after the last was taken
    (again,) = r.take()
    assert isinstance(again, SlowConsumerError) and (again.dropped, again.event_id) == (1, "0-5")


def test_other_errors_are_bounded_the_oldest_discarded_and_counted() -> None:
    r = ErrorReports()
    r.slow_consumer("a", 1, 1, "0-0")
    for i in range(MAX_PENDING_ERRORS + 5):
        r.add(RequestError("undeliverable", str(i)))
    out = r.take()
    assert len(out) == MAX_PENDING_ERRORS + 1 and r.discarded == 5
    assert isinstance(out[0], SlowConsumerError)  # drops are never discarded
    assert [str(e).split(": ")[1] for e in out[1:3]] == ["5", "6"]


def test_the_nodes_drops_name_the_node() -> None:
    err = SlowConsumerError("", node_id=2)
    assert (err.subscriber, err.node_id, err.dropped) == ("", 2, 0) and "node 2" in str(err)
