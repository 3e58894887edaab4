"""overlay.node.core.NodeCore: operator commands (split, place, status) and
the exact migration message sequence they start (SPEC §8.1, §13)."""

from __future__ import annotations

from collections import Counter

import pytest

from coreworld import EC, HIGH, LOW, SPLIT_500, World
from overlay.balance.migration import OutState
from overlay.messages import client as cm
from overlay.messages import peer as pm

# -- operator commands: split and place ------------------------------------------------------------------


def test_admin_split_divides_subscriptions_and_updates_every_table():
    w = World()
    net = w.net
    admin = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "low", "price < 100")
    w.subscribe(1, sid, "all", 'sym = "AB"')
    w.subscribe(1, sid, "top", "price > 500")
    mark = len(net.trace)
    reply = w.admin(0, admin, "split", **SPLIT_500)
    assert net.types(mark) == [
        (0, 1, "UpdateRoutingTable"),
        (0, 2, "UpdateRoutingTable"),
        (1, 0, "ReplyUpdateGlobal"),
        (2, 0, "ReplyUpdateGlobal"),
    ]
    update = net.trace[mark][2]
    assert update.delete_chs == (EC,)
    assert [i.ch_id for i in update.update_chs] == [LOW, HIGH]
    assert all(i.entry.owners == (0,) for i in update.update_chs)
    assert isinstance(reply, cm.AdminReply)
    assert net.routing_tables_equal()
    assert sorted(w.cores[0].local.ids()) == [LOW, HIGH]
    g = {lid: w.gid(1, sid, lid) for lid in ("low", "all", "top")}
    assert w.stored(LOW) == {g["low"], g["all"]}
    assert w.stored(HIGH) == {g["all"], g["top"]}
    assert w.cores[0].routing.lookup_event({"price": 500.0, "sym": "A"}) == LOW
    assert w.cores[2].routing.lookup_event({"price": 500.01, "sym": "A"}) == HIGH
    # The smaller child's share is indexed in the background (Channel rule 5).
    core = w.cores[0]
    assert core.index_wanted and sum(ch.unindexed for ch in core.local) > 0
    assert core.index_pending(1) == sum(ch.unindexed for ch in core.local)
    assert core.index_pending(10_000) == 0 and not core.index_wanted
    assert w.stored(LOW) == {g["low"], g["all"]} and w.stored(HIGH) == {g["all"], g["top"]}


def test_admin_split_by_string_values():
    w = World()
    admin = w.client(0, "ops")
    sid = w.client(2, "c")
    w.subscribe(2, sid, "ab", 'sym = "AB"')
    w.subscribe(2, sid, "x", 'sym = "X"')
    assert isinstance(w.admin(0, admin, "split", channel="0.0", attr="sym", values=["AB", "CD"]), cm.AdminReply)
    assert w.stored(LOW) == {w.gid(2, sid, "ab")}
    assert w.stored(HIGH) == {w.gid(2, sid, "x")}
    assert w.net.routing_tables_equal()


@pytest.mark.parametrize(
    ("node", "command", "args", "fragment"),
    [
        (1, "split", SPLIT_500, "owned by node 0"),
        (0, "split", {"channel": "7.7", "attr": "price", "at": 1.0}, "does not exist"),
        (0, "split", {"channel": "zero", "attr": "price", "at": 1.0}, "node.seq"),
        (0, "split", {"channel": "0.0", "attr": "price", "at": 1000.0}, "below its top"),
        (0, "split", {"channel": "0.0", "attr": "price"}, "numeric 'at'"),
        (0, "split", {"channel": "0.0", "attr": "nope", "at": 1.0}, "nope"),
        (0, "place", {"channel": "0.0", "node": 9}, "not a member"),
        (0, "place", {"channel": "0.0", "node": "1"}, "integer 'node'"),
        (1, "place", {"channel": "0.0", "node": 2}, "owned by node 0"),
        (0, "reboot", {}, "unknown admin command"),
        # Arguments a command does not take were ignored: drain's `node` drained the access node.
        (1, "drain", {"node": 2}, "this is node 1"),
        (1, "drain", {"node": 7}, "this is node 1"),
        (1, "drain", {"node": True}, "this is node 1"),
        (1, "drain", {"wait": False}, "no argument 'wait'"),
        (0, "place", {"channel": "0.0", "node": 1, "force": True}, "no argument 'force'"),
        (0, "status", {"verbose": 1}, "it takes none"),
        (0, "journal", {"n": 5}, "its arguments: limit, since"),
        (0, "journal", {"limit": True}, "non-negative integers"),
    ],
)
def test_admin_errors_are_answered_and_change_nothing(node, command, args, fragment):
    w = World()
    sid = w.client(node, "ops")
    before = w.cores[0].routing.entries()
    reply = w.admin(node, sid, command, **args)
    assert isinstance(reply, cm.Error) and reply.code == cm.ErrorCode.ADMIN
    assert fragment in reply.message
    assert w.net.routing_tables_equal() and w.cores[0].routing.entries() == before
    assert w.cores[0].local.ids() == [EC]
    assert not any(core.draining for core in w.cores.values())


