"""overlay.node.outbox: an event that the dispatch of its own ``send`` tells
the outbox about — complete at once (a local owner, local subscribers), or
matched, confirmed or given a deferred error on the way — ends exactly as
one told the same right after ``send`` returned: the same actions, in the
same order, the same counters, what stays kept and what is sent again.
The outbox makes no record for the first (module doc); these tests hold
that path to the general one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from overlay.actions import Action, ToClient
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.outbox import Outbox
from test_outbox import EC, VALUES, Rig, acks

Step = Callable[[Outbox, str, list[Action]], object]


def _matched(*nodes: int, by: int = -1) -> Step:
    return lambda box, eid, out: box.matched(eid, nodes, out, by)


def _delivered(node: int) -> Step:
    return lambda box, eid, out: box.delivered(eid, node, out)


def _deferred(text: str) -> Step:
    return lambda box, eid, out: box.defer_error(eid, cm.ErrorCode.UNDELIVERABLE, text)


def _on_delivered(src: int) -> Step:
    return lambda box, eid, out: box.on_delivered(src, pm.EventsDelivered((eid,)), out)


SCENARIOS: dict[str, list[Step]] = {
    "nothing matched": [_matched()],
    "only local subscribers": [_matched(by=0)],
    "a remote subscriber's node, confirmed later": [_matched(1)],
    "a remote node confirms its own report": [_matched(1, by=1)],
    "confirmed before the report": [_delivered(1), _matched(1)],
    "confirmed by a batch": [_matched(1), _on_delivered(1)],
    "a deferred error, then complete": [_deferred("no instance of group 'g'"), _matched()],
    "two nodes, one confirms": [_matched(1, 2), _delivered(2)],
    "nothing": [],
}


def _run(steps: list[Step], *, inline: bool) -> tuple[Rig, list[Action], bool]:
    """Publish ``0-1`` (session 1, seq 7) with ``steps`` done inside its dispatch, or after it."""
    r = Rig(resend_after=1.0, ttl=10.0)
    out: list[Action] = []

    def dispatch(ev: pm.Event, o: list[Action]) -> None:
        r.sent.append(ev)
        if inline:
            for step in steps:
                step(r.outbox, ev.event_id, o)

    r.outbox.dispatch = dispatch
    r.ctx.now = 0.0
    ev = pm.Event("0-1", VALUES, 0, pm.DispatchSign.EVENT_DISPATCHED, EC, 0.0, payload=b"abc")
    complete = r.outbox.send(ev, 1, 7, out)
    if not inline:
        for step in steps:
            step(r.outbox, "0-1", out)
    return r, out, complete


def _state(r: Rig) -> tuple[object, ...]:
    box = r.outbox
    return (len(box), box.ids(), box.bytes, box.completed, box.waiting("0-1"), dict(r.ctx.stats))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_told_within_its_send_ends_as_told_right_after(name: str) -> None:
    steps = SCENARIOS[name]
    (a, out_a, complete_a), (b, out_b, _) = _run(steps, inline=True), _run(steps, inline=False)
    assert out_a == out_b
    assert _state(a) == _state(b)
    assert complete_a == (len(a.outbox) == 0)  # send says whether it completed
    # The rest of its life (rule 3, 4): re-sent alike while kept, told alike once given up.
    for t in (1.0, 3.0, 7.0, 10.0):
        later_a: list[Action] = []
        later_b: list[Action] = []
        a.outbox.tick(t, later_a)
        b.outbox.tick(t, later_b)
        assert later_a == later_b and len(a.sent) == len(b.sent)
    assert _state(a) == _state(b)


def test_an_event_complete_within_its_send_is_acked_and_leaves_nothing() -> None:
    r, out, complete = _run([_matched()], inline=True)
    assert complete and acks(out) == [(1, 7, "0-1")]
    assert len(r.outbox) == 0 and r.outbox.bytes == 0 and r.ctx.stats["events_confirmed"] == 1
    later: list[Action] = []
    r.outbox.tick(100.0, later)
    assert later == [] and len(r.sent) == 1  # no deadline was left behind
    r.outbox.matched("0-1", (), later)  # a second report is stale
    assert later == [] and r.ctx.stats["receipts_stale"] == 1


def test_a_deferred_error_within_the_send_comes_after_the_pub_ack() -> None:
    _, out, complete = _run([_deferred("no instance of group 'g'"), _matched()], inline=True)
    assert complete
    assert [(type(a.msg).__name__, a.msg.seq) for a in out if type(a) is ToClient] == [("PubAck", 7), ("Error", 7)]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_dispatch_that_fails_leaves_nothing_of_the_event(name: str) -> None:
    """Rule 6: its publisher is answered internal_error (node.clients), so
    the event is not kept — not re-sent, not acked, not expired later —
    whatever its dispatch told the outbox before it failed (a record made
    on the way is dropped too), ``unsent`` hears of it, and the same id sent
    again is handled as new.  Failed before: the event stayed kept, was
    re-sent and PubAck'd after the internal_error."""
    steps = SCENARIOS[name]
    r = Rig(resend_after=1.0, ttl=10.0)
    unsent: list[str] = []
    r.outbox.unsent = lambda eid, now: unsent.append(eid)

    def failing(ev: pm.Event, o: list[Action]) -> None:
        r.sent.append(ev)
        for step in steps:
            if step is steps[-1] and len(steps) > 1:
                break  # the last step would complete it: the failure comes first
            step(r.outbox, ev.event_id, o)
        raise RuntimeError("a bug")

    r.outbox.dispatch = failing
    r.ctx.now = 0.0
    ev = pm.Event("0-1", VALUES, 0, pm.DispatchSign.EVENT_DISPATCHED, EC, 0.0, payload=b"abc")
    with pytest.raises(RuntimeError):
        r.outbox.send(ev, 1, 7, [])  # what it added is dropped with the rest (node.clients)
    assert unsent == ["0-1"] and r.ctx.stats["events_in"] == -1  # counted in by node.clients, not here
    assert r.outbox.ids() == [] and r.outbox.bytes == 0 and r.outbox.waiting("0-1") == []
    assert r.outbox.completed == 0 and r.ctx.stats["events_confirmed"] == 0  # nor counted if it completed
    r.outbox.dispatch = lambda ev, o: r.sent.append(ev)
    out: list[Action] = []
    for t in (1.0, 3.0, 7.0, 10.0, 20.0):
        r.outbox.tick(t, out)
    later: list[Action] = []
    r.outbox.matched("0-1", (), later)  # a report of it is stale
    assert len(r.sent) == 1 and later == [] and acks(out) == []
    assert not [a for a in out if type(a) is ToClient and type(a.msg) is not cm.PubAck]  # no undeliverable either
    # Sent again, the same id: kept and acked as any new event.
    r.ctx.now = 20.0
    assert not r.outbox.send(ev, 1, 8, out)
    r.outbox.matched("0-1", (), out)
    assert acks(out) == [(1, 8, "0-1")] and r.outbox.bytes == 0 and len(r.outbox) == 0
