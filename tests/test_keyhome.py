"""Ordered keys and group dispatch across a node's death (overlay.node.keyhome,
node.groups rule 9, node.notify rule 5), on node cores joined by CoreLink.

A node that crashes is never ticked again and everything sent to or from it
is lost; the others declare it dead by heartbeats (the product's detector,
fast settings) and recover its channels.  Clients acknowledge every tracked
Notify as it comes (``autoack``), unless a test holds them."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from coreworld import _LOADED, EC
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.ordering import rendezvous_pair
from overlay.testing.corelink import CoreLink

pytestmark = pytest.mark.timeout(60)

INTERVAL, TIMEOUT = 0.25, 1.5
CONFIG = msgspec.structs.replace(
    _LOADED,
    cluster=msgspec.structs.replace(
        _LOADED.cluster, balancing=False, heartbeat_interval=INTERVAL, suspect_timeout=TIMEOUT
    ),
)


def key_with(home: int, backup: int) -> str:
    return next(k for k in (f"key{i}" for i in range(1000)) if rendezvous_pair(k, [0, 1, 2]) == (home, backup))


def event(i: int) -> dict[str, object]:
    return {"price": float(i), "sym": "AB", "qty": i}


class Cluster:
    """A CoreLink whose nodes can crash, with clients that ack what they get."""

    def __init__(self) -> None:
        self.net = CoreLink(CONFIG)
        self.net.start()
        self.dead: set[int] = set()
        self.autoack: set[tuple[int, int]] = set()
        self._acked = 0

    def crash(self, node: int) -> None:
        self.dead.add(node)
        self._drop()

    def _drop(self) -> None:
        for (a, b), link in self.net.links.items():
            if a in self.dead or b in self.dead:
                while len(link):
                    link.pop()

    def ack(self) -> int:
        """Every tagged Notify of an ``autoack`` session not acked yet is acked now."""
        net, n = self.net, 0
        while self._acked < len(net.to_clients):
            node, sid, m = net.to_clients[self._acked]
            self._acked += 1
            if isinstance(m, cm.Notify) and m.tag and (node, sid) in self.autoack and node not in self.dead:
                net.client_send(node, sid, cm.Ack(m.event_id, 0.0, m.tag))
                n += 1
        return n

    def settle(self) -> None:
        while True:
            self._drop()
            self.net.run()
            if not self.ack():
                return

    def run_until(self, t: float, step: float = 0.05) -> None:
        now = self.net.now
        while now < t:
            now = round(now + step, 6)
            for i in self.net.cores:
                if i not in self.dead:
                    self.net.tick(i, now)
            self.settle()

    def notified(self, node: int, sid: int) -> list[cm.Notify]:
        return self.net.received(node, sid, kind=cm.Notify)


def publish(cl: Cluster, node: int, sid: int, n: int, key: str = "", first: int = 0) -> list[str]:
    ids = []
    for i in range(first, first + n):
        cl.net.client_send(node, sid, cm.Publish(i + 1, event(i), 0.0, key, 0, f"e{i}"))
        ids.append(f"pub/e{i}")
    return ids


def pubacks(cl: Cluster, node: int, sid: int) -> Counter[str]:
    return Counter(m.event_id for m in cl.net.received(node, sid, kind=cm.PubAck))


# -- a key's home dies ---------------------------------------------------------------------------


@pytest.mark.parametrize("acked", [False, True], ids=["in flight, not acked", "acked, completion lost"])
def test_the_home_dies_holding_events_and_one_in_flight_its_backup_goes_on_in_order(acked: bool) -> None:
    cl = Cluster()
    net = cl.net
    key = key_with(home=2, backup=1)
    sub = net.open_client(1, "sub")
    assert any(isinstance(m, cm.SubAck) for m in net.request(1, sub, cm.Subscribe(1, "s", "price >= 0")))
    pub = net.open_client(0, "pub")
    if acked:  # the subscriber acks rank 1 but its completion never reaches the home
        cl.autoack.add((1, sub))
        net.hold(lambda a, b, m: b == 2 and isinstance(m, pm.NotificationAck) and m.code == "complete")
    ids = publish(cl, 0, pub, 5, key)
    cl.settle()
    assert pubacks(cl, 0, pub) == Counter(ids)  # home and backup hold all five
    assert [n.rank for n in cl.notified(1, sub)] == [1]  # one in flight, four held
    assert net.cores[1].ordering.home.copies.state(key) is not None
    cl.crash(2)
    net.release()
    cl.autoack.add((1, sub))
    cl.run_until(5.0)
    assert all(net.cores[i].liveness.is_dead(2) for i in (0, 1))
    notes = cl.notified(1, sub)
    assert [(n.event_id, n.rank) for n in notes] == [(e, r) for r, e in enumerate(ids, 1)]  # once each, in order
    assert pubacks(cl, 0, pub) == Counter(ids)
    home = net.cores[1].ordering
    assert home.sequencer.context(key) == ("WAITING", 6, 0)
    assert net.cores[1].stats["ordered_keys_taken_over"] == 1
    # More events of the key continue its ranks at the new home.
    ids2 = publish(cl, 0, pub, 2, key, first=5)
    cl.run_until(6.0)
    assert [n.rank for n in cl.notified(1, sub)] == [1, 2, 3, 4, 5, 6, 7]
    assert pubacks(cl, 0, pub) == Counter(ids + ids2)


def test_a_publish_sent_again_through_another_node_after_its_access_node_died_is_sequenced_once() -> None:
    cl = Cluster()
    net = cl.net
    key = key_with(home=2, backup=1)
    sub = net.open_client(1, "sub")
    net.request(1, sub, cm.Subscribe(1, "s", "price >= 0"))
    cl.autoack.add((1, sub))
    pub0 = net.open_client(0, "pub")
    ids = publish(cl, 0, pub0, 3, key)
    net.hold(lambda a, b, m: b == 0 and isinstance(m, pm.NotificationAck) and m.code == "sequenced")
    cl.settle()
    assert not pubacks(cl, 0, pub0)  # the verdicts are on their way when node 0 dies
    cl.crash(0)
    net.release()
    pub1 = net.open_client(1, "pub")  # the publisher sends them again through node 1, same ids
    publish(cl, 1, pub1, 3, key)
    cl.run_until(5.0)
    assert pubacks(cl, 1, pub1) == Counter(ids)
    assert [(n.event_id, n.rank) for n in cl.notified(1, sub)] == [(e, r) for r, e in enumerate(ids, 1)]
    assert net.cores[2].stats["ordered_duplicates"] == 3


# -- the owner of a keyed event's channel dies ------------------------------------------------------


@pytest.mark.parametrize("reached", [False, True], ids=["notification lost", "notification arrived"])
def test_the_owner_dies_with_a_keyed_event_in_flight_the_home_sends_it_again(reached: bool) -> None:
    cl = Cluster()
    net = cl.net
    assert net.owner_of(EC) == [0]
    key = key_with(home=2, backup=1)
    sub = net.open_client(1, "sub")
    net.request(1, sub, cm.Subscribe(1, "s", "price >= 0"))
    pub = net.open_client(1, "pub")
    if not reached:
        net.hold_types(pm.Notification, src=0, dst=1)
    ids = publish(cl, 1, pub, 4, key)
    cl.settle()
    assert pubacks(cl, 1, pub) == Counter(ids)
    assert [n.rank for n in cl.notified(1, sub)] == ([1] if reached else [])
    cl.crash(0)
    net.release()
    cl.autoack.add((1, sub))
    cl.run_until(5.0)
    (owner,) = [i for i in net.owner_of(EC) if i not in cl.dead]
    assert owner in (1, 2)
    assert [(n.event_id, n.rank) for n in cl.notified(1, sub)] == [(e, r) for r, e in enumerate(ids, 1)]
    assert net.cores[2].stats["ordered_redispatched"] >= 1


# -- a group's owner dies ------------------------------------------------------------------------------


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_a_groups_owner_dies_each_event_reaches_exactly_one_instance(keyed: bool) -> None:
    cl = Cluster()
    net = cl.net
    a = net.open_client(1, "inst-a")
    b = net.open_client(2, "inst-b")
    for node, sid in ((1, a), (2, b)):
        assert any(
            isinstance(m, cm.SubAck) for m in net.request(node, sid, cm.Subscribe(1, "g", "price >= 0", group="g"))
        )
        cl.autoack.add((node, sid))
    pub = net.open_client(1, "pub")
    # The owner's reports to the publisher's access node never arrive: every
    # event stays in its outbox and is sent again; a keyed one stays in
    # flight at its home (node 2), which sends it again.
    net.hold(lambda a, b, m: a == 0 and isinstance(m, (pm.EventsMatched, pm.NotificationAck)) and (b == 1 or keyed))
    key = key_with(home=2, backup=1) if keyed else ""
    ids = publish(cl, 1, pub, 6, key)
    cl.settle()
    first = Counter(n.event_id for node, sid in ((1, a), (2, b)) for n in cl.notified(node, sid))
    assert sum(first.values()) >= 1 and all(v == 1 for v in first.values())
    cl.crash(0)
    net.release()
    cl.run_until(6.0)
    got = Counter(n.event_id for node, sid in ((1, a), (2, b)) for n in cl.notified(node, sid))
    assert got == Counter(ids), got  # each event to exactly one instance
    assert pubacks(cl, 1, pub) == Counter(ids)
    if keyed:
        ranks = [n.rank for node, sid in ((1, a), (2, b)) for n in cl.notified(node, sid)]
        assert sorted(ranks) == list(range(1, 7))


def test_an_event_matched_again_goes_to_the_instance_it_went_to_and_is_not_delivered_twice() -> None:
    """node.groups rule 9 on a live owner: the same event id published again
    through another node is matched again; the owner's sticky choice sends it
    to the same instance, whose access node answers without delivering it."""
    cl = Cluster()
    net = cl.net
    inst = {1: net.open_client(1, "inst-a"), 2: net.open_client(2, "inst-b")}
    for node, sid in inst.items():
        net.request(node, sid, cm.Subscribe(1, "g", "price >= 0", group="g"))
        cl.autoack.add((node, sid))
    for n in range(4):  # the dispatcher alternates between the two instances
        p = net.open_client(0, f"p{n}")
        net.client_send(0, p, cm.Publish(1, event(1), 0.0, event_id="e1"))
        cl.settle()
        assert pubacks(cl, 0, p) == Counter(["p0/e1"] if n == 0 else [f"p{n}/e1"])
    first = [(node, n.event_id) for node, sid in inst.items() for n in cl.notified(node, sid)]
    assert len(first) == 4  # four publishers' ids: four events
    p = net.open_client(1, "p0")  # the first publisher again, through another node, same id
    net.client_send(1, p, cm.Publish(1, event(1), 0.0, event_id="e1"))
    cl.settle()
    assert pubacks(cl, 1, p) == Counter(["p0/e1"])
    got = [(node, n.event_id) for node, sid in inst.items() for n in cl.notified(node, sid)]
    assert got == first  # nothing delivered twice
    assert net.cores[0].stats["group_sticky"] == 1
    assert sum(net.cores[i].stats["tracked_duplicates_dropped"] for i in (1, 2)) == 1
