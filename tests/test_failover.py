"""overlay.client.routing.AgentClient against real nodes on loopback (SPEC §12).

* the routing agent avoids a node made slow (its replies to clients delayed);
* it honours Choke: a node whose inbox is past ``choke_threshold`` (its
  dispatcher held, its inbox filled) chokes every publish; the agent moves
  away, and with no other node waits the delays out — nothing is dropped;
* no PubAck within mean + 3σ: a failure, the publish goes to another node
  (at least once: the first node's copy arrives too, under its own id);
* a publisher's access node is lost mid-stream: every publish still acked;
* a subscriber's access node is stopped or crashes mid-stream: the
  subscription fails over and every event published after the SubAck
  reaches the application exactly once (identities counted);
* the subscriber's load factor rides on its acks; a group has one home;
* the command line: ``pub --key --rank``, ``sub --group --weight``, ``[agent]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from conftest import CONFIGS, LOCAL, CapturedUntil
from overlay.errors import LocalProtocolError, RequestError
from overlay.messages import client as cm
from overlay.net.inbox import ClientClosed
from overlay.net.node import Node
from overlay.testing import LOADED_SUSPECT_TIMEOUT, WAIT, LoopbackCluster, wait_progressing, wait_until, with_tls_table
from overlay.testing.proxy import Proxy

pytestmark = pytest.mark.timeout(60)
# No publish or delivery for this long is a stall: longer than a dead access
# node takes to be declared dead (suspect_timeout 4 s here, and the vote).
STALL: Final = 15.0


def running(n: int) -> LoopbackCluster:
    """``n`` nodes of local.toml, balancing off: node 0 owns EC.

    The nodes keep the default ``choke_threshold``: a test that wants a node
    to choke fills that node's inbox to it (``hold_dispatcher``).  (A low
    threshold for the whole cluster — 20 until 2026-11 — had healthy nodes
    of a busy machine choke too, whenever their inbox briefly held 20
    messages, and the agent's routing followed those chokes.)"""
    return LoopbackCluster(LOCAL, n, balancing=False)


def replies(node: Node, send: Callable[[int, cm.ClientMessage], None]) -> None:
    """The core's replies to ``node``'s clients go through ``send`` (the shell's
    ``ClientConnections.send`` itself is ``send_now(node)``), in front of the
    node's connections: a ``Proxy`` (a compiled class's methods are not replaced)."""
    conns = node.connections
    if isinstance(conns, Proxy):
        conns = conns.target
    node.connections = Proxy(conns, send=send)  # type: ignore[assignment]


def send_now(node: Node) -> Callable[[int, cm.ClientMessage], None]:
    """``node``'s own, undelayed way to its clients."""
    conns = node.connections
    return conns.target.send if isinstance(conns, Proxy) else conns.send


def slow_down(node: Node, delay: float) -> None:
    """Every reply of ``node`` to its clients leaves ``delay`` s late (the
    loop is shared by every node of the test, so no blocking sleep)."""
    send = send_now(node)
    loop = asyncio.get_running_loop()
    replies(node, lambda sid, msg: loop.call_later(delay, send, sid, msg))


async def hold_dispatcher(node: Node) -> asyncio.Event:
    """Stop ``node``'s dispatcher before its next batch and fill the normal
    level of its inbox to its choke threshold (below the inbox's bound, so
    what else arrives still fits); set the returned event to let it go on
    (the filler items are harmless: closes of unknown sessions)."""
    gate = asyncio.Event()
    held = asyncio.Event()
    inbox = node.inbox

    async def hold() -> None:  # net.dispatch rule 5
        node.dispatcher.pace(None)  # once
        held.set()
        await gate.wait()

    node.dispatcher.pace(hold)
    # The dispatcher may be inside the inbox's wait(): wake it with one filler
    # (left in the inbox, harmless) so that it comes to the hold.
    inbox.put_force(ClientClosed(-1), False)
    await wait_until(held.is_set, what="the dispatcher held")
    choke_at = node.config.cluster.choke_threshold
    assert choke_at < node.config.cluster.peer_queue  # the inbox's bound
    for _ in range(choke_at):
        inbox.put_force(ClientClosed(-1), False)
    return gate


