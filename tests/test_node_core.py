"""overlay.node.core.NodeCore: cores joined by in-memory links, no event loop.

SPEC §3 (initialisation), §4 (subscriptions, events, re-routing).  Operator
commands are in test_node_core_admin, migration with Reforward and its
failures in test_node_core_reforward; the cores and ``World`` in coreworld.
"""

from __future__ import annotations

import random
from collections import Counter

import msgspec
import pytest

from coreworld import CONFIG, EC, HIGH, LOW, SCHEMA, SPLIT_500, SUBSCRIPTIONS, World, random_events, spread
from overlay.actions import CloseClient, Notifies, ToClient, ToPeer
from overlay.channels import ChannelId, EventSpace, RouteEntry, parse_subscription
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node import NodeCore
from overlay.node.sessions import CLOSE_AT_ONCE

# -- initialisation (SPEC §3) -------------------------------------------------------------------


def test_initializer_creates_ec_and_is_ready_when_every_peer_replied():
    w = World(start=False)
    net, cores = w.net, w.cores
    assert not any(c.ready for c in cores.values())
    acts = cores[0].start(0.0)
    # EC at the table's first version: major 1, written by node 0 (channels.routing_table rule 5).
    init = pm.RoutingTableInit((pm.RouteItem(EC, RouteEntry(EventSpace.whole(SCHEMA), (0,)), 1 << 32),))
    assert acts == [ToPeer(1, init), ToPeer(2, init)]
    assert cores[0].local.ids() == [EC]
    assert cores[1].start(0.0) == [] and cores[2].start(0.0) == []
    net.execute(0, acts)
    assert net.step()[:2] == (0, 1)
    assert cores[1].ready and cores[1].has_table and not cores[0].ready
    assert cores[1].local.ids() == []
    assert net.step()[:2] == (0, 2)
    assert net.step() == (1, 0, pm.ReplyRoutingTableInit(1))
    assert not cores[0].ready  # still waiting for node 2
    assert net.step() == (2, 0, pm.ReplyRoutingTableInit(2))
    assert cores[0].ready
    assert net.step() is None
    assert net.routing_tables_equal()
    # A new channel created later by node 0 never reuses 0.0.
    assert cores[1].local.new_id() == ChannelId(1, 0)


def test_single_node_cluster_is_ready_at_once():
    w = World(1)
    assert w.cores[0].ready
    assert w.net.trace == []


def test_clients_get_not_ready_before_initialisation():
    w = World(start=False)
    sid = w.net.open_client(1, "early")
    (welcome,) = w.net.received(1, sid)
    assert welcome == cm.Welcome(1, sid, False, "local", CONFIG.groups.ack_timeout, CONFIG.cluster.max_payload)
    for msg in (cm.Publish(1, {"price": 1.0, "sym": "AB"}), cm.Subscribe(2, "s", "price < 5")):
        w.net.client_send(1, sid, msg)
        reply = w.net.received(1, sid)[-1]
        assert isinstance(reply, cm.Error) and reply.code == cm.ErrorCode.NOT_READY and reply.seq == msg.seq
    assert w.net.pending() == []
    # The initializer is not ready either until every peer answered.
    w.net.execute(0, w.cores[0].start(0.0))
    s0 = w.net.open_client(0, "early0")
    w.net.client_send(0, s0, cm.Publish(3, {"price": 1.0, "sym": "AB"}))
    assert w.net.received(0, s0)[-1].code == cm.ErrorCode.NOT_READY
    w.net.run()
    assert w.cores[0].stats["rejected_not_ready"] == 1 and w.cores[1].stats["rejected_not_ready"] == 2
    # Once ready, the same sessions are served (the PubAck once the owner,
    # node 0, reported the event matched: node.outbox).
    w.net.client_send(1, sid, cm.Publish(4, {"price": 1.0, "sym": "AB"}))
    w.net.run()
    assert isinstance(w.net.received(1, sid)[-1], cm.PubAck)


