"""overlay.node.core.NodeCore: Reforward around the three time points, and a
session failing before <2>, between <2> and <3>, after <3> (SPEC §8.2)."""

from __future__ import annotations

import random
from collections import Counter

from coreworld import EC, HIGH, LOW, MIGRATION_TYPES, SCHEMA, SPLIT_500, SUBSCRIPTIONS, TIMEOUT, World, random_events
from overlay.balance.migration import InState, OutState
from overlay.channels import parse_subscription
from overlay.messages import client as cm
from overlay.messages import peer as pm

# -- Reforward (SPEC §8.2) ------------------------------------------------------------------------------


def _start_place(w: World, admin: int, channel: str, node: int) -> int:
    seq = w.seq()
    w.net.client_send(0, admin, cm.Admin(seq, "place", {"channel": channel, "node": node}))
    return seq


def test_subscriptions_between_time_1_and_2_ride_in_the_snapshot():
    w = World()
    net = w.net
    admin = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "old", "price < 100")
    w.subscribe(1, sid, "gone", "price < 200")
    net.hold_types(pm.ReplyChannelTransfer, src=2, dst=0)  # stay before <2>
    _start_place(w, admin, "0.0", 2)
    net.run()
    (mig,) = w.cores[0].migration.outgoing.values()
    assert mig.state is OutState.TRANSFERRING and not mig.reforwarding
    w.subscribe(1, sid, "new", "price > 900")  # applied on node 0, acked normally
    w.unsubscribe(1, sid, "gone")
    eid = w.publish(1, sid, {"price": 950.0, "sym": "Z"})
    net.run()
    assert w.cores[0].stats["events_matched"] == 1 and w.cores[0].stats["reforwards"] == 0
    net.release()
    net.run()
    moves = [m for _, _, m in net.trace if isinstance(m, pm.SubscriptionMove)]
    (move,) = moves
    assert {s.id for s in move.ch_sub_set[0].subscriptions} == {w.gid(1, sid, "old"), w.gid(1, sid, "new")}
    assert w.stored(EC) == {w.gid(1, sid, "old"), w.gid(1, sid, "new")}
    assert net.owner_of(EC) == [2] and net.routing_tables_equal()
    assert w.notifies() == w.expected() == Counter({(1, sid, eid, frozenset({"new"})): 1})
    assert w.cores[0].stats["reforwards"] == 0


