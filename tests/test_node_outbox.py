"""Nothing acknowledged is lost (SPEC §16; ``node.outbox``, ``node.dedup``) on three
sans-IO cores joined by CoreLink: the PubAck waits for the receipts, an owner
that dies is covered by the re-send to the channel's new owner, and the
copies the re-send makes are dropped by event id — every PubAck'd event
reaches every matching subscription exactly once.  Plus publisher-chosen ids
and the outbox's bound at the client protocol."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from coreworld import CONFIG, HIGH, SPLIT_500, World
from overlay.actions import ToPeer
from overlay.channels.channel import Channel
from overlay.channels.routing_table import RouteEntry
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.outbox import FULL_DELAY, RECEIPT_DELAY, RECEIPTS_BATCH
from overlay.testing.memory_link import MemoryLink

RESEND = CONFIG.cluster.resend_after


def high_on_node_2() -> tuple[World, int, int]:
    """Channel HIGH (price > 500) owned by node 2; a subscriber on node 0 and one on node 1."""
    w = World()
    ops = w.client(0, "ops")
    w.admin(0, ops, "split", **SPLIT_500)
    w.admin(0, ops, "place", channel="0.2", node=2)
    s0, s1 = w.client(0, "s0"), w.client(1, "s1")
    w.subscribe(0, s0, "a", "price > 600")
    w.subscribe(1, s1, "b", 'price > 600 and sym = "AB"')
    return w, s0, s1


def kill(w: World, node: int) -> None:
    """``node`` dies: what is queued to or from it is lost, and nothing more gets through."""
    for key in list(w.net.links):
        if node in key:
            w.net.links[key] = MemoryLink()
            w.net.links[key].paused = True


def recover(w: World, chid: object, dead: int, heir: int) -> None:
    """``heir`` takes ``dead``'s channel with the same subscriptions (as the
    recovery rebuilds it), and every live table names it."""
    old = w.cores[dead].local[chid]
    ch = Channel(old.id, old.space, w.cores[heir].schema)
    for sub in old:
        ch.add(sub)
    w.cores[heir].local.add(ch)
    for i, core in w.cores.items():
        if i != dead:
            core.routing.set(old.id, RouteEntry(old.space, (heir,)))


def test_the_pub_ack_waits_for_every_subscribers_access_node() -> None:
    w, _s0, s1 = high_on_node_2()
    pub = w.client(1, "pub")
    net = w.net
    net.pause(2, 0)  # the notification to node 0 waits
    mark, seen = len(net.trace), len(net.to_clients)
    eid = w.publish(1, pub, {"price": 700.0, "sym": "AB"})
    net.run()
    assert net.received(1, pub, since=seen, kind=cm.PubAck) == []  # node 1's own client has it; node 0 not yet
    assert net.received(1, s1, since=seen, kind=cm.Notify) != []
    net.release()
    net.run()
    assert [a.event_id for a in net.received(1, pub, since=seen, kind=cm.PubAck)] == [eid]
    # The owner notified other nodes only: each reports the match as it
    # confirms (node 1's own report is a call), naming every node notified.
    assert net.types(mark) == [
        (1, 2, "Event"),
        (2, 1, "Notification"),
        (2, 0, "Notification"),
        (0, 1, "EventsMatched"),
    ]
    matched = next(m for _, _, m in net.trace[mark:] if isinstance(m, pm.EventsMatched))
    assert matched.event_ids == (eid,) and sorted(matched.nodes[0]) == [0, 1]  # every node notified but the owner
    assert w.notifies() == w.expected()


def test_an_owner_that_dies_is_covered_by_the_re_send_and_each_subscription_gets_each_event_once() -> None:
    w, s0, s1 = high_on_node_2()
    pub = w.client(1, "pub")
    net = w.net
    # e1: node 2 matches it; its notification reaches node 1, the one to node 0 dies with it.
    net.pause(2, 0)
    e1 = w.publish(1, pub, {"price": 700.0, "sym": "AB"})
    net.run()
    assert len(net.received(1, s1, kind=cm.Notify)) == 1
    kill(w, 2)
    # e2: accepted after node 2 died, lost on the way to it.  e3 matches nothing there.
    e2 = w.publish(1, pub, {"price": 800.0, "sym": "AB"})
    e3 = w.publish(1, pub, {"price": 900.0, "sym": "ZZ"})
    net.run()
    assert net.received(1, pub, kind=cm.PubAck) == []  # none is confirmed: nothing is acknowledged
    # The first re-send still goes to node 2 (the table says so): lost too.
    net.tick(1, RESEND)
    net.run()
    assert w.cores[1].stats["events_resent"] == 3 and net.received(1, pub, kind=cm.PubAck) == []
    # Node 0 takes node 2's channel, and the next re-send finds it there.
    recover(w, HIGH, dead=2, heir=0)
    net.tick(1, 3 * RESEND)
    net.run()
    assert {a.event_id for a in net.received(1, pub, kind=cm.PubAck)} == {e1, e2, e3}
    assert len(w.cores[1].outbox) == 0
    # Exactly once per matching subscription: node 1's copy of e1 was dropped as a duplicate.
    assert w.cores[1].stats["duplicates_dropped"] == 1
    assert w.notifies() == w.expected()
    assert w.notifies() == Counter(
        {
            (0, s0, e1, frozenset({"a"})): 1,
            (0, s0, e2, frozenset({"a"})): 1,
            (0, s0, e3, frozenset({"a"})): 1,
            (1, s1, e1, frozenset({"b"})): 1,
            (1, s1, e2, frozenset({"b"})): 1,
        }
    )


def test_a_subscribers_access_node_that_dies_is_not_waited_for() -> None:
    w, _s0, _s1 = high_on_node_2()
    pub = w.client(1, "pub")
    kill(w, 0)
    w.publish(1, pub, {"price": 700.0, "sym": "AB"})
    w.net.run()
    assert w.net.received(1, pub, kind=cm.PubAck) == []
    out: list = []
    w.cores[1].recovery.node_dead(0, 10.0, out, reassign=False)  # a majority declared it dead (node.liveness)
    w.net.execute(1, out)
    assert len(w.net.received(1, pub, kind=cm.PubAck)) == 1


def test_a_publisher_chosen_id_sent_twice_is_delivered_once() -> None:
    w, _s0, _s1 = high_on_node_2()
    net = w.net
    pub = w.client(1, "pub")
    values = {"price": 700.0, "sym": "AB"}
    net.client_send(1, pub, cm.Publish(1, values, event_id="e-1"))
    net.client_send(1, pub, cm.Publish(2, values, event_id="e-1"))  # again, while kept: joins the first
    net.run()
    assert [(a.seq, a.event_id) for a in net.received(1, pub, kind=cm.PubAck)] == [(1, "pub/e-1"), (2, "pub/e-1")]
    assert w.cores[1].stats["publishes_rejoined"] == 1 and w.cores[1].stats["events_in"] == 1
    # After a lost connection, to another node: a new event at the access node, the same one for subscribers.
    other = net.open_client(0, "pub")
    net.client_send(0, other, cm.Publish(3, values, event_id="e-1"))
    net.run()
    assert [a.event_id for a in net.received(0, other, kind=cm.PubAck)] == ["pub/e-1"]
    notes = [m.event_id for _, _, m in net.to_clients if isinstance(m, cm.Notify)]
    assert Counter(notes) == Counter({"pub/e-1": 2})  # s0 once, s1 once
    assert w.cores[0].stats["duplicates_dropped"] + w.cores[1].stats["duplicates_dropped"] == 2


def test_a_chosen_id_must_be_plain() -> None:
    w = World()
    net = w.net
    ok, anon = net.open_client(1, "pub"), net.open_client(1, "bad client")
    for seq, sid, eid in ((1, ok, "a b"), (2, ok, "x/y"), (3, ok, "é"), (4, anon, "fine")):
        net.client_send(1, sid, cm.Publish(seq, {"price": 1.0, "sym": "A"}, event_id=eid))
        (err,) = [m for m in net.received(1, sid) if getattr(m, "seq", None) == seq]
        assert isinstance(err, cm.Error) and err.code == cm.ErrorCode.BAD_EVENT, err
    assert w.cores[1].stats["rejected_bad_event"] == 4 and w.cores[1].stats["events_in"] == 0


def test_a_full_outbox_answers_choke() -> None:
    cluster = msgspec.structs.replace(CONFIG.cluster, outbox_limit=2)
    w = World(start=False)
    for core in w.cores.values():
        core.ctx.config = msgspec.structs.replace(CONFIG, cluster=cluster)
        core.outbox.limit = 2
    w.net.start()
    pub = w.client(1, "pub")
    for seq in (1, 2, 3):
        w.net.client_send(1, pub, cm.Publish(seq, {"price": 1.0, "sym": "A"}))
    assert w.net.received(1, pub, kind=cm.Choke) == [cm.Choke(3, FULL_DELAY)]
    assert w.cores[1].stats["choked_outbox_full"] == 1
    w.net.run()
    assert [a.seq for a in w.net.received(1, pub, kind=cm.PubAck)] == [1, 2]


def test_receipts_wait_while_the_node_is_busy_unless_due() -> None:
    """node.outbox rule 5: the shell's dispatcher says whether its inbox is empty."""
    core = World().cores[2]
    out: list = []
    core.ctx.now = 10.0
    core.receipts.delivered(1, "1-1", out)
    assert out == [] and core.end_batch(idle=False) == []
    assert core.receipts_due_in(10.0) == pytest.approx(RECEIPT_DELAY)
    assert core.end_batch() == [ToPeer(1, pm.EventsDelivered(("1-1",)))]  # idle: at once
    assert core.receipts_due_in(10.0) is None
    core.receipts.delivered(1, "1-2", out)
    core.ctx.now += RECEIPT_DELAY  # busy, but the oldest has waited long enough
    assert core.end_batch(idle=False) == [ToPeer(1, pm.EventsDelivered(("1-2",)))]
    for i in range(RECEIPTS_BATCH):  # busy, but a frame's worth waits
        core.receipts.delivered(0, f"0-{i}", out)
    (sent,) = core.end_batch(idle=False)
    assert isinstance(sent.msg, pm.EventsDelivered) and len(sent.msg.event_ids) == RECEIPTS_BATCH


