"""overlay.channels.routing_table: the cluster-wide channel map and its indexed lookups (SPEC §2.4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    routing_table,
)
from overlay.channels.routing_table import Change, item_hash, version, version_text
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


# -- versions (rules 4-9) -------------------------------------------------------------------------


def test_changes_made_here_are_versioned_by_a_lamport_clock(schema):
    wes = EventSpace.whole(schema)
    low, high = wes.cut(schema.attributes["price"], 20)
    rt = RoutingTable(schema, writer=3)
    assert rt.clock == 0 and rt.version(C(0, 0)) == 0
    v1 = rt.set(C(0, 0), RouteEntry(wes, (0,)))
    assert v1 == version(1, 0, 3) and rt.version(C(0, 0)) == v1 and version_text(v1) == "1.0@3"
    # One change (a split): the parent's tombstone and both children at one version.
    v2 = rt.apply([C(0, 0)], [(C(0, 1), RouteEntry(low, (0,))), (C(0, 2), RouteEntry(high, (0,)))])
    assert v2 == version(2, 0, 3) and rt.clock == 2
    assert rt.deleted(C(0, 0)) and rt.tombstones() == {C(0, 0): v2} and rt.version(C(0, 0)) == v2
    assert rt.versions() == {C(0, 1): v2, C(0, 2): v2}
    assert sorted(rt.versioned()) == [(C(0, 1), RouteEntry(low, (0,)), v2), (C(0, 2), RouteEntry(high, (0,)), v2)]
    # A recovery keeps the major and bumps the minor (rule 6); the clock stays.
    assert rt.recover(C(0, 1), RouteEntry(low, (1,))) == version(2, 1, 3)
    assert rt.recover(C(0, 1), RouteEntry(low, (2,))) == version(2, 2, 3) and rt.clock == 2
    # A version seen from a peer moves the clock on: the next change here is newer than it.
    rt.merge([(C(5, 0), RouteEntry(high, (5,)), version(9, 0, 5))])
    assert rt.clock == 9 and rt.set(C(0, 2), RouteEntry(high, (1,))) == version(10, 0, 3)


def test_a_merge_takes_only_what_is_newer(schema):
    wes = EventSpace.whole(schema)
    old, new = RouteEntry(wes, (0,)), RouteEntry(wes, (1,))
    rt = RoutingTable(schema)
    m = rt.merge([(C(0, 0), new, version(3, 0, 0))])
    assert m.changed == [Change(C(0, 0), None, new)] and not m.stale
    # Older and equal: nothing changes; the older one is reported stale.
    m = rt.merge([(C(0, 0), old, version(2, 5, 4)), (C(0, 0), new, version(3, 0, 0))])
    assert not m.changed and m.stale == [(C(0, 0), version(2, 5, 4), version(3, 0, 0))] and rt[C(0, 0)] == new
    # A tombstone older than the entry is stale; a newer one deletes it.
    assert rt.merge(deleted=[(C(0, 0), version(2, 0, 1))]).stale and C(0, 0) in rt
    m = rt.merge(deleted=[(C(0, 0), version(4, 0, 1))])
    assert m.changed == [Change(C(0, 0), new, None)] and C(0, 0) not in rt and rt.deleted(C(0, 0))
    # ... and an entry as old as it, or older, never brings the channel back.
    assert rt.merge([(C(0, 0), new, version(4, 0, 1)), (C(0, 0), new, version(3, 9, 9))]).stale
    assert C(0, 0) not in rt
    # A tombstone of a channel never heard of is kept: its entry, late, stays out.
    rt.merge(deleted=[(C(7, 7), version(5, 0, 7))])
    assert rt.merge([(C(7, 7), old, version(4, 0, 7))]).stale and C(7, 7) not in rt


def test_a_recovery_loses_to_what_the_dead_owner_did_that_the_coordinator_had_not_seen(schema):
    """Rule 6: node 1 split 0.0 and died; the coordinator (node 2), which had
    not heard of the split, gave 0.0 to node 3.  Wherever both arrive, in
    either order, the split wins: the spaces still partition."""
    wes = EventSpace.whole(schema)
    low, high = wes.cut(schema.attributes["price"], 20)
    base = RoutingTable(schema, writer=0)
    base.set(C(0, 0), RouteEntry(wes, (1,)))  # version 1.0@0
    owner = RoutingTable(schema, writer=1)
    owner.merge([(C(0, 0), RouteEntry(wes, (1,)), base.version(C(0, 0)))])
    owner.apply([C(0, 0)], [(C(1, 0), RouteEntry(low, (1,))), (C(1, 1), RouteEntry(high, (1,)))])
    coordinator = RoutingTable(schema, writer=2)
    coordinator.merge([(C(0, 0), RouteEntry(wes, (1,)), base.version(C(0, 0)))])
    coordinator.recover(C(0, 0), RouteEntry(wes, (3,)))
    split = ([(c, e, v) for c, e, v in owner.versioned()], list(owner.tombstones().items()))
    recovered = ([(c, e, v) for c, e, v in coordinator.versioned()], [])
    for first, second in ((split, recovered), (recovered, split)):
        rt = RoutingTable(schema)
        rt.merge(*first)
        rt.merge(*second)
        assert set(rt) == {C(1, 0), C(1, 1)} and rt.deleted(C(0, 0))


def test_equal_versions_with_different_contents_settle_the_same_way_everywhere(schema):
    """Rule 7: corruption, not a protocol state — but every node picks the same entry."""
    wes = EventSpace.whole(schema)
    a, b = RouteEntry(wes, (1,)), RouteEntry(wes, (2,))
    v = version(4, 0, 1)
    one, two = RoutingTable(schema), RoutingTable(schema)
    one.merge([(C(0, 0), a, v)])
    two.merge([(C(0, 0), b, v)])
    one.merge([(C(0, 0), b, v)])
    two.merge([(C(0, 0), a, v)])
    assert one == two and one.digest == two.digest
    assert one[C(0, 0)] == (a if item_hash(C(0, 0), v, a) > item_hash(C(0, 0), v, b) else b)


def test_the_digest_follows_the_entries(schema):
    wes = EventSpace.whole(schema)
    low, high = wes.cut(schema.attributes["price"], 20)
    items = [(C(0, 1), RouteEntry(low, (0,)), version(2, 0, 0)), (C(0, 2), RouteEntry(high, (1,)), version(3, 0, 0))]
    a, b = RoutingTable(schema), RoutingTable(schema)
    a.merge(items)
    b.merge(items[::-1])
    assert a.digest == b.digest != 0 and a == b
    assert a.digest == sum(item_hash(c, v, e) for c, e, v in items) % (1 << 63)
    b.replace_all(items[:1])
    assert b.digest != a.digest and b != a  # a table that lost an entry
    b.replace_all([(C(0, 1), RouteEntry(low, (0,)), version(2, 0, 0)), (C(0, 2), RouteEntry(high, (2,)), items[1][2])])
    assert b.digest != a.digest  # one entry changed in place, at the same version
    b.replace_all({})
    assert b.digest == 0 and len(b) == 0


def test_the_digest_does_not_depend_on_the_process(schema, tmp_path):
    """Rule 9: sets are hashed sorted — a process's string hashing changes nothing."""
    script = tmp_path / "digest.py"
    script.write_text(
        "from overlay.channels import ChannelId, EventSpace, RouteEntry\n"
        "from overlay.channels.routing_table import item_hash\n"
        "from overlay.config import load_config\n"
        "import sys\n"
        "schema = load_config(sys.argv[1]).schema\n"
        "low, high = EventSpace.whole(schema).take_strings('sym', ['AB', 'CD', 'EF', 'GH', 'XY'])\n"
        "print(item_hash(ChannelId(0, 1), 5, RouteEntry(low, (0,))), item_hash(ChannelId(0, 2), 5, RouteEntry(high, (1,))))\n"
    )
    config = Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml"
    outs = {
        subprocess.run(
            [sys.executable, str(script), str(config)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1


def test_tombstones_are_bounded(schema, monkeypatch):
    monkeypatch.setattr(routing_table, "MAX_TOMBSTONES", 3)
    rt = RoutingTable(schema)
    for i in range(5):
        rt.merge(deleted=[(C(0, i), version(i + 1, 0, 0))])
    assert list(rt.tombstones()) == [C(0, 2), C(0, 3), C(0, 4)]


def test_replace_all_takes_a_table_whole(schema):
    wes = EventSpace.whole(schema)
    rt = RoutingTable(schema, writer=1)
    rt.set(C(9, 9), RouteEntry(wes, (9,)))
    rt.replace_all([(C(0, 0), RouteEntry(wes, (0,)), version(7, 2, 0))], [(C(0, 5), version(6, 0, 0))])
    assert list(rt) == [C(0, 0)] and rt.version(C(0, 0)) == version(7, 2, 0) and rt.clock == 7
    assert rt.tombstones() == {C(0, 5): version(6, 0, 0)} and not rt.deleted(C(9, 9))


@st.composite
def _changes(draw):
    """States of a few channels as peers would send them: (chid, entry or None, version)."""
    n = draw(st.integers(1, 12))
    out = []
    for _ in range(n):
        chid = C(0, draw(st.integers(0, 3)))
        v = version(draw(st.integers(1, 4)), draw(st.integers(0, 2)), draw(st.integers(0, 3)))
        owners = draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True)))
        out.append((chid, None if owners is None else tuple(owners), v))
    return out


