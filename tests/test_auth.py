"""Client authentication on real nodes (``overlay.node.clients`` rules A1–A4):
a token's signature, expiry, roles and content scopes, end to end."""

from __future__ import annotations

import asyncio
import time

import pytest

from authkit import OTHER_KEY, auth, token
from conftest import LOCAL
from overlay.client import AgentClient, Client
from overlay.errors import ConnectionLost, OverlayError, RequestError
from overlay.messages import client as cm
from overlay.testing import LoopbackCluster
from overlay.testing._loopback import wait_until
from test_admin import fetch

pytestmark = pytest.mark.timeout(60)


async def refused(cl: LoopbackCluster, tok: str, client_id: str | None = None) -> RequestError:
    """Connect with ``tok``; the node's refusal of the Hello."""
    with pytest.raises(RequestError) as info:
        await Client([cl.addr(0)], token=tok, client_id=client_id, reconnect=False).connect(timeout=10)
    return info.value


@pytest.mark.parametrize(
    "tok, client_id, words",
    [
        ("", None, "needs a signed token"),
        ("expired", None, "expired"),
        ("not-a-jwt", None, "not a JWT"),
        ("other-key", None, "does not trust"),
        ("other-cluster", None, "for cluster 'elsewhere'"),
        ("alice", "mallory", "for client 'alice', and the Hello names 'mallory'"),
    ],
)
async def test_a_session_without_a_good_token_is_refused_at_hello(tok: str, client_id: str | None, words: str) -> None:
    given = {
        "expired": lambda: token(ttl=1e-3),
        "other-key": lambda: token(key=OTHER_KEY),
        "other-cluster": lambda: token(audience="elsewhere"),
        "alice": lambda: token("alice"),
        "not-a-jwt": lambda: "not-a-jwt",
        "": lambda: "",
    }[tok]()
    async with LoopbackCluster(LOCAL, 1, auth=auth()) as cl:
        if tok == "expired":
            await asyncio.sleep(0.01)
        error = await refused(cl, given, client_id)
        assert error.code == cm.ErrorCode.UNAUTHORIZED and words in error.reason, error
        core = cl.nodes[0].core
        assert core.stats["rejected_unauthorized"] == 1 and not core.sessions.owners


async def test_in_scope_works_end_to_end_and_out_of_scope_is_forbidden_naming_the_scope() -> None:
    reader = token("reader", "subscribe", scopes={"subscribe": 'sym prefix "AB"'})
    writer = token("writer", "publish", scopes={"publish": 'venue = "lse"'})
    async with LoopbackCluster(LOCAL, 3, auth=auth(), balancing=False) as cl:
        r = await cl.client(1, token=reader)
        w = await cl.client(2, token=writer)
        assert r.client_id == "reader" and w.client_id == "writer"  # taken from the tokens
        with pytest.raises(RequestError) as info:
            await r.subscribe("price < 10")
        assert info.value.code == cm.ErrorCode.FORBIDDEN
        assert 'not covered by your subscribe scope `sym prefix "AB"`' in info.value.reason
        sub = await r.subscribe('sym prefix "ABC" and price < 10')
        with pytest.raises(RequestError) as info:
            await w.publish({"price": 1.0, "sym": "ABC", "venue": "nyse"})
        assert info.value.code == cm.ErrorCode.FORBIDDEN
        assert 'event not inside your publish scope `venue = "lse"`' in info.value.reason
        await w.publish({"price": 1.0, "sym": "ABC", "venue": "lse"})
        note = await sub.next(10)
        assert note.event["venue"] == "lse" and sub.received == 1
        # Roles: the reader cannot publish, the writer cannot subscribe.
        with pytest.raises(RequestError, match="publishing needs a token with the publish role"):
            await r.publish({"price": 1.0, "sym": "ABC", "venue": "lse"})
        with pytest.raises(RequestError, match="subscribing needs a token with the subscribe role"):
            await w.subscribe('sym = "ABC"')
        assert cl.stat("rejected_forbidden") == 4 and cl.stat("events_in") == 1 and cl.stat("subscriptions_in") == 1
        # Refused: nothing was stored, nothing delivered.
        stored = sum(len(ch) for n in cl.nodes.values() for ch in n.core.local)
        assert stored == 1 and sub.received == 1
        status, metrics, _ = await fetch(cl.url(1) + "/metrics")
        assert status == 200 and 'overlay_rejected_total{node="1",reason="forbidden"} 2.0' in metrics


