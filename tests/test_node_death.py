"""A node's death with real nodes on loopback (overlay.node.liveness, .recovery,
net.node rule 14): detection by heartbeats, the dead owner's channel rebuilt on
a live node, and a run declared dead rejoining as a new one."""

from __future__ import annotations

import pytest

from conftest import LOCAL
from overlay.channels import ChannelId
from overlay.client.subscription import Subscription
from overlay.errors import RequestError
from overlay.messages import client as cm
from overlay.testing import WAIT, LoopbackCluster, wait_until

pytestmark = pytest.mark.timeout(60)

EC = ChannelId(0, 0)


def cluster() -> LoopbackCluster:
    return LoopbackCluster(LOCAL, 3, balancing=False, heartbeat_interval=0.1, suspect_timeout=0.6)


async def notified(sub: Subscription, n: int) -> list[str]:
    return [(await sub.next(WAIT)).event_id for _ in range(n)]


async def test_a_dead_owners_channel_is_rebuilt_and_events_flow_again() -> None:
    async with cluster() as cl:
        assert EC in cl.nodes[0].core.local
        sub = await (await cl.client(1)).subscribe("price < 100")
        await cl.crash_node(0)
        await wait_until(
            lambda: all(cl.nodes[i].core.liveness.is_dead(0) for i in (1, 2)), WAIT, "node 0 declared dead"
        )
        await wait_until(
            lambda: any(EC in cl.nodes[i].core.local and not cl.nodes[i].core.recovery.rebuilding for i in (1, 2)),
            WAIT,
            "EC rebuilt on a live node",
        )
        owner = next(i for i in (1, 2) if EC in cl.nodes[i].core.local)
        assert len(cl.nodes[owner].core.local[EC]) == 1  # the subscription, from its access node
        pub = await cl.client(2)
        ids = [await pub.publish({"price": float(i), "sym": "AB"}) for i in range(5)]
        assert await notified(sub, 5) == ids


async def test_a_node_left_alone_refuses_publishes_and_subscriptions_with_no_quorum() -> None:
    async with cluster() as cl:
        c = await cl.client(2)
        await c.publish({"price": 1.0, "sym": "AB"})
        await cl.crash_node(0)
        await cl.crash_node(1)
        await wait_until(lambda: not cl.nodes[2].core.liveness.has_quorum(cl.nodes[2].core.now), WAIT, "quorum lost")
        with pytest.raises(RequestError) as pub:
            await c.publish({"price": 1.0, "sym": "AB"})
        assert pub.value.code == cm.ErrorCode.NO_QUORUM
        with pytest.raises(RequestError) as sub:
            await c.subscribe("price < 5")
        assert sub.value.code == cm.ErrorCode.NO_QUORUM
        # One vote of three is no majority: nobody was declared dead.
        assert not cl.nodes[2].core.liveness.dead


async def test_the_agent_takes_a_publish_a_cut_off_node_refuses_to_another_node_under_the_same_id() -> None:
    async with cluster() as cl:
        sub = await (await cl.client(2)).subscribe("price < 100")
        cut = cl.nodes[0].core.liveness
        cut.has_quorum = lambda now: False  # type: ignore[method-assign]  # node 0 believes it is cut off
        agent = await cl.agent(0, 1, probe_interval=0)
        ids = [await agent.publish({"price": float(i), "sym": "AB"}) for i in range(20)]
        assert agent.quorum_refusals >= 1 and agent.published[0] == 0
        assert sorted(await notified(sub, 20)) == sorted(ids)
        assert cl.stat("rejected_no_quorum") == agent.quorum_refusals