def test_first_client_message_must_be_hello():
    w = World()
    sid = w.cores[0].client_opened()
    acts = w.cores[0].handle_client(sid, cm.Publish(1, {"price": 1.0, "sym": "A"}), 0.0)
    assert len(acts) == 2
    assert isinstance(acts[0], ToClient) and acts[0].msg.code == cm.ErrorCode.PROTOCOL and acts[0].msg.fatal
    assert isinstance(acts[1], CloseClient) and acts[1].session == sid


def test_server_messages_from_a_client_close_it():
    w = World()
    sid = w.client(0, "c")
    acts = w.cores[0].handle_client(sid, cm.Welcome(0, 1, True), 0.0)
    assert [type(a) for a in acts] == [ToClient, CloseClient]
    assert acts[0].msg.fatal


def test_peer_hello_from_another_cluster_is_a_protocol_error():
    w = World()
    with pytest.raises(RemoteProtocolError, match="cluster"):
        w.cores[0].peer_hello(1, pm.PeerHello(1, "other"), 0.0)


def test_peer_without_a_table_gets_the_table_from_any_node_holding_one_on_hello():
    w = World()
    assert w.cores[0].peer_hello(1, pm.PeerHello(1, "local", True), 0.0) == []
    for node in (0, 1):  # not only the initializer: it may be the one that restarted
        (act,) = w.cores[node].peer_hello(2, pm.PeerHello(2, "local", False), 0.0)
        assert act.node == 2 and isinstance(act.msg, pm.RoutingTableInit) and act.msg.sync
        assert {i.ch_id for i in act.msg.routing_table} == {EC}
    # A node without a table has none to give.
    fresh = NodeCore(CONFIG, 1)
    assert fresh.peer_hello(2, pm.PeerHello(2, "local", False), 0.0) == []


# -- subscriptions (SPEC §4) -----------------------------------------------------------------------


def test_subscribe_is_acked_only_after_the_owner_applied_it():
    w = World()
    net = w.net
    sid = w.client(1, "c1")
    net.client_send(1, sid, cm.Subscribe(7, "s1", "price < 100"))
    assert net.received(1, sid, kind=cm.SubAck) == []
    gid = w.gid(1, sid, "s1")
    ((src, dst, msg),) = net.pending()
    assert (src, dst) == (1, 0)
    assert msg == pm.Subscription(
        gid, parse_subscription("price < 100", SCHEMA), "c1", 1, pm.DispatchSign.SUBSCRIBE_DISPATCHED, EC
    )
    net.step()  # the owner applies it ...
    assert gid in w.cores[0].local[EC]
    assert net.received(1, sid, kind=cm.SubAck) == []
    assert net.pending() == [(0, 1, pm.SubscriptionApplied(gid, EC, True))]
    net.step()  # ... and only its answer releases the SubAck
    assert net.received(1, sid, kind=cm.SubAck) == [cm.SubAck(7, "s1", 1)]


def test_subscribe_on_the_owner_is_acked_without_peer_traffic():
    w = World()
    sid = w.client(0, "c0")
    mark = len(w.net.trace)
    w.subscribe(0, sid, "s", "price < 5")
    assert w.net.trace[mark:] == []
    assert w.gid(0, sid, "s") in w.cores[0].local[EC]


def test_subscription_is_stored_in_every_channel_it_belongs_to():
    w = World()
    admin = w.client(0, "ops")
    spread(w, admin)
    sid = w.client(2, "c")
    w.subscribe(2, sid, "wide", 'price >= 400 and sym != "ZZ"')
    gid = w.gid(2, sid, "wide")
    reply = [m for m in w.net.received(2, sid) if isinstance(m, cm.SubAck)][-1]
    assert reply.channels == 3
    assert {c for c in (ChannelId(0, 3), ChannelId(0, 4), HIGH) if gid in w.stored(c)} == {
        ChannelId(0, 3),
        ChannelId(0, 4),
        HIGH,
    }
    w.subscribe(2, sid, "narrow", 'price >= 600 and sym = "AB"')
    gid2 = w.gid(2, sid, "narrow")
    assert [c for c in (ChannelId(0, 3), ChannelId(0, 4), HIGH) if gid2 in w.stored(c)] == [HIGH]


