"""Failure detection (overlay.node.liveness) and recovery of a dead node's channels
(overlay.node.recovery), on the pure classes and on node cores joined by CoreLink."""

from __future__ import annotations

import msgspec
import pytest

from coreworld import _LOADED, EC, LOW, SPLIT_500, World
from coreworld import TIMEOUT as PEER_TIMEOUT
from overlay.actions import ToPeer
from overlay.channels import ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext, sub_prefix
from overlay.node.liveness import LEASE, Liveness
from overlay.node.peers import PeerRuns
from overlay.testing.corelink import CoreLink

pytestmark = pytest.mark.timeout(60)

INTERVAL, TIMEOUT = 0.25, 1.5


def live(node: int = 0, peers: tuple[int, ...] = (1, 2, 3, 4), **kw: float) -> Liveness:
    lv = Liveness(node, 7, list(peers), interval=INTERVAL, timeout=TIMEOUT, **kw)
    lv.start(0.0)
    return lv


def beat(suspects: tuple[int, ...] = (), dead: tuple[tuple[int, int], ...] = (), inc: int = 1) -> pm.Heartbeat:
    return pm.Heartbeat(inc, suspects, tuple(pm.DeadNode(n, i) for n, i in dead))


# -- the pure detector --------------------------------------------------------------------------


def test_nobody_is_suspected_before_the_timeout_after_start() -> None:
    lv = live()
    assert lv.suspects(TIMEOUT - 0.01) == [] and lv.has_quorum(TIMEOUT - 0.01)
    assert lv.suspects(TIMEOUT + 0.01) == [1, 2, 3, 4]


def test_heartbeats_go_out_every_interval_and_catch_up_after_a_pause() -> None:
    lv = live()
    assert lv.due(0.0) and not lv.due(0.1) and lv.due(0.25) and not lv.due(0.3)
    assert lv.due(10.0) and not lv.due(10.1) and lv.due(10.25)


def test_a_silent_peer_is_dead_only_when_a_majority_suspects_it() -> None:
    lv = live()
    for t in (0.5, 1.0, 1.5, 2.0):
        for p in (1, 2, 3):
            lv.heard(p, t)
    # Node 4 silent since the start: suspected here, but one vote of five is no majority.
    assert lv.check(2.0) == [] and lv.suspects(2.0) == [4]
    lv.on_heartbeat(1, beat((4,)), 2.0)
    assert lv.check(2.0) == []  # two votes
    lv.on_heartbeat(2, beat((4,)), 2.0)
    assert lv.check(2.0) == [4] and lv.is_dead(4)  # three of five
    assert lv.heartbeat(2.0).dead == (pm.DeadNode(4, 0),)
    assert lv.check(2.1) == []  # declared once


def test_a_minority_has_no_quorum_and_declares_nobody_dead() -> None:
    lv = live()
    lv.heard(1, 2.0)
    lv.on_heartbeat(1, beat((2, 3, 4)), 2.0)
    assert not lv.has_quorum(2.0)
    assert lv.check(2.0) == []
    assert not lv.dead


def test_the_quorum_answer_kept_between_calls_is_always_the_one_computed_afresh() -> None:
    # has_quorum remembers a True answer until a deadline could end it;
    # whatever is heard, echoed or declared meanwhile, it must agree with a
    # detector that computes it afresh.
    import random

    rng = random.Random(16)
    for _ in range(200):
        lv = live()
        now = 0.0
        for _ in range(60):
            now += rng.choice((0.0, 0.05, 0.3, 0.9, 1.6))
            act = rng.random()
            p = rng.choice((1, 2, 3, 4))
            if act < 0.3:
                lv.heard(p, now)
            elif act < 0.6:
                lv.on_heartbeat(p, pm.Heartbeat(1, sent=now, echo=max(0.0, now - rng.choice((0.1, 0.5, 1.2)))), now)
            elif act < 0.65:
                lv.declare(p, 0, "test", now)
            elif act < 0.7:
                lv.revived(p, 9, now)
            kept = lv.has_quorum(now)
            lv._quorum_until = 0.0  # forget: compute afresh
            assert kept == lv.has_quorum(now), now


