"""Balancing on real nodes: a failure in mid-session (SPEC §8.1, §8.2).

``test_failure_mid_session_rolls_back`` — a receiver that stops answering
after ChannelTransfer (before answering it, and after answering it): the
sender times out, rolls back to its tables of <1>, keeps serving the
channel, and subscribers on the surviving nodes lose nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import pytest

from conftest import LOCAL
from overlay.actions import Action
from overlay.channels import parse_subscription
from overlay.client import Client
from overlay.errors import RequestError
from overlay.messages import peer as pm
from overlay.net.inbox import FromPeer, InboxItem
from overlay.testing import GOLDEN, QUEUE_SIZE, Ledger, LoopbackCluster, Sub, wait_until

# -- test 4: a failure in mid-session ------------------------------------------------------

# The admin's bound on the move it expects to abort: far past the session's
# peer_timeout, so a loaded machine's late ticks still end it by the abort.
ADMIN_WAIT: Final = 30.0


async def _place_must_abort(admin: Client, channel: str, node: int, timeout: float) -> None:
    try:
        await admin.admin("place", channel=channel, node=node, timeout=timeout)
    except RequestError as exc:
        assert "aborted" in str(exc), exc
        return
    raise AssertionError("the move went through")


def _tables(core: Any) -> tuple[Any, ...]:
    """What rollback must restore: the routing table, and each local channel
    with its space and subscriptions."""
    routing = sorted((str(c), e.space.text(core.schema), e.owners) for c, e in core.routing.items())
    local = sorted((str(ch.id), ch.space.text(core.schema), tuple(sorted(s.id for s in ch))) for ch in core.local)
    return tuple(routing), tuple(local)


@pytest.mark.parametrize(
    "failure",
    [
        "silent_after_transfer",
        "dies_after_reply",
    ],
)
async def test_failure_mid_session_rolls_back(failure: str) -> None:
    """A forced move of one channel to node 2; node 2 stops answering once the
    ChannelTransfer reaches it (``silent_after_transfer``: it never answers;
    ``dies_after_reply``: it answers, so the sender is past <2> and
    reforwarding, then the node stops).  Publishing from nodes 0 and 1 goes on
    throughout; their subscribers must lose nothing."""
    TIMEOUT = 1.0
    async with LoopbackCluster(LOCAL, balancing=False, peer_timeout=TIMEOUT, slice_seconds=0.5) as cl:
        sender, receiver = 0, 2
        admin = await cl.client(sender, client_id="admin")
        await admin.admin("split", channel="0.0", attr="price", at=500.0)
        moving = next(ch for ch in cl.nodes[sender].core.local if ch.space.contains({"price": 750.0, "sym": "A"}))
        led = Ledger()
        subscribers = []
        for k, node in enumerate([0, 1, 0, 1]):
            c = await cl.client(node, client_id=f"sub-{k}")
            led.hook(k, c, node)
            subscribers.append(c)
        exprs = ["price >= 600", "price < 400", 'sym = "B"', "price > 100 and price < 900"]
        for k, expr in enumerate(exprs * 2):
            ci = k % len(subscribers)
            sid = f"s{k}"
            s = Sub(ci, sid, expr, parse_subscription(expr, cl.config.schema), time.time())
            led.subs[(ci, sid)] = s
            await subscribers[ci].subscribe(expr, sub_id=sid, queue_size=QUEUE_SIZE)
            s.acked = time.time()

        # The receiver stops answering once ChannelTransfer reaches it.
        seen: list[str] = []

        def tap(item: InboxItem) -> list[Action] | None:  # net.dispatch rule 5
            if type(item) is not FromPeer:
                return None
            if seen:
                return []  # gone quiet: nothing it receives is answered
            if isinstance(item.msg, pm.ChannelTransfer):
                seen.append(type(item.msg).__name__)
                if failure == "silent_after_transfer":
                    return []
                # The core answers SUCCESS (this batch), then the node stops.
                asyncio.get_running_loop().call_soon(cl.nodes[receiver].stop)
            return None

        cl.nodes[receiver].dispatcher.intercept(tap)

        publishers = [await cl.client(i, client_id=f"pub-{i}") for i in (0, 1)]
        stop = asyncio.Event()
        counter = iter(range(1_000_000))

        async def publish(c: Client) -> None:
            while not stop.is_set():
                k = next(counter)
                ev = {"price": round((k * GOLDEN % 1.0) * 1000, 3), "sym": "AB"[k % 2], "qty": k}
                start = time.time()
                await c.publish(ev)
                led.events[k] = (ev, start, time.time())
                await asyncio.sleep(0.002)

        tasks = [asyncio.create_task(publish(c)) for c in publishers for _ in range(2)]
        await wait_until(lambda: len(led.events) >= 100, 15, "publishing under way")
        at1 = _tables(cl.nodes[sender].core)  # <1>: nothing changes the tables from here but the session
        t = time.time()
        try:
            await _place_must_abort(admin, str(moving.id), receiver, ADMIN_WAIT)
        except BaseException:
            stop.set()
            await asyncio.gather(*tasks)
            raise
        waited = time.time() - t
        assert seen == ["ChannelTransfer"]
        # Not before the timeout (a loaded machine only makes the abort later:
        # how much later is the machine's, not a pass/fail matter).  That the
        # session's own timeout ended it, not the admin's, the answer says:
        # "aborted" (an admin timeout raises TimeoutError), and the journal below.
        assert waited >= TIMEOUT * 0.9, waited

        # Rolled back: the sender's tables are those of <1>, no session left.
        core = cl.nodes[sender].core
        assert _tables(core) == at1
        assert not any(m.active for m in core.migration.outgoing.values()) and not core.migration.reforwarding
        assert core.monitor.state is not core.monitor.state.BUSY
        aborts = cl.journal("abort", [sender])
        assert aborts and "no answer" in aborts[-1]["reason"], aborts
        # Node 1 never heard of a change either.
        assert _tables(cl.nodes[1].core)[0] == at1[0]

        # The channel is still served: publishing goes on, then everything is checked.
        def served() -> list[int]:
            return [q for q, (ev, start, _) in led.events.items() if start > t + waited and ev["price"] > 500]

        try:
            await wait_until(lambda: len(served()) >= 100, 15, "events for the moving channel after the rollback")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        await cl.wait_settled((0, 1), progress=led.received)  # node 2 is silent or gone
        bad, exact, _ = await led.violations_off_loop()
        assert not bad, f"{len(bad)} violations, e.g.:\n" + "\n".join(bad[:20])
        assert exact > len(led.events), exact
        print(f"{failure}: abort after {waited:.2f}s; {len(led.events)} events, {exact} exact deliveries checked")
