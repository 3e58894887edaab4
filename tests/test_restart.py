"""A node that restarts never makes the cluster worse (``overlay.node.boot``,
``overlay.node.core`` rules 6–8), on sans-IO cores joined by ``CoreLink``.

A restart is a new ``NodeCore`` for the same id with a new incarnation: its
memory is gone, its peers remember its previous run.
"""

from __future__ import annotations

import logging

import msgspec
import pytest

from coreworld import CONFIG, EC, SPLIT_500, World
from overlay.balance.migration import OutState
from overlay.channels import ChannelId, parse_subscription
from overlay.channels.routing_table import version
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node import NodeCore
from overlay.node.context import sub_prefix
from overlay.node.ordering import rendezvous_home
from overlay.testing.corelink import CoreLink


def restart(net: CoreLink, node: int, incarnation: int) -> NodeCore:
    """Replace ``node``'s core by a fresh run that boots as the shell boots
    it, and exchange hellos with every peer (as the links do on connect)."""
    core = NodeCore(net.config, node, incarnation=incarnation)
    net.cores[node] = core
    for (a, b), link in net.links.items():  # its sockets died with it
        if node in (a, b):
            link.high.clear()
            link.normal.clear()
    net.execute(node, core.boot(net.now))
    hellos(net, node)
    net.run()
    return core


def hellos(net: CoreLink, node: int) -> None:
    for peer, other in net.cores.items():
        if peer != node:
            net.execute(peer, other.peer_hello(node, net.cores[node].hello(), net.now))
            net.execute(node, net.cores[node].peer_hello(peer, other.hello(), net.now))


def incarnated_world() -> World:
    """A started 3-node world whose cores carry incarnations (as real nodes do)."""
    w = World(start=False)
    for i in list(w.net.cores):
        w.net.cores[i] = NodeCore(CONFIG, i, incarnation=1000 + i)
    for i in w.net.cores:
        w.net.execute(i, w.net.cores[i].boot(0.0))
    for i in w.net.cores:
        hellos(w.net, i)
    w.net.run()
    assert all(c.ready for c in w.net.cores.values())
    return w


def test_a_cold_start_initialises_once_every_peer_said_it_has_no_table() -> None:
    w = incarnated_world()
    assert all(c.routing.entries() == {EC: w.cores[0].routing[EC]} for c in w.cores.values())
    assert all(c.epoch == 1000 for c in w.cores.values())  # the initializer's incarnation


def test_the_initializer_waits_for_silent_peers_only_as_long_as_the_grace() -> None:
    core = NodeCore(CONFIG, 0, incarnation=7)
    # Nothing but the asks for its keys' states (node.keyhome rule 6).
    assert {type(a.msg) for a in core.boot(0.0)} == {pm.KeyAsk} and not core.has_table
    beats = {pm.Heartbeat}  # sent from the start, table or not
    assert {type(a.msg) for a in core.tick(CONFIG.cluster.peer_timeout / 2)} <= beats and not core.has_table
    acts = core.tick(CONFIG.cluster.peer_timeout + 0.1)
    assert core.has_table and {type(a.msg) for a in acts} - beats == {pm.RoutingTableInit}


def test_a_restarted_initializer_joins_the_running_cluster_instead_of_reinitialising_it() -> None:
    w = incarnated_world()
    s1 = w.client(1, "c1")
    w.subscribe(1, s1, "a", "price < 100")
    w.admin(0, w.client(0, "op"), "split", **SPLIT_500)
    tables = {i: dict(w.cores[i].routing.entries()) for i in (1, 2)}
    assert set(tables[1]) == {ChannelId(0, 1), ChannelId(0, 2)}

    core = restart(w.net, 0, incarnation=5000)
    # The survivors' tables did not change; the restarted node took theirs.
    assert all(dict(w.cores[i].routing.entries()) == tables[i] for i in (1, 2))
    assert core.ready and dict(core.routing.entries()) == tables[1] and core.epoch == 1000
    # Its channels are back, not re-created as EC, with the subscriptions the
    # access nodes hold for them (node.recovery rule 5): c1's "a" is in [0, 500].
    assert set(core.local.ids()) == {ChannelId(0, 1), ChannelId(0, 2)}
    assert [len(core.local[c]) for c in (ChannelId(0, 1), ChannelId(0, 2))] == [1, 0]
    assert not core.recovery.rebuilding
    assert core.local.new_id() == ChannelId(0, 3)  # no id of the running cluster is reused
    assert w.net.errors == []
    # Publishing works on every node, and a new subscription on the restarted node is served.
    s0 = w.client(0, "new")
    w.subscribe(0, s0, "b", "price < 100")
    for node in (0, 1, 2):
        w.publish(node, w.client(node, f"p{node}"), {"price": 10.0, "sym": "A"})
    w.net.run()
    got = list(w.net.received(0, s0, kind=cm.Notify))
    assert len(got) == 3 and all(m.sub_ids == ("b",) for m in got)


