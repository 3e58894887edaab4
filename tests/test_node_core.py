"""overlay.node_core.NodeCore: cores joined by in-memory links, no event loop.

SPEC §3 (initialisation), §4 (routing), §8.1–8.2 (migration and Reforward).
The network is ``tests/corelink.CoreLink``: deterministic FIFO links with the
high-priority queue first, every peer message through the real codec.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from corelink import CoreLink

from overlay.balance.migration import InState, OutState
from overlay.channels import ChannelId, EventSpace, RouteEntry, parse_subscription
from overlay.config import load_config
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node_core import CloseClient, NodeCore, ToClient, ToPeer

_LOADED = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
# The balancer stays off: these tests drive every session themselves.
CONFIG = msgspec.structs.replace(_LOADED, cluster=msgspec.structs.replace(_LOADED.cluster, balancing=False))
SCHEMA = CONFIG.schema
TIMEOUT = CONFIG.cluster.peer_timeout
EC = ChannelId(0, 0)
LOW = ChannelId(0, 1)  # price ∈ [0, 500] after SPLIT_500
HIGH = ChannelId(0, 2)  # price ∈ (500, 1000]
SPLIT_500 = {"channel": "0.0", "attr": "price", "at": 500.0}

MIGRATION_TYPES = (
    pm.RequestLoadBalance,
    pm.ReplyRequestLoadBalance,
    pm.ChannelTransfer,
    pm.ReplyChannelTransfer,
    pm.SubscriptionMove,
    pm.ReplySubscriptionMove,
    pm.UpdateRoutingTable,
    pm.ReplyUpdateGlobal,
    pm.CompleteLoadBalance,
    pm.Reforward,
)


# -- helpers ------------------------------------------------------------------------------------


class World:
    """A started CoreLink plus the client sessions a test opened, with their
    subscriptions and publications, to compute brute-force expectations."""

    def __init__(self, n: int = 3, *, start: bool = True) -> None:
        cfg = CONFIG if n == 3 else CONFIG.with_nodes(CONFIG.nodes[:n])
        self.net = CoreLink(cfg)
        self.subs: dict[tuple[int, int], dict[str, str]] = {}  # (node, sid) -> local id -> expression
        self.events: dict[str, dict] = {}  # event id -> values
        self._seq = 0
        if start:
            self.net.start()

    @property
    def cores(self) -> dict[int, NodeCore]:
        return self.net.cores

    def seq(self) -> int:
        self._seq += 1
        return self._seq

    def client(self, node: int, name: str) -> int:
        sid = self.net.open_client(node, name)
        self.subs[(node, sid)] = {}
        return sid

    def subscribe(self, node: int, sid: int, lid: str, expr: str, *, settle: bool = True) -> int:
        seq = self.seq()
        self.net.client_send(node, sid, cm.Subscribe(seq, lid, expr))
        self.subs[(node, sid)][lid] = expr
        if settle:
            self.net.run()
            self.assert_replied(node, sid, cm.SubAck, seq)
        return seq

    def unsubscribe(self, node: int, sid: int, lid: str, *, settle: bool = True) -> int:
        seq = self.seq()
        self.net.client_send(node, sid, cm.Unsubscribe(seq, lid))
        del self.subs[(node, sid)][lid]
        if settle:
            self.net.run()
            self.assert_replied(node, sid, cm.UnsubAck, seq)
        return seq

    def publish(self, node: int, sid: int, values: dict) -> str:
        """Publish (no delivery yet); the PubAck is immediate, the id is its event id."""
        seq = self.seq()
        mark = len(self.net.to_clients)
        self.net.client_send(node, sid, cm.Publish(seq, values))
        (ack,) = [m for m in self.net.received(node, sid, since=mark) if getattr(m, "seq", None) == seq]
        assert isinstance(ack, cm.PubAck), ack
        self.events[ack.event_id] = values
        return ack.event_id

    def admin(self, at: int, sid: int, command: str, /, **args) -> object:
        seq = self.seq()
        self.net.client_send(at, sid, cm.Admin(seq, command, args))
        self.net.run()
        return self.reply(at, sid, seq)

    def reply(self, node: int, sid: int, seq: int) -> object:
        replies = [m for m in self.net.received(node, sid) if getattr(m, "seq", None) == seq]
        assert len(replies) == 1, replies
        return replies[0]

    def assert_replied(self, node: int, sid: int, kind: type, seq: int) -> object:
        r = self.reply(node, sid, seq)
        assert isinstance(r, kind), r
        return r

    def notifies(self) -> Counter:
        """Every Notify sent, as (node, sid, event id, sub ids) → count."""
        out: Counter = Counter()
        for node, sid, m in self.net.to_clients:
            if isinstance(m, cm.Notify):
                assert m.event == self.events[m.event_id]
                assert len(set(m.sub_ids)) == len(m.sub_ids)  # each subscription once
                out[(node, sid, m.event_id, frozenset(m.sub_ids))] += 1
        return out

    def expected(self, subs: dict[tuple[int, int], dict[str, str]] | None = None, events: dict | None = None) -> Counter:
        """Brute force: one Notify per (client, event) listing every matching subscription."""
        subs = self.subs if subs is None else subs
        events = self.events if events is None else events
        out: Counter = Counter()
        for (node, sid), table in subs.items():
            filters = {lid: parse_subscription(e, SCHEMA) for lid, e in table.items()}
            for eid, values in events.items():
                hit = frozenset(lid for lid, f in filters.items() if f.matches(values))
                if hit:
                    out[(node, sid, eid, hit)] += 1
        return out

    def stored(self, chid: ChannelId) -> set[str]:
        """Global ids of the subscriptions held by ``chid`` wherever it lives."""
        (owner,) = self.net.owner_of(chid)
        return {s.id for s in self.cores[owner].local[chid]}

    def gid(self, node: int, sid: int, lid: str) -> str:
        return self.cores[node].sessions[sid].subs[lid][0]


def spread(w: World, admin_sid: int) -> None:
    """Split EC at price 500 and place the upper half on node 2; then split the
    lower half by sym and place the {AB, CD} part on node 1."""
    assert isinstance(w.admin(0, admin_sid, "split", **SPLIT_500), cm.AdminReply)
    assert isinstance(w.admin(0, admin_sid, "place", channel="0.2", node=2), cm.AdminReply)
    assert isinstance(w.admin(0, admin_sid, "split", channel="0.1", attr="sym", values=["AB", "CD"]), cm.AdminReply)
    assert isinstance(w.admin(0, admin_sid, "place", channel="0.3", node=1), cm.AdminReply)
    assert w.net.routing_tables_equal()
    assert sorted(w.cores[0].local.ids()) == [ChannelId(0, 4)]
    assert w.cores[1].local.ids() == [ChannelId(0, 3)]
    assert w.cores[2].local.ids() == [HIGH]


def random_events(rng: random.Random, n: int) -> list[dict]:
    prices = [0.0, 1.0, 99.5, 100.0, 250.0, 499.0, 500.0, 500.5, 750.0, 999.0, 1000.0]
    syms = ["AB", "CD", "EF", "X", "ABC"]
    out = []
    for _ in range(n):
        e = {"price": rng.choice(prices), "sym": rng.choice(syms)}
        if rng.random() < 0.5:
            e["qty"] = rng.randrange(0, 100)
        out.append(e)
    return out


SUBSCRIPTIONS = [
    "price < 100",
    "price >= 500",
    'sym = "AB"',
    'sym prefix "A" and price <= 500',
    "price in [250, 750]",
    'sym in {"CD", "X"}',
    "qty > 50",
    'price > 999 and sym != "AB"',
]


# -- initialisation (SPEC §3) -------------------------------------------------------------------


def test_initializer_creates_ec_and_is_ready_when_every_peer_replied():
    w = World(start=False)
    net, cores = w.net, w.cores
    assert not any(c.ready for c in cores.values())
    acts = cores[0].start(0.0)
    init = pm.RoutingTableInit((pm.RouteItem(EC, RouteEntry(EventSpace.whole(SCHEMA), (0,))),))
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
    assert welcome == cm.Welcome(1, sid, False, "local")
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
    # Once ready, the same sessions are served.
    w.net.client_send(1, sid, cm.Publish(4, {"price": 1.0, "sym": "AB"}))
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


def test_peer_without_a_table_gets_the_initializers_table_on_hello():
    w = World()
    assert w.cores[0].peer_hello(1, pm.PeerHello(1, "local", True), 0.0) == []
    (act,) = w.cores[0].peer_hello(1, pm.PeerHello(1, "local", False), 0.0)
    assert act.node == 1 and isinstance(act.msg, pm.RoutingTableInit)
    assert {i.ch_id for i in act.msg.routing_table} == {EC}
    # Only the initializer hands out tables.
    assert w.cores[1].peer_hello(2, pm.PeerHello(2, "local", False), 0.0) == []


# -- subscriptions (SPEC §4) -----------------------------------------------------------------------


def test_subscribe_is_acked_only_after_the_owner_applied_it():
    w = World()
    net = w.net
    sid = w.client(1, "c1")
    net.client_send(1, sid, cm.Subscribe(7, "s1", "price < 100"))
    assert net.received(1, sid, kind=cm.SubAck) == []
    gid = w.gid(1, sid, "s1")
    (src, dst, msg), = net.pending()
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
    net.send(1, 0, pm.Event("stale-1", w.events["stale-1"], 1, pm.DispatchSign.EVENT_DISPATCHED, HIGH))
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
        (0, "place", {"channel": "0.0", "node": 0}, "cannot receive"),
        (0, "place", {"channel": "0.0", "node": "1"}, "integer 'node'"),
        (1, "place", {"channel": "0.0", "node": 2}, "owned by node 0"),
        (0, "reboot", {}, "unknown admin command"),
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
        (1, 0, "ReplyUpdateGlobal"),
        (2, 0, "ReplyUpdateGlobal"),
        (0, 2, "CompleteLoadBalance"),
    ]
    msgs = [m for _, _, m in net.trace[mark:]]
    session = msgs[0].session
    assert all(m.session == session for m in msgs)
    assert msgs[0].forced
    assert msgs[1].status is pm.ReplySign.REPLY_SUCCESS
    assert msgs[2].channels == (pm.ChannelSpec(HIGH, w.cores[1].routing[HIGH].space),)
    assert msgs[3] == pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, (HIGH,), session)
    assert msgs[4].ch_sub_set == (pm.ChannelSubscriptions(HIGH, (stored,)),)
    assert msgs[6] == msgs[7]
    assert msgs[6].delete_chs == () and msgs[6].origin == 0
    assert [(i.ch_id, i.entry.owners) for i in msgs[6].update_chs] == [(HIGH, (2,))]
    assert msgs[10] == pm.CompleteLoadBalance(session, aborted=False)
    assert reply == cm.AdminReply(
        reply.seq,
        {"session": session, "channels": ["0.2"], "receiver": 2, "subscriptions_moved": 1, "bytes": reply.result["bytes"]},
    )
    assert net.owner_of(HIGH) == [2] and net.owner_of(LOW) == [0]
    assert w.stored(HIGH) == {gid}
    assert net.routing_tables_equal()
    # The receiver stored the moved subscriptions at once and indexes them later.
    assert w.cores[2].index_wanted and w.cores[2].local[HIGH].unindexed == 1
    assert w.cores[2].index_pending(16) == 0 and w.stored(HIGH) == {gid}
    assert w.cores[0].outgoing[session].state is OutState.DONE
    assert w.cores[2].incoming == {}
    # Traffic now goes straight to the new owner.
    mark = len(net.trace)
    eid = w.publish(1, sid, {"price": 700.0, "sym": "A"})
    net.run()
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
    mig, acts = w.cores[0].start_migration([EC], 1, 0.0, forced=False)
    net.execute(0, acts)
    mark = len(net.trace)
    net.run()
    assert net.types(mark) == [(0, 1, "RequestLoadBalance"), (1, 0, "ReplyRequestLoadBalance"), (0, 1, "CompleteLoadBalance")]
    assert mig.state is OutState.ABORTED and mig.reason == "balancing is off"
    assert net.owner_of(EC) == [0] and net.routing_tables_equal()
    assert w.cores[0].stats["migrations_aborted"] == 1


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
    (mig,) = w.cores[0].outgoing.values()
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
    (mig,) = cores[0].outgoing.values()
    assert mig.state is OutState.MOVING and mig.reforwarding
    assert cores[2].incoming[(0, mig.session)].state is InState.SUBSCRIPTIONS_ADDED
    applied0 = cores[2].stats["subscriptions_applied"]
    w.subscribe(1, c1, "c", "price >= 50", settle=False)
    gid_a = w.gid(1, c1, "a")
    w.unsubscribe(1, c1, "a", settle=False)
    w.subscribe(0, c0, "d", "price > 990", settle=False)  # the moving-out node's own client
    window1 = [
        w.publish(n, s, e)
        for n, s, e in [(1, c1, {"price": 60.0, "sym": "AB"}), (2, c2, {"price": 995.0, "sym": "Q"}), (0, c0, {"price": 10.0, "sym": "AB"})]
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
    (mig,) = [m for m in cores[0].outgoing.values() if m.active]
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
        belongs = {
            gid for gid in live if cores[0].routing[chid].space.belongs(_filter_of(w, gid), SCHEMA)
        }
        assert owner_filter == belongs, chid
    assert net.errors == []


def _filter_of(w: World, gid: str):
    for (n, s), table in w.subs.items():
        for lid in table:
            if w.gid(n, s, lid) == gid:
                return parse_subscription(table[lid], SCHEMA)
    raise KeyError(gid)


# -- failure before <2> (SPEC §8.2) ------------------------------------------------------------------------


def test_timeout_before_time_2_aborts_and_rolls_back_the_receiver():
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    sid = w.client(1, "c")
    w.subscribe(1, sid, "s", "price < 10")
    net.hold_types(pm.ReplyChannelTransfer, src=2, dst=0)
    seq = _start_place(w, admin, "0.0", 2)
    net.run()
    (mig,) = cores[0].outgoing.values()
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
    assert net.trace[mark][2].aborted
    assert EC not in cores[2].local and cores[2].incoming == {}
    assert net.owner_of(EC) == [0]
    err = w.reply(0, admin, seq)
    assert isinstance(err, cm.Error) and err.code == cm.ErrorCode.ADMIN and "aborted" in err.message
    assert mig.session not in cores[0].outgoing  # forgotten at the tick
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
    assert w.cores[1].incoming == {} and w.net.owner_of(EC) == [0]


def test_receiver_forgets_an_accepted_session_the_sender_never_continues():
    w = World()
    net, cores = w.net, w.cores
    admin = w.client(0, "ops")
    net.hold_types(pm.ChannelTransfer, src=0, dst=2)
    _start_place(w, admin, "0.0", 2)
    net.run()
    (key,) = cores[2].incoming
    assert cores[2].incoming[key].state is InState.ACCEPTED
    net.tick(2, TIMEOUT - 0.001)
    assert key in cores[2].incoming
    net.tick(2, TIMEOUT + 0.001)
    assert cores[2].incoming == {} and EC not in cores[2].local
    # The late ChannelTransfer names a session that is over: answered with
    # REPLY_FAIL, so the sender, never confirmed, rolls back at once.
    net.release()
    net.run()
    assert net.errors == []
    assert not any(m.active for m in cores[0].outgoing.values())
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
    (mig,) = cores[0].outgoing.values()
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
    (mig,) = cores[0].outgoing.values()
    assert mig.state is OutState.UPDATING
    net.tick(0, 1000.0)
    assert mig.state is OutState.UPDATING  # the tables changed: wait, do not abort
    assert net.owner_of(EC) == [2]
    net.release()
    net.run()
    assert mig.state is OutState.DONE and net.routing_tables_equal()
