"""overlay.limits.quotas and .settings: what each client id holds on a node, checked without a loop."""

from __future__ import annotations

import pytest

from conftest import LOCAL
from overlay.channels.expressions import parse_subscription
from overlay.errors import LimitExceeded
from overlay.limits import CLIENT_KEYS, LimitSettings, Quotas, client_limits, parse_client_limits
from overlay.limits.quotas import MAX_IDLE
from overlay.messages.client import ErrorCode

pytestmark = pytest.mark.timeout(30)


class Subs(dict[int, int]):
    """Subscriptions held per session, as node.sessions would say."""

    def __call__(self, sid: int) -> int:
        return self.get(sid, 0)


def quotas(**limits: float) -> tuple[Quotas, Subs]:
    subs = Subs()
    return Quotas(7, LimitSettings(**limits), subs, lambda: sum(subs.values())), subs  # type: ignore[arg-type]


def test_the_defaults_are_the_documented_ones_and_zero_means_no_limit() -> None:
    s = LimitSettings()
    assert (s.max_connections, s.max_subscriptions, s.max_expression_bytes, s.max_predicates) == (64, 10_000, 8192, 64)
    assert (s.publish_rate, s.publish_burst, s.queue_budget, s.slow_consumer_grace) == (50_000, 100_000, 128 << 20, 10)
    q, subs = quotas(max_connections=0, max_subscriptions=0)
    for sid in range(1, 200):
        q.open(sid, "c", 0.0)
        subs[sid] = 1000
    q.check_subscribe(1, "price < 1")  # 199,000 held: no limit


def test_the_nodes_subscriptions_are_bounded_every_client_id_together() -> None:
    # Found by the second outside audit: client ids made up by the thousand
    # (no [auth]) each held max_subscriptions, and nothing bounded the node's table.
    q, subs = quotas(max_subscriptions=3, max_node_subscriptions=5)
    for sid, client in enumerate("abc", start=1):
        q.open(sid, client, 0.0)
    subs[1], subs[2] = 3, 2
    with pytest.raises(LimitExceeded) as info:
        q.check_subscribe(3, "price < 1")  # 'c' holds none, but the node holds 5
    exc = info.value
    assert exc.code == ErrorCode.TOO_MANY_SUBSCRIPTIONS and exc.key == "max_node_subscriptions"
    assert (exc.limit, exc.value) == (5, 6)
    assert "node 7 holds 5 subscriptions of its clients" in str(exc)
    assert "[limits] max_node_subscriptions = 5" in str(exc)
    subs[2] = 1  # one unsubscribed: room again at once
    q.check_subscribe(3, "price < 1")
    q, subs = quotas(max_node_subscriptions=0)  # 0: no limit
    q.open(1, "a", 0.0)
    subs[1] = 5_000
    q.check_subscribe(1, "price < 1")
    assert LimitSettings().max_node_subscriptions == 1_000_000


def test_connections_are_counted_per_client_id_and_freed_at_close() -> None:
    q, _ = quotas(max_connections=2)
    q.open(1, "a", 0.0)
    q.open(2, "a", 0.0)
    q.open(3, "b", 0.0)  # another client id has its own count
    with pytest.raises(LimitExceeded) as info:
        q.open(4, "a", 0.0)
    exc = info.value
    assert exc.code == ErrorCode.TOO_MANY_CONNECTIONS and exc.key == "max_connections"
    assert (exc.limit, exc.value) == (2, 3)
    assert "'a' has 2 connections open on node 7" in str(exc) and "[limits] max_connections = 2" in str(exc)
    assert q.connections("a") == 2 and len(q) == 3  # the refused one never counted
    q.close(1, 0.0)
    q.close(1, 0.0)  # idempotent
    q.open(4, "a", 0.0)
    assert q.connections("a") == 2


