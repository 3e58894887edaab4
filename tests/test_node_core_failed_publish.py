"""NodeCore: a Publish whose handling fails inside the core (node.outbox
rule 6) is answered ``internal_error`` and leaves nothing behind; the
publisher's retry under the same event id is a new event.  The cores and
``World`` in coreworld; the rest of the core's behaviour in test_node_core.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coreworld import World
from overlay.capture import CaptureBuffer
from overlay.messages import client as cm
from overlay.messages import peer as pm


class _FailingCapture(CaptureBuffer):
    """A capture buffer that fails when the event ``pub/bad`` reaches this
    node's own subscribers: a bug in the middle of one Publish's handling,
    put in from outside, after it has added actions (the Notification for the
    other node's subscriber, matched first) — not before any."""

    failing = True  # False: the bug is fixed, the publisher's retry goes through

    def deliver(self, event_id: str, sub_ids: Any, owners: Any, payload_bytes: int = 0) -> None:
        if event_id == "pub/bad" and self.failing:
            raise RuntimeError("a bug")
        super().deliver(event_id, sub_ids, owners, payload_bytes)


def _publish_run_world() -> tuple[World, int, list[cm.Publish]]:
    """Subscribers on node 1 (first) and on node 0, which holds the channel;
    a publisher on node 0 and its run, whose second event is ``pub/bad``."""
    w = World()
    w.subscribe(1, w.client(1, "far"), "s", "price < 1000")
    w.subscribe(0, w.client(0, "near"), "s", "price < 1000")
    sid = w.client(0, "pub")
    run = [cm.Publish(1, {"price": 1.0, "sym": "A"}), cm.Publish(2, {"price": 1.0, "sym": "BAD"}, event_id="bad")]
    run.append(cm.Publish(3, {"price": 2.0, "sym": "B"}))
    return w, sid, run


def _of_bad(acts: list[Any]) -> list[Any]:
    return [a for a in acts if getattr(a.msg, "event_id", None) == "pub/bad" or getattr(a.msg, "seq", None) == 2]


def test_a_publish_that_fails_in_a_run_is_its_own_failure(caplog):
    # Without the bug, the second Publish adds the Notification for node 1
    # before it reaches the local subscriber: the failure below comes after it.
    w, sid, run = _publish_run_world()
    fine = [type(a.msg) for a in _of_bad(w.cores[0].handle_publishes(sid, run, w.net.now))]
    assert fine[:2] == [pm.Notification, cm.Notify]
    w, sid, run = _publish_run_world()
    core = w.cores[0]
    core.capture = _FailingCapture(0)
    acts = core.handle_publishes(sid, run, w.net.now)
    # Rolled back: nothing of the failed Publish goes out, but its answer.
    of_bad = [a.msg for a in _of_bad(acts)]
    assert [type(m) for m in of_bad if type(m) is not cm.Error] == []  # no half-done Notification
    (bad,) = of_bad
    assert type(bad) is cm.Error and bad.seq == 2
    assert bad.code == cm.ErrorCode.INTERNAL and "RuntimeError: a bug" in bad.message
    assert core.stats["publish_errors"] == 1
    assert "failed handling Publish 2" in caplog.text
    # The others are served in full: delivered everywhere, then acknowledged.
    w.net.execute(0, acts)
    w.net.run()
    acked = {m.seq: m.event_id for m in w.net.received(0, sid, kind=cm.PubAck)}
    assert sorted(acked) == [1, 3]
    notified = sorted((node, m.event_id) for node, _, m in w.net.to_clients if type(m) is cm.Notify)
    assert notified == sorted((node, acked[seq]) for node in (0, 1) for seq in (1, 3))


def _run_timers(w: World, until: float) -> None:
    """Every node's ticks, a second apart, up to ``until`` seconds on: the
    outbox's re-sends and expiries (node.outbox rules 3, 4), the receipts."""
    start = w.net.now
    t = start
    while t < start + until:
        t += 1.0
        for node in w.cores:
            w.net.tick(node, t)
        w.net.run()


def test_a_publish_failing_after_its_event_went_to_a_peer_leaves_nothing_and_its_retry_is_new():
    """As below, the Publish through node 2, whose dispatch fails after it
    added the Event for the channel's owner (node 0): rolled back, the Event
    never leaves, nothing is kept to be re-sent; the retry is new."""
    w = World()
    w.subscribe(1, w.client(1, "far"), "s", "price < 1000")
    w.subscribe(0, w.client(0, "near"), "s", "price < 1000")
    sid = w.client(2, "pub")
    core = w.cores[2]
    real = core.outbox.dispatch
    failing = [True]

    def dispatch(ev: pm.Event, out: list[Any]) -> None:
        real(ev, out)
        if ev.event_id == "pub/bad" and failing[0]:
            assert [type(a.msg) for a in out] == [pm.Event]  # it went to node 0, then the bug
            raise RuntimeError("a bug")

    core.outbox.dispatch = dispatch
    bad = cm.Publish(1, {"price": 1.0, "sym": "BAD"}, event_id="bad")
    w.net.execute(2, core.handle_publishes(sid, [bad], w.net.now))
    w.net.run()
    _run_timers(w, core.config.cluster.event_ttl + 5)
    assert [(type(m), m.seq) for m in w.net.received(2, sid) if type(m) is not cm.Welcome] == [(cm.Error, 1)]
    assert [m for _, _, m in w.net.to_clients if type(m) is cm.Notify] == []
    assert len(core.outbox) == 0 and core.stats["events_resent"] == 0
    failing[0] = False
    mark = len(w.net.to_clients)
    w.net.execute(2, core.handle_publishes(sid, [msgspec.structs.replace(bad, seq=2)], w.net.now))
    w.net.run()
    _run_timers(w, 5.0)
    assert w.net.received(2, sid, since=mark) == [cm.PubAck(2, "pub/bad")]  # once
    got = sorted(node for node, _, m in w.net.to_clients[mark:] if type(m) is cm.Notify and m.event_id == "pub/bad")
    assert got == [0, 1]


def test_a_publish_answered_internal_error_leaves_nothing_and_its_retry_is_new():
    """node.outbox rule 6: a Publish answered internal_error is not kept, not
    re-sent, not PubAck'd, delivered nowhere, and its dedup mark is undone:
    sent again under the same event id, it is delivered once to each
    subscriber (this node's own too) and PubAck'd once.  Fails with
    Outbox.send keeping an event whose dispatch failed (node 1's subscriber
    then got it, its publisher a PubAck after its Error, node 0's never)."""
    w, sid, run = _publish_run_world()
    core = w.cores[0]
    capture = core.capture = _FailingCapture(0)
    w.net.execute(0, core.handle_publishes(sid, run, w.net.now))
    w.net.run()
    (err,) = w.net.received(0, sid, kind=cm.Error)
    assert err.seq == 2 and err.code == cm.ErrorCode.INTERNAL
    _run_timers(w, core.config.cluster.event_ttl + 5)  # past every re-send and the expiry
    assert [m.seq for m in w.net.received(0, sid, kind=cm.PubAck)] == [1, 3]
    assert [m.seq for m in w.net.received(0, sid, kind=cm.Error)] == [2]  # not undeliverable later either
    bad = [(node, s) for node, s, m in w.net.to_clients if type(m) is cm.Notify and m.event_id == "pub/bad"]
    assert bad == []
    assert "pub/bad" not in core.outbox and core.outbox.bytes == 0 and core.stats["events_resent"] == 0
    assert core.stats["events_in"] == 2 and core.stats["publish_errors"] == 1  # counted in only when handled
    # The publisher sends it again, the same event id: handled as new.
    capture.failing = False
    mark = len(w.net.to_clients)
    retry = msgspec.structs.replace(run[1], seq=4)
    w.net.execute(0, core.handle_publishes(sid, [retry], w.net.now))
    w.net.execute(0, core.end_batch())
    w.net.run()
    _run_timers(w, 5.0)  # a re-send, were it kept, is dropped as a duplicate: counted once all the same
    got = [(node, s, type(m).__name__) for node, s, m in w.net.to_clients[mark:] if type(m) is not cm.Notify]
    assert got == [(0, sid, "PubAck")]
    assert w.net.received(0, sid, since=mark, kind=cm.PubAck)[0] == cm.PubAck(4, "pub/bad")
    bad = sorted(node for node, _, m in w.net.to_clients[mark:] if type(m) is cm.Notify and m.event_id == "pub/bad")
    assert bad == [0, 1]
    assert core.stats["events_in"] == 3 and core.stats["duplicates_dropped"] == 0
