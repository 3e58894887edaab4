"""Drain and join on real in-process nodes (overlay.node.membership, overlay.net.membership).

Drain: node 1 gives its channels away through the ordinary migration path
while two publishers run, and every (event, matching subscription) pair is
delivered exactly once; the journal holds the drain decisions; node 1 then
stops and traffic goes on.  Refusals: unknown node, last node, a second
drain, a missing or wrong token, and a draining node refusing a channel.
Join: a fourth node whose config lists the three running nodes (theirs does
not list it) says hello, gets the routing table, becomes UNDERLOADED, shows
in ``/cluster``, and takes a channel through balancing under skewed traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import CONFIGS, LOCAL
from overlay.cli import main
from overlay.client import Client
from overlay.client.connection import RequestError
from overlay.config import ClusterConfig
from overlay.net.admin import TOKEN_ENV
from overlay.testing import LoopbackCluster, Traffic, wait_until, with_tls_table

pytestmark = pytest.mark.timeout(30)


async def post(url: str, token: str | None = None, **kw: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.post(url, headers=headers, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def get(url: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200, (url, resp.status)
        return await resp.json()


def write_config(cfg: ClusterConfig, path: Path) -> Path:
    """cluster_configs/local.toml with ``cfg``'s nodes (their real ports) and
    its ``[tls]`` (the test cluster's plain TCP), for the command line."""
    lines, skipping = [], False
    for line in with_tls_table((CONFIGS / "local.toml").read_text(), cfg.tls).splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[[nodes]]"
        if not skipping:
            lines.append(line)
    for n in cfg.nodes:
        lines += [
            "[[nodes]]",
            f"id = {n.id}",
            f'host = "{n.host}"',
            f"port = {n.port}",
            f"admin_port = {n.admin_port}",
            f"capacity = {n.capacity}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- drain under traffic ------------------------------------------------------------------------


class Ledger:
    """Range subscriptions on nodes 0 and 2 and what each received, by event identity."""

    def __init__(self) -> None:
        self.ranges: list[tuple[float, float]] = []
        self.got: list[dict[tuple[str, int], int]] = []
        self.published: list[tuple[str, int, float]] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.index: dict[tuple[int, str], int] = {}  # (client, its subscription id) -> ledger index

    async def subscribe(self, client: Client, lo: float, hi: float) -> None:
        """Each subscription of a client gets its own copy of every event it matches."""
        sub = await client.subscribe(f"price >= {lo} and price < {hi}", queue_size=1_000_000)
        self.ranges.append((lo, hi))
        self.got.append({})
        self.index[(id(client), sub.sub_id)] = len(self.got) - 1

        async def consume() -> None:
            got = self.got[self.index[(id(client), sub.sub_id)]]
            async for note in sub:
                k = (str(note.event["venue"]), int(note.event["qty"]))
                got[k] = got.get(k, 0) + 1

        self.tasks.append(asyncio.create_task(consume()))

    def expected(self) -> list[set[tuple[str, int]]]:
        return [{(v, q) for v, q, p in self.published if lo <= p < hi} for lo, hi in self.ranges]

    def complete(self) -> bool:
        return all(set(g) == e for g, e in zip(self.got, self.expected()))


async def publish_until(client: Client, venue: str, stop: asyncio.Event, ledger: Ledger, rate: float) -> None:
    start, k = time.monotonic(), 0
    while not stop.is_set():
        due = int((time.monotonic() - start) * rate)
        while k < due:
            price = round((k * 0.6180339887498949 + (0.3 if venue == "p2" else 0.0)) % 1.0 * 1000.0, 2)
            await client.publish_windowed({"price": price, "sym": "A", "qty": k, "venue": venue})
            ledger.published.append((venue, k, price))
            k += 1
        await asyncio.sleep(0.005)
    await client.flush(timeout=10)
    assert client.publish_errors == 0


async def test_drain_under_traffic_moves_every_channel_and_delivers_exactly_once() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, balancing=False, slice_seconds=0.4) as cl:
        ops = await cl.client(0, client_id="ops")
        assert (await ops.admin("split", channel="0.0", attr="price", at=300.0))["update"]
        await ops.admin("split", channel="0.2", attr="price", at=600.0)
        await ops.admin("place", channel="0.1", node=1)
        await ops.admin("place", channel="0.3", node=1)
        assert sorted(str(c.id) for c in cl.nodes[1].core.local) == ["0.1", "0.3"]

        ledger = Ledger()
        subs = [await cl.client(0, client_id="sub-0"), await cl.client(2, client_id="sub-2")]
        for i in range(24):
            lo = round((i * 0.37) % 1.0 * 900.0, 1)
            await ledger.subscribe(subs[i % 2], lo, round(lo + 50.0 + 13.0 * (i % 7), 1))
        # A client of node 1: told to go elsewhere once node 1 is drained, its subscription dropped.
        away = await cl.client(1, client_id="sub-1")
        await away.subscribe("price >= 0 and price < 1000")
        pubs = [await cl.client(0, client_id="pub-0"), await cl.client(2, client_id="pub-2")]
        stop = asyncio.Event()
        publishers = [asyncio.create_task(publish_until(p, v, stop, ledger, 400.0)) for p, v in zip(pubs, ("p0", "p2"))]
        await wait_until(lambda: len(ledger.published) >= 300, 15, "traffic under way")

        # Bounded, not timed: how soon a drain ends is the machine's.
        status, summary = await asyncio.wait_for(post(cl.url(1) + "/drain"), 20)
        assert status == 200, summary
        assert summary["drained"] and summary["channels_moved"] == 2 and sorted(summary["channels"]) == ["0.1", "0.3"]
        assert summary["subscriptions_moved"] > 0
        assert not len(cl.nodes[1].core.local) and cl.nodes[1].core.draining
        assert all(1 not in e["owners"] for e in (await get(cl.url(0) + "/routing"))["channels"])
        assert all(1 not in e.owners for _, e in cl.nodes[0].core.routing.items())

        # The drain decisions, with every candidate's load level.
        moves = [e for e in cl.nodes[1].core.journal if e["kind"] == "decision" and e.get("phase") == "drain"]
        assert [e["action"] for e in moves] == ["start", "move", "move", "done"]
        for e in moves[1:3]:
            assert {c["node"] for c in e["candidates"]} == {0, 2} and all("dc" in c for c in e["candidates"])
            assert e["receiver"] == min(e["candidates"], key=lambda c: (c["dc"], c["node"]))["node"]
        assert (await get(cl.url(1) + "/drain"))["done"] is True
        # It left: the others no longer count it among their peers; its client was closed.
        await wait_until(lambda: all(1 not in cl.nodes[i].core.peers for i in (0, 2)), 5, "node 1 left")
        assert summary["clients_closed"] == 1
        await wait_until(lambda: not away.connected, 5, "node 1's client closed")

        def left_behind() -> list[str]:
            return [
                f"{ch.id}@{i}:{s.id}" for i in (0, 2) for ch in cl.nodes[i].core.local for s in ch if s.access_node == 1
            ]

        with contextlib.suppress(AssertionError):
            await wait_until(lambda: not left_behind(), 5, "its subscription dropped")
        assert not left_behind(), (left_behind(), dict(cl.nodes[1].core.stats), cl.nodes[1].core.sessions.pending_ids())

        # Node 1 can stop now; traffic goes on without it.
        await cl.stop_node(1)
        after = len(ledger.published)
        await wait_until(lambda: len(ledger.published) >= after + 200, 15, "traffic after node 1 stopped")
        stop.set()
        await asyncio.gather(*publishers)
        with contextlib.suppress(AssertionError):
            await wait_until(ledger.complete, 10, "every matching event delivered")
        missing = [sorted(e - set(g))[:5] for g, e in zip(ledger.got, ledger.expected())]
        extra = [sorted(set(g) - e)[:5] for g, e in zip(ledger.got, ledger.expected())]
        prices = {(v, q): p for v, q, p in ledger.published}
        assert not any(missing) and not any(extra), repr(
            (missing, extra, [[prices[k] for k in m] for m in missing], ledger.ranges, dict(cl.nodes[0].core.stats))
        )
        await asyncio.sleep(0.3)  # a duplicate would come late
        for got, want in zip(ledger.got, ledger.expected()):
            assert set(got) == want
            assert all(n == 1 for n in got.values()), [k for k, n in got.items() if n != 1]
        assert cl.stat("events_unroutable") == 0
        # With node 1 gone, a migration between the others completes (no one waits for node 1's reply).
        moved = str(next(iter(cl.nodes[0].core.local)).id)
        assert (await ops.admin("place", channel=moved, node=2, timeout=5))["receiver"] == 2
        for t in ledger.tasks:
            t.cancel()


# -- refusals -----------------------------------------------------------------------------------


async def test_drain_refusals_unknown_node_second_drain_left_node_last_node(tmp_path: Path) -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, balancing=False) as cl:
        status, body = await post(cl.url(0) + "/drain", json={"node": 9})
        assert status == 404 and "unknown node 9" in body["error"]
        status, body = await post(cl.url(0) + "/drain", json={"node": 2})
        assert status == 400 and "node 2's admin endpoint" in body["error"]
        # The command line refuses a node its config does not list.
        cfg = write_config(cl.config, tmp_path / "cluster.toml")
        assert main(["node", "drain", "9", "--config", str(cfg)]) == 2

        # Node 2 (empty) drains at once, by the client protocol's Admin command too.
        c2 = await cl.client(2, client_id="ops-2")
        summary = await c2.admin("drain")
        assert summary["drained"] and summary["channels_moved"] == 0
        with pytest.raises(RequestError, match="already draining"):
            await c2.admin("drain")
        status, body = await post(cl.url(2) + "/drain")
        assert status == 409 and "already draining" in body["error"]
        # A drained node left: it takes nothing, not even a forced placement.
        await wait_until(lambda: all(2 not in cl.nodes[i].core.peers for i in (0, 1)), 5, "node 2 left")
        ops = await cl.client(0, client_id="ops")
        await ops.admin("split", channel="0.0", attr="price", at=500.0)
        with pytest.raises(RequestError, match="node 2 cannot receive"):
            await ops.admin("place", channel="0.1", node=2)
        # Node 0 drains to node 1, its only peer left, from the command line.
        assert await asyncio.to_thread(main, ["node", "drain", "0", "--config", str(cfg)]) == 0
        assert not len(cl.nodes[0].core.local) and len(cl.nodes[1].core.local) == 2
        # Node 1 is now the last node of the cluster.
        status, body = await post(cl.url(1) + "/drain")
        assert status == 409 and "last node of the cluster" in body["error"] and len(cl.nodes[1].core.local) == 2