async def test_a_refusal_is_logged_once_per_session(caplog: pytest.LogCaptureFixture) -> None:
    reader = token("reader", "subscribe")
    async with LoopbackCluster(LOCAL, 1, auth=auth()) as cl:
        c = await cl.client(0, token=reader)
        for _ in range(3):
            with pytest.raises(RequestError):
                await c.publish({"price": 1.0, "sym": "A"})
        assert cl.stat("rejected_forbidden") == 3
    logged = [r for r in caplog.records if "refused" in r.getMessage() and "'reader'" in r.getMessage()]
    assert len(logged) == 1


async def test_refused_hellos_are_counted_each_and_logged_within_a_bound(caplog: pytest.LogCaptureFixture) -> None:
    # Found by the second outside audit: each refused Hello was a WARNING line, so a
    # stranger without a token wrote one per connection, as fast as it connected.
    async with LoopbackCluster(LOCAL, 1, auth=auth(), limits={"max_connections": 1}) as cl:
        cl.nodes[0].core.clients._refusals.every = 3600.0  # however slow the machine, one period
        for _ in range(20):
            await refused(cl, "not-a-jwt")
        await cl.client(0, token=token("bob"))
        for _ in range(20):
            error = await refused(cl, token("bob"))  # past bob's max_connections
            assert error.code == cm.ErrorCode.TOO_MANY_CONNECTIONS
        assert (cl.stat("rejected_unauthorized"), cl.stat("rejected_too_many_connections")) == (20, 20)
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and ") refused: " in r.getMessage()]
    assert len(lines) == 2 and "not a JWT" in lines[0] and "max_connections" in lines[1], lines


async def test_a_keyed_publish_and_a_group_subscription_are_checked_too() -> None:
    tok = token("c", scopes={"publish": 'sym = "K"', "subscribe": 'sym = "K"'})
    async with LoopbackCluster(LOCAL, 2, auth=auth(), balancing=False) as cl:
        c = await cl.client(0, token=tok)
        with pytest.raises(RequestError, match="forbidden"):
            await c.publish({"price": 1.0, "sym": "Z"}, key="k1")
        with pytest.raises(RequestError, match="forbidden"):
            await c.subscribe('sym = "Z"', group="g")
        sub = await c.subscribe('sym = "K"', group="g")
        await c.publish({"price": 1.0, "sym": "K"}, key="k1")
        assert (await sub.next(10)).key == "k1"


async def test_a_session_whose_token_expires_is_closed_and_a_token_function_reconnects_it() -> None:
    """Rule A3: even a listener's rights end with its token; the client's token
    function gives the reconnect a fresh one, and the subscription comes back."""
    errors: list[OverlayError] = []
    issued: list[str] = []
    made: list[Client] = []

    def fresh() -> str:  # called for the client id, then before each connection
        first = not made or made[0].connections == 0
        issued.append(token("listener", ttl=1.0 if first else 600.0))
        return issued[-1]

    async with LoopbackCluster(LOCAL, 1, auth=auth()) as cl:
        c = Client([cl.addr(0)], token=fresh, error_cb=errors.append)
        made.append(c)
        cl.clients.append(c)
        await c.connect()
        sub = await c.subscribe('sym = "EXP"')
        await wait_until(lambda: cl.stat("rejected_token_expired") == 1, 10, "the session closed at expiry")
        await wait_until(lambda: c.connections == 2 and c.connected, 10, "reconnected with a fresh token")
        assert any(isinstance(e, RequestError) and e.code == cm.ErrorCode.TOKEN_EXPIRED for e in errors)
        async with Client([cl.addr(0)], token=token("pub", "publish")) as p:
            await wait_until(lambda: len(cl.nodes[0].core.sessions.owners) == 1, 10, "re-subscribed")
            await p.publish({"price": 1.0, "sym": "EXP"})
        assert (await sub.next(10)).event["sym"] == "EXP"
        assert len(issued) >= 3


