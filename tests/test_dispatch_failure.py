"""overlay.net.dispatch rule 2: a request whose handling fails on the node
is answered ``internal_error``; the node logs the traceback and goes on."""

from __future__ import annotations

import pytest

from authkit import auth, token
from conftest import LOCAL
from overlay.errors import RequestError
from overlay.messages import client as cm
from overlay.testing import LoopbackCluster
from overlay.testing.proxy import Proxy

pytestmark = pytest.mark.timeout(60)


async def test_a_request_the_node_fails_on_is_answered_and_the_next_one_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with LoopbackCluster(LOCAL, 1, auth=auth()) as cl:
        c = await cl.client(0, client_id="victim", token=token("victim"))
        (sess,) = [s for s in cl.nodes[0].core.sessions.values() if s.client_id == "victim"]
        rights = sess.rights

        def failing(f: object) -> None:  # a bug in the session's scope check, from outside (proxy rule 2)
            if "BUG" in repr(f):
                raise RuntimeError("a bug")
            rights.check_subscribe(f)  # type: ignore[union-attr]

        sess.rights = Proxy(rights, check_subscribe=failing)  # type: ignore[assignment]
        # Unanswered, this waited out the request's whole timeout (an
        # AgentClient's subscribe then tried every other node alike).
        with pytest.raises(RequestError) as info:
            await c.subscribe('sym = "BUG"', timeout=10.0)
        assert info.value.code == cm.ErrorCode.INTERNAL and "RuntimeError: a bug" in str(info.value)
        assert "failed handling Subscribe" in caplog.text
        sub = await c.subscribe("price < 5", timeout=10.0)  # the session goes on
        await (await cl.client(0, client_id="pub", token=token("pub"))).publish({"price": 1.0, "sym": "A"})
        assert (await sub.next(5.0)).event["price"] == 1.0