async def test_drain_of_the_last_node_is_refused() -> None:
    async with LoopbackCluster(LOCAL, 1, admin=True) as cl:
        status, body = await post(cl.url(0) + "/drain")
        assert status == 409 and "last node of the cluster" in body["error"]
        assert not cl.nodes[0].core.draining


@pytest.mark.parametrize(
    "query, body",
    [
        ("", {"node": float("inf")}),  # JSON's Infinity: int() raised OverflowError, a 500 with a traceback
        ("", {"node": 1e400}),
        ("", {"node": 0.5}),  # int() made it node 0: this node drained
        ("", {"node": True}),  # int() made it node 1
        ("", {"node": -1}),
        ("", {"node": "0x0"}),
        ("?node=abc", None),
        ("?node=-0", None),
    ],
)
async def test_drain_naming_no_node_id_is_a_400_and_drains_nothing(query: str, body: Any) -> None:
    async with LoopbackCluster(LOCAL, 2, admin=True, balancing=False) as cl:
        sep = "&" if query else "?"
        status, answer = await post(cl.url(0) + f"/drain{query}{sep}wait=0", json=body)
        assert status == 400 and "must be a node id" in answer["error"], (status, answer)
        assert not cl.nodes[0].core.draining and not cl.nodes[1].core.draining