def test_a_node_whose_heartbeats_are_not_echoed_stops_serving_before_it_can_be_declared_dead() -> None:
    """Rule 4's lease: cut off one way (it hears its peers, they do not hear
    it), a node still stops answering before any peer may declare it dead."""
    lv = live()
    assert lv.heartbeat(0.25).sent == 0.25 and lv.to(1, lv.heartbeat(0.25)).echo == -1.0
    for t in (0.25, 0.5):
        for p in (1, 2, 3, 4):
            lv.on_heartbeat(p, pm.Heartbeat(1, sent=t, echo=t), t)
    assert lv.to(3, lv.heartbeat(0.6)).echo == 0.5  # what node 3 sent last, sent back
    assert lv.has_quorum(0.6)
    # From 0.5 on, nothing it sends arrives: its peers keep talking, echoing 0.5.
    t = 0.5
    while lv.has_quorum(t):
        for p in (1, 2, 3, 4):
            lv.on_heartbeat(p, pm.Heartbeat(1, sent=t, echo=0.5), t)
        t = round(t + 0.05, 2)
    assert t <= 0.5 + LEASE * TIMEOUT + 0.05 < 0.5 + TIMEOUT  # the peers' earliest declaration
    assert lv.live(t) == [0, 1, 2, 3, 4]  # it still suspects nobody: only the lease ended
    lv.on_heartbeat(1, pm.Heartbeat(1, sent=t, echo=t), t)
    lv.on_heartbeat(2, pm.Heartbeat(1, sent=t, echo=t), t)
    assert lv.has_quorum(t)  # echoes again from a majority (itself, 1 and 2)


def test_a_death_is_learned_from_a_live_peer_and_a_run_told_it_is_dead_rejoins() -> None:
    lv = live()
    assert lv.on_heartbeat(1, beat(dead=((3, 5),)), 1.0) == [3]
    assert lv.is_dead(3) and not lv.rejoin
    lv.on_heartbeat(2, beat(dead=((0, 6),)), 1.1)  # an older run of this node: not us
    assert not lv.rejoin
    lv.on_heartbeat(2, beat(dead=((0, 7),)), 1.2)
    assert lv.rejoin and "node 2" in lv.rejoin_reason


def test_the_coordinator_is_the_lowest_live_node() -> None:
    lv = live(node=3, peers=(0, 1, 2, 4))
    for p in (1, 2, 4):
        lv.heard(p, 2.0)
    assert lv.coordinator(2.0) == 1  # node 0 is suspected
    lv.heard(0, 2.0)
    assert lv.coordinator(2.0) == 0


def test_a_node_back_from_the_dead_is_damped_longer_each_time_it_flaps() -> None:
    lv = live(damping=10.0, flap_window=300.0)
    lv.on_heartbeat(1, beat(dead=((4, 1),)), 1.0)
    assert lv.revived(4, 2, 5.0) and lv.damped(4, 14.9) and not lv.damped(4, 15.1)
    lv.on_heartbeat(1, beat(dead=((4, 2),)), 20.0)
    assert lv.revived(4, 3, 21.0) and lv.damped(4, 40.9) and not lv.damped(4, 41.1)  # 2 deaths: 20 s
    assert not lv.revived(4, 3, 22.0)  # alive already


# -- cores: a node dies, its channels are rebuilt elsewhere -------------------------------------------

CONFIG = msgspec.structs.replace(
    _LOADED,
    cluster=msgspec.structs.replace(
        _LOADED.cluster, balancing=False, heartbeat_interval=INTERVAL, suspect_timeout=TIMEOUT
    ),
)


class Cluster:
    """A CoreLink whose nodes can crash: a crashed node is never ticked and
    everything sent to it is lost."""

    def __init__(self) -> None:
        self.net = CoreLink(CONFIG)
        self.net.start()
        self.dead: set[int] = set()

    def crash(self, node: int) -> None:
        self.dead.add(node)
        self._drop()

    def _drop(self) -> None:
        for (a, b), link in self.net.links.items():
            if a in self.dead or b in self.dead:
                while len(link):
                    link.pop()

    def run_until(self, t: float, step: float = 0.05) -> None:
        now = self.net.now
        while now < t:
            now = round(now + step, 6)
            for i in self.net.cores:
                if i not in self.dead:
                    self.net.tick(i, now)
            self._drop()
            while self.net.step() is not None:
                self._drop()


