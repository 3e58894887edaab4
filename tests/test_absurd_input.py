"""No single request can stop the cluster (SPEC §16 "absurd input").

Valid-but-absurd numbers are refused at the boundary with an error that
names them — a split at NaN, a weight of 1e308, a rank past 2^53, a publish
time of NaN, an expression that can never match or is too long — and the
owner's per-event path cannot fail for one subscription's sake: that
subscription's error is counted, every other match is served.  After each,
publishing still works through every node.
"""

from __future__ import annotations

import logging
import math

import pytest

from conftest import LOCAL
from coreworld import EC, World
from overlay.channels.expressions import MAX_EXPRESSION_LENGTH
from overlay.channels.subscriptions import Subscription
from overlay.client import Client
from overlay.errors import LocalProtocolError, RequestError
from overlay.messages import client as cm
from overlay.testing import LoopbackCluster

pytestmark = pytest.mark.timeout(60)

NAN = float("nan")


async def _request(c: Client, make) -> cm.ClientMessage:
    return await c._request(make, 5.0)


async def _everyone_still_publishes(cluster: LoopbackCluster) -> None:
    """A publish through each node reaches a subscriber on each node."""
    subs = []
    for node in cluster.nodes:
        c = await cluster.client(node, client_id=f"check-sub-{node}")
        subs.append(await c.subscribe("price < 1000", sub_id=f"check-{node}-{len(c.subscriptions)}"))
    sent = set()
    for node in cluster.nodes:
        c = await cluster.client(node, client_id=f"check-pub-{node}")
        sent.add(await c.publish({"price": 1.0 + node, "sym": "A"}))
    for sub in subs:
        got = {(await sub.next(5.0)).event_id for _ in sent}
        assert got == sent