def test_traffic_after_time_2_is_reforwarded_and_applied_once_on_the_receiver():
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    c0 = w.client(0, "c0")
    c1 = w.client(1, "c1")
    c2 = w.client(2, "c2")
    w.subscribe(1, c1, "a", "price < 100")
    w.subscribe(1, c1, "b", 'sym = "AB"')
    w.subscribe(2, c2, "z", "price >= 0")
    before = w.expected()  # nothing published yet
    assert before == Counter()

    # Window 1: after <2>, before <3> — hold the receiver's ReplySubscriptionMove.
    net.hold_types(pm.ReplySubscriptionMove, src=2, dst=0)
    seq = _start_place(w, admin, "0.0", 2)
    net.run()
    (mig,) = cores[0].migration.outgoing.values()
    assert mig.state is OutState.MOVING and mig.reforwarding
    assert cores[2].arrivals.incoming[(0, mig.session)].state is InState.SUBSCRIPTIONS_ADDED
    applied0 = cores[2].stats["subscriptions_applied"]
    w.subscribe(1, c1, "c", "price >= 50", settle=False)
    gid_a = w.gid(1, c1, "a")
    w.unsubscribe(1, c1, "a", settle=False)
    w.subscribe(0, c0, "d", "price > 990", settle=False)  # the moving-out node's own client
    window1 = [
        w.publish(n, s, e)
        for n, s, e in [
            (1, c1, {"price": 60.0, "sym": "AB"}),
            (2, c2, {"price": 995.0, "sym": "Q"}),
            (0, c0, {"price": 10.0, "sym": "AB"}),
        ]
    ]
    e1, e2, e3 = window1
    mark = len(net.trace)
    net.run()
    # Everything that reached node 0 went on to node 2 as Reforward, in arrival
    # order.  (Node 2's own event waits on the paused link 2→0, behind the held
    # reply: it is reforwarded in window 2.)
    reforwards = [(a, b, m) for a, b, m in net.trace[mark:] if isinstance(m, pm.Reforward)]
    assert {(a, b) for a, b, _ in reforwards} == {(0, 2)}
    assert all(m.ch_id == EC and m.session == mig.session for _, _, m in reforwards)
    inner = [m.messages[0].message for _, _, m in reforwards]
    assert [(type(i).__name__, getattr(i, "sub_id", getattr(i, "event_id", None))) for i in inner] == [
        ("Subscription", w.gid(0, c0, "d")),  # node 0's own client: handled at once
        ("Event", e3),  # node 0's own event
        ("Subscription", w.gid(1, c1, "c")),  # then node 1's, in the order sent
        ("UnSubscription", gid_a),
        ("Event", e1),
    ]
    assert [m.messages[0].sign for _, _, m in reforwards] == [
        pm.ReforwardSign.SUBSCRIBE,
        pm.ReforwardSign.EVENT_MESSAGE,
        pm.ReforwardSign.SUBSCRIBE,
        pm.ReforwardSign.UNSUBSCRIBE,
        pm.ReforwardSign.EVENT_MESSAGE,
    ]
    assert cores[0].stats["events_matched"] == 0
    assert cores[2].stats["events_matched"] == 2

    # Window 2: after <3> — node 1 has not applied the UpdateRoutingTable yet.
    net.release()
    net.hold_types(pm.UpdateRoutingTable, src=0, dst=1)
    net.run()
    assert mig.state is OutState.UPDATING and net.paused() == [(0, 1)]
    assert EC not in cores[0].local and cores[0].routing[EC].owners == (2,)
    assert cores[0].stats["reforwards"] == 6  # node 2's event came back through node 0
    e4 = w.publish(1, c1, {"price": 70.0, "sym": "CD"})
    w.subscribe(1, c1, "e", 'sym = "CD"', settle=False)
    e5 = w.publish(1, c1, {"price": 80.0, "sym": "CD"})
    net.run()
    assert cores[0].stats["reforwards"] == 6 + 3
    net.release()
    net.run()

    assert mig.state is OutState.DONE
    assert isinstance(w.reply(0, admin, seq), cm.AdminReply)
    assert net.routing_tables_equal()
    assert net.owner_of(EC) == [2]
    assert cores[0].stats["events_matched"] == 0
    assert cores[2].stats["events_matched"] == len(w.events) == 5
    # Each (un)subscription took effect exactly once, on the receiver.
    assert cores[2].stats["subscriptions_applied"] - applied0 == 3  # c, d, e
    assert cores[2].stats["unsubscriptions_applied"] == 1  # a
    assert w.stored(EC) == {w.gid(n, s, lid) for (n, s), t in w.subs.items() for lid in t}
    # Every client heard back once per request.
    assert sorted(m.sub_id for m in net.received(1, c1, kind=cm.SubAck)) == ["a", "b", "c", "e"]
    assert [m.sub_id for m in net.received(1, c1, kind=cm.UnsubAck)] == ["a"]
    assert [m.sub_id for m in net.received(0, c0, kind=cm.SubAck)] == ["d"]
    # Every event matched, once, the subscriptions in force on node 2 when it
    # got there: d, e3, c, -a, e1 | e2, e4, e, e5.  e3 still matched "a" there,
    # but node 1 had forgotten "a" when the client unsubscribed: not notified.
    assert cores[1].stats["notifications_orphaned"] == 1
    assert w.notifies() == Counter(
        {
            (1, c1, e3, frozenset({"b"})): 1,
            (2, c2, e3, frozenset({"z"})): 1,
            (1, c1, e1, frozenset({"b", "c"})): 1,
            (2, c2, e1, frozenset({"z"})): 1,
            (1, c1, e2, frozenset({"c"})): 1,
            (0, c0, e2, frozenset({"d"})): 1,
            (2, c2, e2, frozenset({"z"})): 1,
            (1, c1, e4, frozenset({"c"})): 1,
            (2, c2, e4, frozenset({"z"})): 1,
            (1, c1, e5, frozenset({"c", "e"})): 1,
            (2, c2, e5, frozenset({"z"})): 1,
        }
    )
    assert net.errors == []


