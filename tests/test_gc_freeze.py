"""overlay.net.gc_freeze, and what the cyclic GC's full passes visit (issue 18 item 4).

A full pass visits every tracked object that is not frozen: a node holding
hundreds of thousands of subscriptions must not hold as many tracked objects
(``overlay.channels.predicates`` rule 8), and a node process freezes what a
long full pass found alive (``overlay.net.node`` rule 16)."""

from __future__ import annotations

import asyncio
import gc
import random

import msgspec
import pytest

from conftest import LOCAL
from coreworld import SPLIT_500, World
from overlay.config import NodeConfig
from overlay.messages import client as cm
from overlay.net.gc_freeze import FREEZE_AFTER, MAX_FREEZES, YOUNG_THRESHOLD, FreezePolicy
from overlay.net.node import Node
from overlay.testing import LoopbackCluster, wait_until
from overlay.testing._loopback import HOST, bound_socket, insecure_tls

# -- the policy (rules 2 and 3) -----------------------------------------------------------------


def test_only_a_long_full_pass_freezes():
    policy = FreezePolicy()
    assert not policy.after_full_pass(0.0)
    assert not policy.after_full_pass(FREEZE_AFTER / 2)
    assert policy.freezes == 0
    assert policy.after_full_pass(FREEZE_AFTER)
    assert policy.after_full_pass(10.9)  # the pass that got a node declared dead
    assert policy.freezes == 2


def test_freezes_per_run_are_bounded():
    policy = FreezePolicy(after=0.01, limit=3)
    assert [policy.after_full_pass(1.0) for _ in range(5)] == [True, True, True, False, False]
    assert policy.exhausted and policy.freezes == 3
    assert FreezePolicy().limit == MAX_FREEZES


# -- the shell (net.node rule 16) -----------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_node_process_freezes_what_a_long_full_pass_kept():
    async with LoopbackCluster(LOCAL, 1) as cl:
        node = cl.nodes[0]
        # Nodes sharing a process (as here) never freeze: a long pass is only timed.
        node.gc_policy = FreezePolicy(after=0.0, limit=1)
        frozen = gc.get_freeze_count()
        node._gc_timer("start", {"generation": 2})
        node._gc_timer("stop", {"generation": 2})
        assert gc.get_freeze_count() == frozen and node.core.stats["gc_freezes"] == 0
        node._freeze_gc = True  # as in a process of its own (its stop unfreezes: rule 4)
        try:
            node._gc_timer("start", {"generation": 1})
            node._gc_timer("stop", {"generation": 1})
            assert gc.get_freeze_count() == frozen  # a young pass: never
            node._gc_timer("start", {"generation": 2})
            node._gc_timer("stop", {"generation": 2})
            assert gc.get_freeze_count() > frozen
            assert node.core.stats["gc_freezes"] == 1
            node._gc_timer("start", {"generation": 2})
            node._gc_timer("stop", {"generation": 2})
            assert node.core.stats["gc_freezes"] == 1  # the limit (rule 3)
        finally:
            gc.unfreeze()
        await wait_until(lambda: node.started.is_set(), 5, "the node serving")


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_node_process_passes_over_its_young_objects_less_often_while_it_runs():
    """Rule 6: the young generation's threshold, for the run only."""
    sock, admin = bound_socket(), bound_socket()
    me = NodeConfig(0, HOST, sock.getsockname()[1], admin.getsockname()[1])
    before = gc.get_threshold()
    config = msgspec.structs.replace(LOCAL, tls=insecure_tls()).with_nodes((me,))
    node = Node(config, 0, sock=sock, admin_sock=admin, freeze_gc=True)
    task = asyncio.create_task(node.run())
    try:
        await asyncio.wait_for(node.started.wait(), 10)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        node.stop()
        await asyncio.wait_for(task, 10)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


# -- stored subscriptions (predicates rule 8) -----------------------------------------------------


def _expression(rng: random.Random, k: int) -> str:
    lo = round(rng.uniform(0, 900), 2)
    sym = f"S{rng.randrange(1000):03d}"
    kind = k % 5
    if kind == 0:  # one attribute: the index's per-bucket dicts
        return f"price in [{lo}, {lo + 50}]"
    if kind == 1:  # plain: bounds only
        return f'price in [{lo}, {lo + 50}] and sym = "{sym}" and qty >= {rng.randrange(1000)}'
    if kind == 2:  # the compiled exact test, a small set
        return f'price >= {lo} and sym in {{"{sym}", "S1", "S2"}} and venue prefix "v{k % 7}"'
    if kind == 3:  # anything-but and absence (string automata are cached per predicate: a few here)
        return f'price < {lo + 1} and sym not in {{"S{k % 3}", "S9"}} and venue != "v{k % 7}" and not exists qty'

    # several conjuncts (node.sessions rule 7)
    return f'(price in [{lo}, {lo + 5}] and sym = "{sym}") or (qty = {k} and sym like "S*{k % 10}")'


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_stored_subscriptions_add_next_to_nothing_a_full_pass_visits():
    # Two cores: the access node keeps each subscription in its session, and
    # the owner (node 0 or 1, by price) in its channel, pending and then indexed.
    w = World(2)
    admin = w.client(0, "admin")
    w.admin(0, admin, "split", **SPLIT_500)
    w.admin(0, admin, "place", channel="0.2", node=1)
    loader = w.client(0, "loader")
    rng = random.Random(18)

    def load(first: int, n: int) -> None:
        for k in range(first, first + n):
            w.net.client_send(0, loader, cm.Subscribe(w.seq(), f"s{k}", _expression(rng, k)))
            if k % 100 == 99:
                w.net.run()
        w.net.run()
        for core in w.cores.values():  # index everything pending (the shell's indexer)
            while core.background_step(1 << 20, w.net.now)[0]:
                pass
        w.net.trace.clear()  # the harness's own log of every message
        w.net.to_clients.clear()

    load(0, 300)  # caches, buckets and tables made once
    before = _tracked()
    load(300, 1500)
    grown = _tracked() - before
    held = sum(len(ch) for core in w.cores.values() for ch in core.local)
    assert held >= 1800
    # Before predicates rule 8: about 75 tracked objects per subscription.
    assert grown < 0.1 * 1500, f"{grown} more tracked objects for 1,500 more subscriptions"