def test_duplicate_and_unknown_subscription_ids_are_refused():
    w = World()
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price < 5")
    w.net.client_send(1, sid, cm.Subscribe(50, "s", "price < 6"))
    assert w.net.received(1, sid)[-1].code == cm.ErrorCode.DUPLICATE_SUBSCRIPTION
    w.net.client_send(1, sid, cm.Unsubscribe(51, "nope"))
    assert w.net.received(1, sid)[-1].code == cm.ErrorCode.UNKNOWN_SUBSCRIPTION


def test_bad_expression_and_bad_event_are_answered_with_the_position():
    w = World()
    sid = w.client(1, "c")
    w.net.client_send(1, sid, cm.Subscribe(1, "s", "price >> 3"))
    err = w.net.received(1, sid)[-1]
    assert (err.code, err.seq, err.position, err.fatal) == (cm.ErrorCode.BAD_EXPRESSION, 1, 7, False)
    w.net.client_send(1, sid, cm.Publish(2, "{price: 10}"))
    err = w.net.received(1, sid)[-1]
    assert (err.code, err.seq, err.position) == (cm.ErrorCode.BAD_EVENT, 2, 10)
    assert "sym" in err.message
    w.net.client_send(1, sid, cm.Publish(3, {"price": 10.0}))
    err = w.net.received(1, sid)[-1]
    assert (err.code, err.seq) == (cm.ErrorCode.BAD_EVENT, 3) and "sym" in err.message
    w.net.client_send(1, sid, cm.Publish(4, {"price": 2000.0, "sym": "A"}))
    assert w.net.received(1, sid)[-1].code == cm.ErrorCode.BAD_EVENT
    assert w.net.pending() == []


def test_unsubscribe_is_acked_after_every_channel_dropped_it():
    w = World()
    admin = w.client(0, "ops")
    spread(w, admin)
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price > 300")
    gid = w.gid(1, sid, "s")
    holders = [c for c in (ChannelId(0, 3), ChannelId(0, 4), HIGH) if gid in w.stored(c)]
    assert len(holders) == 3
    seq = w.unsubscribe(1, sid, "s", settle=False)
    w.net.run()
    assert w.net.received(1, sid)[-1] == cm.UnsubAck(seq, "s")
    assert not any(gid in w.stored(c) for c in holders)
    pub = w.client(2, "p")
    w.publish(2, pub, {"price": 400.0, "sym": "AB"})
    w.net.run()
    assert w.notifies() == Counter()


def test_client_close_removes_its_subscriptions_everywhere():
    w = World()
    admin = w.client(0, "ops")
    spread(w, admin)
    sid = w.client(1, "leaving")
    w.subscribe(1, sid, "a", "price < 100")
    w.subscribe(1, sid, "b", "price >= 0")
    gids = {w.gid(1, sid, "a"), w.gid(1, sid, "b")}
    chans = [ChannelId(0, 3), ChannelId(0, 4), HIGH]
    assert any(gids & w.stored(c) for c in chans)
    stay = w.client(1, "staying")
    w.subscribe(1, stay, "c", "price >= 0")
    w.net.close_client(1, sid)
    del w.subs[(1, sid)]
    w.net.run()
    for c in chans:
        assert not gids & w.stored(c), c
        assert w.gid(1, stay, "c") in w.stored(c)
    assert sid not in w.cores[1].sessions
    mark = len(w.net.to_clients)
    pub = w.client(2, "p")
    w.publish(2, pub, {"price": 50.0, "sym": "AB"})
    w.net.run()
    assert [s for n, s, m in w.net.to_clients[mark:] if isinstance(m, cm.Notify)] == [stay]
    assert w.cores[1].stats["notifications_orphaned"] == 0  # gone at the owners, not only here


