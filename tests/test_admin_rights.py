"""One rule for admin rights (``overlay.node.clients``): with an admin token
configured, the client protocol's commands that change the cluster need it,
as the admin HTTP endpoint's do; reading does not."""

from __future__ import annotations

import pytest

from conftest import LOCAL
from overlay.client import Client
from overlay.errors import RequestError
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