async def test_a_fixed_token_refused_on_a_reconnect_ends_the_client() -> None:
    async with LoopbackCluster(LOCAL, 1, auth=auth()) as cl:
        errors: list[OverlayError] = []
        c = Client([cl.addr(0)], token=token("short", ttl=1.0), error_cb=errors.append)
        cl.clients.append(c)
        await c.connect()
        sub = await c.subscribe('sym = "X"')
        with pytest.raises(ConnectionLost, match=r"refused the session.*expired"):
            async with asyncio.timeout(15):
                async for _ in sub:
                    pass
        assert any(isinstance(e, RequestError) and e.code == cm.ErrorCode.UNAUTHORIZED for e in errors)


async def test_where_tokens_are_optional_a_session_without_one_publishes_but_never_operates() -> None:
    async with LoopbackCluster(LOCAL, 2, auth=auth(required=False), balancing=False) as cl:
        anon = await cl.client(0)
        sub = await anon.subscribe('sym = "OPT"')
        await anon.publish({"price": 1.0, "sym": "OPT"})
        assert (await sub.next(10)).event["sym"] == "OPT"
        with pytest.raises(RequestError) as info:
            await anon.admin("split", channel="0.0", attr="price", at=500.0)
        assert info.value.code == cm.ErrorCode.FORBIDDEN and "admin role" in info.value.reason
        assert len(cl.nodes[0].core.routing) == 1
        # A token presented is checked all the same.
        error = await refused(cl, token(key=OTHER_KEY))
        assert error.code == cm.ErrorCode.UNAUTHORIZED


async def test_an_agent_client_takes_its_id_from_the_token() -> None:
    async with LoopbackCluster(LOCAL, 2, auth=auth()) as cl:
        agent = AgentClient([cl.addr(0), cl.addr(1)], token=token("agent-7"))
        cl.clients.append(agent)
        await agent.connect()
        assert agent.client_id == "agent-7"
        sub = await agent.subscribe('sym = "AG"')
        await agent.publish({"price": 2.0, "sym": "AG"})
        assert (await sub.next(10)).event["sym"] == "AG"


async def test_the_verify_cost_is_paid_once_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reconnect storm: the same token verified again is a cache hit."""
    tok = token("storm")
    async with LoopbackCluster(LOCAL, 1, auth=auth()) as cl:
        verifier = cl.nodes[0].core.verifier
        assert verifier is not None
        # The cost is the signature check: counted, not timed (a loaded
        # machine makes any stopwatch say nothing about a cache).
        checks = []
        verified = verifier._verified_claims

        def counting(t: str) -> object:
            checks.append(t)
            return verified(t)

        monkeypatch.setattr(verifier, "_verified_claims", counting)
        for _ in range(5):
            async with Client([cl.addr(0)], token=tok, reconnect=False):
                pass
        assert len(verifier._cache) == 1 and checks == [tok]


def test_a_session_past_its_token_is_told_once() -> None:
    """Rule A3 in the core: what the session sends after its token expired is
    refused once with token_expired (the session closes) and then ignored."""
    from overlay.actions import CloseClient, ToClient
    from overlay.auth import load_public_key
    from overlay.auth.tokens import Verifier
    from overlay.node import NodeCore

    cfg = LOCAL
    keys = [load_public_key(auth()["public_keys"][0])]
    verifier = Verifier(keys, audience=cfg.cluster.name, schema=cfg.schema, leeway=0.0)
    core = NodeCore(cfg, 0, verifier=verifier)
    sid = core.client_opened()
    now = time.time()
    out = core.handle_client(sid, cm.Hello("alice", 1, token("alice", ttl=60)), now)
    assert isinstance(out[0], ToClient) and isinstance(out[0].msg, cm.Welcome)
    publish = cm.Publish(1, {"price": 1.0, "sym": "A"})
    first = core.handle_client(sid, publish, now + 61)
    errors = [a.msg for a in first if isinstance(a, ToClient) and isinstance(a.msg, cm.Error)]
    assert [e.code for e in errors] == [cm.ErrorCode.TOKEN_EXPIRED] and errors[0].fatal
    assert any(isinstance(a, CloseClient) for a in first)
    assert core.handle_client(sid, publish, now + 62) == []
    assert core.tick(now + 63) is not None and core.stats["rejected_token_expired"] == 1