def test_a_big_session_is_unsubscribed_a_few_at_a_time_after_its_close():
    # node.sessions rule 4: a client holding 40,000 subscriptions held its
    # access node's loop 12.7 s when it left; now the first CLOSE_AT_ONCE go
    # at once and the rest with the shell's background steps.
    w = World()
    admin = w.client(0, "ops")
    spread(w, admin)
    sid = w.client(1, "big")
    n = CLOSE_AT_ONCE + 40
    for k in range(n):
        w.subscribe(
            1, sid, f"s{k}", f"price in [{k}, {k + 600}]" if k % 2 else f'price >= {k} and sym = "AB"', settle=False
        )
    w.net.run()
    core = w.cores[1]
    held = lambda: sum(len(ch) for c in w.cores.values() for ch in c.local)  # noqa: E731
    while core.background_step(1000, w.net.now)[0]:  # everything indexed first
        pass
    assert held() >= n and not core.index_wanted
    mark = len(w.net.trace)
    w.net.close_client(1, sid)
    w.net.run()
    unsubs = [m for src, _, m in w.net.trace[mark:] if src == 1 and isinstance(m, pm.UnSubscription)]
    assert core.sessions.closing == n - CLOSE_AT_ONCE and core.index_wanted
    assert len({m.sub_id for m in unsubs}) <= CLOSE_AT_ONCE  # some go to two channels
    steps = 0
    while True:
        more, acts = core.background_step(4, w.net.now)
        w.net.execute(1, acts)
        steps += 1
        if not more:
            break
    w.net.run()
    assert steps >= (n - CLOSE_AT_ONCE) // 4 and core.background_last.startswith("unsubscribing closed sessions")
    assert core.sessions.closing == 0 and not core.index_wanted
    assert held() == 0  # gone at every owner
    assert core.sessions.pending() == 0


# -- events and notifications (SPEC §4) --------------------------------------------------------------


def test_notify_sets_are_exactly_the_matching_subscriptions():
    w = World()
    admin = w.client(0, "ops")
    spread(w, admin)
    rng = random.Random(1)
    clients = [(n, w.client(n, f"c{n}{k}")) for n in range(3) for k in range(2)]
    for i, (node, sid) in enumerate(clients):
        for j, expr in enumerate(rng.sample(SUBSCRIPTIONS, 4)):
            w.subscribe(node, sid, f"s{i}{j}", expr)
    publishers = [w.client(n, f"p{n}") for n in range(3)]
    for k, values in enumerate(random_events(rng, 300)):
        node = k % 3
        w.publish(node, publishers[node], values)
    w.net.run()
    got, want = w.notifies(), w.expected()
    assert sum(want.values()) > 300  # the test means something
    assert got == want
    # Each event matched once, on the owner of its one channel.
    assert sum(c.stats["events_matched"] for c in w.cores.values()) == 300
    assert w.net.errors == []


def test_overlapping_subscriptions_of_one_client_give_one_notify():
    w = World()
    sid = w.client(1, "c")
    w.subscribe(1, sid, "a", "price < 100")
    w.subscribe(1, sid, "b", 'sym = "AB"')
    w.subscribe(1, sid, "c", "price > 900")
    pub = w.client(2, "p")
    eid = w.publish(2, pub, {"price": 5.0, "sym": "AB"})
    w.net.run()
    assert w.notifies() == Counter({(1, sid, eid, frozenset({"a", "b"})): 1})


# -- re-routing a DISPATCHED message whose channel left (SPEC §4) -----------------------------------------


def test_dispatched_to_a_split_channel_is_rerouted():
    w = World()
    net = w.net
    admin = w.client(0, "ops")
    sub_client = w.client(1, "c")
    # Node 1 does not hear of the split yet: its table still names 0.0.
    net.hold_types(pm.UpdateRoutingTable, src=0, dst=1)
    net.client_send(0, admin, cm.Admin(1, "split", SPLIT_500))
    net.run()
    assert net.paused() == [(0, 1)]
    assert list(net.cores[1].routing) == [EC] and EC not in w.cores[0].local
    w.subscribe(1, sub_client, "s", 'sym = "AB"', settle=False)
    w.subscribe(1, sub_client, "t", "price > 600", settle=False)
    eid = w.publish(1, sub_client, {"price": 700.0, "sym": "AB"})
    net.run()
    gid_s, gid_t = w.gid(1, sub_client, "s"), w.gid(1, sub_client, "t")
    assert gid_s in w.stored(LOW) and gid_s in w.stored(HIGH)
    assert gid_t in w.stored(HIGH) and gid_t not in w.stored(LOW)
    assert w.cores[0].stats["subscriptions_rerouted"] == 2
    assert w.cores[0].stats["events_rerouted"] == 1
    assert net.received(1, sub_client, kind=cm.SubAck) == []  # the answers wait behind the paused link
    net.release()
    net.run()
    acks = {m.sub_id: m for m in net.received(1, sub_client, kind=cm.SubAck)}
    assert acks["s"].channels == 2 and acks["t"].channels == 1
    # The event went to 0.2 by the re-route, matched once, after both subscriptions.
    assert w.notifies() == Counter({(1, sub_client, eid, frozenset({"s", "t"})): 1})
    assert net.routing_tables_equal()
    assert net.errors == []