def test_placing_a_channel_where_it_is_already_changes_nothing_and_says_so():
    w = World()
    reply = w.admin(0, w.client(0, "ops"), "place", channel="0.0", node=0)
    assert isinstance(reply, cm.AdminReply) and reply.result["moved"] is False and "already" in reply.result["note"]
    assert w.cores[0].local.ids() == [EC] and not w.cores[0].migration.outgoing


def test_a_split_says_what_it_did():
    w = World()
    reply = w.admin(0, w.client(0, "ops"), "split", **SPLIT_500)
    assert reply.result["split"] == "0.0" and reply.result["attr"] == "price" and reply.result["node"] == 0
    assert [(c["id"], c["space"]) for c in reply.result["children"]] == [
        ("0.1", w.cores[0].local[LOW].space.text(w.cores[0].schema)),
        ("0.2", w.cores[0].local[HIGH].space.text(w.cores[0].schema)),
    ]


def test_an_operator_splits_and_places_a_replicated_channel_its_first_owner_taking_it_back() -> None:
    w = World()
    ops = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price < 900")
    # Replicate EC to node 2, as the balancer does when a slice's events are all one point.
    core = w.cores[0]
    mig, acts = core.migration.start([EC], 2, 0.0, forced=True)
    mig.replicate = True
    w.net.execute(0, acts)
    w.net.run()
    assert core.routing[EC].owners == (0, 2) and EC in w.cores[2].local
    # A split on a later replica is refused with the node to ask.
    reply = w.admin(2, w.client(2, "ops2"), "split", **SPLIT_500)
    assert isinstance(reply, cm.Error) and "ask node 0" in reply.message
    # On the first owner it works: node 2 drops its replica, the children are node 0's.
    reply = w.admin(0, ops, "split", **SPLIT_500)
    assert isinstance(reply, cm.AdminReply) and [c["id"] for c in reply.result["children"]] == ["0.1", "0.2"]
    assert EC not in w.cores[2].local and w.cores[2].stats["replicas_dropped"] == 1
    assert w.net.routing_tables_equal() and sorted(w.net.owner_of(LOW) + w.net.owner_of(HIGH)) == [0, 0]
    # Events still reach the subscription exactly once.
    eid = w.publish(2, w.client(2, "pub"), {"price": 10.0, "sym": "A"})
    w.net.run()
    assert [n.event_id for n in w.net.received(1, sid, kind=cm.Notify)] == [eid]


def test_admin_status_reports_channels_and_routing():
    w = World()
    sid = w.client(1, "ops")
    reply = w.admin(1, sid, "status")
    assert reply.result["node"] == 1 and reply.result["ready"]
    assert reply.result["channels"] == []
    assert reply.result["routing"] == [{"id": "0.0", "space": "WES", "owners": [0]}]