async def test_agent_avoids_a_slow_node() -> None:
    async with running(3) as cluster:
        slow_down(cluster.nodes[1], 0.03)
        agent = await cluster.agent(0, 1, 2, probe_interval=0)
        ids = [await agent.publish({"price": float(i), "sym": "AB"}) for i in range(300)]
        assert len(set(ids)) == 300
        per_node = agent.published
        assert sum(per_node) == 300
        # A handful to learn the slow node's cost, then it is avoided (round
        # robin would send it 100).  On a loaded machine a fast node can spike
        # past mean + 3σ once or twice: a re-send is then right, not a failure.
        assert per_node[1] <= 20, per_node
        assert agent.timeouts <= 3, agent.timeouts
        now = time.perf_counter()
        # 30 ms injected against a fast node's few ms: a wide margin even when
        # the machine is loaded (a tenfold ratio failed at 8.7 under load).
        assert agent.agent.cost(1, now) > 3 * min(agent.agent.cost(0, now), agent.agent.cost(2, now))


async def test_probing_brings_a_recovered_node_back() -> None:
    async with running(2) as cluster:
        node = cluster.nodes[0]
        # Delays well past a busy machine's spikes: at 30 ms and 10 ms, node 1's
        # spikes at load 8-10 won node 0 ten of the first 40 publishes.
        slow_down(node, 0.2)
        agent = await cluster.agent(0, 1, probe_interval=0.05)
        for i in range(40):
            await agent.publish({"price": float(i), "sym": "AB"})
        before = agent.published[0]
        assert before <= 5, agent.published
        node.connections = node.connections.target  # type: ignore[attr-defined]  # it recovers ...
        slow_down(cluster.nodes[1], 0.1)  # ... and the other one slows down
        await wait_until(lambda: agent.probes >= 40, what="probes")
        for i in range(200):
            await agent.publish({"price": float(i), "sym": "AB"})
        assert agent.published[0] > before + 20, agent.published


async def test_agent_moves_away_from_a_choking_node() -> None:
    async with running(3) as cluster:
        sub_client = await cluster.client(0)
        sub = await sub_client.subscribe('sym = "CH"')
        # Index 0 is the choking node 1.  Probing on: should node 2 look slow for
        # a moment (one spike on a loaded machine), a probe clears it, where
        # the choked node's estimate stays at the Choke delay.
        agent = await cluster.agent(1, 2, probe_interval=0.05)
        gate = await hold_dispatcher(cluster.nodes[1])  # after the Hello: the dispatcher answers it
        ids = [await agent.publish({"price": float(i), "sym": "CH"}) for i in range(50)]
        assert agent.chokes >= 1
        assert agent.published == [0, 50]  # nothing got through node 1, nothing lost
        got = {(await sub.next(WAIT)).event_id for _ in range(50)}
        assert got == set(ids)
        gate.set()


async def test_agent_waits_out_choke_when_no_other_node() -> None:
    async with running(2) as cluster:
        sub_client = await cluster.client(0)
        sub = await sub_client.subscribe('sym = "CH"')
        # A Choke's delay (10 ms) is fed in as the node's latency, and the ack
        # timeout follows the latencies down to min_timeout: at the default
        # 50 ms, a busy machine's slow Choke answer timed out now and then.
        # This test is about chokes, not timeouts: a timeout here means 1 s.
        agent = await cluster.agent(1, probe_interval=0, min_timeout=1.0)
        gate = await hold_dispatcher(cluster.nodes[1])
        publishing = [asyncio.ensure_future(agent.publish({"price": float(i), "sym": "CH"})) for i in range(5)]
        await wait_until(lambda: agent.chokes >= 10, what="repeated chokes")
        assert not any(p.done() for p in publishing)  # waiting the delays out, not failing
        gate.set()
        ids = await asyncio.gather(*publishing)
        assert len(set(ids)) == 5 and agent.timeouts == 0
        got = {(await sub.next(WAIT)).event_id for _ in range(5)}
        assert got == set(ids)
        # The chokes were fed into the estimator as latencies.
        assert len(agent.agent.estimators[0]) >= 10


async def test_a_node_that_timed_out_once_takes_the_publish_when_the_other_chokes() -> None:
    """Rule 2: a choking node counts as tried.  A busy machine's one slow PubAck
    left node 2 out of the publish while node 1 choked: the publish waited the
    chokes out until its deadline (TimeoutError), with node 2 healthy."""
    async with running(3) as cluster:
        agent = await cluster.agent(1, 2, probe_interval=0, min_timeout=0.05, max_timeout=0.2)
        gate = await hold_dispatcher(cluster.nodes[1])
        node = cluster.nodes[2]
        send = send_now(node)
        lost: list[cm.PubAck] = []

        def lose_the_first_puback(sid: int, msg: cm.ClientMessage) -> None:
            if isinstance(msg, cm.PubAck) and not lost:
                lost.append(msg)  # a slow reply, as far as the agent can tell
                return
            send(sid, msg)

        replies(node, lose_the_first_puback)
        await agent.publish({"price": 1.0, "sym": "CH"}, timeout=5)
        assert lost and agent.timeouts == 1 and agent.chokes >= 1, (lost, agent.timeouts, agent.chokes)
        assert agent.published == [0, 1]
        gate.set()