def test_subscriptions_are_counted_over_every_session_of_the_client_id() -> None:
    q, subs = quotas(max_subscriptions=5)
    q.open(1, "a", 0.0)
    q.open(2, "a", 0.0)
    subs[1], subs[2] = 3, 2
    with pytest.raises(LimitExceeded) as info:
        q.check_subscribe(2, "price < 1")
    exc = info.value
    assert exc.code == ErrorCode.TOO_MANY_SUBSCRIPTIONS and (exc.limit, exc.value) == (5, 6)
    assert "holds 5 subscriptions on node 7" in str(exc) and "[limits] max_subscriptions = 5" in str(exc)
    subs[1] = 2  # one unsubscribed: room again at once
    q.check_subscribe(2, "price < 1")


def test_an_expression_is_checked_by_its_bytes_then_by_its_predicates() -> None:
    q, _ = quotas(max_expression_bytes=40, max_predicates=2)
    q.open(1, "a", 0.0)
    with pytest.raises(LimitExceeded) as info:
        q.check_subscribe(1, 'sym = "é' + "x" * 31 + '"')  # 41 bytes, 40 characters: bytes count
    assert info.value.code == ErrorCode.EXPRESSION_TOO_LARGE and info.value.key == "max_expression_bytes"
    assert "41 bytes" in str(info.value) and "[limits] max_expression_bytes = 40" in str(info.value)
    f = parse_subscription("price < 5 and price > 1 and qty < 3", LOCAL.schema)
    with pytest.raises(LimitExceeded) as info:
        q.check_filter(1, f)
    assert info.value.key == "max_predicates" and "3 predicates" in str(info.value)
    q.check_filter(1, parse_subscription("price < 5 and qty < 3", LOCAL.schema))


def test_a_token_claim_overrides_the_config_and_the_message_says_so() -> None:
    q, subs = quotas(max_subscriptions=5)
    q.open(1, "vip", 0.0, {"max_subscriptions": 1})
    subs[1] = 1
    with pytest.raises(LimitExceeded) as info:
        q.check_subscribe(1, "price < 1")
    assert "your token's limits claim max_subscriptions = 1" in str(info.value)


def test_publishes_share_one_bucket_per_client_id_and_a_reconnect_does_not_refill_it() -> None:
    q, _ = quotas(publish_rate=10.0, publish_burst=2)
    q.open(1, "p", 0.0)
    q.open(2, "p", 0.0)
    assert q.publish(1, 0.0) == 0.0 and q.publish(2, 0.0) == 0.0
    assert q.publish(1, 0.0) == pytest.approx(0.1)
    q.close(1, 0.0)
    q.close(2, 0.0)
    assert q.idle_buckets == 1  # kept: empty, not idle
    q.open(3, "p", 0.01)
    assert q.publish(3, 0.01) > 0.0  # the same bucket, still empty
    assert "[limits] publish_rate = 10/s" in q.rate_hint(3)
    q.close(3, 0.01)
    q.sweep(100.0)
    assert q.idle_buckets == 0  # full again: forgotten


def test_idle_buckets_are_bounded() -> None:
    q, _ = quotas(publish_rate=1.0, publish_burst=1)
    for sid in range(MAX_IDLE + 10):
        q.open(sid, f"c{sid}", 0.0)
        q.publish(sid, 0.0)
        q.close(sid, 0.0)
    assert q.idle_buckets == MAX_IDLE


def test_a_refusal_is_first_once_per_session_and_kind() -> None:
    q, _ = quotas()
    q.open(1, "a", 0.0)
    assert q.first_refusal(1, "too_many_subscriptions")
    assert not q.first_refusal(1, "too_many_subscriptions")
    assert q.first_refusal(1, "rate")


