"""node.sessions rule 4: a closed session's tracked deliveries fail once its
subscriptions have left it — a group copy offered again is never offered to
the session being closed.  Sans-IO node cores (``coreworld``)."""

from __future__ import annotations

import pytest

from coreworld import EC, World
from overlay.actions import ToClient
from overlay.messages import client as cm

pytestmark = pytest.mark.timeout(60)


def test_a_group_copy_failed_by_a_close_is_not_offered_to_the_closing_session_again() -> None:
    """Fault seed 821: the client held two instances of the group on one
    session, on the node that owns the channel; it closed the session with a
    copy unanswered.  The failed copy was offered again at once — to the
    other instance of the same session, still listed: a Notify to a session
    the node had just been told was closed."""
    w = World(3)
    assert w.net.owner_of(EC) == [0]
    sid = w.client(0, "two-instances")
    for name in ("a", "b"):
        seq = w.seq()
        w.net.client_send(0, sid, cm.Subscribe(seq, name, "price >= 0", group="g"))
        w.net.run()
        w.assert_replied(0, sid, cm.SubAck, seq)
    pub = w.client(0, "pub")
    eid = w.publish(0, pub, {"price": 250.0, "sym": "AB", "qty": 10})
    w.net.run()
    (copy,) = [m for m in w.net.received(0, sid, kind=cm.Notify) if m.event_id == eid]
    assert copy.tag, "a group copy is tracked"
    out = w.cores[0].client_closed(sid)  # unanswered: the copy fails
    assert not [a for a in out if isinstance(a, ToClient) and a.session == sid], out
    assert w.cores[0].stats["delivery_failed_closed"] == 1