def test_the_majority_reassigns_a_dead_owners_channel_and_rebuilds_its_subscriptions() -> None:
    cl = Cluster()
    net = cl.net
    assert net.owner_of(EC) == [0]
    s1 = net.open_client(1, "sub-1")
    s2 = net.open_client(2, "sub-2")
    net.client_send(1, s1, cm.Subscribe(1, "a", "price < 100"))
    net.client_send(2, s2, cm.Subscribe(1, "b", "price >= 50"))
    net.run()
    assert any(isinstance(m, cm.SubAck) for m in net.received(1, s1))
    assert any(isinstance(m, cm.SubAck) for m in net.received(2, s2))
    cl.run_until(1.0)
    cl.crash(0)
    cl.run_until(4.0)
    for i in (1, 2):
        core = net.cores[i]
        assert core.liveness.is_dead(0), i
        assert core.routing[EC].owners != (0,), core.routing[EC]
    (owner,) = [i for i in net.owner_of(EC) if i not in cl.dead]
    assert owner in (1, 2)
    ch = net.cores[owner].local[EC]
    assert len(ch) == 2  # both subscriptions rebuilt from their access nodes
    assert not net.cores[owner].recovery.rebuilding
    pub = net.open_client(2, "pub")
    mark = len(net.to_clients)
    net.client_send(2, pub, cm.Publish(1, {"price": 70.0, "sym": "AB"}))
    cl.run_until(4.5)
    got = [(n, s) for n, s, m in net.to_clients[mark:] if isinstance(m, cm.Notify)]
    assert sorted(got) == [(1, s1), (2, s2)]


def test_a_restarted_owner_gets_subscriptions_for_a_channel_this_table_never_heard_of() -> None:
    """Fault seed 66: a split's announcement died with the owner; its new run
    claims the split's halves, which node 2's table does not know.  Node 2's
    clients' subscriptions in them must still go (node.recovery rule 5)."""
    cl = Cluster()
    net = cl.net
    s2 = net.open_client(2, "sub-2")
    net.client_send(2, s2, cm.Subscribe(1, "a", "price >= 900"))
    net.client_send(2, s2, cm.Subscribe(2, "b", "price < 10"))
    net.run()
    core = net.cores[2]
    half = ChannelId(0, 9)
    claim = pm.UpdateRoutingTable((), (pm.RouteItem(half, RouteEntry(core.routing[EC].space, (0,))),), 1, 0, 0)
    assert half not in core.routing
    out = core.handle_peer(0, claim, net.now)
    rebuilds = [a.msg for a in out if isinstance(a, ToPeer) and isinstance(a.msg, pm.Rebuild)]
    assert [r.ch_id for r in rebuilds] == [half] and rebuilds[-1].last
    assert sorted(s.id.split(":")[2] for r in rebuilds for s in r.subscriptions) == ["a", "b"]


def test_a_rebuild_is_its_access_nodes_whole_truth() -> None:
    """Fault seed 593: a replica kept a subscription whose unsubscription died
    with the first owner.  The access node's Rebuild (its last chunk) is the
    whole truth of what it holds: what it does not name goes."""
    cl = Cluster()
    net = cl.net
    s2 = net.open_client(2, "sub-2")
    net.client_send(2, s2, cm.Subscribe(1, "keep", "price < 100"))
    net.client_send(2, s2, cm.Subscribe(2, "gone", "price >= 500"))
    net.run()
    owner = net.cores[0]
    ch = owner.local[EC]
    ids = {s.id.split(":")[2]: s for s in ch}
    assert set(ids) == {"keep", "gone"}
    keep = ids["keep"]
    chunk = pm.StoredSubscription(keep.id, keep.filter, keep.subscriber, 2, "", 1.0)
    owner.handle_peer(2, pm.Rebuild(EC, (chunk,), last=False, dead=1), net.now)
    assert len(ch) == 2  # not the last chunk: nothing judged yet
    owner.handle_peer(2, pm.Rebuild(EC, (), last=True, dead=1), net.now)
    assert [s.id.split(":")[2] for s in ch] == ["keep"]
    assert owner.ctx.stats["subscriptions_dropped_by_rebuild"] == 1