@pytest.mark.parametrize(
    "request_, code, words",
    [
        (
            lambda seq: cm.Admin(seq, "split", {"channel": "0.0", "attr": "price", "at": NAN}),
            cm.ErrorCode.ADMIN,
            "finite",
        ),
        (
            lambda seq: cm.Admin(seq, "split", {"channel": "0.0", "attr": "price", "at": math.inf}),
            cm.ErrorCode.ADMIN,
            "finite",
        ),
        (
            lambda seq: cm.Admin(seq, "split", {"channel": "0.0", "attr": "price", "at": 1e308}),
            cm.ErrorCode.ADMIN,
            "outside",
        ),
        (
            lambda seq: cm.Admin(seq, "split", {"channel": "0.0", "attr": "price", "at": "500"}),
            cm.ErrorCode.ADMIN,
            "numeric",
        ),
        (
            lambda seq: cm.Admin(seq, "split", {"channel": "0.0", "attr": "qty", "at": 2}),
            cm.ErrorCode.ADMIN,
            "distinguishing",
        ),
        (
            lambda seq: cm.Admin(seq, "split", {"channel": "0.0", "attr": "nope", "at": 1}),
            cm.ErrorCode.ADMIN,
            "distinguishing",
        ),
        (
            lambda seq: cm.Admin(seq, "split", {"channel": "0.0", "attr": "sym", "values": list(range(3))}),
            cm.ErrorCode.ADMIN,
            "string",
        ),
        (lambda seq: cm.Subscribe(seq, "g", "price < 10", "workers", 1e308), cm.ErrorCode.BAD_GROUP, "weight"),
        (lambda seq: cm.Subscribe(seq, "g", "price < 10", "workers", NAN), cm.ErrorCode.BAD_GROUP, "weight"),
        (lambda seq: cm.Subscribe(seq, "g", "price < 10", "workers", -1.0), cm.ErrorCode.BAD_GROUP, "weight"),
        (lambda seq: cm.Subscribe(seq, "x", "price > 10 and price < 5"), cm.ErrorCode.BAD_EXPRESSION, "never match"),
        (
            lambda seq: cm.Subscribe(seq, "x", "price < 1 and " * (MAX_EXPRESSION_LENGTH // 14) + "price < 1"),
            cm.ErrorCode.EXPRESSION_TOO_LARGE,  # [limits] max_expression_bytes, before the parser's own bound
            "max_expression_bytes",
        ),
        (lambda seq: cm.Publish(seq, {"price": NAN, "sym": "A"}), cm.ErrorCode.BAD_EVENT, "finite"),
        (lambda seq: cm.Publish(seq, {"price": 1e308, "sym": "A"}), cm.ErrorCode.BAD_EVENT, "outside"),
        (lambda seq: cm.Publish(seq, {"price": 1.0, "sym": "A"}, 0.0, "k", 2**60), cm.ErrorCode.BAD_RANK, "largest"),
    ],
)
async def test_an_absurd_request_is_refused_by_name_and_every_node_keeps_serving(request_, code, words) -> None:
    async with LoopbackCluster(LOCAL, balancing=False) as cluster:
        c = await cluster.client(0, client_id="absurd")
        reply = await _request(c, request_)
        assert isinstance(reply, cm.Error) and reply.code == code, reply
        assert words in reply.message, reply.message
        assert c.connected  # the session stays open
        await _everyone_still_publishes(cluster)
        assert all(len(n.core.routing) == 1 for n in cluster.nodes.values())


async def test_a_nan_publish_time_is_replaced_by_the_node_clock() -> None:
    async with LoopbackCluster(LOCAL, balancing=False) as cluster:
        c = await cluster.client(1, client_id="clock")
        sub = await c.subscribe("price < 10")
        reply = await _request(c, lambda seq: cm.Publish(seq, {"price": 1.0, "sym": "A"}, NAN))
        assert isinstance(reply, cm.PubAck)
        note = await sub.next(5.0)
        assert math.isfinite(note.publish_time) and note.publish_time > 0
        await _everyone_still_publishes(cluster)


def test_one_subscription_that_cannot_be_dispatched_does_not_cost_the_others_their_event() -> None:
    """The owner's per-event path: a group instance whose weight cannot be
    turned into a dispatch weight (as 1e308 once could) is left out and
    counted; its group's other instance and the plain subscriber get it."""
    w = World()
    a, b = w.client(1, "a"), w.client(2, "b")
    w.subscribe(1, a, "plain", "price < 100")
    w.net.client_send(2, b, cm.Subscribe(w.seq(), "inst", "price < 100", "workers", 2.0))
    w.net.run()
    owner = w.cores[0]
    bad = Subscription("9:9:bad:1", owner.local[EC].get(w.gid(1, a, "plain")).filter, "x", 2, "workers", math.inf)
    owner.local[EC].add(bad)  # as a peer could once store it
    w.publish(1, w.client(1, "pub"), {"price": 5.0, "sym": "A"})
    w.net.run()
    assert len(w.net.received(1, a, kind=cm.Notify)) == 1
    assert [n.sub_ids for n in w.net.received(2, b, kind=cm.Notify)] == [("inst",)]
    assert owner.stats["subscription_errors"] == 1


def test_matching_that_raises_for_one_subscription_serves_the_others(caplog: pytest.LogCaptureFixture) -> None:
    """When the channel's matcher raises, the owner tests each member on its
    own: the one that raises is counted and logged, the others notified."""
    caplog.set_level(logging.ERROR, logger="overlay.node")  # the simulator's tests silence "overlay"
    w = World()
    a = w.client(1, "a")
    w.subscribe(1, a, "plain", "price < 100")
    ch = w.cores[0].local[EC]

    class Poison:
        def matches(self, values: object) -> bool:
            raise TypeError("a filter that cannot be tested")

        def attrs(self) -> frozenset[str]:
            return frozenset()

    ch._pending["poison"] = (Subscription("poison", Poison(), "p", 1), None)  # type: ignore[arg-type]
    w.publish(1, w.client(1, "pub"), {"price": 5.0, "sym": "A"})
    w.net.run()
    assert len(w.net.received(1, a, kind=cm.Notify)) == 1
    assert w.cores[0].stats["subscription_errors"] == 1
    assert "['poison']" in caplog.text and "the other subscriptions are served" in caplog.text


async def test_the_client_refuses_a_rank_past_the_bound_before_sending() -> None:
    async with LoopbackCluster(LOCAL, balancing=False) as cluster:
        c = await cluster.client(0, client_id="ranks")
        with pytest.raises(Exception, match="rank"):
            await c.publish({"price": 1.0, "sym": "A"}, key="k", rank=2**60)
        with pytest.raises(RequestError, match="bad_group"):
            await c.subscribe("price < 1", group="g", weight=1e308)


@pytest.mark.parametrize("timeout", [NAN, math.inf, 1e308, 0.0, -1.0])
async def test_a_client_refuses_an_absurd_timeout_before_it_sends(timeout: float) -> None:
    async with LoopbackCluster(LOCAL, balancing=False) as cluster:
        c = await cluster.client(0, client_id="timeouts")
        with pytest.raises(LocalProtocolError, match="timeout"):
            await c.publish({"price": 1.0, "sym": "A"}, timeout=timeout)
        with pytest.raises(LocalProtocolError, match="timeout"):
            await c.subscribe("price < 1", timeout=timeout)
        assert c.connected and not c.subscriptions
