"""node.groups rule 10: a moving channel's group copies in flight go with it.

Sans-IO node cores (``coreworld``).  Channel 0.0 lives on node 0; the group's
instances are clients of node 1; the link 0→1 is held so that the copy node 0
sent is still in flight when the channel moves to node 2.  Fault seeds 1094
and 1533 of the simulation found what these pin down: the sender and the
receiver each picked another instance, and the group got the event twice.
Fault seed 427 found it again before the hand-over (<2> to <3>): the
receiver, matching the event again after the sender's choice had left,
picked an instance while the sender still tracked its copy.
"""

from __future__ import annotations

from collections import Counter

import pytest

from coreworld import EC, HIGH, LOW, SCHEMA, SPLIT_500, TIMEOUT, World
from overlay.channels.channel import Channel
from overlay.channels.space import EventSpace
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.deliveries import Delivery

pytestmark = pytest.mark.timeout(60)

INSTANCES = ("a", "b", "c")
EVENT = {"price": 250.0, "sym": "AB", "qty": 10}


def _setup() -> tuple[World, dict[str, int], int, str]:
    w = World(3)
    admin = w.client(0, "admin")
    clients = {name: w.client(1, f"inst-{name}") for name in INSTANCES}
    for name, sid in clients.items():
        w.subscribe(1, sid, name, "price >= 0", group="g")
    # The copy node 0 sends stays on the link 0→1 (held, with all that follows it).
    w.net.hold(lambda src, dst, m: src == 0 and dst == 1 and isinstance(m, pm.Notification))
    pub = w.client(0, "pub")
    eid = w.publish(0, pub, EVENT)
    w.net.run()
    w.net.hold(lambda *_: False)  # nothing more held; 0→1 stays paused
    assert w.net.paused() == [(0, 1)]
    assert w.cores[0].groups.tracks(eid)
    return w, clients, admin, eid


def _copies(w: World, clients: dict[str, int], eid: str) -> Counter[str]:
    """Notifies of ``eid`` per instance."""
    out: Counter[str] = Counter()
    for name, sid in clients.items():
        for m in w.net.received(1, sid, kind=cm.Notify):
            if m.event_id == eid:
                out[name] += 1
    return out


class Answers:
    """The instances' clients: each copy of the event answered once, declined
    by the instances named in ``decline`` (an overloaded client), else taken."""

    def __init__(self, w: World, clients: dict[str, int], eid: str) -> None:
        self.w, self.clients, self.eid = w, clients, eid
        self.decline: set[str] = set()
        self.taken: Counter[str] = Counter()
        self._done: set[tuple[int, int]] = set()

    def __call__(self) -> None:
        for name, sid in self.clients.items():
            for m in self.w.net.received(1, sid, kind=cm.Notify):
                if m.event_id == self.eid and (sid, m.tag) not in self._done:
                    self._done.add((sid, m.tag))
                    declined = name in self.decline
                    if not declined:
                        self.taken[name] += 1
                    self.w.net.client_send(1, sid, cm.Ack(self.eid, 0.0, m.tag, declined=declined))
        self.w.net.run()


def _move_to_2(w: World, admin: int) -> None:
    w.net.client_send(0, admin, cm.Admin(w.seq(), "place", {"channel": "0.0", "node": 2}))
    w.net.run()  # to <3>: the UpdateRoutingTable to node 1 waits behind the held copy