def test_a_node_cut_off_alone_answers_no_quorum_and_learns_it_was_declared_dead() -> None:
    cl = Cluster()
    net = cl.net
    cl.run_until(1.0)
    # Node 2 is cut off: nothing reaches it or leaves it, but it keeps ticking.
    cut = {2}
    for key, link in net.links.items():
        if set(key) & cut:
            link.paused = True
    now = 1.0
    while now < 4.0:
        now = round(now + 0.05, 6)
        for i in net.cores:
            net.tick(i, now)
        for key, link in net.links.items():
            if set(key) & cut:
                while len(link):
                    link.pop()
        net.run()
    assert not net.cores[2].liveness.has_quorum(now)
    sid = net.open_client(2, "c")
    net.client_send(2, sid, cm.Publish(1, {"price": 1.0, "sym": "AB"}))
    (err,) = [m for m in net.received(2, sid) if isinstance(m, cm.Error)]
    assert err.code == cm.ErrorCode.NO_QUORUM
    assert all(net.cores[i].liveness.is_dead(2) for i in (0, 1))
    # The cut heals: node 2 hears that it was declared dead and asks to rejoin.
    for link in net.links.values():
        link.paused = False
    cl.run_until(now + 1.0)
    (rejoin,) = net.rejoins  # once
    assert rejoin[0] == 2 and "declared this run of node 2 dead" in rejoin[1]


# -- a sender dies in the middle of a migration ---------------------------------------------------


STEPS = [
    (pm.ChannelTransfer, 2),  # before the receiver has the channel
    (pm.SubscriptionMove, 2),  # the receiver holds the channel, not its subscriptions
    (pm.UpdateRoutingTable, 1),  # <3> reached the receiver, not node 1
    (pm.UpdateRoutingTable, 2),  # <3> reached node 1, not the receiver
    (pm.CompleteLoadBalance, 2),  # every table moved; the receiver waits for the end
]


@pytest.mark.parametrize("dies", [0, 2], ids=["sender dies", "receiver dies"])
@pytest.mark.parametrize(("held", "dst"), STEPS)
def test_a_node_dying_at_any_step_of_a_migration_leaves_one_whole_owner(held: type, dst: int, dies: int) -> None:
    # Node 0 moves EC to node 2; the session stops at ``held`` and ``dies`` crashes.
    cl = Cluster()
    net = cl.net
    s1 = net.open_client(1, "sub-1")
    net.client_send(1, s1, cm.Subscribe(1, "a", "price < 100"))
    subs = [(1, s1)]
    survivor = 2 if dies == 0 else 0
    s2 = net.open_client(survivor, "sub-2")
    net.client_send(survivor, s2, cm.Subscribe(1, "b", "price >= 50"))
    subs.append((survivor, s2))
    net.run()
    admin = net.open_client(0, "ops")
    net.hold_types(held, src=0, dst=dst)
    net.client_send(0, admin, cm.Admin(1, "place", {"channel": "0.0", "node": 2}))
    net.run()
    assert net.paused(), "the session never reached the held message"
    cl.crash(dies)
    net.release()
    cl.run_until(8.0)
    live = sorted({0, 1, 2} - {dies})
    assert net.cores[live[0]].routing == net.cores[live[1]].routing
    (owner,) = [i for i in live if EC in net.cores[i].local]
    assert net.cores[1].routing[EC].owners == (owner,)
    assert len(net.cores[owner].local[EC]) == 2
    assert all(net.cores[i].settled() for i in live)
    pub = net.open_client(1, "pub")
    mark = len(net.to_clients)
    net.client_send(1, pub, cm.Publish(1, {"price": 70.0, "sym": "AB"}))
    cl.run_until(8.5)
    got = sorted((n, s) for n, s, m in net.to_clients[mark:] if isinstance(m, cm.Notify))
    assert got == sorted(subs)


def test_a_node_that_was_paused_itself_does_not_count_its_peers_silence() -> None:
    lv = live()
    for t in (0.5, 1.0):
        lv.check(t)
        for p in (1, 2, 3, 4):
            lv.heard(p, t)
    lv.on_heartbeat(1, beat((2, 3)), 1.0)
    # The node's own loop was held for 5 s: everyone looks silent, nobody is suspected.
    assert lv.check(6.0) == [] and lv.suspects(6.0) == [] and lv.heartbeat(6.0).suspects == ()
    t = 6.0
    while t < 6.0 + TIMEOUT + 0.1:  # running again, and still nothing heard: now they count
        t = round(t + 0.1, 6)
        assert lv.check(t) == []
    assert lv.suspects(t) == [1, 2, 3, 4]