# -- the publisher remembered for a group's late undeliverable (node.clients, node.notify rule 4) ----------


def test_an_event_complete_at_once_without_a_group_delivery_leaves_no_publisher_entry() -> None:
    """Owner, subscriber and publisher on one node: the PubAck comes in the
    publish's own call and nothing can come back for the event, so the node
    keeps no (session, seq) for it; an event of a remote owner keeps one."""
    w = World()
    sub = w.client(0, "sub")
    w.subscribe(0, sub, "s", "price < 100")
    pub0, pub1 = w.client(0, "p0"), w.client(1, "p1")
    local = w.publish(0, pub0, {"price": 1.0, "sym": "A"})
    assert [m.event_id for m in w.net.received(0, pub0, kind=cm.PubAck)] == [local]
    assert w.cores[0].ordering.recent_publish(local) is None
    remote = w.publish(1, pub1, {"price": 2.0, "sym": "A"})  # EC's owner is node 0
    (seq,) = [s for (n, sid, s), e in w.published.items() if e == remote]
    assert w.cores[1].ordering.recent_publish(remote) == (pub1, seq)
    w.net.run()
    assert w.notifies()[(0, sub, local, frozenset({"s"}))] == 1


def test_a_group_undeliverable_after_a_local_pub_ack_still_reaches_the_publisher() -> None:
    """The owner is the publisher's node and the only group instance declines
    the event after its PubAck went: the publisher still hears it is
    undeliverable, with its publish's seq (the group delivery was tracked,
    so the publisher was remembered)."""
    w = World()
    inst = w.client(0, "inst")
    seq = w.seq()
    w.net.client_send(0, inst, cm.Subscribe(seq, "g1", "price < 100", group="g"))
    w.net.run()
    w.assert_replied(0, inst, cm.SubAck, seq)
    pub = w.client(0, "pub")
    eid = w.publish(0, pub, {"price": 1.0, "sym": "A"})
    w.net.run()
    (note,) = [m for m in w.net.received(0, inst, kind=cm.Notify) if m.event_id == eid]
    assert note.tag
    (pub_seq,) = [s for (n, sid, s), e in w.published.items() if e == eid]
    assert w.cores[0].ordering.recent_publish(eid) == (pub, pub_seq)
    w.net.client_send(0, inst, cm.Ack(eid, tag=note.tag, declined=True))
    w.net.run()
    got = w.net.received(0, pub)
    acks = [i for i, m in enumerate(got) if isinstance(m, cm.PubAck) and m.event_id == eid]
    errors = [i for i, m in enumerate(got) if isinstance(m, cm.Error) and m.code == cm.ErrorCode.UNDELIVERABLE]
    assert len(acks) == 1 and len(errors) == 1 and acks[0] < errors[0]
    assert got[errors[0]].seq == pub_seq and eid in got[errors[0]].message
