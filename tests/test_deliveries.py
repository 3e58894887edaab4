"""overlay.client.deliveries: one answer per Notify, and the group fence (rules 1–4), without a loop."""

from __future__ import annotations

from overlay.client.deliveries import Deliveries, Notification
from overlay.client.load_factor import BACKLOG_SHARE, LoadFactor
from overlay.messages import client as cm


def note(eid: str = "e1", tag: int = 0, subs: tuple[str, ...] = ("a", "b")) -> Notification:
    return Notification(eid, {"price": 1.0}, subs, tag=tag)


def test_one_ack_once_every_listed_subscription_took_it_with_the_highest_lf() -> None:
    d = Deliveries()
    n = note(tag=7)
    assert d.arrived(n, 2, group=False, conn=1, now=0.0) is None
    assert d.claim(n, 0.2, 1.0) == (True, None)
    ok, ack = d.claim(n, 0.6, 1.0)
    assert ok and ack == cm.Ack("e1", 0.6, 7, declined=False) and len(d) == 0


def test_a_copy_not_taken_makes_the_answer_a_decline() -> None:
    d = Deliveries()
    n = note(tag=3)
    d.arrived(n, 2, group=False, conn=1, now=0.0)
    assert d.dropped(n) is None
    assert d.claim(n, 0.1, 0.0) == (True, cm.Ack("e1", 0.1, 3, declined=True))


def test_a_notify_no_open_subscription_takes_is_declined_at_once() -> None:
    assert Deliveries().arrived(note(tag=4), 0, group=True, conn=1, now=0.0) == cm.Ack("e1", 0.0, 4, declined=True)


def test_a_revoked_group_copy_is_never_handed_over_and_answered_once() -> None:
    d = Deliveries()
    n = note(tag=9, subs=("g",))
    d.arrived(n, 1, group=True, conn=1, now=0.0)
    assert d.revoke(9, "e1") == cm.Ack("e1", 0.0, 9, declined=True)
    assert d.claim(n, 0.0, 0.1) == (False, None)  # skipped; nothing more to say
    assert len(d) == 0 and d.revoked == 1


def test_a_revoke_after_the_ack_or_of_an_unknown_copy_is_declined_safely() -> None:
    d = Deliveries()
    n = note(tag=5, subs=("g",))
    d.arrived(n, 1, group=True, conn=1, now=0.0)
    ok, ack = d.claim(n, 0.0, 0.1)
    assert ok and ack is not None and not ack.declined  # this Ack left first: the node takes it
    assert d.revoke(5, "e1").declined and d.revoked == 0


def test_a_group_copy_older_than_the_window_is_declined_not_handed() -> None:
    d = Deliveries()
    d.window = 2.0
    fresh, old = note("e1", 1, ("g",)), note("e2", 2, ("g",))
    d.arrived(fresh, 1, group=True, conn=1, now=0.0)
    d.arrived(old, 1, group=True, conn=1, now=0.0)
    assert d.claim(fresh, 0.3, 1.9)[0]
    ok, ack = d.claim(old, 0.3, 2.1)
    assert not ok and ack == cm.Ack("e2", 0.3, 2, declined=True)
    # A plain copy is never revoked, however old.
    plain = note("e3", 3, ("p",))
    d.arrived(plain, 1, group=False, conn=1, now=0.0)
    assert d.claim(plain, 0.0, 99.0)[0]


def test_a_lost_connection_voids_its_group_copies_only() -> None:
    d = Deliveries()
    g, p, other = note("e1", 1, ("g",)), note("e2", 2, ("p",)), note("e3", 3, ("g",))
    d.arrived(g, 1, group=True, conn=1, now=0.0)
    d.arrived(p, 1, group=False, conn=1, now=0.0)
    d.arrived(other, 1, group=True, conn=2, now=0.0)
    d.connection_lost(1)
    assert not d.claim(g, 0.0, 0.0)[0] and d.claim(p, 0.0, 0.0)[0] and d.claim(other, 0.0, 0.0)[0]


def test_a_backlog_that_outlasts_the_nodes_window_makes_lf_one() -> None:
    lf = LoadFactor()
    for k in range(10):
        lf.processed(0.025, k * 0.03)
    budget = 2.0
    limit = BACKLOG_SHARE * budget / 0.025  # 40 queued: 1 s of work, half the window
    assert lf.update(int(limit * 0.9), 10_000, 0.3, budget) < 1.0
    assert lf.update(int(limit * 1.1), 10_000, 0.3, budget) == 1.0
    assert lf.update(int(limit * 1.1), 10_000, 0.3) < 1.0  # without a window: the seed's formula alone
