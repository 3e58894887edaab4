"""overlay.channels.routing_table: the cluster-wide channel map and its indexed lookups (SPEC §2.4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.channels import (
    ChannelId,
    EventSpace,
    ExceptConstraint,
    Interval,
    RangeConstraint,
    RouteEntry,
    RoutingTable,
    SetConstraint,
)
from overlay.errors import LocalProtocolError
from strategies import PROPERTY_SCHEMAS, STRINGS, events, filters, partition, unchecked_filter

PROPS = settings(max_examples=200, deadline=None)

EVENT = {"price": 12.5, "qty": 3, "sym": "AB", "tag": 7}
C = ChannelId


def sub(text, schema):
    return unchecked_filter(text, schema)


def split_table(schema):
    """price ∈ [0, 20] on node 1, (20, 1000] split again by sym on nodes 2 and 3."""
    low, high = EventSpace.whole(schema).cut(schema.attributes["price"], 20)
    ab, rest = high.take_strings("sym", ["AB", "CD"])
    return RoutingTable(
        schema,
        {C(1, 0): RouteEntry(low, (1,)), C(2, 0): RouteEntry(ab, (2,)), C(3, 0): RouteEntry(rest, (3, 4))},
    )


# -- entries ---------------------------------------------------------------------------------


def test_route_entry_owners(schema):
    wes = EventSpace.whole(schema)
    single, replicated = RouteEntry(wes, (3,)), RouteEntry(wes, (3, 5))
    assert single.owner == 3 and not single.replicated
    assert replicated.owner == 3 and replicated.replicated


def test_content_operations(schema):
    wes = EventSpace.whole(schema)
    rt = RoutingTable(schema)
    assert len(rt) == 0 and rt.lookup_event(EVENT) is None and rt.lookup_subscription(sub("qty < 3", schema)) == []
    rt.set(C(0, 0), RouteEntry(wes, (0,)))
    assert len(rt) == 1 and C(0, 0) in rt and list(rt) == [C(0, 0)]
    assert rt[C(0, 0)] == rt.get(C(0, 0)) == RouteEntry(wes, (0,))
    assert rt.get(C(9, 9)) is None
    with pytest.raises(LocalProtocolError, match=r"9\.9 is not in the routing table"):
        rt[C(9, 9)]
    with pytest.raises(LocalProtocolError, match="at least one owner"):
        rt.set(C(1, 0), RouteEntry(wes, ()))
    assert C(1, 0) not in rt
    copy = rt.entries()
    copy.clear()
    assert len(rt) == 1  # entries() is a copy
    assert list(rt.items()) == [(C(0, 0), RouteEntry(wes, (0,)))]
    assert rt.remove(C(0, 0)) == RouteEntry(wes, (0,))
    assert rt.remove(C(0, 0)) is None
    assert len(rt) == 0


def test_equality_and_channels_of(schema):
    a, b = split_table(schema), split_table(schema)
    assert a == b and a != RoutingTable(schema) and a != a.entries()
    assert a.channels_of(1) == [C(1, 0)]
    assert a.channels_of(4) == [C(3, 0)]  # a replica
    assert a.channels_of(9) == []


def test_apply_deletes_first_then_updates(schema):
    rt = split_table(schema)
    wes = EventSpace.whole(schema)
    rt.apply(delete=[C(1, 0), C(2, 0), C(3, 0)], update={C(3, 0): RouteEntry(wes, (7,))})
    assert rt.entries() == {C(3, 0): RouteEntry(wes, (7,))}
    rt.apply(delete=[C(42, 0)], update=[(C(5, 1), RouteEntry(wes, (8,)))])  # unknown ids ignored
    assert set(rt) == {C(3, 0), C(5, 1)}
    with pytest.raises(LocalProtocolError, match="at least one owner"):
        rt.apply(update={C(6, 0): RouteEntry(wes, ())})


def test_replace_all(schema):
    rt = split_table(schema)
    wes = EventSpace.whole(schema)
    rt.replace_all({C(0, 0): RouteEntry(wes, (0,))})
    assert rt.entries() == {C(0, 0): RouteEntry(wes, (0,))}
    assert rt.lookup_event(EVENT) == C(0, 0)


# -- lookups ------------------------------------------------------------------------------------


def test_lookup_event(schema):
    rt = split_table(schema)
    assert rt.lookup_event({**EVENT, "price": 20}) == C(1, 0)
    assert rt.lookup_event({**EVENT, "price": 0}) == C(1, 0)
    assert rt.lookup_event({**EVENT, "price": 20.5, "sym": "AB"}) == C(2, 0)
    assert rt.lookup_event({**EVENT, "price": 1000, "sym": "CD"}) == C(2, 0)
    assert rt.lookup_event({**EVENT, "price": 20.5, "sym": "EF"}) == C(3, 0)
    assert rt.lookup_event({k: v for k, v in EVENT.items() if k != "price"}) is None
    assert rt.lookup_event({**EVENT, "price": 50, "sym": None}) is None


def test_lookup_event_in_a_gap_is_none(schema):
    wes = EventSpace.whole(schema)
    low, _ = wes.cut(schema.attributes["price"], 20)
    rt = RoutingTable(schema, {C(0, 0): RouteEntry(low, (0,))})
    assert rt.lookup_event({**EVENT, "price": 30}) is None
    assert rt.lookup_event({**EVENT, "price": 10}) == C(0, 0)


def test_lookup_subscription_returns_every_overlapping_channel_sorted(schema):
    rt = split_table(schema)
    assert rt.lookup_subscription(sub("price < 10", schema)) == [C(1, 0)]
    assert rt.lookup_subscription(sub("price <= 20", schema)) == [C(1, 0)]
    assert rt.lookup_subscription(sub("price > 20", schema)) == [C(2, 0), C(3, 0)]
    assert rt.lookup_subscription(sub('price > 10 and sym = "AB"', schema)) == [C(1, 0), C(2, 0)]
    assert rt.lookup_subscription(sub('sym prefix "E"', schema)) == [C(1, 0), C(3, 0)]
    assert rt.lookup_subscription(sub("qty = 3", schema)) == [C(1, 0), C(2, 0), C(3, 0)]
    assert rt.lookup_subscription(sub("price > 5 and price < 4", schema)) == []
    assert rt.lookup_subscription(sub('note = "a" and note = "b"', schema)) == []


def test_lookups_follow_changes(schema):
    rt = split_table(schema)
    e = {**EVENT, "price": 20.5, "sym": "EF"}
    assert rt.lookup_event(e) == C(3, 0)
    merged = rt[C(2, 0)].space.union(rt[C(3, 0)].space, schema)
    rt.apply(delete=[C(2, 0), C(3, 0)], update={C(2, 1): RouteEntry(merged, (2,))})
    assert rt.lookup_event(e) == C(2, 1)
    assert rt.lookup_subscription(sub("price > 20", schema)) == [C(2, 1)]
    rt.remove(C(2, 1))
    assert rt.lookup_event(e) is None
    rt.set(C(2, 2), RouteEntry(merged, (5,)))
    assert rt.lookup_event(e) == C(2, 2)


def test_string_keyed_index():
    wes = EventSpace.whole(STRINGS)
    ab, rest = wes.take_strings("s", ["a", "b"])
    a, b = ab.take_strings("s", ["a"])
    rt = RoutingTable(
        STRINGS, {C(0, 0): RouteEntry(a, (0,)), C(0, 1): RouteEntry(b, (0,)), C(0, 2): RouteEntry(rest, (1,))}
    )
    assert a.constraint("s") == SetConstraint("s", frozenset({"a"}))
    assert rest.constraint("s") == ExceptConstraint("s", frozenset({"a", "b"}))
    assert rt.lookup_event({"s": "a", "u": ""}) == C(0, 0)
    assert rt.lookup_event({"s": "b", "u": ""}) == C(0, 1)
    assert rt.lookup_event({"s": "ab", "u": ""}) == C(0, 2)
    assert rt.lookup_subscription(sub('s in {"a", "zz"}', STRINGS)) == [C(0, 0), C(0, 2)]
    assert rt.lookup_subscription(sub('s prefix "a"', STRINGS)) == [C(0, 0), C(0, 2)]
    assert rt.lookup_subscription(sub('s != "a"', STRINGS)) == [C(0, 1), C(0, 2)]
    assert rt.lookup_subscription(sub('u = "x"', STRINGS)) == [C(0, 0), C(0, 1), C(0, 2)]


def test_float_key_open_ends(schema):
    price = schema.attributes["price"]
    low, high = EventSpace.whole(schema).cut(price, 20)
    mid, top = high.cut(price, 20.5)
    rt = RoutingTable(
        schema, {C(0, 0): RouteEntry(low, (0,)), C(0, 1): RouteEntry(mid, (0,)), C(0, 2): RouteEntry(top, (0,))}
    )
    assert mid.constraint("price") == RangeConstraint("price", Interval(20, 20.5, True, False))
    assert rt.lookup_event({**EVENT, "price": 20}) == C(0, 0)
    assert rt.lookup_event({**EVENT, "price": 20.25}) == C(0, 1)
    assert rt.lookup_event({**EVENT, "price": 20.5}) == C(0, 1)
    assert rt.lookup_event({**EVENT, "price": 20.75}) == C(0, 2)
    assert rt.lookup_subscription(sub("price >= 20 and price <= 20", schema)) == [C(0, 0)]
    assert rt.lookup_subscription(sub("price > 20 and price < 20.5", schema)) == [C(0, 1)]
    assert rt.lookup_subscription(sub("price in [20.5, 21]", schema)) == [C(0, 1), C(0, 2)]


# -- properties: the index answers exactly what a linear scan answers -------------------------------


@pytest.mark.parametrize("schema_name", sorted(PROPERTY_SCHEMAS))
@PROPS
@given(data=st.data())
def test_lookups_equal_a_linear_scan(schema_name, data):
    schema = PROPERTY_SCHEMAS[schema_name]
    spaces = partition(data, schema, max_steps=10)
    owners = data.draw(st.lists(st.integers(0, 3), min_size=len(spaces), max_size=len(spaces)))
    rt = RoutingTable(schema, {C(o, i): RouteEntry(sp, (o,)) for i, (sp, o) in enumerate(zip(spaces, owners))})
    for e in data.draw(st.lists(events(schema), min_size=1, max_size=15), label="events"):
        holders = [c for c, entry in rt.items() if entry.space.contains(e)]
        assert len(holders) == 1  # the spaces partition the event space
        assert rt.lookup_event(e) == holders[0]
    for f in data.draw(st.lists(filters(schema), min_size=1, max_size=8), label="filters"):
        assert rt.lookup_subscription(f) == sorted(c for c, entry in rt.items() if entry.space.overlaps(f, schema))