@PROPS
@given(changes=_changes(), data=st.data())
def test_any_order_of_the_same_changes_gives_the_same_table(changes, data):
    """Rule 7: merging is commutative, associative and idempotent — whatever
    order the states come in, in whatever batches, however often."""
    schema = PROPERTY_SCHEMAS["mixed"]
    wes = EventSpace.whole(schema)

    def build(order, batch):
        rt = RoutingTable(schema)
        for i in range(0, len(order), batch):
            part = order[i : i + batch]
            rt.merge(
                [(c, RouteEntry(wes, o), v) for c, o, v in part if o is not None],
                [(c, v) for c, o, v in part if o is None],
            )
        return rt

    reference = build(changes, 1)
    shuffled = data.draw(st.permutations(changes + data.draw(st.lists(st.sampled_from(changes), max_size=4))))
    other = build(shuffled, data.draw(st.integers(1, 5)))
    assert other == reference and other.digest == reference.digest and other.clock == reference.clock
    assert {c for c, *_ in changes if other.deleted(c)} == {c for c, *_ in changes if reference.deleted(c)}
    # The winner of each channel is its highest version (a tombstone winning a tie).
    for chid in {c for c, *_ in changes}:
        top = max(v for c, _, v in changes if c == chid)
        assert reference.version(chid) == top


