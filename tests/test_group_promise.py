"""A group's copy of an unkeyed event and the publisher's PubAck (SPEC §16, §11).

Sans-IO node cores (``coreworld``, ``test_keyhome.Cluster`` for a death,
``test_restart`` for a restart).  A PubAck promises the event reaches one
instance of each matching group even if any single node other than the
instance's access node dies.

* Fault seed 3467: an owner (also the publisher's access node) whose outbox
  re-sent the event while the group's copy was still on its way: the match
  again skipped the group (its copy in flight, ``node.groups`` rule 10) and
  reported no other access node, so the event was PubAck'd at once; the owner
  then rejoined as a new run and the copy died with the old one.
* Fault seed 1990 (on code of 9cd9c66): the copy reached its access node (so
  the event was PubAck'd) and failed there, and the failed answer died with
  the owner's run (paused, declared dead, rejoined): nobody gave the event to
  another instance (``node.failed_copies``).
"""

from __future__ import annotations

from collections import Counter

import pytest

from coreworld import CONFIG, EC, World
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.choices import GroupChoices
from overlay.node.context import NodeContext
from overlay.testing.corelink import CoreLink
from test_keyhome import Cluster, event
from test_restart import incarnated_world, restart

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


def _instances(net: CoreLink, nodes: tuple[int, int] = (1, 1)) -> dict[str, tuple[int, int]]:
    """Instances a and b of group g (on ``nodes``), every event in channel 0.0 (node 0)."""
    out: dict[str, tuple[int, int]] = {}
    for name, node in zip("ab", nodes, strict=True):
        sid = net.open_client(node, f"inst-{name}")
        net.client_send(node, sid, cm.Subscribe(1, "g", "price >= 0", group="g"))
        out[name] = (node, sid)
    return out


def _notified(net: CoreLink, inst: dict[str, tuple[int, int]], eid: str) -> list[tuple[str, cm.Notify]]:
    return [
        (n, m) for n, (node, sid) in inst.items() for m in net.received(node, sid, kind=cm.Notify) if m.event_id == eid
    ]


def _published_and_declined(net: CoreLink, inst: dict[str, tuple[int, int]]) -> tuple[str, int, str]:
    """An event published through node 2, PubAck'd, its copy declined by its
    instance; the failed answer held on 1→0.  Returns (event id, publisher, instance)."""
    pub = net.open_client(2, "pub")
    net.client_send(2, pub, cm.Publish(1, event(1), 0.0, event_id="e1"))
    net.run()
    eid = "pub/e1"
    assert [a.event_id for a in net.received(2, pub, kind=cm.PubAck)] == [eid]  # the copy reached node 1
    ((name, note),) = _notified(net, inst, eid)
    net.hold_types(pm.NotificationAck, src=1, dst=0)
    node, sid = inst[name]
    net.client_send(node, sid, cm.Ack(eid, 0.0, note.tag, declined=True))
    net.run()
    assert [type(m) for _, _, m in net.pending(1, 0)] == [pm.NotificationAck]
    return eid, pub, name


def _taken(net: CoreLink, inst: dict[str, tuple[int, int]], eid: str) -> Counter[str]:
    """Every copy of ``eid`` after the declined one, taken by its client: how many each instance took."""
    taken: set[tuple[str, int]] = set()
    for _ in range(10):
        fresh = [(n, m) for n, m in _notified(net, inst, eid)[1:] if (n, m.tag) not in taken]
        if not fresh:
            break
        for n, m in fresh:
            node, sid = inst[n]
            net.client_send(node, sid, cm.Ack(eid, 0.0, m.tag))
            taken.add((n, m.tag))
        net.run()
    return Counter(n for n, _ in taken)


def test_a_copy_failed_back_to_an_owner_that_died_goes_to_the_channels_new_owner():
    """Fault seed 1990's shape: the owner dies with the failed answer; node 1,
    the instance's access node, sends the event to the recovered channel's owner."""
    cl = Cluster()
    net = cl.net
    inst = _instances(net)
    net.run()
    eid, _, _ = _published_and_declined(net, inst)
    cl.ack()  # (the declined copy counts as answered)
    cl.autoack.update(inst.values())  # every copy from now on is taken
    cl.crash(0)
    net.release()
    cl.run_until(net.now + 6.0)
    again = _notified(net, inst, eid)[1:]
    assert len(again) == 1, again  # one instance of the group took it, once
    assert net.cores[1].stats["group_copies_resent"] == 1
    assert net.errors == []


