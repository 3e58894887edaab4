"""One rule for admin rights (``overlay.node.admin``): the commands that change
the cluster need a token with the admin role where the cluster has ``[auth]``,
or else the cluster's legacy admin token when one is configured — on the
client protocol as on the admin HTTP endpoint; reading needs neither."""

from __future__ import annotations

import pytest

from authkit import OTHER_KEY, auth, token
from conftest import LOCAL
from overlay.client import Client
from overlay.errors import ConfigError, RequestError
from overlay.messages import client as cm
from overlay.testing import LoopbackCluster
from test_admin import fetch

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret"


@pytest.mark.parametrize(
    "command, args",
    [
        ("drain", {}),
        ("split", {"channel": "0.0", "attr": "price", "at": 500.0}),
        ("place", {"channel": "0.0", "node": 1}),
    ],
)
async def test_a_changing_command_without_the_token_is_refused_on_every_protocol(
    command: str, args: dict, monkeypatch
) -> None:
    monkeypatch.delenv("OVERLAY_ADMIN_TOKEN", raising=False)
    async with LoopbackCluster(LOCAL, 3, admin=True, balancing=False, admin_token=TOKEN) as cl:
        for token in ("", "wrong"):
            async with Client([cl.addr(0)], token=token, reconnect=False) as anon:
                with pytest.raises(RequestError) as info:
                    await anon.admin(command, **args)
                assert info.value.code == cm.ErrorCode.UNAUTHORIZED and "admin token" in info.value.reason
                assert (await anon.admin("status"))["node"] == 0  # reading needs no token
        core = cl.nodes[0].core
        assert not core.draining and len(core.routing) == 1 and core.stats["rejected_unauthorized"] == 2
        # HTTP refuses the same without it.
        status, _, _ = await fetch(cl.url(0) + "/drain", "POST")
        assert status == 401
        # With the token, the command is carried out.
        async with Client([cl.addr(0)], token=TOKEN, reconnect=False) as op:
            await op.admin(command, **args)


async def test_without_a_configured_token_every_client_may_operate(monkeypatch) -> None:
    monkeypatch.delenv("OVERLAY_ADMIN_TOKEN", raising=False)
    async with LoopbackCluster(LOCAL, 3, admin=True, balancing=False) as cl:
        async with Client([cl.addr(0)], reconnect=False) as anon:
            await anon.admin("split", channel="0.0", attr="price", at=500.0)
        assert len(cl.nodes[0].core.routing) == 2


# -- with [auth]: admin rights come from a token with the admin role (overlay.auth) --------


@pytest.mark.parametrize(
    "command, args",
    [
        ("drain", {}),
        ("split", {"channel": "0.0", "attr": "price", "at": 500.0}),
        ("place", {"channel": "0.0", "node": 1}),
    ],
)
async def test_with_auth_a_changing_command_needs_the_admin_role_on_every_protocol(
    command: str, args: dict, monkeypatch
) -> None:
    monkeypatch.delenv("OVERLAY_ADMIN_TOKEN", raising=False)
    async with LoopbackCluster(LOCAL, 3, admin=True, balancing=False, auth=auth()) as cl:
        core = cl.nodes[0].core
        routing = dict(core.routing.items())
        async with Client([cl.addr(0)], token=token("pubsub"), reconnect=False) as user:
            with pytest.raises(RequestError) as info:
                await user.admin(command, **args)
            assert info.value.code == cm.ErrorCode.FORBIDDEN
            assert "admin role" in info.value.reason and "publish, subscribe" in info.value.reason
            assert (await user.admin("status"))["node"] == 0  # reading needs no admin role
        # HTTP: 401 without a token or with a bad one, 403 without the role.
        url = cl.url(0) + "/drain"
        assert (await fetch(url, "POST"))[0] == 401
        status, body, _ = await fetch(url, "POST", headers={"Authorization": f"Bearer {token(key=OTHER_KEY)}"})
        assert status == 401 and "does not trust" in body["error"]
        status, body, _ = await fetch(url, "POST", headers={"Authorization": "Bearer s3cret"})
        assert status == 401 and "not a JWT" in body["error"]
        status, body, _ = await fetch(url, "POST", headers={"Authorization": f"Bearer {token('pubsub')}"})
        assert status == 403 and "admin role" in body["error"]
        assert not core.draining and dict(core.routing.items()) == routing  # nothing changed
        assert core.stats["rejected_forbidden"] == 2 and core.stats["rejected_unauthorized"] == 3
        # With the role, the command is carried out.
        async with Client([cl.addr(0)], token=token("op", "admin"), reconnect=False) as op:
            await op.admin(command, **args)


async def test_with_auth_refused_admin_requests_are_counted_each_and_logged_within_a_bound(
    monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by the second outside audit: each refused request was a WARNING line,
    # and anyone reaching the admin port could send them as fast as HTTP allows.
    monkeypatch.delenv("OVERLAY_ADMIN_TOKEN", raising=False)
    async with LoopbackCluster(LOCAL, 1, admin=True, auth=auth()) as cl:
        cl.nodes[0].admin._refusals.every = 3600.0  # however slow the machine, one period
        url = cl.url(0) + "/drain"
        for headers in ({"Authorization": "Bearer s3cret"}, {"Authorization": f"Bearer {token('pubsub')}"}):
            for _ in range(15):
                assert (await fetch(url, "POST", headers=headers))[0] in (401, 403)
        core = cl.nodes[0].core
        assert (core.stats["rejected_unauthorized"], core.stats["rejected_forbidden"]) == (15, 15)
        assert not core.draining
    lines = [r.getMessage() for r in caplog.records if "admin request POST /drain refused" in r.getMessage()]
    assert len(lines) == 2 and "not a JWT" in lines[0] and "no admin role" in lines[1], lines


async def test_with_auth_an_admin_token_drains_over_http(monkeypatch) -> None:
    monkeypatch.delenv("OVERLAY_ADMIN_TOKEN", raising=False)
    async with LoopbackCluster(LOCAL, 2, admin=True, balancing=False, auth=auth()) as cl:
        headers = {"Authorization": f"Bearer {token('op', 'admin')}"}
        status, body, _ = await fetch(cl.url(1) + "/drain?wait=0", "POST", headers=headers)
        assert status == 202 and body["draining"] is True


def test_with_auth_the_legacy_admin_token_variable_stops_a_node(monkeypatch) -> None:
    """One rule: a node with [auth] refuses to start with OVERLAY_ADMIN_TOKEN set."""
    monkeypatch.setenv("OVERLAY_ADMIN_TOKEN", TOKEN)
    with pytest.raises(ConfigError, match="unset OVERLAY_ADMIN_TOKEN"):
        LoopbackCluster(LOCAL, 1, auth=auth())