def test_the_sender_hands_its_copy_in_flight_to_the_receiver_which_replaces_it_alone():
    w, clients, admin, eid = _setup()
    _move_to_2(w, admin)
    c0, c2 = w.cores[0], w.cores[2]
    assert not c0.groups.tracks(eid) and c2.groups.tracks(eid)
    assert c0.stats["deliveries_handed_over"] == 1 and c2.stats["deliveries_adopted"] == 1
    # The receiver sent the copy again (link 2→1 is open): its instance declines it.
    first = _copies(w, clients, eid)
    assert sum(first.values()) == 1
    (chosen,) = first
    answer = Answers(w, clients, eid)
    answer.decline = {chosen}
    answer()
    # The receiver picked another instance, which takes it; then the sender's
    # held copy arrives at the declining instance (a copy not taken comes again).
    answer()
    w.net.release()
    w.net.run()
    answer()
    assert set(answer.taken.values()) == {1} and len(answer.taken) == 1, answer.taken  # one instance, once
    assert chosen not in answer.taken
    assert c0.stats["group_redispatched"] == 0  # the sender forgot the delivery: its copy's answer is stale
    assert c2.stats["group_redispatched"] == 1
    assert not c2.groups.tracks(eid)
    assert w.net.errors == []


def test_an_event_matched_again_after_its_instance_left_reaches_one_other_instance():
    """Fault seeds 1094/1533: the instance of the copy in flight unsubscribes,
    and the event comes to the receiver again (its access node re-sent it)."""
    w, clients, admin, eid = _setup()
    entry = w.cores[0].groups.choices.get(eid)
    assert entry is not None
    (chosen,) = [n for n, sid in clients.items() if w.gid(1, sid, n) == entry[1]["g"][0]]
    _move_to_2(w, admin)
    # Another event, dispatched by the receiver: its shares move on from the sender's.
    other = w.publish(0, w.client(0, "pub2"), {"price": 300.0, "sym": "CD", "qty": 5})
    w.net.run()
    Answers(w, clients, other)()
    w.unsubscribe(1, clients[chosen], chosen)  # gone from the channel (node 2) and its access node
    again = pm.Event(eid, EVENT, 0, pm.DispatchSign.EVENT_DISPATCHED, EC, 1.0, payload=w.payloads[eid])
    w.net.send(0, 2, again)  # queued behind nothing: 0→2 is open
    w.net.run()
    answer = Answers(w, clients, eid)
    answer()
    w.net.release()
    w.net.run()
    answer()
    assert sum(answer.taken.values()) == 1, answer.taken  # one instance of the group, once
    assert not w.cores[2].groups.tracks(eid) and not w.cores[0].groups.tracks(eid)
    assert w.net.errors == []


def test_a_delivery_without_groups_merges_one_with_groups():
    """node.deliveries rule 3: a keyed event's delivery without groups (its
    group tables shared and read-only) takes a handed-over one's groups."""
    ev = pm.Event("e1", EVENT, 0, pm.DispatchSign.EVENT_DISPATCHED, EC, 1.0, key="k", rank=1, home=0)
    mine = Delivery(ev, EC, groups=False)
    mine.waiting["p1"] = 1
    rec = pm.TrackedDelivery(ev, (pm.CopyInFlight("p2", 2),), (pm.GroupTries("g", ("i1",), ("i1", "i2")),))
    theirs = Delivery.from_wire(rec, Channel(EC, EventSpace.whole(SCHEMA), SCHEMA))
    mine.merge(theirs)
    assert mine.waiting == {"p1": 1, "p2": 2} and mine.tried == {"g": {"i1"}} and not mine.in_flight("g")
    other = Delivery(ev, EC, groups=False)
    assert other.tried == {}  # the shared empty tables were not written to


