"""node.notify rule 3: a copy for a subscription gone from its access node is
answered failed to the channel's owner, even when that node no longer knows
the subscription was a group instance (its group id pruned).

Sans-IO node cores (``coreworld``).  Fault seeds 459 and 929 of the
simulation found it: the access node dropped such a group copy unanswered, the
owner handed the copy over still in flight when the channel moved, the
receiver crashed, and the PubAck'd event was lost for the group.
"""

from __future__ import annotations

from collections import Counter

import pytest

from coreworld import EC, World
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.notify import PRUNE_SECONDS

pytestmark = pytest.mark.timeout(60)

INSTANCES = ("a", "b")
EVENT = {"price": 250.0, "sym": "AB", "qty": 10}


def test_a_group_copy_for_an_instance_gone_and_forgotten_is_failed_back_to_its_owner():
    w = World(3)
    clients = {name: w.client(1, f"inst-{name}") for name in INSTANCES}
    for name, sid in clients.items():
        w.subscribe(1, sid, name, "price >= 0", group="g")
    # The owner's copy to the group's instance waits on the link 0→1.
    w.net.hold(lambda src, dst, m: src == 0 and dst == 1 and isinstance(m, pm.Notification))
    eid = w.publish(0, w.client(0, "pub"), EVENT)
    w.net.run()
    owner, access = w.cores[0], w.cores[1]
    assert owner.groups.tracks(eid)
    entry = owner.groups.choices.get(eid)
    assert entry is not None
    (chosen,) = [n for n, sid in clients.items() if w.gid(1, sid, n) == entry[1]["g"][0]]
    # Its instance leaves meanwhile, and its access node prunes the group ids
    # of subscriptions gone: the copy, when it comes, looks like a plain one.
    w.unsubscribe(1, clients[chosen], chosen, settle=False)
    w.net.run()
    access.notifier.prune(access.ctx.now + 2 * PRUNE_SECONDS)
    w.net.release()
    w.net.run()
    got: Counter[str] = Counter()
    for name, sid in clients.items():
        for m in w.net.received(1, sid, kind=cm.Notify):
            if m.event_id == eid:
                got[name] += 1
                w.net.client_send(1, sid, cm.Ack(eid, 0.0, m.tag))
    w.net.run()
    # The owner heard the copy failed and gave the event to the other instance.
    assert got == Counter({n: 1 for n in INSTANCES if n != chosen}), got
    assert owner.stats["group_redispatched"] == 1
    assert not owner.groups.tracks(eid)
    assert w.net.errors == []


def test_a_copy_failed_by_an_instance_that_had_taken_the_event_is_not_replaced():
    """Fault seed 1751: the instance took the event, then unsubscribed; its
    access node re-sent the event before the unsubscription reached the owner,
    which sent it to the same instance (node.groups rule 9); the access node,
    which had pruned what it knew of the instance, answered that copy failed
    (rule 3: the subscription is gone), and the owner gave the event to
    another instance of the group: a second one."""
    w = World(3)
    clients = {name: w.client(1, f"inst-{name}") for name in INSTANCES}
    for name, sid in clients.items():
        w.subscribe(1, sid, name, "price >= 0", group="g")
    eid = w.publish(2, w.client(2, "pub"), EVENT)
    w.net.run()
    got: Counter[str] = Counter()

    def answer() -> None:
        for name, sid in clients.items():
            for m in w.net.received(1, sid, kind=cm.Notify):
                if m.event_id == eid and (name, m.tag) not in seen:
                    seen.add((name, m.tag))
                    got[name] += 1
                    w.net.client_send(1, sid, cm.Ack(eid, 0.0, m.tag))
        w.net.run()

    seen: set[tuple[str, int]] = set()
    answer()
    (chosen,) = got
    owner = w.cores[0]
    entry = owner.groups.choices.get(eid)
    assert entry is not None and entry[1]["g"] == (w.gid(1, clients[chosen], chosen), True)  # taken
    # The instance leaves; its unsubscription waits on the link 1→0 (with all
    # that follows it), and its access node prunes what it knew of it.
    w.net.hold_types(pm.UnSubscription, src=1, dst=0)
    w.unsubscribe(1, clients[chosen], chosen, settle=False)
    w.net.run()
    access = w.cores[1]
    access.notifier.prune(access.ctx.now + 2 * PRUNE_SECONDS)
    again = pm.Event(eid, EVENT, 2, pm.DispatchSign.EVENT_DISPATCHED, EC, 1.0, payload=w.payloads[eid])
    w.net.send(2, 0, again)  # the publisher's access node re-sends it (node.outbox)
    w.net.run()
    w.net.release()
    w.net.run()
    answer()
    assert got == Counter({chosen: 1}), got  # the group had it: no other instance
    assert owner.stats["group_redispatched"] == 0
    assert not owner.groups.tracks(eid)
    assert w.net.errors == []