def test_space_contains_is_eventspace_contains() -> None:
    """lookup_event's compiled test of a space agrees with EventSpace.contains:
    every constraint kind, values in and out, a missing attribute."""
    from itertools import product

    from conftest import make_schema
    from overlay.channels.routing_table import space_contains

    schema = make_schema()
    spaces = [
        EventSpace.whole(schema),
        EventSpace.build(schema, [ExceptConstraint("sym", frozenset({"X", "YY"}))]),
        EventSpace.build(schema, [SetConstraint("sym", frozenset({"AB", "C"}))]),
        EventSpace.build(schema, [SetConstraint("sym", frozenset())]),
        EventSpace.build(
            schema,
            [RangeConstraint("price", Interval(10.0, 500.0, True, False)), SetConstraint("sym", frozenset({"AB"}))],
        ),
        EventSpace.build(schema, [RangeConstraint("qty", Interval(5, 5))]),
    ]
    events = [
        {"price": p, "qty": q, "sym": s, "tag": 1}
        for p, q, s in product((0.0, 10.0, 10.5, 500.0, 501), (0, 5, 6), ("AB", "C", "X", "YY", "Z"))
    ]
    events += [{"price": 20.0, "qty": 5, "tag": 1}, {"qty": 5, "sym": "AB", "tag": 1}, {}]
    for space in spaces:
        for ev in events:
            assert space_contains(space, ev) == space.contains(ev), (space, ev)
