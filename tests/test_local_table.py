"""overlay.channels.local_table: the channels placed on one node and the ids it creates."""

from __future__ import annotations

import pytest

from overlay.channels import Channel, ChannelId, EventSpace, LocalTable, Subscription, parse_subscription
from overlay.errors import LocalProtocolError

EVENT = {"price": 12.5, "qty": 3, "sym": "AB", "tag": 7}


def make_channel(schema, chid):
    return Channel(chid, EventSpace.whole(schema), schema)


def test_new_ids_are_numbered_by_this_node():
    lt = LocalTable(7)
    assert [lt.new_id() for _ in range(3)] == [ChannelId(7, 0), ChannelId(7, 1), ChannelId(7, 2)]


def test_observe_id_keeps_the_counter_past_our_ids():
    lt = LocalTable(7)
    lt.observe_id(ChannelId(7, 10))
    assert lt.new_id() == ChannelId(7, 11)
    lt.observe_id(ChannelId(7, 3))  # older: no change
    lt.observe_id(ChannelId(8, 99))  # another node's: no change
    assert lt.new_id() == ChannelId(7, 12)


def test_add_get_remove(schema):
    lt = LocalTable(1)
    ch = make_channel(schema, lt.new_id())
    lt.add(ch)
    assert len(lt) == 1 and ch.id in lt and lt.ids() == [ch.id] and list(lt) == [ch]
    assert lt.get(ch.id) is ch and lt[ch.id] is ch
    with pytest.raises(LocalProtocolError, match="already on node 1"):
        lt.add(make_channel(schema, ch.id))
    assert lt[ch.id] is ch  # refused add changed nothing
    assert lt.remove(ch.id) is ch
    assert lt.remove(ch.id) is None
    assert lt.get(ch.id) is None and ch.id not in lt and len(lt) == 0
    with pytest.raises(LocalProtocolError, match="not on node 1"):
        lt[ch.id]


def test_adding_a_channel_never_lets_an_id_be_reused(schema):
    lt = LocalTable(1)
    lt.add(make_channel(schema, ChannelId(1, 5)))  # e.g. received back after a migration
    lt.add(make_channel(schema, ChannelId(2, 9)))  # made by another node
    assert lt.new_id() == ChannelId(1, 6)
    assert set(lt.ids()) == {ChannelId(1, 5), ChannelId(2, 9)}


def test_load_is_the_sum_of_channel_loads(schema):
    lt = LocalTable(1)
    assert lt.load == 0
    a, b = make_channel(schema, lt.new_id()), make_channel(schema, lt.new_id())
    lt.add(a)
    lt.add(b)
    for ch in (a, b):
        ch.add(Subscription("s1", parse_subscription("qty < 10", schema)))
    b.add(Subscription("s2", parse_subscription("qty >= 0", schema)))
    _, ta = a.match(EVENT, 0)
    _, tb1 = b.match(EVENT, 0)
    _, tb2 = b.match(EVENT, 0)
    assert lt.load == ta + tb1 + tb2 == a.load + b.load
    assert lt.load >= 1 + 2 + 2  # each matched subscription was tested
    a.roll_slice()
    assert lt.load == b.load
