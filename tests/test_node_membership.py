"""overlay.node.membership on cores joined by in-memory links (no event loop).

Drain: the refusals (last node, twice, before ready), the moves through the
ordinary migration messages to the lightest peer, the journal, the leaving
hello and what the peers do with it.  Join: a hello from an unknown node with
its address adds it (AddPeer before the table), one without an address does not.
"""

from __future__ import annotations

import pytest

from coreworld import CONFIG
from overlay.actions import AddPeer, ToPeer
from overlay.channels.channel import ChannelId
from overlay.errors import LocalProtocolError
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