async def test_no_ack_in_time_is_a_failure_and_the_publish_goes_elsewhere() -> None:
    async with running(3) as cluster:
        sub_client = await cluster.client(0)
        sub = await sub_client.subscribe('sym = "TO"')
        agent = await cluster.agent(1, 2, probe_interval=0, min_timeout=0.05, max_timeout=0.2)
        # Node 2 is a little slower, so the agent comes to prefer node 1 (on a
        # loaded machine node 1's latency spikes past node 2's now and then:
        # warm up until it does, not for a fixed count) ...
        slow_down(cluster.nodes[2], 0.015)  # below min_timeout; above a loaded machine's spikes
        for i in range(400):
            await agent.publish({"price": float(i), "sym": "WARM"})
            if i >= 5 and agent.agent.choose(time.perf_counter()) == 0:
                break
        assert agent.agent.choose(time.perf_counter()) == 0
        # A warm-up publish can time out too on a loaded machine (a spike past
        # mean + 3σ): its copy matches nothing, so no access node drops one.
        warm_timeouts = agent.timeouts
        # ... then node 1 goes on accepting events but its PubAcks get lost.
        node = cluster.nodes[1]
        send = send_now(node)
        replies(node, lambda sid, msg: None if isinstance(msg, cm.PubAck) else send(sid, msg))
        ids = [await agent.publish({"price": float(i), "sym": "TO"}, timeout=5) for i in range(20)]
        assert agent.timeouts > warm_timeouts and agent.resent == agent.timeouts
        assert agent.agent.failures[0] >= 1
        assert len(set(ids)) == 20 and all(i.startswith(f"{agent.client_id}/") for i in ids)  # the agent named them
        # Node 1 accepted the timed-out publishes too, under the same ids: the
        # subscriber's access node drops those copies, each event arrives once.
        got = [(await sub.next(WAIT)).event_id for _ in range(20)]
        with contextlib.suppress(TimeoutError):
            got.append((await sub.next(0.5)).event_id)
        assert sorted(got) == sorted(ids)
        copies = agent.timeouts - warm_timeouts  # each a second copy of a "TO" event
        await wait_until(
            lambda: cluster.nodes[0].core.stats["duplicates_dropped"] == copies,
            what=f"the {copies} copies dropped (of {agent.timeouts} timeouts, {warm_timeouts} in the warm-up)",
        )


async def test_publisher_survives_the_loss_of_its_access_node() -> None:
    async with running(3) as cluster:
        sub_client = await cluster.client(0)
        sub = await sub_client.subscribe('sym = "PF"')
        agent = await cluster.agent(1, 2, probe_interval=0)
        ids: list[str] = []

        async def publish() -> None:
            for i in range(300):
                ids.append(await agent.publish({"price": float(i), "sym": "PF"}, timeout=WAIT))

        task = asyncio.ensure_future(publish())
        await wait_until(lambda: len(ids) >= 100, what="a third published")
        cluster.nodes[1].stop()
        await asyncio.wait_for(task, WAIT * 2)
        assert len(set(ids)) == 300
        assert agent.connected == [1]
        # Every publish arrives once: one node 1 had accepted, confirmed or
        # not, was sent again through node 2 under the same id, and the
        # subscriber's access node dropped the second copy.
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append((await sub.next(1.0)).event_id)
        assert sorted(got) == sorted(ids)


async def test_bad_group_weight_is_refused() -> None:
    async with running(2) as cluster:
        subscriber = await cluster.agent(0, 1, probe_interval=0)
        with pytest.raises(RequestError):
            await subscriber.subscribe('sym = "W"', group="g", weight=0.0)
        assert not subscriber._subs


@pytest.mark.parametrize(("key", "rank"), [("k", -1), ("x" * 257, 1), ("k", 1.5)])
async def test_bad_key_or_rank_is_refused_before_it_is_sent(key: str, rank: int) -> None:
    async with running(2) as cluster:
        agent = await cluster.agent(0, 1, probe_interval=0)
        with pytest.raises(LocalProtocolError):
            await agent.publish({"price": 1.0, "sym": "B"}, key=key, rank=rank)
        assert agent.connected == [0, 1]  # no session was closed for it
        assert (await agent.publish({"price": 1.0, "sym": "B"}, key="k", rank=1)).startswith(agent.client_id)