def test_reforward_under_concurrent_load_delivers_exactly_once():
    # SPEC §8.2's invariant with traffic from every node around every step of
    # the session: each migration message is held until a batch of events and
    # (un)subscriptions has been sent around it.
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    rng = random.Random(7)
    clients = [(n, w.client(n, f"c{n}")) for n in range(3)]
    for i, (n, s) in enumerate(clients):
        for j, expr in enumerate(rng.sample(SUBSCRIPTIONS, 3)):
            w.subscribe(n, s, f"s{i}{j}", expr)
    w.admin(0, admin, "split", **SPLIT_500)
    # Churn: subscriptions no published event can match (qty stays below 100),
    # made and dropped during the session; each must take effect exactly once.
    churn = [(n, w.client(n, f"churn{n}")) for n in range(3)]
    quiet = "qty > 1000 and price > 400"
    steps = [t for t in MIGRATION_TYPES if t is not pm.Reforward]
    net.hold_types(*steps)
    _start_place(w, admin, "0.2", 1)
    (mig,) = [m for m in cores[0].migration.outgoing.values() if m.active]
    states = []
    for rnd in range(30):
        if not mig.active:
            break
        states.append(mig.state)
        for n, s in clients:
            for _ in range(3):
                w.publish(n, s, random_events(rng, 1)[0])
        for n, s in churn:
            w.subscribe(n, s, f"q{rnd}", quiet, settle=False)
            if rnd >= 2:
                w.unsubscribe(n, s, f"q{rnd - 2}", settle=False)
        for _ in range(5):
            net.step()
        for n, s in clients:
            w.publish(n, s, random_events(rng, 1)[0])
        net.run()
        net.release()
        net.hold_types(*steps)
        net.run()
    net.release()
    net.run()
    assert mig.state is OutState.DONE
    assert {OutState.MOVING, OutState.UPDATING} <= set(states)  # traffic in both windows
    assert net.owner_of(HIGH) == [1] and net.routing_tables_equal()
    assert cores[0].stats["reforwards"] > 10
    # Events: each matched once, each matching subscriber notified once.
    assert sum(c.stats["events_matched"] for c in cores.values()) == len(w.events)
    assert w.notifies() == w.expected()
    # (Un)subscriptions: every acknowledgement once, the stores exactly as asked.
    for n, s in churn:
        acks = Counter(m.sub_id for m in net.received(n, s, kind=cm.SubAck))
        assert set(acks.values()) == {1} and len(acks) == len(states)
        unacks = Counter(m.sub_id for m in net.received(n, s, kind=cm.UnsubAck))
        assert set(unacks.values()) == {1} and len(unacks) == len(states) - 2
    live = {w.gid(n, s, lid) for (n, s), t in w.subs.items() for lid in t}
    for chid in (LOW, HIGH):
        owner_filter = {s.id for s in cores[net.owner_of(chid)[0]].local[chid]}
        belongs = {gid for gid in live if cores[0].routing[chid].space.belongs(_filter_of(w, gid), SCHEMA)}
        assert owner_filter == belongs, chid
    assert net.errors == []


def _filter_of(w: World, gid: str):
    for (n, s), table in w.subs.items():
        for lid in table:
            if w.gid(n, s, lid) == gid:
                return parse_subscription(table[lid], SCHEMA)
    raise KeyError(gid)


# -- failure before <2> (SPEC §8.2) ------------------------------------------------------------------------


def test_an_answer_to_a_session_aborted_for_an_unreachable_receiver_is_ignored():
    """Fault seed 4893: the receiver became unreachable while its
    ReplyRequestLoadBalance was in flight; the session aborted at once
    (peer_unreachable) but is forgotten only at the next tick.  The answer
    arriving in between is late, not a protocol error."""
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price < 10")
    net.hold_types(pm.ReplyRequestLoadBalance, src=2, dst=0)
    seq = _start_place(w, admin, "0.0", 2)
    net.run()
    (mig,) = cores[0].migration.outgoing.values()
    assert mig.state is OutState.REQUESTED
    routing_before = cores[0].routing.entries()
    net.execute(0, cores[0].peer_unreachable(2, cores[0].ctx.now))
    assert mig.state is OutState.ABORTED and mig.session in cores[0].migration.outgoing
    net.release()
    net.run()
    assert net.errors == []
    assert mig.state is OutState.ABORTED
    assert all(c.routing.entries() == routing_before for c in cores.values())
    err = w.reply(0, admin, seq)
    assert isinstance(err, cm.Error) and "aborted" in err.message
    eid = w.publish(1, sid, {"price": 5.0, "sym": "A"})
    net.run()
    assert w.notifies() == Counter({(1, sid, eid, frozenset({"s"})): 1})


