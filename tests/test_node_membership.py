"""overlay.node.membership on cores joined by in-memory links (no event loop).

Drain: the refusals (last node, twice, before ready), the moves through the
ordinary migration messages to the lightest peer, the journal, the leaving
hello and what the peers do with it — its clients' subscriptions dropped even
when their unsubscriptions died with it, its receipts no longer waited for —
and a node that left refusing new clients.  Join: a hello from an unknown
node with its address adds it (AddPeer before the table), one without an
address does not; a drained node that restarts joins again.
"""

from __future__ import annotations

import pytest

from coreworld import CONFIG
from overlay.actions import AddPeer, CloseClient, ToPeer
from overlay.channels.channel import ChannelId
from overlay.errors import LocalProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.testing.corelink import CoreLink

EC = ChannelId(0, 0)


def started(n: int = 3) -> CoreLink:
    net = CoreLink(CONFIG if n == 3 else CONFIG.with_nodes(CONFIG.nodes[:n]))
    net.start()
    return net


def test_drain_of_the_last_node_is_refused_and_changes_nothing():
    net = started(1)
    with pytest.raises(LocalProtocolError, match="last node of the cluster"):
        net.cores[0].drain(1.0)
    assert not net.cores[0].draining and len(net.cores[0].local) == 1


def test_drain_before_ready_is_refused():
    net = CoreLink(CONFIG)  # not started: no table anywhere
    with pytest.raises(LocalProtocolError, match="not ready"):
        net.cores[1].drain(1.0)


def test_drain_moves_every_channel_by_the_migration_protocol_then_leaves():
    net = started()
    core = net.cores[0]
    net.execute(0, core.drain(1.0))
    with pytest.raises(LocalProtocolError, match="already draining"):
        core.drain(1.0)
    net.run()
    net.tick(0, 1.1)  # the drain notices the session is done and ends
    net.run()
    assert not len(core.local) and core.drain_state is not None and core.drain_state.done
    assert net.owner_of(EC) == [1]  # the lightest peer (a tie on dc 0: the lowest id)
    assert net.routing_tables_equal()
    kinds = [name for _, _, name in net.types()]
    for step in (
        "RequestLoadBalance",
        "ChannelTransfer",
        "SubscriptionMove",
        "UpdateRoutingTable",
        "CompleteLoadBalance",
    ):
        assert step in kinds
    drain = [e for e in core.journal if e["kind"] == "decision" and e.get("phase") == "drain"]
    assert [e["action"] for e in drain] == ["start", "move", "done"]
    assert drain[1]["receiver"] == 1 and {c["node"] for c in drain[1]["candidates"]} == {1, 2}
    # Rule 6: the leaving hello; the others drop node 0 from their peers and monitors.
    assert core.membership.left and all(
        0 not in net.cores[i].peers and 0 not in net.cores[i].monitor.peers for i in (1, 2)
    )
    # A draining node refuses every request, forced or not.
    assert core.balancing.accepts(pm.RequestLoadBalance(0.0, 0.0, 7, True)) == (False, "node 0 is draining")


def test_a_hello_from_an_unknown_node_with_its_address_adds_it_before_the_table():
    net = started()
    hello = pm.PeerHello(3, "local", False, "127.0.0.1", 7999, 8999, 2.0)
    acts = net.cores[0].peer_hello(3, hello, 1.0)
    assert [type(a) for a in acts] == [AddPeer, ToPeer]
    assert acts[0].peer.port == 7999 and acts[0].peer.admin_port == 8999 and acts[0].peer.capacity == 2.0
    assert isinstance(acts[1].msg, pm.RoutingTableInit) and acts[1].node == 3
    core = net.cores[0]
    assert 3 in core.peers and 3 in core.monitor.peers and core.config.node(3).port == 7999
    # Again (a reconnect, still without a table): the table only.  Any node
    # holding a table adds it, then hands it the table (node.boot rule 1).
    assert [type(a.msg) for a in core.peer_hello(3, hello, 1.0)] == [pm.RoutingTableInit]
    add, table = net.cores[1].peer_hello(3, hello, 1.0)
    assert isinstance(add, AddPeer) and 3 in net.cores[1].peers
    assert isinstance(table, ToPeer) and table.node == 3 and table.msg.sync