def test_dispatched_to_a_moved_channel_is_rerouted_to_its_new_owner():
    w = World()
    net = w.net
    admin = w.client(0, "ops")
    w.admin(0, admin, "split", **SPLIT_500)
    w.admin(0, admin, "place", channel="0.2", node=2)
    sid = w.client(1, "c")
    w.subscribe(1, sid, "hi", "price > 600")
    # A stale DISPATCHED event and subscription reach the old owner.
    w.events["stale-1"] = {"price": 800.0, "sym": "Q"}
    f = parse_subscription("price > 900", SCHEMA)
    w.payloads["stale-1"] = b"rerouted \x00 whole"  # the reroute keeps the payload
    net.send(
        1,
        0,
        pm.Event(
            "stale-1", w.events["stale-1"], 1, pm.DispatchSign.EVENT_DISPATCHED, HIGH, payload=w.payloads["stale-1"]
        ),
    )
    net.send(1, 0, pm.Subscription("x:1", f, "c", 1, pm.DispatchSign.SUBSCRIBE_DISPATCHED, HIGH))
    net.send(1, 0, pm.UnSubscription("x:1", f, "c", 1, pm.DispatchSign.UNSUBSCRIBE_DISPATCHED, HIGH))
    mark = len(net.trace)
    net.run()
    assert (0, 2, "Event") in net.types(mark) and (0, 2, "Subscription") in net.types(mark)
    assert w.notifies() == Counter({(1, sid, "stale-1", frozenset({"hi"})): 1})
    assert "x:1" not in w.stored(HIGH)
    assert w.cores[2].stats["subscriptions_applied"] == 2  # "hi" and the stale one, each once
    assert w.cores[2].stats["unsubscriptions_applied"] == 1
    assert w.cores[0].stats["events_matched"] == 0


def test_event_bouncing_between_stale_tables_is_dropped_after_max_hops():
    w = World()
    # Node 1 claims 0.0 moved to itself; node 0 claims it moved to node 1: a loop.
    whole = EventSpace.whole(SCHEMA)
    ghost = ChannelId(9, 9)
    for i in (0, 1):
        w.cores[i].routing.apply([EC], [(ghost, RouteEntry(whole, (1 - i,)))])
    w.cores[0].local.remove(EC)
    w.net.send(2, 0, pm.Event("loop", {"price": 1.0, "sym": "A"}, 2, pm.DispatchSign.EVENT_DISPATCHED, EC))
    assert w.net.run() < 10
    assert w.cores[0].stats["events_unroutable"] + w.cores[1].stats["events_unroutable"] == 1


def test_sessions_with_the_same_local_ids_share_one_notify_object():
    """node.notify: one Notify object for the sessions whose matching
    subscriptions carry the same local ids — the shell encodes it once
    (net.clients rule 8); a session with other ids gets its own."""
    w = World()
    sids = [w.client(1, f"sub{i}") for i in range(3)]
    for sid in sids[:2]:
        w.subscribe(1, sid, "s1", "price >= 0")
    w.subscribe(1, sids[2], "other", "price >= 0")
    pub = w.client(0, "pub")
    mark = len(w.net.to_clients)
    w.publish(0, pub, {"price": 5.0, "sym": "AB", "qty": 1})
    w.net.run()
    got = {s: m for n, s, m in w.net.to_clients[mark:] if n == 1 and isinstance(m, cm.Notify)}
    assert set(got) == set(sids)
    assert got[sids[0]] is got[sids[1]] and got[sids[0]].sub_ids == ("s1",)
    assert got[sids[2]].sub_ids == ("other",)


