"""Subscriber groups in the cluster (SPEC §11; overlay.node.groups), on real nodes."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from conftest import LOCAL
from overlay.channels import ChannelId
from overlay.messages import client as cm
from overlay.testing import LOADED_SUSPECT_TIMEOUT, LoopbackCluster, wait_until

pytestmark = pytest.mark.timeout(60)
# No node fails here: every cluster keeps a busy machine's leases
# (LOADED_SUSPECT_TIMEOUT) — at load 8-10 the harness's 2.7 s lease lapsed
# and publishes were refused no_quorum (2 of 3 runs).
EC = ChannelId(0, 0)


def ev(i: int) -> dict:
    return {"price": float(i % 1000), "sym": "AB", "qty": i}


async def publish_all(pub, n: int, start: int = 0, batch: int = 200) -> None:
    for b in range(start, start + n, batch):
        replies = await asyncio.gather(*(pub.publish_nowait(ev(i)) for i in range(b, min(b + batch, start + n))))
        assert all(isinstance(r, cm.PubAck) for r in replies), [r for r in replies if not isinstance(r, cm.PubAck)][:3]


async def test_each_event_once_to_the_group_in_proportion_to_static_weights():
    async with LoopbackCluster(LOCAL, 3, balancing=False, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cl:
        weights = {0: 1.0, 1: 2.0, 2: 3.0}
        inst = {i: await cl.raw(i) for i in weights}
        for i, w in weights.items():
            assert isinstance(await inst[i].subscribe("price >= 0", group="g", weight=w), cm.SubAck)
        plain = await cl.raw(1)
        await plain.subscribe("price >= 0")
        pub = await cl.raw(0)
        n = 1200
        await publish_all(pub, n)
        await wait_until(
            lambda: sum(len(c.notes) for c in inst.values()) == n and len(plain.notes) == n, what="all delivered"
        )
        # A second copy of an event would come after: once nothing is queued anywhere and no copy came since.
        await cl.wait_settled(progress=lambda: sum(len(c.notes) for c in inst.values()))
        ids = Counter(note.event_id for c in inst.values() for note in c.notes)
        assert len(ids) == n and set(ids.values()) == {1}  # exactly one instance per event
        total = sum(weights.values())
        for i, w in weights.items():
            assert abs(len(inst[i].notes) / n - w / total) < 0.02, (i, len(inst[i].notes))


async def test_dispatch_shifts_away_from_an_instance_reporting_high_load():
    async with LoopbackCluster(LOCAL, 3, balancing=False, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cl:
        fast = await cl.raw(1, lf=0.0)
        slow = await cl.raw(2, lf=0.8)  # Wd = 1·(1 − 0.8)
        for c in (fast, slow):
            await c.subscribe("price >= 0", group="g")
        pub = await cl.raw(0)
        await publish_all(pub, 100)
        await wait_until(lambda: cl.stat("notification_acks") >= 100, what="acks with LF back at the owner")
        before = len(slow.notes)
        await publish_all(pub, 600, start=100)
        await wait_until(lambda: len(fast.notes) + len(slow.notes) == 700, what="all delivered")
        share = (len(slow.notes) - before) / 600
        assert share < 0.25, share  # ≈ 0.2/1.2 once the LF is known, vs 0.5 before


async def test_all_instances_overloaded_low_priority_events_are_throttled_and_counted():
    async with LoopbackCluster(
        LOCAL,
        3,
        balancing=False,
        suspect_timeout=LOADED_SUSPECT_TIMEOUT,
        groups={"low_priority": "qty < 1000", "throttle_lf": 0.5},
    ) as cl:
        a = await cl.raw(1, lf=0.9)
        b = await cl.raw(2, lf=0.95)
        for c in (a, b):
            await c.subscribe("price >= 0", group="g")
        pub = await cl.raw(0)
        await publish_all(pub, 10, start=5000)  # normal priority: teaches the LFs
        await wait_until(lambda: cl.stat("notification_acks") >= 10, what="LFs known")
        await publish_all(pub, 50)  # low priority (qty < 1000): dropped
        await publish_all(pub, 20, start=6000)  # normal: delivered
        await wait_until(lambda: len(a.notes) + len(b.notes) == 30, what="normal events delivered")
        # A low-priority copy let through would come after: once nothing is queued anywhere and none came since.
        await cl.wait_settled(progress=lambda: len(a.notes) + len(b.notes))
        assert len(a.notes) + len(b.notes) == 30
        assert all(n.event["qty"] >= 1000 for c in (a, b) for n in c.notes)
        assert cl.stat("group_throttled") == 50


async def test_a_dead_instance_s_events_go_to_the_others_and_none_left_tells_the_publisher():
    # ack_timeout: long enough that the live instance's auto-acks (same loop as
    # the nodes) always make it on a loaded machine — one late ack would mark
    # it faulty for fault_period, and a clean-clone CI run at load 6–8 saw the
    # live instance's copies revoked too at 1 s — and short enough to keep the
    # test quick.
    async with LoopbackCluster(
        LOCAL,
        3,
        balancing=False,
        suspect_timeout=LOADED_SUSPECT_TIMEOUT,
        groups={"ack_timeout": 2.5, "fault_period": 30.0},
    ) as cl:
        live = await cl.raw(1)
        dead = await cl.raw(2, auto_ack=False)  # receives, never acks: times out
        for c in (live, dead):
            await c.subscribe("price >= 0", group="g")
        pub = await cl.raw(0)
        await publish_all(pub, 40)
        await wait_until(lambda: len({n.event_id for n in live.notes}) == 40, what="every event at the live instance")
        assert len(live.notes) == 40  # each once
        # Everything it got before its first timeout went on to the live one.
        first = len(dead.notes)
        assert first >= 1
        await wait_until(lambda: cl.stat("group_redispatched") == first, what="its events redispatched")
        # Each was revoked (it never took it) and its client gave it back.
        assert cl.stat("deliveries_revoked") == first and cl.stat("deliveries_declined") == first
        await publish_all(pub, 40, start=100)  # now marked faulty: nothing more for it
        await wait_until(lambda: len(live.notes) == 80, what="second batch at the live instance")
        assert len(dead.notes) == first
        # Now the last live instance goes away: its events cannot be delivered.
        live_id = live.client_id
        await live.close()
        await wait_until(
            lambda: cl.nodes[1].core.sessions.keys().isdisjoint(cl.nodes[1].core.notifier.acks.sessions()),
            what="session gone",
        )
        # Its access node unsubscribed it: the owner holds the group's one faulty instance only.
        await wait_until(
            lambda: not any(sub.subscriber == live_id for n in cl.nodes.values() for ch in n.core.local for sub in ch),
            what="the live instance's subscription gone from its channel",
        )
        r = await pub.publish(ev(7))
        # The owner is the publisher's access node here: the Error may overtake the PubAck.
        if isinstance(r, cm.PubAck):
            await wait_until(
                lambda: any(e.code == cm.ErrorCode.UNDELIVERABLE for e in pub.errors), what="publisher told"
            )
            r = next(e for e in pub.errors if e.code == cm.ErrorCode.UNDELIVERABLE)
        assert isinstance(r, cm.Error) and r.code == cm.ErrorCode.UNDELIVERABLE
        assert "no instance of group 'g'" in r.message
        assert cl.stat("group_undeliverable") >= 1


async def test_dispatch_state_survives_a_migration():
    async with LoopbackCluster(LOCAL, 3, balancing=False, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cl:
        a = await cl.raw(1)
        b = await cl.raw(2)
        await a.subscribe("price >= 0", group="g", weight=1.0)
        await b.subscribe("price >= 0", group="g", weight=3.0)
        pub = await cl.raw(0)
        await publish_all(pub, 203)
        await wait_until(lambda: len(a.notes) + len(b.notes) == 203, what="first batch")
        before = cl.nodes[0].core.groups.dispatcher(EC, "g").state()
        await cl.admin(0, "place", channel="0.0", node=1)
        await wait_until(
            lambda: cl.nodes[1].core.groups.dispatcher(EC, "g") is not None, what="state restored on the receiver"
        )
        after = cl.nodes[1].core.groups.dispatcher(EC, "g").state()
        assert after.dispatched == before.dispatched == 203
        assert {i: (s.acc, s.sent) for i, s in after.instances.items()} == {
            i: (s.acc, s.sent) for i, s in before.instances.items()
        }
        await publish_all(pub, 197, start=203)
        await wait_until(lambda: len(a.notes) + len(b.notes) == 400, what="second batch")
        assert abs(len(a.notes) - 100) <= 1 and abs(len(b.notes) - 300) <= 1
        assert cl.stat("group_states_restored") == 1


async def test_ordered_events_to_a_group_keep_key_order():
    async with LoopbackCluster(LOCAL, 3, balancing=False, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cl:
        inst = [await cl.raw(i) for i in range(3)]
        for c in inst:
            await c.subscribe("price >= 0", group="g")
        pub = await cl.raw(0)
        futs = [pub.publish_nowait(ev(r), key=f"k{j}") for r in range(10) for j in range(10)]
        assert all(isinstance(x, cm.PubAck) for x in await asyncio.gather(*futs))
        await wait_until(lambda: sum(len(c.notes) for c in inst) == 100, what="all delivered")
        # Merged in delivery order (the next rank is released only after the ack).
        for j in range(10):
            seen = sorted((n.rank, n.event["qty"]) for c in inst for n in c.notes if n.key == f"k{j}")
            assert seen == [(r + 1, r) for r in range(10)]