def test_a_hello_from_an_unknown_node_without_an_address_is_not_added():
    net = started()
    assert net.cores[1].peer_hello(5, pm.PeerHello(5, "local", True), 1.0) == []
    assert 5 not in net.cores[1].peers


def test_a_drained_node_that_restarts_joins_again():
    net = started()
    net.execute(1, net.cores[1].drain(1.0))
    net.run()
    net.tick(1, 1.1)
    net.run()
    assert all(1 not in net.cores[i].peers for i in (0, 2))
    me = CONFIG.node(1)
    hello = pm.PeerHello(1, "local", False, me.host, me.port, me.admin_port, me.capacity)
    acts = net.cores[2].peer_hello(1, hello, 2.0)
    assert [type(a) for a in acts] == [AddPeer, ToPeer] and 1 in net.cores[2].peers
    assert isinstance(acts[1].msg, pm.RoutingTableInit) and acts[1].msg.sync  # it restarted without a table
    assert [n.id for n in net.cores[2].config.nodes].count(1) == 1


def drained_and_stopped(net: CoreLink, node: int) -> None:
    """``node`` drains (it holds no channel: at once) and stops right after
    its leaving hello: what it sent last — the unsubscriptions of the clients
    it closed — is lost with its links, and nothing reaches it any more."""
    net.execute(node, net.cores[node].drain(1.0))
    for (src, dst), link in net.links.items():
        if src == node:
            link.normal = type(link.normal)((t, m) for t, m in link.normal if not isinstance(m, pm.UnSubscription))
        if dst == node:
            link.paused = True
    net.run()


def test_a_node_that_left_leaves_no_subscription_of_its_clients_behind_to_hold_up_publishes():
    net = started()
    sub = net.open_client(2, "sub-2")
    assert [type(m) for m in net.request(2, sub, cm.Subscribe(1, "s", "price < 100"))] == [cm.SubAck]
    assert [s.access_node for s in net.cores[0].local[EC]] == [2]
    drained_and_stopped(net, 2)
    assert net.cores[2].membership.left and all(2 not in net.cores[i].peers for i in (0, 1))
    # Rule 6: node 0 dropped the subscription though its unsubscription never came ...
    assert not len(net.cores[0].local[EC]) and net.cores[0].stats["subscriptions_of_dead_clients_removed"] == 1
    # ... so an event it would have matched is acknowledged: nothing waits for node 2.
    pub = net.open_client(1, "pub")
    got = net.request(1, pub, cm.Publish(1, {"price": 5.0, "sym": "A"}))
    assert [type(m) for m in got] == [cm.PubAck]


def test_a_node_that_left_stops_waiting_for_receipts_it_owed_and_waits_again_when_it_rejoins():
    net = started()
    for node in (1, 2):  # node 1's notification names node 2 among the nodes notified
        sub = net.open_client(node, f"sub-{node}")
        net.request(node, sub, cm.Subscribe(1, "s", "price < 100"))
    pub = net.open_client(1, "pub")
    net.pause(0, 2)  # the event's notification to node 2 waits on the link: node 2 never confirms it
    net.client_send(1, pub, cm.Publish(1, {"price": 5.0, "sym": "A"}))
    net.run()
    assert net.received(1, pub, kind=cm.PubAck) == []
    drained_and_stopped(net, 2)
    assert [m.seq for m in net.received(1, pub, kind=cm.PubAck)] == [1]  # node 1 no longer waits for node 2
    assert 2 in net.cores[1].outbox._dead
    me = CONFIG.node(2)
    net.cores[1].peer_hello(2, pm.PeerHello(2, "local", False, me.host, me.port, me.admin_port, me.capacity), 2.0)
    assert 2 in net.cores[1].peers and 2 not in net.cores[1].outbox._dead  # back: its receipts count again


def test_a_node_that_left_refuses_a_new_client():
    net = started()
    drained_and_stopped(net, 2)
    core = net.cores[2]
    sid = core.client_opened()
    acts = core.handle_client(sid, cm.Hello("late"), 2.0)
    assert [type(a) for a in acts] == [type(acts[0]), CloseClient]
    err = acts[0].msg
    assert isinstance(err, cm.Error) and err.code == cm.ErrorCode.DRAINING and err.fatal and "left" in err.message
    assert core.stats["rejected_left"] == 1