@pytest.mark.timeout(180)  # a hang's bound: its 600 publishes take what a loaded machine gives them
@pytest.mark.parametrize("how", ["stop", "crash"])
async def test_subscriber_fails_over_exactly_once(how: str) -> None:
    async with running(4) as cluster:  # node 0 owns every channel; 1-3 are access nodes
        subscriber = await cluster.agent(1, 2, 3, probe_interval=0)
        sub = await subscriber.subscribe('sym = "FO"')
        homes = sorted(sub.homes)
        assert len(homes) == 2
        victim = homes[0] + 1  # node id = index + 1
        publisher = await cluster.client(0)
        published: list[str] = []
        total = 600

        async def publish() -> None:
            for i in range(total):
                published.append(await publisher.publish({"price": float(i % 1000), "sym": "FO", "qty": i}))
                if i % 20 == 0:
                    await asyncio.sleep(0.002)

        received: list[str] = []

        async def consume() -> None:
            async for note in sub:
                received.append(note.event_id)
                if len(received) == total:
                    return

        pub_task = asyncio.ensure_future(publish())
        con_task = asyncio.ensure_future(consume())
        await wait_until(lambda: len(published) >= total // 3, what="a third published")
        if how == "stop":
            cluster.nodes[victim].stop()
        else:
            cluster.tasks[victim].cancel()
        # 600 publishes one at a time, and the victim's death detected meanwhile: a
        # loaded machine takes its time, only a stall past detection fails.
        await wait_progressing(pub_task.done, lambda: len(published), STALL, "every publish acknowledged")
        await pub_task
        await wait_progressing(con_task.done, lambda: len(received), STALL, "every event received")
        await con_task
        await asyncio.sleep(0.2)  # a late duplicate would show up here
        while not sub.queue.empty():
            item = sub.queue.get_nowait()
            assert item is not None
            received.append(item[0].event_id)
        assert len(received) == len(set(received)) == total  # exactly once
        assert set(received) == set(published)
        assert sub.failovers == 1
        assert sub.duplicates > 0  # both homes delivered: the client de-duplicated
        await wait_until(lambda: len(sub.homes) == 2, what="a new second home")
        assert victim - 1 not in sub.homes
        # The new home delivers too.
        eid = await publisher.publish({"price": 1.0, "sym": "FO"})
        assert (await sub.next(WAIT)).event_id == eid


async def test_group_subscription_has_one_home_and_reports_load() -> None:
    async with running(2) as cluster:
        subscriber = await cluster.agent(0, 1, probe_interval=0)
        sub = await subscriber.subscribe('sym = "GR"', group="workers", weight=2.0, queue_size=10)
        assert len(sub.homes) == 1
        (home,) = sub.homes
        part = sub.homes[home]
        assert (part.group, part.weight) == ("workers", 2.0)
        acks: list[cm.Ack] = []
        conn = subscriber.clients[home]
        send = conn._send

        def spy(msg: cm.ClientMessage) -> None:
            if isinstance(msg, cm.Ack):
                acks.append(msg)
            send(msg)

        conn._send = spy  # type: ignore[method-assign]
        publisher = await cluster.client(0)
        for i in range(8):
            await publisher.publish({"price": float(i), "sym": "GR"})
        await wait_until(lambda: sub.queue.qsize() == 8, what="8 queued")
        for _ in range(8):
            await sub.next(WAIT)
            await asyncio.sleep(0.03)  # 30 ms of "processing" each
        sub.done()
        await wait_until(lambda: len(acks) >= 8, what="acks")
        # The first ack saw 7 of 10 still queued: LF = Wq·LFq = 0.5 · 0.7 / 0.8.
        assert acks[0].lf == pytest.approx(0.5 * 0.7 / 0.8)
        # Later acks carry the processing time: (30 ms − 5 ms) / 50 ms · Wet ≈ 0.25.
        assert acks[-1].lf > 0.1
        assert all(0.0 <= a.lf <= 1.0 for a in acks)


# -- the command line (overlay pub --key/--rank, overlay sub --group/--weight) ------------


def cluster_toml(cluster: LoopbackCluster, tmp_path: Path, extra: str = "") -> Path:
    import re

    text = with_tls_table((CONFIGS / "local.toml").read_text(), cluster.config.tls)  # the cluster's plain TCP
    for i in range(len(cluster.nodes)):
        text = re.sub(rf"port = 710{i}\n", f"port = {cluster.addr(i)[1]}\n", text)
    text = re.sub(r"admin_port = \d+", "admin_port = 0", text)
    path = tmp_path / "cluster.toml"
    path.write_text(text + extra)
    return path


async def test_cli_pub_with_key_and_rank_and_sub_with_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from overlay import cli

    async with running(3) as cluster:
        cfg = cluster_toml(cluster, tmp_path, "\n[agent]\nwindow = 8\nprobe_interval = 0\n")
        sub_args = cli.build_parser().parse_args(
            [
                "sub",
                "--config",
                str(cfg),
                'sym = "CLI"',
                "--group",
                "g1",
                "--weight",
                "2",
                "--count",
                "2",
                "--seconds",
                "20",
            ]
        )
        subscriber = asyncio.ensure_future(cli.run_sub(sub_args))
        seen = CapturedUntil(capsys, '"subscribed"')  # printed once its home acknowledged
        await wait_until(seen.found, WAIT, "the CLI subscription acknowledged")
        pub_args = cli.build_parser().parse_args(
            [
                "pub",
                "--config",
                str(cfg),
                "--key",
                "k1",
                "--rank",
                "1",
                '{price: 1.5, sym: "CLI"}',
                '{price: 2.5, sym: "CLI"}',
            ]
        )
        assert (pub_args.key, pub_args.rank) == ("k1", 1)
        assert await cli.run_pub(pub_args) == 0
        assert await asyncio.wait_for(subscriber, WAIT) == 0
        out = seen.rest()
        assert '"group": "g1"' in out.err
        assert out.out.count('"event_id"') == 4  # two published, two received


@pytest.mark.parametrize(
    "argv",
    [
        ["pub", "--config", "x", "--rank", "0"],
        ["pub", "--config", "x", "--rank", "-3"],
        ["sub", "--config", "x", "e", "--weight", "0"],
        ["sub", "--config", "x", "e", "--weight", "nan"],
    ],
)
def test_cli_refuses_bad_rank_and_weight(argv: list[str]) -> None:
    from overlay import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(argv)


def test_cli_rank_needs_a_key(capsys: pytest.CaptureFixture[str]) -> None:
    from overlay import cli

    assert cli.main(["pub", "--config", "x", "--rank", "2", "e"]) == 2
    assert "--rank needs --key" in capsys.readouterr().err


# -- no_quorum: a refusal of the node, not of the subscription (AgentClient rule 6) --------------


def no_quorum(node: Node) -> None:
    """``node`` believes it is cut off: it refuses publishes and subscriptions with no_quorum."""
    node.core.liveness.has_quorum = lambda now: False  # type: ignore[method-assign]


def quorum_back(node: Node) -> None:
    del node.core.liveness.has_quorum  # type: ignore[attr-defined]


async def test_a_subscription_a_cut_off_node_refuses_is_placed_on_another_node() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cluster:
        no_quorum(cluster.nodes[1])
        agent = await cluster.agent(1, 2, probe_interval=0)
        sub = await agent.subscribe('sym = "NQ"')
        assert sorted(sub.homes) == [1]  # node 2 (index 1) only: node 1 did nothing
        assert cluster.nodes[1].core.stats["rejected_no_quorum"] >= 1
        publisher = await cluster.client(0)
        eid = await publisher.publish({"price": 1.0, "sym": "NQ"})
        assert (await sub.next(WAIT)).event_id == eid


async def test_a_subscribe_every_node_refuses_no_quorum_waits_for_the_quorum() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False, suspect_timeout=LOADED_SUSPECT_TIMEOUT) as cluster:
        cut = cluster.nodes[1]
        no_quorum(cut)
        agent = await cluster.agent(1, probe_interval=0)
        subscribing = asyncio.ensure_future(agent.subscribe('sym = "NQ"', timeout=WAIT * 2))
        await wait_until(lambda: cut.core.stats["rejected_no_quorum"] >= 2, what="refused, then tried again")
        assert not subscribing.done()  # waiting, not failed
        quorum_back(cut)
        sub = await asyncio.wait_for(subscribing, WAIT * 2)
        assert sorted(sub.homes) == [0]
        publisher = await cluster.client(0)
        eid = await publisher.publish({"price": 1.0, "sym": "NQ"})
        assert (await sub.next(WAIT)).event_id == eid
        # With the quorum gone for good, the caller's timeout ends it with the nodes' answer.
        no_quorum(cut)
        with pytest.raises(RequestError) as refused:
            await agent.subscribe('sym = "NQ2"', timeout=1.0)
        assert refused.value.code == cm.ErrorCode.NO_QUORUM
