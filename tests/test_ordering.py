"""Ordered delivery in the cluster (SPEC §10; overlay.node.ordering), on real nodes.

Per key, every subscriber sees events in rank order, whatever node they were
published on, while channels split and migrate, and when a key's home leaves.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Final

import pytest

from conftest import LOCAL
from overlay.messages import client as cm
from overlay.node.ordering import rendezvous_home
from overlay.testing import LOADED_SUSPECT_TIMEOUT, LoopbackCluster, wait_progressing, wait_until

pytestmark = pytest.mark.timeout(60)
# A backlog of ordered events makes no progress for this long: stuck (the
# default hold_ttl is 5 s).
STALL: Final = 15.0


def ev(i: int, price: float = 10.0) -> dict:
    return {"price": price, "sym": "AB", "qty": i}


def per_key(notes: list[cm.Notify]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for n in notes:
        out[n.key].append((n.rank, n.event["qty"]))
    return out


@pytest.fixture
async def cl():
    async with LoopbackCluster(LOCAL, 3, balancing=False) as c:
        yield c


async def test_many_keys_interleaved_keep_order_at_every_subscriber(cl):
    subs = [await cl.raw(i) for i in range(3)]
    for s in subs:
        assert isinstance(await s.subscribe("price >= 0"), cm.SubAck)
    pubs = [await cl.raw(i) for i in range(3)]
    keys, per = [f"k{i}" for i in range(30)], 12
    futs = []
    # Each key is published from one client (its order is that client's), keys interleave.
    for r in range(per):
        for j, k in enumerate(keys):
            futs.append(pubs[j % 3].publish_nowait(ev(r, price=float(j * 30 % 1000)), key=k))
    replies = await asyncio.wait_for(asyncio.gather(*futs), 20)
    assert all(isinstance(r, cm.PubAck) for r in replies), [r for r in replies if not isinstance(r, cm.PubAck)][:3]
    total = len(keys) * per
    await wait_until(lambda: all(len(s.notes) == total for s in subs), 20, "every event at every subscriber")
    for s in subs:
        got = per_key(s.notes)
        assert set(got) == set(keys)
        for k, seq in got.items():
            assert [r for r, _ in seq] == list(range(1, per + 1)), k
            assert [q for _, q in seq] == list(range(per)), k
    await wait_until(lambda: cl.stat("ordered_completed") == total, what="every delivery completed at its home")


async def test_explicit_ranks_out_of_order_are_released_in_rank_order(cl):
    sub = await cl.raw(2)
    await sub.subscribe("price >= 0")
    pub = await cl.raw(0)
    for rank in (3, 1, 5, 2, 4):
        assert isinstance(await pub.publish(ev(rank), key="x", rank=rank), cm.PubAck)
    await wait_until(lambda: len(sub.notes) == 5, what="five notifications")
    assert [n.rank for n in sub.notes] == [1, 2, 3, 4, 5]
    assert [n.event["qty"] for n in sub.notes] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("policy", ["skip", "drop"])
async def test_a_missing_rank_expires_per_policy(policy):
    # hold_ttl: the "held" check below comes right after the PubAcks; a loaded
    # machine can stall the loop past a short TTL (it was 0.3 s) in between.
    async with LoopbackCluster(LOCAL, 3, balancing=False, sequencer={"policy": policy, "hold_ttl": 2.0}) as cl:
        sub = await cl.raw(1)
        await sub.subscribe("price >= 0")
        pub = await cl.raw(0)
        for rank in (2, 3):  # rank 1 never comes
            assert isinstance(await pub.publish(ev(rank), key="gap", rank=rank), cm.PubAck)
        # Held: the key's home sequenced both (their PubAcks say so) and released neither,
        # and a release is the only way to a subscriber.
        home = cl.nodes[cl.nodes[0].core.ordering.home_of("gap")].core.ordering.home.sequencer.counters
        assert (home["held"], home["released"]) == (2, 0), home
        assert sub.notes == []
        if policy == "skip":
            await wait_until(lambda: len(sub.notes) == 2, what="the gap skipped")
            assert [n.rank for n in sub.notes] == [2, 3]
            await wait_until(lambda: cl.stat("seq_gaps_skipped") == 1, what="gap counted")
            assert cl.stat("seq_ranks_skipped") == 1
        else:
            await wait_until(lambda: cl.stat("seq_expired_dropped") == 2, what="held events dropped and counted")
            assert sub.notes == []
            assert isinstance(await pub.publish(ev(1), key="gap", rank=1), cm.PubAck)
            await wait_until(lambda: len(sub.notes) == 1, what="rank 1 delivered")
            assert sub.notes[0].rank == 1


async def test_bad_input_gets_specific_errors(cl):
    pub = await cl.raw(0)
    r = await pub.publish(ev(1), rank=3)
    assert isinstance(r, cm.Error) and r.code == cm.ErrorCode.BAD_RANK
    assert isinstance(await pub.publish(ev(1), key="d", rank=1), cm.PubAck)
    r = await pub.publish(ev(1), key="d", rank=1)
    assert isinstance(r, cm.Error) and r.code == cm.ErrorCode.DUPLICATE_RANK, r
    for w in (0.0, -1.0, float("nan")):
        r = await pub.subscribe("price >= 0", group="g", weight=w)
        assert isinstance(r, cm.Error) and r.code == cm.ErrorCode.BAD_GROUP, r
    r = await pub.subscribe("price >= 0", group="  ")
    assert isinstance(r, cm.Error) and r.code == cm.ErrorCode.BAD_GROUP
    await wait_until(lambda: cl.stat("seq_rejected_duplicate") == 1, what="the duplicate counted")
    # The session is still usable.
    assert isinstance(await pub.publish(ev(2), key="d"), cm.PubAck)


@pytest.mark.timeout(180)  # a hang's bound: the traffic's size depends on the machine's load
async def test_order_kept_while_the_channel_splits_and_migrates_under_traffic():
    # No node fails here, and the traffic loads the nodes: a busy machine's
    # leases (at load 8-10 the harness's 2.7 s lease lapsed, the subscribes
    # and publishes were refused no_quorum and nothing reached two subscribers).
    async with LoopbackCluster(LOCAL, 3, balancing=False, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cl:
        await _order_kept_while_the_channel_splits_and_migrates(cl)


async def _order_kept_while_the_channel_splits_and_migrates(cl: LoopbackCluster) -> None:
    subs = [await cl.raw(i) for i in range(3)]
    for s in subs:
        assert isinstance(await s.subscribe("price >= 0"), cm.SubAck)
    pub = await cl.raw(1)
    keys = [f"m{i}" for i in range(20)]
    rng = random.Random(7)
    sent: dict[str, int] = defaultdict(int)
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            futs = []
            for _ in range(40):
                k = rng.choice(keys)
                futs.append(pub.publish_nowait(ev(sent[k], price=rng.uniform(0, 1000)), key=k))
                sent[k] += 1
            replies = await asyncio.gather(*futs)
            assert all(isinstance(r, cm.PubAck) for r in replies), [r for r in replies if not isinstance(r, cm.PubAck)][
                :3
            ]

    t = asyncio.create_task(traffic())
    await asyncio.sleep(0.2)
    await cl.admin(0, "split", channel="0.0", attr="price", at=500.0)
    await asyncio.sleep(0.1)
    await cl.admin(0, "place", channel="0.2", node=2)
    await asyncio.sleep(0.1)
    await cl.admin(0, "place", channel="0.1", node=1)
    await asyncio.sleep(0.1)
    await cl.admin(2, "place", channel="0.2", node=0)
    await asyncio.sleep(0.2)
    stop.set()
    await t
    total = sum(sent.values())

    def delivered() -> list[int]:
        return [len(s.notes) for s in subs]

    # The traffic ran until the last move, however long a loaded machine took for
    # the moves: its backlog is delivered one event per key at a time (rule 6).
    # Only a stall fails: longer than hold_ttl, after which a lost rank is skipped.
    try:
        await wait_progressing(lambda: delivered() == [total] * 3, delivered, STALL, "every event delivered")
    except AssertionError as exc:
        missing = {
            i: {
                k: sorted(set(range(sent[k])) - {q for _, q in seq})[:5]
                for k, seq in per_key(s.notes).items()
                if len(seq) != sent[k]
            }
            for i, s in enumerate(subs)
        }
        raise AssertionError(f"{exc}: {delivered()} of {total}, missing {missing}") from None
    assert cl.stat("migrations") == 3 and cl.stat("reforwards") + cl.stat("events_rerouted") >= 0
    for s in subs:
        for k, seq in per_key(s.notes).items():
            assert [q for _, q in seq] == list(range(sent[k])), k
            assert [r for r, _ in seq] == list(range(1, sent[k] + 1)), k


async def test_home_stops_its_backup_takes_the_keys_over_where_they_stood(cl):
    """README "Ordered delivery": when a key's home stops, the key's backup —
    the next node of its rendezvous order, which holds a copy of its state —
    carries on: the ranks continue, nothing is lost or repeated."""
    keys = [k for k in (f"h{i}" for i in range(200)) if rendezvous_home(k, [0, 1, 2]) == 2][:10]
    assert len(keys) == 10
    sub = await cl.raw(0)
    await sub.subscribe("price >= 0")
    pub = await cl.raw(1)
    n_before, n_after = 8, 8
    for r in range(n_before):
        await asyncio.gather(*(pub.publish_nowait(ev(r), key=k) for k in keys))
    await wait_until(lambda: len(sub.notes) == n_before * len(keys), what="pre-kill events")
    await cl.stop_node(2)
    await wait_until(
        lambda: 2 not in cl.nodes[1].core.ordering.live_nodes() and 2 not in cl.nodes[0].core.ordering.live_nodes(),
        what="node 2 declared dead",
    )
    assert all(cl.nodes[1].core.ordering.home_of(k) in (0, 1) for k in keys)
    for r in range(n_before, n_before + n_after):
        replies = await asyncio.gather(*(pub.publish_nowait(ev(r), key=k) for k in keys))
        assert all(isinstance(x, cm.PubAck) for x in replies)
    await wait_until(lambda: len(sub.notes) == (n_before + n_after) * len(keys), what="post-kill events")
    for k, seq in per_key(sub.notes).items():
        assert [q for _, q in seq] == list(range(n_before + n_after)), k
        # The new home continues the key's ranks.
        assert [r for r, _ in seq] == list(range(1, n_before + n_after + 1)), k