def test_a_batch_handed_whole_to_a_core_is_its_messages_one_by_one_in_order():
    """node.peer_messages: a Batch (net.peer_link rule 7) the shell did not
    unpack is handled as its messages in order; one refused refuses it whole,
    before any of it is applied."""
    outcomes = []
    for batched in (False, True):
        w = World()
        sid = w.client(2, "sub")
        w.subscribe(2, sid, "s", "price < 100")
        evs = [
            pm.Event(f"x-{i}", {"price": float(i), "sym": "A"}, 1, pm.DispatchSign.EVENT_DISPATCHED, EC)
            for i in range(3)
        ]
        core = w.cores[0]
        if batched:
            acts = core.handle_peer(1, pm.Batch(tuple(evs)), w.net.now)
        else:
            acts = [a for ev in evs for a in core.handle_peer(1, ev, w.net.now)]
        outcomes.append(acts)
        assert core.stats["events_matched"] == 3
    assert outcomes[0] == outcomes[1]
    assert [a.msg.event_id for a in outcomes[1] if isinstance(a.msg, pm.Notification)] == ["x-0", "x-1", "x-2"]
    w = World()
    bad = pm.Event("bad", {"price": float("nan"), "sym": "A"}, 1, pm.DispatchSign.EVENT_DISPATCHED, EC)
    good = pm.Event("good", {"price": 1.0, "sym": "A"}, 1, pm.DispatchSign.EVENT_DISPATCHED, EC)
    with pytest.raises(RemoteProtocolError):
        w.cores[0].handle_peer(1, pm.Batch((good, bad)), w.net.now)
    assert w.cores[0].stats["events_matched"] == 0


# -- a run of publishes in one call (NodeCore.handle_publishes) ------------------------------------


def _mixed_run(seq0: int) -> list[cm.Publish]:
    """Publishes of every kind a session may send in a row: plain, as text,
    refused (bad values, unknown attribute, NaN, too large), with the
    publisher's id (and that id again), keyed."""
    big = CONFIG.cluster.max_payload + 1
    msgs = [
        cm.Publish(0, {"price": 10.0, "sym": "A"}, payload=b"p"),
        cm.Publish(0, '{price: 20, sym: "B"}'),
        cm.Publish(0, {"price": float("nan"), "sym": "A"}),
        cm.Publish(0, {"price": 1e308, "sym": "A"}),
        cm.Publish(0, {"price": 1.0, "sym": "A", "colour": "red"}),
        cm.Publish(0, {"price": 1.0, "sym": "A"}, payload=b"x" * big),
        cm.Publish(0, {"price": 30.0, "sym": "C"}, event_id="mine-1"),
        cm.Publish(0, {"price": 30.0, "sym": "C"}, event_id="mine-1"),
        cm.Publish(0, {"price": 31.0, "sym": "C"}, event_id="bad id"),
        cm.Publish(0, {"price": 40.0, "sym": "D"}, key="k1"),
        cm.Publish(0, {"price": 50.0, "sym": "E"}),
    ]
    return [msgspec.structs.replace(m, seq=seq0 + i) for i, m in enumerate(msgs)]


@pytest.mark.parametrize("node", [0, 1])  # the channel's owner, and another node
def test_a_run_of_publishes_in_one_call_does_what_each_would_alone(node):
    worlds = [World(), World()]
    sids = []
    for w in worlds:
        sub = w.client(2, "sub")
        w.subscribe(2, sub, "s", "price < 1000")
        sids.append(w.client(node, "pub"))
    run = _mixed_run(100)
    one, many = worlds
    alone = []
    for msg in run:
        alone.extend(one.cores[node].handle_client(sids[0], msg, one.net.now))
    batched = many.cores[node].handle_publishes(sids[1], run, many.net.now)
    assert batched == alone
    assert any(type(a.msg) is cm.Error for a in alone if type(a) is ToClient)
    for w, acts in ((one, alone), (many, batched)):
        w.net.execute(node, acts)
        w.net.execute(node, w.cores[node].end_batch())
        w.net.run()
    assert one.net.to_clients == many.net.to_clients
    assert one.cores[node].stats == many.cores[node].stats
    acked = {m.seq for m in many.net.received(node, sids[1], kind=cm.PubAck)}
    assert acked == {100, 101, 106, 107, 109, 110}  # the refused ones got their Error