def test_a_copy_orphaned_at_its_access_node_and_failed_back_to_an_owner_that_died_goes_to_the_new_owner():
    """Fault seed 1990 itself: the instance's subscription was gone from its
    access node when the copy came (node.notify rule 3), and the failed answer,
    behind the unsubscription, died with the owner."""
    cl = Cluster()
    net = cl.net
    inst = _instances(net, nodes=(2, 1))
    net.run()
    cl.autoack.update(inst.values())
    pub = net.open_client(2, "pub")
    net.client_send(2, pub, cm.Publish(2, event(0), 0.0, event_id="e0"))
    cl.settle()
    assert [n for n, _ in _notified(net, inst, "pub/e0")] == ["a"]  # the group's next event is b's
    net.pause(1, 0)  # b's unsubscription, then the failed answer, die with node 0
    node, sid = inst["b"]
    net.client_send(node, sid, cm.Unsubscribe(2, "g"))
    net.client_send(2, pub, cm.Publish(1, event(1), 0.0, event_id="e1"))
    cl.settle()
    eid = "pub/e1"
    assert [a.event_id for a in net.received(2, pub, kind=cm.PubAck)] == ["pub/e0", eid]
    assert _notified(net, inst, eid) == []  # the owner chose b, gone from node 1: orphaned there
    assert net.cores[1].stats["notifications_orphaned"] == 1
    cl.crash(0)
    net.release()
    cl.run_until(net.now + 6.0)
    assert [n for n, _ in _notified(net, inst, eid)] == ["a"]
    assert net.cores[1].stats["group_copies_resent"] == 1
    assert net.errors == []


def test_a_copy_failed_back_to_an_owner_that_restarted_goes_to_its_new_run():
    """The same when the owner restarts before anyone declares it dead: its new
    run holds the channel again, and node 1 sends it the event."""
    w = incarnated_world()
    net = w.net
    inst = _instances(net)
    net.run()
    eid, _, _ = _published_and_declined(net, inst)
    restart(net, 0, incarnation=5000)  # what was on its links died with it
    net.release()
    net.run()
    assert sum(_taken(net, inst, eid).values()) == 1  # one instance of the group took it, once
    assert net.cores[1].stats["group_copies_resent"] == 1
    assert net.errors == []


def test_a_new_owner_told_one_instance_took_the_event_keeps_that_whatever_another_access_node_says():
    """node.groups rule 9: the instances' access nodes tell a new owner the dead
    one's choices in any order (Rebuild.groups); a copy that failed at one of
    them (sent again by node.failed_copies) must not turn the sticky choice
    away from the instance that took the event since, or the group gets it twice."""
    choices = GroupChoices(NodeContext(CONFIG, 0, 0), {})
    took = pm.GroupChoice("pub/e1", "g", "s39", True)
    failed = pm.GroupChoice("pub/e1", "g", "s51", False)
    choices.learn((took,), EC)
    choices.learn((failed,), EC)
    assert choices.get("pub/e1") == (EC, {"g": ("s39", True)})
    choices.remember("pub/e2", "g", "s51", EC)
    choices.remember("pub/e2", "g", "s52", EC)  # a replacement of a copy not taken
    assert choices.get("pub/e2") == (EC, {"g": ("s52", False)})


def test_the_access_node_keeps_a_group_copys_event_only_until_its_client_takes_it():
    """node.failed_copies rule 1: the payload is not held for the event's whole
    life once the group has the event; a plain copy is not kept at all."""
    w = World(3)
    inst = w.client(1, "inst")
    w.subscribe(1, inst, "a", "price >= 0", group="g")
    plain = w.client(1, "plain")
    w.subscribe(1, plain, "p", "price >= 0")
    eid = w.publish(2, w.client(2, "pub"), EVENT)
    w.net.run()
    kept = w.cores[1].failed_copies
    assert kept.keeps(eid)  # its instance has not answered
    (note,) = [m for m in w.net.received(1, inst, kind=cm.Notify) if m.event_id == eid]
    w.net.client_send(1, inst, cm.Ack(eid, 0.0, note.tag))
    w.net.run()
    assert not kept.keeps(eid)
    w.unsubscribe(1, inst, "a")
    other = w.publish(2, w.client(2, "pub2"), EVENT)
    w.net.run()
    assert not kept.keeps(other)