def test_ids_of_a_restarted_node_never_repeat_and_its_dead_clients_subscriptions_go() -> None:
    w = incarnated_world()
    old = w.client(1, "old")
    w.subscribe(1, old, "a", "price < 100")
    old_gid = w.gid(1, old, "a")
    first = w.publish(1, old, {"price": 10.0, "sym": "A"})
    w.net.run()
    assert old_gid in w.cores[0].local[EC]

    core = restart(w.net, 1, incarnation=9000)
    mark = len(w.net.to_clients)  # the new run numbers its sessions from 1 again
    # The owner dropped the subscription of node 1's dead client.
    assert old_gid not in w.cores[0].local[EC]
    assert w.cores[0].stats["subscriptions_of_dead_clients_removed"] == 1
    new = w.client(1, "new")
    w.subscribe(1, new, "a", "price < 100")  # the same session number and local id as the dead one
    assert w.gid(1, new, "a") != old_gid
    second = w.publish(1, new, {"price": 10.0, "sym": "A"})
    assert second != first
    w.net.run()
    notes = w.net.received(1, new, since=mark, kind=cm.Notify)
    assert [n.event_id for n in notes] == [second]
    assert core.stats["notifications_orphaned"] == 0


def test_a_late_subscription_of_a_dead_client_is_not_stored() -> None:
    w = incarnated_world()
    old_run = sub_prefix(1, 500) + "7:x:1"  # made by node 1's previous run
    f = parse_subscription("price < 5", CONFIG.schema)
    w.net.send(1, 0, pm.Subscription(old_run, f, "c", 1, pm.DispatchSign.SUBSCRIBE_DISPATCHED, EC))
    current = sub_prefix(1, 1001) + "7:x:1"
    w.net.send(1, 0, pm.Subscription(current, f, "c", 1, pm.DispatchSign.SUBSCRIBE_DISPATCHED, EC))
    w.net.run()
    assert old_run not in w.cores[0].local[EC] and current in w.cores[0].local[EC]


def test_a_receiver_that_restarts_mid_session_rolls_the_session_back_on_both_sides() -> None:
    w = incarnated_world()
    op = w.client(0, "op")
    w.subscribe(0, op, "s", "price < 900")
    w.net.hold_types(pm.ReplySubscriptionMove, src=1)
    w.net.client_send(0, op, cm.Admin(77, "place", {"channel": "0.0", "node": 1}))
    w.net.run()
    sender = w.cores[0]
    (mig,) = [m for m in sender.migration.outgoing.values() if m.active]
    assert mig.state is OutState.MOVING
    w.net.release()
    for link in w.net.links.values():
        link.high.clear()
        link.normal.clear()
    restart(w.net, 1, incarnation=7777)
    assert not mig.active and EC in sender.local and sender.routing[EC].owners == (0,)
    assert not sender.monitor.busy and not w.cores[1].arrivals.incoming
    # The operator hears why.
    assert any(isinstance(m, cm.Error) and m.seq == 77 for m in w.net.received(0, op))


def test_a_keyed_event_lost_with_a_restarted_nodes_old_run_goes_again_to_its_channels_owner() -> None:
    """Fault seed 1132: node 0, past <3> of moving EC to node 1, passed on to
    node 1 the event its key's home had released to it, and crashed with it;
    its new run said hello before anyone declared it dead and owns nothing, so
    no recovery update came, and the home never released the event again.  A
    restart is now met as a death is: the homes release what they have in
    flight again (``node.keyhome`` rule 9)."""
    w = incarnated_world()
    sub = w.client(1, "sub")
    w.subscribe(1, sub, "s", "price < 900")
    key = next(k for k in (f"key{i}" for i in range(100)) if rendezvous_home(k, [0, 1, 2]) == 2)
    w.net.hold_types(pm.Event, src=2, dst=0)  # the home's release to EC's owner waits on 2→0
    w.net.client_send(2, w.client(2, "pub"), cm.Publish(w.seq(), {"price": 5.0, "sym": "AB"}, 0.0, key, 0))
    w.net.run()
    assert w.net.paused() == [(2, 0)]
    w.net.client_send(0, w.client(0, "op"), cm.Admin(w.seq(), "place", {"channel": "0.0", "node": 1}))
    w.net.run()
    assert EC not in w.cores[0].local and w.cores[0].routing[EC].owners == (1,)  # <3> on node 0
    w.net.pause(0, 1)  # what node 0 passes on to node 1 now dies with it
    w.net.links[(2, 0)].paused = False
    w.net.run()
    assert any(isinstance(m, (pm.Reforward, pm.Event)) for _, _, m in w.net.pending(0, 1))
    restart(w.net, 0, incarnation=5000)
    w.net.release()
    w.net.run()
    assert [n.key for n in w.net.received(1, sub, kind=cm.Notify)] == [key]
    assert w.net.errors == []