def test_a_run_of_publishes_before_the_cluster_is_ready_is_refused_message_by_message():
    w = World(start=False)
    sid = w.net.open_client(1, "early")
    acts = w.cores[1].handle_publishes(sid, _mixed_run(1)[:3], 0.0)
    assert [(a.msg.seq, a.msg.code) for a in acts] == [(i, cm.ErrorCode.NOT_READY) for i in (1, 2, 3)]
    # A session not greeted yet: the first Publish closes it, as alone.
    raw = w.cores[1].client_opened()
    acts = w.cores[1].handle_publishes(raw, _mixed_run(1)[:2], 0.0)
    assert [type(a) for a in acts][:2] == [ToClient, CloseClient]


def test_a_run_of_peer_events_in_one_call_does_what_each_would_alone(caplog):
    worlds = [World(), World()]
    for w in worlds:
        sub = w.client(2, "sub")
        w.subscribe(2, sub, "s", "price < 1000")
    dispatched = pm.DispatchSign.EVENT_DISPATCHED
    events = [
        pm.Event("1-1-1", {"price": 1.0, "sym": "A"}, 1, dispatched, EC, 5.0, payload=b"a"),
        pm.Event("1-1-2", {"price": float("nan"), "sym": "A"}, 1, dispatched, EC, 5.0),  # refused: PeerError
        pm.Event("1-1-3", {"price": 2.0, "sym": "B"}, 1, dispatched, EC, 5.0),
    ]
    one, many = worlds
    alone = []
    for ev in events:
        try:
            alone.extend(one.cores[0].handle_peer(1, ev, one.net.now))
        except RemoteProtocolError as exc:  # what the shell's dispatcher answers
            alone.append(ToPeer(1, pm.PeerError("protocol_error", str(exc))))
    batched = many.cores[0].handle_peer_events(1, events, many.net.now)
    assert batched == alone
    assert [type(a.msg) for a in batched] == [pm.Notification, pm.PeerError, pm.Notification]
    assert "protocol error from peer 1" in caplog.text
    # From a run declared dead: every one dropped and counted.
    core = many.cores[0]
    core.liveness.dead[1] = 0  # node 1, its run 0
    assert core.handle_peer_events(1, events, many.net.now) == []
    assert core.stats["dropped_from_dead_peer"] == 3


def test_an_event_for_several_sessions_is_one_notifies_action():
    """node.notify rule 7: an unkeyed event matching subscriptions of several
    sessions of the access node is one Notifies action listing each session
    once, with its local ids (a subscription whose conjuncts both matched
    once: rule 6) — no ToClient, no Notify per session."""
    w = World()
    a, b, c, pub = (w.client(0, name) for name in ("a", "b", "c", "pub"))
    w.subscribe(0, a, "s1", "price < 100")
    w.subscribe(0, b, "s1", "price < 100")
    w.subscribe(0, c, "x", "price < 50")
    w.subscribe(0, c, "y", 'price < 100 or sym = "AB"')
    acts = w.cores[0].handle_client(pub, cm.Publish(w.seq(), {"price": 10.0, "sym": "AB"}, payload=b"p"), w.net.now)
    notes = [a for a in acts if type(a) is Notifies]
    assert not [a for a in acts if type(a) is ToClient and type(a.msg) is cm.Notify]
    (act,) = notes
    got = dict(zip(act.sessions, (frozenset(ids) for ids in act.sub_ids), strict=True))
    assert got == {a: {"s1"}, b: {"s1"}, c: {"x", "y"}}
    assert all(len(set(ids)) == len(ids) for ids in act.sub_ids)
    assert act.msg.payload == b"p" and act.msg.sub_ids == act.sub_ids[0] and act.msg.tag == 0