def test_a_token_limits_claim_is_checked() -> None:
    assert parse_client_limits({"max_subscriptions": 50_000, "publish_rate": 5}) == {
        "max_subscriptions": 50_000,
        "publish_rate": 5.0,
    }
    with pytest.raises(ValueError, match="unknown limit 'queue_budget'"):
        parse_client_limits({"queue_budget": 1})  # node-wide: not a token's to set
    with pytest.raises(ValueError, match="bad limit"):
        parse_client_limits({"max_connections": -1})
    assert set(CLIENT_KEYS) == {
        "max_connections",
        "max_subscriptions",
        "max_expression_bytes",
        "max_predicates",
        "publish_rate",
        "publish_burst",
    }
    assert client_limits(LimitSettings(), {"max_connections": 3}).max_connections == 3


def test_a_run_passes_at_once_only_when_every_publish_of_it_would() -> None:
    q, _ = quotas(publish_rate=10.0, publish_burst=5)
    q.open(1, "p", 0.0)
    assert q.publish_all(1, 3, 0.0)  # 5 tokens: 3 taken
    assert not q.publish_all(1, 3, 0.0)  # 2 left: nothing taken ...
    assert q.publish(1, 0.0) == 0.0 and q.publish(1, 0.0) == 0.0  # ... as one by one shows
    assert q.publish(1, 0.0) > 0.0
    assert q.publish_all(1, 1, 0.1)  # refilled at the rate
    assert q.publish_all(99, 10**6, 0.0)  # no session: nothing to pace (as publish says)


def test_take_all_then_one_by_one_is_one_by_one() -> None:
    """limits.bucket rule 5 as node.clients uses it (the run at once, else
    each on its own) gives what rule 2 one by one gives, over random runs
    and clocks: the same answers and the same bucket after."""
    import random

    from overlay.limits.bucket import TokenBucket

    rng = random.Random(5)
    for _ in range(300):
        rate, burst = rng.choice([0.0, 3.0, 1000.0]), rng.randint(1, 20)
        a, b = TokenBucket(rate, burst, 0.0), TokenBucket(rate, burst, 0.0)
        now = 0.0
        for _ in range(30):
            now += rng.choice([0.0, 0.0, 0.001, 1 / 3, 0.3, -0.1])
            n = rng.randint(1, 8)
            got = [0.0] * n if a.take_all(n, now) else [a.take(now) for _ in range(n)]
            assert got == [b.take(now) for _ in range(n)]
            assert (a.tokens, a.stamp, a.next_turn) == (b.tokens, b.stamp, b.next_turn)


def test_a_run_of_publishes_is_paced_one_by_one() -> None:
    """node.clients rule L3 on the batched path (``publish_many``): past the
    burst, each publish of the run is choked, in order."""
    import msgspec

    from coreworld import CONFIG
    from overlay.messages import client as cm
    from overlay.testing.corelink import CoreLink

    cfg = msgspec.structs.replace(CONFIG, limits=LimitSettings(publish_rate=10.0, publish_burst=3))
    net = CoreLink(cfg.with_nodes(cfg.nodes[:1]))
    net.start()
    core = net.cores[0]
    sid = net.open_client(0, "p")
    run = [cm.Publish(i, {"price": 1.0, "sym": "A"}) for i in range(1, 6)]
    acts = core.handle_publishes(sid, run, net.now)
    replies = [(type(a.msg).__name__, a.msg.seq) for a in acts if a.session == sid]
    assert replies == [("PubAck", 1), ("PubAck", 2), ("PubAck", 3), ("Choke", 4), ("Choke", 5)]
    net.now += 0.3  # three tokens again: a run of three passes at once, the next is choked
    run = [cm.Publish(i, {"price": 1.0, "sym": "A"}) for i in range(6, 10)]
    acts = core.handle_publishes(sid, run[:3], net.now) + core.handle_publishes(sid, run[3:], net.now)
    replies = [(type(a.msg).__name__, a.msg.seq) for a in acts if a.session == sid]
    assert replies == [("PubAck", 6), ("PubAck", 7), ("PubAck", 8), ("Choke", 9)]
