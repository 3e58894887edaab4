"""overlay.node.router: the common case's own path (``Router.deliver_one``, an
unkeyed event that matched one plain subscription) gives what the general
one (``Router.deliver``) gives for the same match — the same actions, the
same receipts, the same counters — wherever the publisher and the subscriber
are; and ``Router.match`` takes it only for that case."""

from __future__ import annotations

from typing import Any

import pytest

from coreworld import EC, World
from overlay.actions import Action, ToClient, ToPeer
from overlay.messages import client as cm
from overlay.messages import peer as pm

VALUES = {"price": 10.0, "sym": "AB"}
OWNER = 0  # EC's owner: the initializer


def _deliver(general: bool, sub_node: int, pub_node: int) -> tuple[list[Action], list[Action], dict[str, int]]:
    """A fresh cluster with one subscription on ``sub_node``; an event of
    ``pub_node``'s matched on EC's owner and delivered by one path."""
    w = World()
    sid = w.client(sub_node, "sub")
    w.subscribe(sub_node, sid, "s", "price < 100")
    core = w.cores[OWNER]
    ch = core.ctx.local.get(EC)
    assert ch is not None
    ev = pm.Event("7-x1", VALUES, pub_node, pm.DispatchSign.EVENT_DISPATCHED, EC, 1.5, payload=b"\x00body")
    matched, _tested = ch.match(VALUES, pub_node)
    assert len(matched) == 1 and not matched[0].group
    before = dict(core.ctx.stats)
    out: list[Action] = []
    if general:
        core.router.deliver(ch, ev, matched, out)
    else:
        core.router.deliver_one(ch, ev, matched[0], out)
    stats = {k: v - before.get(k, 0) for k, v in core.ctx.stats.items() if v != before.get(k, 0)}
    return out, core.receipts.end_batch(), stats


@pytest.mark.parametrize("pub_node", [0, 1])
@pytest.mark.parametrize("sub_node", [0, 1, 2])
def test_one_plain_match_gives_what_the_general_path_gives(sub_node: int, pub_node: int) -> None:
    fast = _deliver(False, sub_node, pub_node)
    general = _deliver(True, sub_node, pub_node)
    assert fast == general
    out, receipts, stats = fast
    assert stats["notifications_out"] == 1
    if sub_node == OWNER:
        (note,) = out
        assert type(note) is ToClient and type(note.msg) is cm.Notify and note.msg.payload == b"\x00body"
        # Only the owner's own client: the owner reports the match (to a remote publisher's node).
        if pub_node != OWNER:
            assert [(type(a), a.node, type(a.msg)) for a in receipts if type(a) is ToPeer] == [
                (ToPeer, pub_node, pm.EventsMatched)
            ]
    else:
        (note,) = out
        assert type(note) is ToPeer and note.node == sub_node
        assert note.msg.confirm == (sub_node,) and note.msg.origin == pub_node
        assert receipts == []  # the subscribers' node reports it as it confirms


def _matches(w: World, node: int, sid: int, seq: int) -> Any:
    return [m for m in w.net.received(node, sid) if getattr(m, "seq", None) == seq]


def test_publish_to_a_local_subscriber_is_notified_and_acked_in_the_same_call() -> None:
    """End to end through the fast path: one Notify, then the PubAck, nothing kept."""
    w = World()
    sub = w.client(0, "sub")
    w.subscribe(0, sub, "s", "price < 100")
    pub = w.client(0, "pub")
    core = w.cores[0]
    acts = core.handle_client(pub, cm.Publish(w.seq(), VALUES, payload=b"p"), w.net.now)
    kinds = [(type(a), type(a.msg), a.session) for a in acts if type(a) is ToClient]
    assert kinds == [(ToClient, cm.Notify, sub), (ToClient, cm.PubAck, pub)]
    assert len(core.outbox) == 0


def test_open_session_ids_are_live_for_the_outbox_and_the_notifier() -> None:
    """``Sessions.open_ids`` (what the outbox and the notifier ask per PubAck
    and per Notify) follows sessions opened and closed after it was taken."""
    w = World()
    core = w.cores[0]
    ids = core.sessions.open_ids
    sid = w.client(0, "c")
    assert sid in ids and sid in core.sessions
    w.net.execute(0, core.client_closed(sid))
    assert sid not in ids and sid not in core.sessions
