"""``overlay.node.peer_checks``: what only the schema can judge in a peer
message is checked before any component acts on it (SPEC §16 "absurd input").

Each case is a finding of ``bench/fuzz.py`` (a peer message the codec
decodes whose content then raised deep in a component, or stayed in the
routing table and broke every later lookup): the message is refused with
``RemoteProtocolError`` naming it, nothing of it is applied, and the node
serves as before.  Valid messages of every type pass.
"""

from __future__ import annotations

import math

import msgspec
import pytest

from coreworld import EC, SCHEMA, World
from overlay.channels import EventSpace, Interval, RangeConstraint, RouteEntry, SetConstraint
from overlay.channels.predicates import Filter, Op, Predicate
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.peer_checks import check_peer_message
from overlay.testing._mutate import samples

CLIENT, PEER = samples(SCHEMA, node=0, peer=2)
SAMPLE = {type(m): m for m in PEER}
GOOD = SAMPLE[pm.Subscription].sub_exp
STRING_BOUND = Filter((Predicate("price", Op.LE, ("REPLY_SUCCESS",)),))
NO_VALUE = Filter((Predicate("price", Op.LE, ()),))
UNKNOWN_ATTR = Filter((Predicate("SUBSCRIBE_NEW", Op.EQ, ("x",)),))
WHOLE = EventSpace.whole(SCHEMA)
# ``price`` twice, ``sym`` missing: the routing table's index then failed every lookup.
NOT_DA = EventSpace((WHOLE.constraints[0], RangeConstraint("price", Interval(0.0, 10.0))))
NAN_BOUND = EventSpace((RangeConstraint("price", Interval(0.0, math.nan)), WHOLE.constraints[1]))
WRONG_KIND = EventSpace((SetConstraint("price", frozenset({"a"})), WHOLE.constraints[1]))


def _stored(f: Filter, weight: float = 1.0):
    sub = SAMPLE[pm.Subscription]
    return msgspec.structs.replace(sub.stored(), filter=f, weight=weight)


def _replace(t: type, **fields) -> pm.PeerMessage:
    return msgspec.structs.replace(SAMPLE[t], **fields)


@pytest.mark.parametrize("msg", PEER, ids=lambda m: type(m).__name__)
def test_valid_messages_of_every_type_pass(msg: pm.PeerMessage) -> None:
    check_peer_message(msg, SCHEMA)


BAD = {
    "a filter's bound of the wrong type": _replace(pm.Subscription, sub_exp=STRING_BOUND),
    "a predicate without its value": _replace(pm.UnSubscription, unsub_exp=NO_VALUE),
    "a predicate on an unknown attribute": _replace(pm.Subscription, sub_exp=UNKNOWN_ATTR),
    "a filter without predicates": _replace(pm.Subscription, sub_exp=Filter(())),
    "an event value of an unknown attribute": _replace(pm.Event, event_exp={"price": 1.0, "sym": "A", "zz": 1}),
    "an event without a distinguishing attribute": _replace(pm.Event, event_exp={"price": 1.0}),
    "an event value out of its domain": _replace(pm.Event, event_exp={"price": 1e308, "sym": "A"}),
    "an event value that is NaN": _replace(pm.Event, event_exp={"price": math.nan, "sym": "A"}),
    "an event's publish time that is NaN": _replace(pm.Event, publish_time=math.nan),
    "a space that constrains a non-distinguishing attribute": _replace(
        pm.UpdateRoutingTable, update_chs=(pm.RouteItem(EC, RouteEntry(NOT_DA, (0,))),)
    ),
    "a route without an owner": _replace(pm.UpdateRoutingTable, update_chs=(pm.RouteItem(EC, RouteEntry(WHOLE, ())),)),
    "a space bound that is NaN": _replace(
        pm.RoutingTableInit, routing_table=(pm.RouteItem(EC, RouteEntry(NAN_BOUND, (0,))),)
    ),
    "a set constraint on a number": _replace(pm.ChannelTransfer, channels=(pm.ChannelSpec(EC, WRONG_KIND),)),
    "a past owner's time that is NaN": _replace(
        pm.ChannelTransfer, channels=(pm.ChannelSpec(EC, WHOLE, (pm.PastOwner(1, math.nan),)),)
    ),
    "a moved subscription's weight that is NaN": _replace(
        pm.SubscriptionMove, ch_sub_set=(pm.ChannelSubscriptions(EC, (_stored(GOOD, math.nan),)),)
    ),
    "a rebuilt subscription's predicate without its value": _replace(pm.Rebuild, subscriptions=(_stored(NO_VALUE),)),
    "a reforwarded subscription's bad filter": _replace(
        pm.Reforward,
        messages=(pm.ReforwardItem(pm.ReforwardSign.SUBSCRIBE, _replace(pm.Subscription, sub_exp=STRING_BOUND)),),
    ),
}


@pytest.mark.parametrize("msg", BAD.values(), ids=BAD.keys())
def test_content_the_schema_refuses_is_a_protocol_error_naming_the_message(msg: pm.PeerMessage) -> None:
    with pytest.raises(RemoteProtocolError, match=type(msg).__name__):
        check_peer_message(msg, SCHEMA)


@pytest.mark.parametrize("msg", BAD.values(), ids=BAD.keys())
def test_a_refused_message_changes_nothing_and_the_node_keeps_serving(msg: pm.PeerMessage) -> None:
    """At the node core: refused before any component saw it — the table,
    the channel and the sessions are as before, and a subscription and an
    event through every node still meet."""
    w = World()
    owner = w.cores[0]
    table, stored = dict(owner.routing.entries()), w.stored(EC)
    with pytest.raises(RemoteProtocolError):
        owner.handle_peer(2, msg, w.net.now)
    assert dict(owner.routing.entries()) == table
    assert w.stored(EC) == stored
    subscriber = w.client(1, "sub")
    w.subscribe(1, subscriber, "s", "price < 100")
    eid = w.publish(2, w.client(2, "pub"), {"price": 5.0, "sym": "A"})
    w.net.run()
    assert [n.event_id for n in w.net.received(1, subscriber, kind=cm.Notify)] == [eid]