def _matched_again_before_the_hand_over() -> tuple[World, dict[str, int], str, str]:
    """Fault seed 427: the channel is at <2> (the receiver holds its
    subscriptions and the sender's choice, not taken), the chosen instance
    leaves, and the event comes to the receiver again before the hand-over."""
    w, clients, admin, eid = _setup()
    entry = w.cores[0].groups.choices.get(eid)
    assert entry is not None
    gid = entry[1]["g"][0]
    (chosen,) = [n for n, sid in clients.items() if w.gid(1, sid, n) == gid]
    w.net.hold_types(pm.ReplySubscriptionMove, src=2, dst=0)  # the sender stays at <2>
    w.net.client_send(0, admin, cm.Admin(w.seq(), "place", {"channel": "0.0", "node": 2}))
    w.net.run()
    assert sorted(w.net.paused()) == [(0, 1), (2, 0)]
    assert gid in w.cores[2].local[EC]
    w.unsubscribe(1, clients[chosen], chosen, settle=False)  # reforwarded by the sender to the receiver
    w.net.run()
    assert gid not in w.cores[2].local[EC]
    again = pm.Event(eid, EVENT, 0, pm.DispatchSign.EVENT_DISPATCHED, EC, 1.0, payload=w.payloads[eid])
    w.net.send(1, 2, again)
    w.net.run()
    return w, clients, chosen, eid


def test_a_receiver_leaves_a_gone_instances_copy_to_the_live_sender_until_its_hand_over():
    w, clients, chosen, eid = _matched_again_before_the_hand_over()
    c0, c2 = w.cores[0], w.cores[2]
    answer = Answers(w, clients, eid)
    answer()
    sent_by_receiver = sum(answer.taken.values())
    waited = c2.groups.tracks(eid)
    # <3> (the sender's copy still held on 0→1): the hand-over gives the receiver
    # that copy in flight; sent again, it fails (its instance left) and the
    # receiver, deciding alone now, gives the event to another instance.
    w.net.links[(2, 0)].paused = False
    w.net.run()
    answer()
    assert not c0.groups.tracks(eid)
    w.net.release()  # then the sender's own copy: failed back to a sender that forgot it
    w.net.run()
    answer()
    assert sum(answer.taken.values()) == 1 and chosen not in answer.taken, answer.taken  # one instance, once
    assert sent_by_receiver == 0 and waited  # before the hand-over the receiver waited for the sender
    assert c2.stats["group_copy_with_sender"] == 1 and c2.stats["deliveries_adopted"] == 1
    assert c2.stats["group_redispatched"] == 1 and c0.stats["group_redispatched"] == 0
    assert not c2.groups.tracks(eid)
    assert w.net.errors == []


def test_a_receiver_waiting_for_the_senders_copy_reports_no_match_the_publisher_could_take_as_whole():
    """node.groups rule 8: the receiver's match sent the group nothing (its copy
    is the sender's), so a report from it, naming no access node, would
    complete the event at its publisher's access node (node 0) while that copy
    is still held on 0→1 (fault seed 3467's shape)."""
    w, _, _, eid = _matched_again_before_the_hand_over()
    reports = [m for _, _, m in w.net.pending(2, 0) if isinstance(m, pm.EventsMatched) and eid in m.event_ids]
    assert reports == []
    assert eid in w.cores[0].outbox


def test_a_receiver_gives_a_gone_instances_copy_to_another_instance_when_the_sender_dies_first():
    """Fault seed 770's constraint: left to a sender that dies before its
    hand-over, the copy is not lost — the receiver picks another instance."""
    w, clients, chosen, eid = _matched_again_before_the_hand_over()
    c2 = w.cores[2]
    assert c2.groups.tracks(eid)
    out: list = []
    c2.groups.peer_down(0, c2.ctx.now, out)  # the sender is gone: its copy (held on 0→1) with it
    w.net.execute(2, out)
    w.net.run()
    answer = Answers(w, clients, eid)
    answer()
    assert sum(answer.taken.values()) == 1 and chosen not in answer.taken, answer.taken
    assert c2.stats["group_redispatched"] == 1
    assert not c2.groups.tracks(eid)
    assert w.net.errors == []