def test_a_third_node_lost_in_updating_does_not_hold_the_session_forever() -> None:
    """The sender waits for every ReplyUpdateGlobal; a peer gone past the
    timeout is not waited for, and both sides leave BUSY."""
    w = incarnated_world()
    op = w.client(0, "op")
    w.net.hold_types(pm.UpdateRoutingTable, dst=2)
    w.net.client_send(0, op, cm.Admin(5, "place", {"channel": "0.0", "node": 1}))
    w.net.run()
    sender = w.cores[0]
    (mig,) = [m for m in sender.migration.outgoing.values() if m.active]
    assert mig.state is OutState.UPDATING and mig.waiting_updates == {2}
    w.net.execute(0, sender.peer_unreachable(2, 10.0))
    w.net.run()
    assert not mig.active and not w.cores[1].arrivals.incoming and not w.cores[1].monitor.busy
    assert isinstance(w.net.received(0, op)[-1], cm.AdminReply)


@pytest.mark.parametrize(("component", "part"), [("balancing", "tick"), ("groups", "tick"), ("migration", "tick")])
def test_one_failing_part_of_a_tick_does_not_stop_the_others(
    component: str, part: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="overlay.node")  # the simulator's tests silence "overlay"
    w = World()
    core = w.cores[0]
    calls: list[str] = []

    def broken(*args: object) -> None:
        raise ValueError("a bad state")

    setattr(getattr(core, component), part, broken)  # a part outside the compiled classes (overlay.build)
    real_drain = core.membership.tick
    core.membership.tick = lambda now, out: calls.append("drain") or real_drain(now, out)  # type: ignore[method-assign]
    core.tick(1.0)
    core.tick(2.0)
    assert calls == ["drain", "drain"] and core.stats["tick_errors"] == 2
    assert "a bad state" in caplog.text and "state:" in caplog.text


def test_a_sync_merges_what_is_newer_and_ignores_what_is_older() -> None:
    """node.boot rule 6 with versions (channels.routing_table rule 7)."""
    w = incarnated_world()
    core = w.cores[2]
    entry = w.cores[0].routing[EC]
    v = core.routing.version(EC)
    major = v >> 32

    def sync(src: int, items: tuple[pm.RouteItem, ...], deleted: tuple[pm.ChannelVersion, ...] = ()) -> None:
        core.handle_peer(src, pm.RoutingTableInit(items, core.epoch, True, deleted), 1.0)

    # Node 2 missed that node 0 gave EC to node 1; node 1's table says so, at a newer version.
    to_1 = pm.RouteItem(EC, msgspec.structs.replace(entry, owners=(1,)), version(major + 1, 0, 0))
    sync(1, (to_1,))
    assert core.routing[EC].owners == (1,) and core.stats["table_entries_repaired"] == 1
    # Node 1 since gave it back: newer again.
    sync(1, (pm.RouteItem(EC, entry, version(major + 2, 0, 1)),))
    assert core.routing[EC].owners == (0,)
    # A sync that left node 0 before it heard of either (fault seed 345) changes nothing.
    sync(0, (to_1,))
    sync(0, (pm.RouteItem(EC, msgspec.structs.replace(entry, owners=(1,)), v),))
    assert core.routing[EC].owners == (0,) and core.stats["table_updates_stale"] == 2
    # Node 0 split EC meanwhile: its sync lists the children and EC's tombstone.
    # A channel the sync does not name (1.5, node 1's) is left alone.
    other = ChannelId(1, 5)
    core.routing.set(other, msgspec.structs.replace(entry, owners=(1,)))
    split = version(core.routing.clock + 1, 0, 0)
    kids = (pm.RouteItem(ChannelId(0, 8), entry, split), pm.RouteItem(ChannelId(0, 9), entry, split))
    sync(0, kids, (pm.ChannelVersion(EC, split),))
    assert set(core.routing.entries()) == {ChannelId(0, 8), ChannelId(0, 9), other}
    assert core.routing.deleted(EC)
    # An entry without a version is refused outright.
    sync(1, (pm.RouteItem(ChannelId(1, 6), entry),))
    assert ChannelId(1, 6) not in core.routing and core.stats["table_entries_refused"] == 1


def test_the_older_epoch_wins_when_a_cluster_was_initialised_twice() -> None:
    w = incarnated_world()
    rogue = NodeCore(CONFIG, 0, incarnation=99_999)
    acts = rogue.start(5.0)  # initialises on its own, a newer epoch
    init = next(a.msg for a in acts if isinstance(a.msg, pm.RoutingTableInit))
    out = w.cores[1].handle_peer(0, init, 5.0)
    # Node 1 keeps its table and sends its own back; the rogue adopts it.
    sync = next(a.msg for a in out if isinstance(a.msg, pm.RoutingTableInit))
    assert sync.sync and sync.epoch == 1000 and w.cores[1].epoch == 1000
    rogue.handle_peer(1, sync, 5.0)
    assert rogue.epoch == 1000 and rogue.ready