def test_timeout_before_time_2_aborts_and_rolls_back_the_receiver():
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price < 10")
    net.hold_types(pm.ReplyChannelTransfer, src=2, dst=0)
    seq = _start_place(w, admin, "0.0", 2)
    net.run()
    (mig,) = cores[0].migration.outgoing.values()
    assert mig.state is OutState.TRANSFERRING
    assert EC in cores[2].local  # the receiver added the channel at ChannelTransfer
    routing_before = cores[0].routing.entries()
    net.tick(0, TIMEOUT - 0.001)
    assert mig.state is OutState.TRANSFERRING
    mark = len(net.trace)
    net.tick(0, TIMEOUT + 0.001)
    assert mig.state is OutState.ABORTED
    net.run()
    assert net.types(mark) == [(0, 2, "CompleteLoadBalance")]
    (complete,) = [m for _, _, m in net.trace[mark:] if type(m) is pm.CompleteLoadBalance]
    assert complete.aborted
    assert EC not in cores[2].local and cores[2].arrivals.incoming == {}
    assert net.owner_of(EC) == [0]
    err = w.reply(0, admin, seq)
    assert isinstance(err, cm.Error) and err.code == cm.ErrorCode.ADMIN and "aborted" in err.message
    assert mig.session not in cores[0].migration.outgoing  # forgotten at the tick
    # The late answer finds no session: it is ignored, nothing else changes.
    net.release()
    net.run()
    assert net.errors == []
    assert all(c.routing.entries() == routing_before for c in cores.values())
    assert net.owner_of(EC) == [0] and cores[0].local[EC].get(w.gid(1, sid, "s")) is not None
    # Nothing lost: the channel still serves its subscribers on node 0.
    eid = w.publish(1, sid, {"price": 5.0, "sym": "A"})
    net.run()
    assert w.notifies() == Counter({(1, sid, eid, frozenset({"s"})): 1})


def test_timeout_waiting_for_the_request_answer_aborts():
    w = World()
    admin = w.client(0, "ops")
    w.net.pause(1, 0)
    seq = _start_place(w, admin, "0.0", 1)
    w.net.run()
    w.net.tick(0, TIMEOUT + 1)
    assert isinstance(w.reply(0, admin, seq), cm.Error)
    w.net.run()
    # Node 1 accepted, then heard the abort: it holds nothing.
    assert w.cores[1].arrivals.incoming == {} and w.net.owner_of(EC) == [0]


def test_receiver_forgets_an_accepted_session_the_sender_never_continues():
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    net.hold_types(pm.ChannelTransfer, src=0, dst=2)
    _start_place(w, admin, "0.0", 2)
    net.run()
    (key,) = cores[2].arrivals.incoming
    assert cores[2].arrivals.incoming[key].state is InState.ACCEPTED
    net.tick(2, TIMEOUT - 0.001)
    assert key in cores[2].arrivals.incoming
    net.tick(2, TIMEOUT + 0.001)
    assert cores[2].arrivals.incoming == {} and EC not in cores[2].local
    # The late ChannelTransfer names a session that is over: answered with
    # REPLY_FAIL, so the sender, never confirmed, rolls back at once.
    net.release()
    net.run()
    assert net.errors == []
    assert not any(m.active for m in cores[0].migration.outgoing.values())
    assert EC in cores[0].local and EC not in cores[2].local
    net.tick(0, 3 * TIMEOUT)
    net.run()
    assert net.owner_of(EC) == [0] and net.routing_tables_equal()


def test_slow_subscription_move_is_waited_for_nothing_lost():
    # The receiver confirmed the channels (<2> on the sender, which now
    # reforwards to it); the SubscriptionMove is slow to arrive.  The receiver
    # must not roll back on its own: the sender is past the point of return.
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price < 10")
    net.hold_types(pm.SubscriptionMove, src=0, dst=2)
    seq = _start_place(w, admin, "0.0", 2)
    net.run()
    (mig,) = cores[0].migration.outgoing.values()
    assert mig.state is OutState.MOVING
    eid = w.publish(1, sid, {"price": 5.0, "sym": "A"})
    net.run()  # node 0 reforwards it behind the SubscriptionMove
    net.tick(2, 3 * TIMEOUT)
    net.tick(0, 3 * TIMEOUT)
    assert EC in cores[2].local  # still waiting for the sender
    net.release()
    net.run()
    assert net.errors == []
    assert mig.state is OutState.DONE and net.owner_of(EC) == [2] and net.routing_tables_equal()
    assert isinstance(w.reply(0, admin, seq), cm.AdminReply)
    assert w.notifies() == Counter({(1, sid, eid, frozenset({"s"})): 1})


def test_timeout_after_time_3_does_not_roll_back():
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    net.hold_types(pm.ReplyUpdateGlobal, src=1, dst=0)
    _start_place(w, admin, "0.0", 2)
    net.run()
    (mig,) = cores[0].migration.outgoing.values()
    assert mig.state is OutState.UPDATING
    net.tick(0, 1000.0)
    assert mig.state is OutState.UPDATING  # the tables changed: wait, do not abort
    assert net.owner_of(EC) == [2]
    net.release()
    net.run()
    assert mig.state is OutState.DONE and net.routing_tables_equal()
