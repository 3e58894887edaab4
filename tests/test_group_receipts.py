"""A group's copy of an unkeyed event and the publisher's PubAck (SPEC §16, §11).

Sans-IO node cores (``coreworld``).  A PubAck promises the event reaches one
instance of each matching group even if any single node other than the
instance's access node dies.  Fault seed 3467 of the simulation found an owner
(also the publisher's access node) whose outbox re-sent the event while the
group's copy was still on its way: the match again skipped the group (its copy
in flight, ``node.groups`` rule 10) and reported no other access node, so the
event was PubAck'd at once; the owner then rejoined as a new run and the copy
died with the old one.
"""

from __future__ import annotations

import pytest

from coreworld import World
from overlay.messages import client as cm
from overlay.messages import peer as pm

pytestmark = pytest.mark.timeout(60)

EVENT = {"price": 250.0, "sym": "AB", "qty": 10}


def _pubacks(w: World, node: int, sid: int) -> list[cm.PubAck]:
    return w.net.received(node, sid, kind=cm.PubAck)


def test_a_match_again_while_the_groups_copy_is_in_flight_waits_for_its_access_node():
    """Fault seed 3467: the re-sent event's report names the access node the
    group's copy is on its way to; the PubAck waits for that node."""
    w = World(3)
    inst = w.client(1, "inst")
    w.subscribe(1, inst, "a", "price >= 0", group="g")
    local = w.client(0, "local")
    w.subscribe(0, local, "p", "price >= 0")  # a plain subscriber on the owner, as in the seed
    # The copy node 0 (owner and publisher's access node) sends stays on the link 0→1.
    w.net.hold(lambda src, dst, m: src == 0 and dst == 1 and isinstance(m, pm.Notification))
    pub = w.client(0, "pub")
    eid = w.publish(0, pub, EVENT)
    w.net.run()
    c0 = w.cores[0]
    assert eid in c0.outbox and c0.groups.tracks(eid)
    # Not confirmed within resend_after: the outbox sends it again, and node 0 matches it again.
    w.net.tick(0, w.net.now + c0.config.cluster.resend_after + 0.01)
    w.net.run()
    assert c0.stats["events_resent"] == 1 and c0.stats["group_copy_in_flight"] == 1
    assert _pubacks(w, 0, pub) == []  # the copy has not reached node 1: no promise yet
    assert eid in c0.outbox
    w.net.release()
    w.net.run()
    assert [a.event_id for a in _pubacks(w, 0, pub)] == [eid]
    (note,) = [m for m in w.net.received(1, inst, kind=cm.Notify) if m.event_id == eid]
    w.net.client_send(1, inst, cm.Ack(eid, 0.0, note.tag))
    w.net.run()
    assert not c0.groups.tracks(eid)
    assert w.net.errors == []