async def test_drain_needs_the_token_when_one_is_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    async with LoopbackCluster(LOCAL, 3, admin=True, balancing=False) as cl:
        for token in (None, "wrong"):
            status, body = await post(cl.url(1) + "/drain", token)
            assert status == 401 and "Bearer" in body["error"]
        assert not cl.nodes[1].core.draining
        cfg = write_config(cl.config, tmp_path / "cluster.toml")
        monkeypatch.delenv(TOKEN_ENV)
        assert await asyncio.to_thread(main, ["node", "drain", "1", "--config", str(cfg), "--token", "bad"]) == 2
        assert await asyncio.to_thread(main, ["node", "drain", "1", "--config", str(cfg), "--token", "s3cret"]) == 0
        assert cl.nodes[1].core.draining


# -- join ---------------------------------------------------------------------------------------


async def test_a_fourth_node_joins_gets_the_table_and_takes_load_through_balancing() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, slice_seconds=0.4, probability=1.0) as cl:
        old = [cl.nodes[i] for i in (0, 1, 2)]
        joined = await cl.join(3)  # its config lists the three running nodes; theirs does not list it
        await wait_until(lambda: joined.core.ready, 10, "the joined node holds the routing table")
        assert len(joined.core.routing) == len(cl.nodes[0].core.routing)
        await wait_until(lambda: all(3 in n.core.peers and 3 in n.links for n in old), 5, "every node knows node 3")
        assert all(n.core.config.node(3).admin_port == joined.me.admin_port for n in old)
        assert any(e["kind"] == "join" and e["peer"] == 3 for e in cl.nodes[1].core.journal)
        view = await get(cl.url(0) + "/cluster")
        assert sorted(int(n["node"]) for n in view["nodes"]) == [0, 1, 2, 3], view["nodes"]

        # Skewed traffic on the three old nodes: node 3, empty, is UNDERLOADED (as it
        # and its peers see it: a poll of the monitors) and takes load through balancing.
        seen: set[str] = set()

        async def watch() -> None:
            while True:
                seen.add(joined.core.monitor.state.value)
                seen.update(p.state.value for n in old for p in n.core.monitor.live() if p.node == 3)
                await asyncio.sleep(0.01)

        def received() -> bool:  # non-forced: node 3 accepted it as UNDERLOADED (SPEC §8.1 step 2)
            return any(
                e["kind"] == "migration" and e["receiver"] == 3 and not e["forced"] for n in old for e in n.core.journal
            )

        watcher = asyncio.create_task(watch())
        traffic = await Traffic(cl, rate=1500.0, nodes=(0, 1, 2)).start()
        try:
            await wait_until(received, 20, "node 3 receives a channel through balancing")
        finally:
            await traffic.stop()
            watcher.cancel()
        assert "UNDERLOADED" in seen and len(joined.core.local) > 0
        st = await get(f"http://127.0.0.1:{joined.admin_port}/status")
        assert st["channels"] and st["ready"]