def test_an_unanswered_subscription_is_sent_again_when_a_node_dies_and_a_late_copy_resurrects_nothing() -> None:
    # node.sessions rule 6, node.router rule 9.
    cl = Cluster()
    net = cl.net
    s1 = net.open_client(1, "sub-1")
    net.hold_types(pm.Subscription, src=1, dst=0)
    net.client_send(1, s1, cm.Subscribe(1, "a", "price < 100"))
    net.run()
    (lost,) = [m for m in net.links[(1, 0)].queued() if isinstance(m, pm.Subscription)]
    net.links[(1, 0)].pop()  # it dies with the connection, as if node 0 had forwarded it and died
    net.release()
    cl.run_until(1.0)
    assert not net.received(1, s1, kind=cm.SubAck)
    cl.crash(2)  # any death: node 1 tries its waiting subscription again
    cl.run_until(4.0)
    assert net.received(1, s1, kind=cm.SubAck)
    assert lost.sub_id in net.cores[0].local[EC]
    net.client_send(1, s1, cm.Unsubscribe(2, "a"))
    cl.run_until(4.5)
    assert net.received(1, s1, kind=cm.UnsubAck) and lost.sub_id not in net.cores[0].local[EC]
    net.send(1, 0, lost)  # the first try, arriving last
    cl.run_until(5.0)
    assert lost.sub_id not in net.cores[0].local[EC]
    assert net.cores[0].stats["subscriptions_resurrection_refused"] == 1


def test_a_copy_that_answers_after_its_channel_was_rebuilt_counts_for_nothing_more() -> None:
    # node.sessions rule 5: the copy's answer used to take the wait below zero, for ever.
    w = World()
    assert isinstance(w.admin(0, w.client(0, "ops"), "split", **SPLIT_500), cm.AdminReply)
    s1 = w.client(1, "sub-1")
    w.net.hold_types(pm.Subscription, src=1, dst=0)
    w.subscribe(1, s1, "a", "price >= 0", settle=False)  # one copy for each half
    w.net.run()
    core = w.cores[1]
    out: list = []
    core.sessions.rebuilt(LOW, out)  # as node.recovery does once it sent LOW's owner this node's copies
    w.net.execute(1, out)
    assert core.sessions.pending() == 1 and not w.net.received(1, s1, kind=cm.SubAck)
    w.net.release()
    w.net.run()  # both held copies are applied at node 0 and answer
    assert not core.sessions.pending() and len(w.net.received(1, s1, kind=cm.SubAck)) == 1
    w.unsubscribe(1, s1, "a")


def test_a_node_given_a_dead_nodes_channel_holds_it_before_the_deaths_retries_look_for_it() -> None:
    # node.recovery rule 3 (fault seed 180): the retries of node.sessions rule 6
    # used to look for the channel before it was created here, and bounced.
    w = World()
    s1 = w.client(1, "sub-1")
    w.net.hold_types(pm.Subscription, src=1, dst=0)
    w.subscribe(1, s1, "a", "price < 100", settle=False)
    w.net.run()
    w.net.links[(1, 0)].pop()  # lost with node 0, which is about to be declared dead
    w.net.release()
    core = w.cores[1]
    entry = core.routing[EC]
    v = core.routing.version(EC)
    recovered = pm.RouteItem(EC, msgspec.structs.replace(entry, owners=(1,)), v + (1 << 16) + 2 - (v & 0xFFFF))
    w.net.send(2, 1, pm.UpdateRoutingTable((), (recovered,), 9, 2, 0))  # node 2 coordinates: node 0 is dead
    w.net.run()
    assert EC in core.local and core.routing[EC].owners == (1,)
    assert core.stats["subscriptions_unroutable"] == 0
    assert w.gid(1, s1, "a") in {s.id for s in core.local[EC]}


def test_a_death_told_of_an_earlier_run_after_the_new_run_said_hello_is_not_taken_for_it() -> None:
    # node.liveness rule 3 (fault seeds 285, 373, 577): node 4 restarted (run 9)
    # and said hello; node 1, which had declared run 8 dead, still tells of it.
    lv = live()
    lv.on_heartbeat(4, beat(inc=8), 0.5)
    assert not lv.revived(4, 9, 1.0)  # not dead here: nothing to revive, but run 9 is known now
    lv.on_heartbeat(1, beat(dead=((4, 8),)), 1.1)
    assert not lv.is_dead(4)
    lv.on_heartbeat(1, beat(dead=((4, 9),)), 1.2)  # a death of run 9 itself is taken
    assert lv.is_dead(4)


