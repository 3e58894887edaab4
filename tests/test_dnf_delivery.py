"""Subscriptions in disjunctive normal form between nodes (node.sessions rule 7,
node.notify rule 6): each conjunct is routed to the channels it overlaps, the
client hears one SubAck and one notification per event however many
conjuncts matched — also after its channels split and move."""

from __future__ import annotations

import random
from collections import Counter

from coreworld import HIGH, World, random_events, spread
from overlay.channels import ChannelId
from overlay.messages import client as cm

LOW_AB = ChannelId(0, 3)  # price ∈ [0, 500], sym ∈ {AB, CD}: node 1 after spread
LOW_REST = ChannelId(0, 4)  # price ∈ [0, 500], any other sym: node 0
CHANNELS = (LOW_AB, LOW_REST, HIGH)

DNF_SUBSCRIPTIONS = [
    'price < 100 or sym = "EF"',
    'not (price < 500 and sym prefix "A")',
    "exists qty and (price > 900 or qty < 10)",
    'not exists qty or sym ieq "ab"',
    'sym not in {"AB", "CD"} or price in [250, 750]',
    'sym like "A*C" or sym isuffix "f" or qty not in [0, 50]',
    "(price < 50 or price > 950) and (qty < 20 or qty > 80)",
]


def test_each_conjunct_goes_to_the_channels_it_overlaps_and_one_suback_counts_them_all():
    w = World()
    spread(w, w.client(0, "ops"))
    sid = w.client(1, "c")
    seq = w.subscribe(1, sid, "s", 'price < 100 or sym = "EF"')
    g0, g1 = w.gids(1, sid, "s")
    assert {c for c in CHANNELS if g0 in w.stored(c)} == {LOW_AB, LOW_REST}  # price < 100
    assert {c for c in CHANNELS if g1 in w.stored(c)} == {LOW_REST, HIGH}  # sym = "EF"
    acks = w.net.received(1, sid, kind=cm.SubAck)
    assert acks == [cm.SubAck(seq, "s", 4)]
    # The event matches both conjuncts, in its one channel: one Notify, the subscription once.
    pub = w.client(2, "p")
    eid = w.publish(2, pub, {"price": 50.0, "sym": "EF"})
    w.net.run()
    assert w.notifies() == Counter({(1, sid, eid, frozenset({"s"})): 1})
    # Unsubscribed: every conjunct leaves every channel, and one UnsubAck.
    useq = w.unsubscribe(1, sid, "s")
    assert w.net.received(1, sid, kind=cm.UnsubAck) == [cm.UnsubAck(useq, "s")]
    assert not any({g0, g1} & w.stored(c) for c in CHANNELS)
    assert sid in w.cores[1].sessions and not w.cores[1].sessions.owners.keys() & {g0, g1}


def _subscribe_all(w: World, rng: random.Random) -> None:
    for n in range(3):
        sid = w.client(n, f"c{n}")
        for j, expr in enumerate(rng.sample(DNF_SUBSCRIPTIONS, 4)):
            w.subscribe(n, sid, f"s{j}", expr)


def _publish(w: World, rng: random.Random, count: int) -> None:
    pubs = [w.client(n, f"p{n}-{len(w.events)}") for n in range(3)]
    for k, values in enumerate(random_events(rng, count)):
        w.publish(k % 3, pubs[k % 3], values)
    w.net.run()


def test_every_matching_subscription_is_notified_once_per_event():
    w = World()
    spread(w, w.client(0, "ops"))
    rng = random.Random(7)
    _subscribe_all(w, rng)
    _publish(w, rng, 300)
    got, want = w.notifies(), w.expected()
    assert sum(want.values()) > 300
    assert got == want  # each (client, event) one Notify, naming each subscription once
    assert w.net.errors == []


def test_conjuncts_follow_their_channels_through_splits_and_moves():
    """Subscribed on the whole space, then split by price and by sym and moved
    to other nodes: every conjunct is where its space says, and events still
    notify each subscription once."""
    w = World()
    rng = random.Random(11)
    _subscribe_all(w, rng)
    _publish(w, rng, 60)
    spread(w, w.client(0, "ops"))
    _publish(w, rng, 200)
    admin = w.client(2, "ops2")  # the owner moves it
    assert isinstance(w.admin(2, admin, "place", channel=str(HIGH), node=1), cm.AdminReply)
    _publish(w, rng, 200)
    got, want = w.notifies(), w.expected()
    assert got == want
    for (node, sid), table in w.subs.items():
        for lid in table:
            for gid in w.gids(node, sid, lid):
                assert gid in w.cores[node].sessions.owners
    assert w.net.errors == []


def test_a_group_subscription_takes_one_conjunction():
    w = World()
    sid = w.client(1, "g")
    w.net.client_send(1, sid, cm.Subscribe(1, "s", "price < 5 or price > 900", group="workers"))
    err = w.net.received(1, sid)[-1]
    assert err.code == cm.ErrorCode.BAD_EXPRESSION and "one conjunction" in err.message