def test_admin_place_emits_the_exact_migration_sequence():
    w = World()
    net = w.net
    admin = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price > 600")
    w.admin(0, admin, "split", **SPLIT_500)
    gid = w.gid(1, sid, "s")
    stored = w.cores[0].local[HIGH].get(gid)
    mark = len(net.trace)
    reply = w.admin(0, admin, "place", channel="0.2", node=2)
    assert net.types(mark) == [
        (0, 2, "RequestLoadBalance"),
        (2, 0, "ReplyRequestLoadBalance"),
        (0, 2, "ChannelTransfer"),
        (2, 0, "ReplyChannelTransfer"),
        (0, 2, "SubscriptionMove"),
        (2, 0, "ReplySubscriptionMove"),
        (0, 1, "UpdateRoutingTable"),
        (0, 2, "UpdateRoutingTable"),
        (0, 2, "DeliveryHandover"),  # nothing tracked: it says so (node.groups rule 10)
        (1, 0, "ReplyUpdateGlobal"),
        (2, 0, "ReplyUpdateGlobal"),
        (0, 2, "CompleteLoadBalance"),
    ]
    msgs = [m for _, _, m in net.trace[mark:]]
    session = msgs[0].session
    assert all(m.session == session for m in msgs)
    assert msgs[0].forced
    assert msgs[1].status is pm.ReplySign.REPLY_SUCCESS
    # It travels with the node it leaves (node.balancing rule 7).
    assert msgs[2].channels == (pm.ChannelSpec(HIGH, w.cores[1].routing[HIGH].space, (pm.PastOwner(0, w.net.now),)),)
    assert msgs[3] == pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, (HIGH,), session)
    assert msgs[4].ch_sub_set == (pm.ChannelSubscriptions(HIGH, (stored,)),)
    assert msgs[6] == msgs[7]
    assert msgs[6].delete_chs == () and msgs[6].origin == 0
    assert [(i.ch_id, i.entry.owners) for i in msgs[6].update_chs] == [(HIGH, (2,))]
    assert msgs[8] == pm.DeliveryHandover(session, HIGH, ())
    assert msgs[11] == pm.CompleteLoadBalance(session, aborted=False)
    assert reply == cm.AdminReply(
        reply.seq,
        {
            "session": session,
            "channels": ["0.2"],
            "receiver": 2,
            "subscriptions_moved": 1,
            "bytes": reply.result["bytes"],
        },
    )
    assert net.owner_of(HIGH) == [2] and net.owner_of(LOW) == [0]
    assert w.stored(HIGH) == {gid}
    assert net.routing_tables_equal()
    # The receiver stored the moved subscriptions at once and indexes them later.
    assert w.cores[2].index_wanted and w.cores[2].local[HIGH].unindexed == 1
    assert w.cores[2].index_pending(16) == 0 and w.stored(HIGH) == {gid}
    assert w.cores[0].migration.outgoing[session].state is OutState.DONE
    assert w.cores[2].arrivals.incoming == {}
    # Traffic now goes straight to the new owner.
    mark = len(net.trace)
    eid = w.publish(1, sid, {"price": 700.0, "sym": "A"})
    net.run()
    # ... whose only other access node is the publisher's: its notification
    # is the match report too (node.outbox rule 2), no receipt message.
    assert net.types(mark) == [(1, 2, "Event"), (2, 1, "Notification")]
    assert w.notifies() == Counter({(1, sid, eid, frozenset({"s"})): 1})


def test_moving_a_channel_twice_at_once_is_refused():
    w = World()
    admin = w.client(0, "ops")
    w.net.client_send(0, admin, cm.Admin(1, "place", {"channel": "0.0", "node": 1}))
    w.net.client_send(0, admin, cm.Admin(2, "place", {"channel": "0.0", "node": 2}))
    second = w.net.received(0, admin)[-1]
    assert second.code == cm.ErrorCode.ADMIN and "already moving" in second.message
    w.net.run()
    assert w.net.owner_of(EC) == [1]
    assert w.net.routing_tables_equal()


def test_refused_request_aborts_and_changes_no_table():
    w = World()
    net = w.net
    # An unforced request (the balancer's) is refused by a node that is not underloaded.
    mig, acts = w.cores[0].migration.start([EC], 1, 0.0, forced=False)
    net.execute(0, acts)
    mark = len(net.trace)
    net.run()
    assert net.types(mark) == [
        (0, 1, "RequestLoadBalance"),
        (1, 0, "ReplyRequestLoadBalance"),
        (0, 1, "CompleteLoadBalance"),
    ]
    assert mig.state is OutState.ABORTED and mig.reason == "balancing is off"
    assert net.owner_of(EC) == [0] and net.routing_tables_equal()
    assert w.cores[0].stats["migrations_aborted"] == 1


def test_balancing_never_sends_a_channel_back_to_a_node_it_left_lately():
    """node.balancing rule 7: the nodes a channel left travel with it; the
    balancer does not send it back to one within RETURN_SLICES slices (an
    operator may), split children are channels of their own."""
    from overlay.node.loads import RETURN_SLICES

    w = World()
    ops = w.client(0, "ops")
    w.admin(0, ops, "split", **SPLIT_500)
    assert isinstance(w.admin(0, ops, "place", channel="0.2", node=1), cm.AdminReply)
    core = w.cores[1]
    now = w.net.now
    assert [p.node for p in core.loads.past_owners(HIGH)] == [0]
    assert HIGH not in {c.ch_id for c in core.balancing.channel_loads(receiver=0, now=now + 1.0)}
    assert HIGH in {c.ch_id for c in core.balancing.channel_loads(receiver=2, now=now + 1.0)}
    later = now + (RETURN_SLICES + 1) * core.monitor.base_slice
    assert HIGH in {c.ch_id for c in core.balancing.channel_loads(receiver=0, now=later)}
    # The operator is not bound by it.
    assert isinstance(w.admin(1, w.client(1, "ops1"), "place", channel="0.2", node=0), cm.AdminReply)
    assert HIGH in w.cores[0].local and [p.node for p in w.cores[0].loads.past_owners(HIGH)] == [0, 1]
