"""overlay.testing.Audit: which (event, receiver) pairs are owed, and every
kind of breach — plain subscriptions (rules 1–4), groups (rule 5), an
unsubscribed subscription's window (rule 6) and per-key order (rule 7).
Pure bookkeeping: no event loop, no node."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import LOCAL
from overlay.channels import parse_subscription
from overlay.client.deliveries import Notification
from overlay.testing import Audit


def event(qty: int, price: float = 10.0) -> dict[str, Any]:
    return {"price": price, "sym": "A", "qty": qty}


def note(qty: int, received: float, price: float = 10.0, event_id: str = "") -> Notification:
    return Notification(
        event_id or f"e{qty}", event(qty, price), ("s",), publish_time=received - 0.01, received=received
    )


def subscribe(audit: Audit, name: str, expression: str = "price < 100", at: float = 1.0) -> None:
    audit.subscription(name, expression, parse_subscription(expression, LOCAL.schema))
    audit.subacked(name, at)


def publish(audit: Audit, qty: int, at: float, *, acked: bool = True, key: str = "", rank: int = 0) -> None:
    audit.publishing(qty, event(qty), at, key=key, rank=rank)
    if acked:
        audit.acked(qty, f"e{qty}", at + 0.01)


def test_a_plain_subscription_is_owed_each_acknowledged_event_after_its_suback_once() -> None:
    audit = Audit()
    subscribe(audit, "s", at=1.0)
    publish(audit, 1, 0.5)  # before the SubAck: not owed
    publish(audit, 2, 2.0)
    publish(audit, 3, 3.0, acked=False)  # no PubAck: not owed
    publish(audit, 4, 4.0)
    assert sorted(audit.owed()) == [("s", 2), ("s", 4)]
    for q in (1, 2, 3, 4, 4):
        audit.deliver("s", note(q, 5.0))
    v = audit.verdict()
    assert (v.expected, v.delivered, v.lost) == (2, 2, [])
    assert v.duplicated_pairs == [("s", 4)] and "2x (ids e4)" in v.duplicated[0] and not v.ok
    audit.deliver("s", note(9, 5.0))
    assert audit.verdict().unknown == ["event 9 to s"]


def test_a_group_is_owed_each_event_once_over_all_its_instances() -> None:
    audit = Audit()
    expr = "price < 100"
    audit.group("g", expr, parse_subscription(expr, LOCAL.schema))
    for name in ("g.1", "g.2", "g.3"):
        audit.instance(name, "g")
    audit.subacked("g.2", 1.0)  # the group counts from its first instance's SubAck
    audit.subacked("g.1", 2.5)
    for q in (1, 2, 3):
        publish(audit, q, float(q))
    assert sorted(audit.owed()) == [("g", 1), ("g", 2), ("g", 3)]
    audit.deliver("g.1", note(1, 5.0))
    audit.deliver("g.2", note(2, 5.0))
    audit.deliver("g.3", note(2, 5.1))  # a second instance got event 2
    v = audit.verdict()
    assert v.lost_pairs == [("g", 3)] and v.duplicated_pairs == [("g", 2)]
    assert "e2 to g.2" in v.duplicated[0] and "e2 to g.3" in v.duplicated[0]
    assert v.expected == 3 and v.delivered == 2
    subscribe(audit, "plain")
    with pytest.raises(ValueError, match="not a group"):
        audit.instance("x", "plain")


def test_an_unsubscribed_subscription_is_owed_only_what_was_acknowledged_before_it_asked() -> None:
    audit = Audit()
    subscribe(audit, "churn", at=1.0)
    publish(audit, 1, 2.0)  # PubAck at 2.01: owed
    publish(audit, 2, 2.995)  # PubAck at 3.005, after the unsubscribe: may come, at most once
    publish(audit, 3, 4.0)
    publish(audit, 4, 2.5, key="k", rank=1)  # keyed: the home may release it after the unsubscribe
    audit.unsubscribed("churn", 3.0)
    assert audit.owed() == [("churn", 1)]
    audit.deliver("churn", note(1, 3.2))
    audit.deliver("churn", note(2, 3.2))
    audit.ended["churn"] = "closed"  # its iteration ended: asked for, no breach
    v = audit.verdict()
    assert v.ok, str(v)
    audit.deliver("churn", note(2, 3.3))
    assert audit.verdict().duplicated_pairs == [("churn", 2)]


def test_keyed_events_out_of_rank_order_are_disordered_per_receiver_and_key() -> None:
    audit = Audit()
    subscribe(audit, "s")
    expr = "price < 100"
    audit.group("g", expr, parse_subscription(expr, LOCAL.schema))
    audit.instance("g.1", "g")
    audit.instance("g.2", "g")
    audit.subacked("g.1", 1.0)
    for q, (key, rank) in enumerate([("a", 1), ("a", 2), ("b", 1), ("a", 3)], start=1):
        publish(audit, q, 1.0 + q, key=key, rank=rank)
    # s: key a in order (1, 2, 3) with key b between; the group: a's rank 2 to
    # one instance after rank 3 to the other.
    for q, t in ((1, 6.0), (3, 6.1), (2, 6.2), (4, 6.3)):
        audit.deliver("s", note(q, t))
    audit.deliver("g.1", note(1, 6.0))
    audit.deliver("g.2", note(4, 6.1))
    audit.deliver("g.1", note(2, 6.2))
    audit.deliver("g.2", note(3, 6.3))
    v = audit.verdict()
    assert v.disordered == ["g key 'a': rank 2 (event 2, to g.1) after rank 3 (event 4, to g.2)"]
    assert not v.ok and "1 disordered" in str(v)
    assert audit.dump()["events"][4]["rank"] == 3


def test_an_ended_iteration_and_a_subscription_never_acknowledged_are_breaches() -> None:
    audit = Audit()
    subscribe(audit, "s")
    audit.subscription("never", "price < 100", parse_subscription("price < 100", LOCAL.schema))
    audit.ended["s"] = "ConnectionLost: gone"
    v = audit.verdict()
    assert v.ended == ["s: ConnectionLost: gone", "never: never subscribed (SubAck)"]