def test_a_restart_claim_naming_this_node_keeps_its_own_clients_subscriptions() -> None:
    """Fault seed 330: a restarted node's new run named node 0 sole owner of a
    channel node 0's table gave to others too.  Node 0's "nothing here for
    it" answer went to the owner the claim named — itself — as an empty last
    Rebuild, and dropped its own clients' subscriptions from the channel."""
    cl = Cluster()
    net = cl.net
    s0 = net.open_client(0, "sub-0")
    net.client_send(0, s0, cm.Subscribe(1, "mine", "price < 100"))
    net.run()
    core = net.cores[0]
    assert [s.id.split(":")[2] for s in core.local[EC]] == ["mine"]
    entry = core.routing[EC]
    core.routing.set(EC, RouteEntry(entry.space, (0, 2)))  # a replica on node 2 too, as in the seed
    claim = pm.UpdateRoutingTable((), (pm.RouteItem(EC, RouteEntry(entry.space, (0,))),), 1, 1, 1)
    out = core.handle_peer(1, claim, net.now)
    assert [s.id.split(":")[2] for s in core.local[EC]] == ["mine"]
    assert not [a for a in out if isinstance(a, ToPeer) and isinstance(a.msg, pm.Rebuild)]
    assert core.stats["subscriptions_dropped_by_rebuild"] == 0


def test_the_subscriptions_of_a_run_declared_dead_are_stale_wherever_they_come_from() -> None:
    """Fault seed 905: a SubscriptionMove snapshot taken before the sender heard
    of a death carried the dead run's subscriptions; they stayed for good."""
    runs = PeerRuns(NodeContext(CONFIG, 1, 5))
    runs.hello(2, 7)
    old = sub_prefix(2, 7) + "3:b:1"
    assert not runs.stale_sub(old, 2)
    runs.drop_subscriptions_of(2)  # declared dead
    assert runs.stale_sub(old, 2)
    assert runs.hello(2, 9)  # its next run
    assert runs.stale_sub(old, 2) and not runs.stale_sub(sub_prefix(2, 9) + "1:a:1", 2)


def test_a_last_rebuild_that_overtakes_the_update_re_stating_a_channel_held_here_counts() -> None:
    """Fault seed 153, once the simulator handed the cores runs of messages
    (``sim.inbox``): a dead node had just handed its channel to node 4; the
    recovery re-stated it there.  Node 2 heard first and its last Rebuild
    reached node 4 before the update: the channel was already there, no
    rebuild under way, so it counted for nothing — and the rebuild the update
    began waited for node 2 for good, holding every event of the channel:
    keyed ones were PubAck'd and never matched (node.recovery rule 4)."""
    w = World()
    s2 = w.client(2, "sub-2")
    w.subscribe(2, s2, "a", "price < 100")
    core = w.cores[0]
    (sub,) = core.local[EC]
    entry, version = core.routing[EC], core.routing.version(EC)
    mine = pm.StoredSubscription(sub.id, sub.filter, sub.subscriber, 2, "", 1.0)
    core.handle_peer(2, pm.Rebuild(EC, (mine,), last=True, dead=1), w.net.now)
    assert not core.recovery.rebuilding
    restated = pm.RouteItem(EC, entry, version)  # node 2 coordinates: node 1 is dead
    core.handle_peer(2, pm.UpdateRoutingTable((), (restated,), 9, 2, 1), w.net.now)
    assert core.liveness.is_dead(1) and core.routing[EC].owners == (0,)
    assert not core.recovery.rebuilding, "node 2's last Rebuild came already: nobody is left to wait for"
    assert [s.id for s in core.local[EC]] == [sub.id]


def test_a_last_rebuild_of_an_earlier_recovery_counts_for_nothing_later() -> None:
    """The same, but the update comes long after (another recovery): a Rebuild
    that old says nothing of what the sender holds now."""
    w = World()
    core = w.cores[0]
    entry, version = core.routing[EC], core.routing.version(EC)
    core.handle_peer(2, pm.Rebuild(EC, (), last=True, dead=1), w.net.now)
    restated = pm.RouteItem(EC, entry, version)
    core.handle_peer(2, pm.UpdateRoutingTable((), (restated,), 9, 2, 1), w.net.now + 2 * PEER_TIMEOUT)
    assert sorted(core.recovery.rebuilding[EC].waiting) == [2]