def test_a_receiver_stops_waiting_for_a_sender_that_called_the_move_off():
    """The sender rolls back past <2> (its receiver unreachable past the
    session's timeout, its answer held on 2→0): the copy stays the sender's,
    and the receiver's delivery waits for it no more."""
    w, clients, chosen, eid = _matched_again_before_the_hand_over()
    c0, c2 = w.cores[0], w.cores[2]
    assert c2.groups.tracks(eid)
    c0.ctx.unreachable.add(2)
    w.net.tick(0, w.net.now + 2 * TIMEOUT)
    c0.ctx.unreachable.discard(2)  # reachable again: its CompleteLoadBalance(aborted) goes out
    w.net.run()
    assert EC in c0.local and EC not in c2.local
    assert not c2.groups.tracks(eid)
    answer = Answers(w, clients, eid)
    w.net.release()
    w.net.run()
    answer()
    assert sum(answer.taken.values()) == 1 and chosen not in answer.taken, answer.taken
    assert not c0.groups.tracks(eid)
    assert w.net.errors == []


def test_a_split_childs_move_hands_over_only_the_deliveries_of_its_own_events():
    """Fault seed 1077: the parent's delivery of an event of the child that
    stays went with the other child's move; the receiver and the sender (which
    matched the re-sent event on the child it kept) each gave it to an instance."""
    w, clients, admin, eid = _setup()  # price 250, matched on 0.0; its copy held on 0→1
    w.net.client_send(0, admin, cm.Admin(w.seq(), "split", SPLIT_500))
    w.net.run()
    assert LOW in w.cores[0].local and HIGH in w.cores[0].local
    w.net.client_send(0, admin, cm.Admin(w.seq(), "place", {"channel": "0.2", "node": 2}))  # (500, 1000] moves
    w.net.run()  # to <3>: the UpdateRoutingTable to node 1 waits behind the held copy
    c0, c2 = w.cores[0], w.cores[2]
    assert LOW in c0.local and HIGH in c2.local
    assert c0.groups.tracks(eid) and not c2.groups.tracks(eid)  # the event lies in 0.1, which stayed
    answer = Answers(w, clients, eid)
    answer.decline = set(INSTANCES)  # every copy declined: the owner tries each instance once
    w.net.release()
    w.net.run()
    for _ in INSTANCES:
        answer()
    assert _copies(w, clients, eid) == Counter(dict.fromkeys(INSTANCES, 1))  # each instance once, from one owner
    assert c2.stats["deliveries_adopted"] == 0 and not c0.groups.tracks(eid)
    assert w.net.errors == []


def test_a_failed_copy_goes_to_no_instance_gone_from_the_channel_the_event_lies_in_now():
    """node.groups rule 4 (fault seed 739): the delivery of an event of a
    split channel's parent re-offered its copy to every instance it matched
    then, gone since or not: 13 of them, ~6 s each, past the drain."""
    w, clients, admin, eid = _setup()  # price 250 on 0.0; the copy to one instance held on 0→1
    entry = w.cores[0].groups.choices.get(eid)
    assert entry is not None
    (chosen,) = [n for n, sid in clients.items() if w.gid(1, sid, n) == entry[1]["g"][0]]
    others = [n for n in INSTANCES if n != chosen]
    gone = {w.gid(1, clients[n], n) for n in others}
    for n in others:  # the other instances leave; the owner hears it (1→0 is open)
        w.unsubscribe(1, clients[n], n, settle=False)
    w.net.run()
    w.net.client_send(0, admin, cm.Admin(w.seq(), "split", SPLIT_500))
    w.net.run()
    c0 = w.cores[0]
    assert EC not in c0.local and not gone & {s.id for s in c0.local[LOW]}
    mark = len(w.net.trace)
    answer = Answers(w, clients, eid)
    answer.decline = {chosen}
    w.net.release()
    w.net.run()
    answer()
    sent = [m for s, _, m in w.net.trace[mark:] if s == 0 and isinstance(m, pm.Notification) and m.event_id == eid]
    assert not [m for m in sent if gone & set(m.sub_ids)], sent  # no copy to an instance gone
    assert c0.stats["group_undeliverable"] == 1 and not c0.groups.tracks(eid)
    assert w.net.errors == []
