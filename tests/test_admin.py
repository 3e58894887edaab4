"""overlay.net.admin: the admin HTTP endpoint of real nodes on loopback.

Every endpoint (``/healthz``, ``/status``, ``/routing``, ``/balancing``,
``/metrics``, ``/cluster``, ``/events``, the page and its files), the JSON
errors (404, 405, 400, 401), the token on cluster-changing routes, the
Prometheus exposition parsed back with ``prometheus_client.parser``, health
before and after the cluster is ready, the server-sent event stream, the
whole-cluster view with a node down, and ``overlay status`` reading it all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from conftest import LOCAL
from overlay.cli import format_status, node_statuses
from overlay.errors import OverlayError
from overlay.net.admin import TOKEN_ENV
from overlay.net.cluster_view import VIEW_TTL
from overlay.testing import LOADED_SUSPECT_TIMEOUT, WAIT, LoopbackCluster, Traffic, wait_until

pytestmark = pytest.mark.timeout(60)

# Balancing under Traffic: these tests show what the endpoints say about it,
# not failure detection, so a busy machine's held loop must not lapse a
# lease (no_quorum): LOADED_SUSPECT_TIMEOUT says why.  (peer_timeout stays:
# a session it rolls back is tried again; a longer one held a stuck session,
# and the events of its channels, for as long.)
BALANCING = {"slice_seconds": 0.4, "probability": 1.0, "suspect_timeout": LOADED_SUSPECT_TIMEOUT}
# Until every node is quiet once the traffic stopped: an overloaded machine
# drains the nodes' backlog late, and what it cannot deliver leaves the
# outbox after event_ttl (30 s by default) — quiet comes by then.
QUIET_WAIT = LOCAL.cluster.event_ttl + WAIT


async def fetch(url: str, method: str = "GET", **kw: Any) -> tuple[int, Any, str]:
    """``(status, body as JSON or text, content type)``."""
    async with aiohttp.ClientSession() as http, http.request(method, url, **kw) as resp:
        text = await resp.text()
        body = json.loads(text) if resp.content_type == "application/json" and method != "HEAD" else text
        return resp.status, body, resp.content_type


async def get_json(url: str) -> Any:
    status, body, kind = await fetch(url)
    assert status == 200 and kind == "application/json", (url, status, body)
    return body


# -- health -------------------------------------------------------------------------------------


async def test_healthz_is_503_with_the_reason_until_ready_then_200() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, autostart=False) as cl:
        await cl.start_node(1)
        status, body, _ = await fetch(cl.url(1) + "/healthz")
        assert status == 503 and body["ready"] is False
        assert "waiting for the routing table" in body["why"]
        # (Links count as up here: the idle nodes' sockets are bound and listening.)
        assert sorted(body["links_up"] + body["links_down"]) == [0, 2]

        await cl.start_node(0)  # the initializer: node 2 is still missing
        await wait_until(lambda: 1 in cl.nodes[0].core.startup.state.heard, 10, "node 0 heard from node 1")
        status, body, _ = await fetch(cl.url(0) + "/healthz")
        # It waits to hear from node 2 (or the grace, peer_timeout) before it initialises.
        assert status == 503 and "waiting to hear from nodes [2]" in body["why"]
        await wait_until(lambda: cl.nodes[1].core.ready, 10, "node 1 has the table")
        assert (await fetch(cl.url(1) + "/healthz"))[0] == 200

        await cl.start_node(2)
        await wait_until(lambda: cl.nodes[0].core.ready, 10, "the initializer ready")
        await wait_until(
            lambda: all(link.connected.is_set() for link in cl.nodes[0].links.values()), 10, "node 0's links up"
        )
        status, body, _ = await fetch(cl.url(0) + "/healthz")
        assert status == 200 and body == {
            "node": 0,
            "ready": True,
            "why": "ready",
            "state": body["state"],
            "links_up": [1, 2],
            "links_down": [],
        }
        head = await fetch(cl.url(2) + "/healthz", "HEAD")
        assert head[0] == 200

        cl.nodes[2].stop()
        assert cl.nodes[2].admin.health() == (False, "the node is stopping")


# -- status, routing, balancing ------------------------------------------------------------------


async def test_status_routing_and_balancing_show_a_migration_with_every_score() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, **BALANCING) as cl:
        traffic = await Traffic(cl, rate=1500).start()
        try:
            await wait_until(lambda: cl.stat("migrations") > 0, 30, "a natural migration")
        finally:
            await traffic.stop()

        for i in cl.nodes:
            st = await get_json(cl.url(i) + "/status")
            assert st["node"] == i and st["ready"] is True
            for key in (
                "state",
                "d",
                "dc",
                "mean_dc",
                "spread",
                "spread_ratio",
                "capacity",
                "slice_seconds",
                "peers",
                "stats",
            ):
                assert key in st, key
            assert set(st["links"]) == {str(p) for p in cl.nodes if p != i}
            for link in st["links"].values():
                assert set(link) == {"connected", "high", "normal", "connects"} and link["connected"]
            assert set(st["inbox"]) == {"high", "normal"}
            assert {"connections", "high", "normal", "max"} <= set(st["clients"])
            for ch in st["channels"]:
                assert {"id", "space", "load", "last_load", "subscriptions", "replicas"} <= set(ch)
            assert st["admin_port"] == cl.nodes[i].admin_port

        # Once quiet, every node's routingTable is the same, and owners hold
        # their channels.  Cold channels merge a few slices after the traffic
        # stops, so the views are taken together, again until they agree.
        async def views() -> tuple[list[Any], dict[int, set[str]]]:
            tables = [(await get_json(cl.url(i) + "/routing"))["channels"] for i in cl.nodes]
            held = {i: {c["id"] for c in (await get_json(cl.url(i) + "/status"))["channels"]} for i in cl.nodes}
            return tables, held

        def agree(tables: list[Any], held: dict[int, set[str]]) -> bool:
            return all(t == tables[0] for t in tables) and all(
                ch["id"] in held[owner] for ch in tables[0] for owner in ch["owners"]
            )

        deadline = time.monotonic() + 20
        tables, held = await views()
        while not agree(tables, held) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            tables, held = await views()
        assert all(t == tables[0] for t in tables), "routing tables never agreed"
        assert agree(tables, held), f"owners do not hold their channels: {tables[0]} vs {held}"
        routing = await get_json(cl.url(0) + "/routing")
        assert [d["name"] for d in routing["da"]] == ["price", "sym"]
        assert len(tables[0]) > 1 and any(c["owners"] != [0] for c in tables[0])
        for ch in tables[0]:
            assert ch["constraints"][0]["attr"] == "price" and ch["constraints"][0]["kind"] == "range"

        last = await get_json(cl.url(0) + "/balancing?n=3")
        assert last["node"] == 0 and last["count"] == len(last["entries"]) <= 3
        assert [e["time"] for e in last["entries"]] == sorted(e["time"] for e in last["entries"])
        entries = [
            e
            for i in cl.nodes
            for e in (await get_json(cl.url(i) + "/balancing?n=2000&kinds=decision,migration"))["entries"]
        ]
        assert {e["kind"] for e in entries} == {"decision", "migration"}
        receivers = [e for e in entries if e.get("phase") == "receivers" and e["candidates"]]
        assert receivers and all({"node", "rank1", "f2", "f3"} <= set(c) for e in receivers for c in e["candidates"])
        channels = [e for e in entries if e.get("phase") == "channels" and e["channels"]]
        assert channels and all({"id", "rank2", "f1", "f3", "f4"} <= set(c) for e in channels for c in e["channels"])
        moves = [e for e in entries if e["kind"] == "migration"]
        assert moves and all({"channels", "receiver", "subscriptions", "bytes"} <= set(e) for e in moves)

        for bad in ("n=abc", "n=0", "since=yesterday"):
            status, body, kind = await fetch(cl.url(0) + "/balancing?" + bad)
            assert status == 400 and kind == "application/json" and body["status"] == 400, bad


# -- errors, files, auth ----------------------------------------------------------------------


async def test_unknown_paths_and_methods_answer_json_errors_and_the_page_is_served() -> None:
    async with LoopbackCluster(LOCAL, 1, admin=True) as cl:
        for path in ("/nope", "/status/extra", "/static/nope.js", "/static/..%2Fcli.py", "/static/index.html"):
            status, body, kind = await fetch(cl.url(0) + path)
            assert status == 404 and kind == "application/json", path
            assert body["status"] == 404 and "no such path" in body["error"]
        status, body, kind = await fetch(cl.url(0) + "/status", "POST")
        assert status == 405 and kind == "application/json" and body["error"] == "POST not allowed on /status"

        status, page, kind = await fetch(cl.url(0) + "/")
        assert status == 200 and kind == "text/html" and "/static/app.js" in page and "<canvas" in page
        for name, want in (("app.js", "text/javascript"), ("style.css", "text/css")):
            status, _, kind = await fetch(cl.url(0) + "/static/" + name)
            assert (status, kind) == (200, want)
        status, _, kind = await fetch(cl.url(0) + "/favicon.ico")
        assert (status, kind) == (200, "image/svg+xml")


async def test_an_event_stream_interval_that_is_no_finite_number_is_a_400(caplog: pytest.LogCaptureFixture) -> None:
    # interval=nan passed the clamp (min/max of NaN is NaN): the stream sent one
    # event, then the loop's timer raised ValueError — a cut stream and a traceback.
    async with LoopbackCluster(LOCAL, 1, admin=True) as cl:
        for bad in ("nan", "inf", "-inf", "soon"):
            status, body, kind = await fetch(cl.url(0) + "/events?interval=" + bad)
            assert status == 400 and kind == "application/json" and "finite number" in body["error"], bad
        assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


async def _drill(request: web.Request) -> web.Response:
    return web.json_response({"done": True})


async def test_the_admin_token_guards_routes_that_change_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    cl = LoopbackCluster(LOCAL, 1, admin=True, admin_token="s3cret")
    cl.nodes[0].admin.add_action("/drill", _drill)
    async with cl:
        url = cl.url(0) + "/drill"
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "s3cret"},
            {"Authorization": "Basic s3cret"},
        ):
            status, body, kind = await fetch(url, "POST", headers=headers)
            assert status == 401 and kind == "application/json" and "Bearer" in body["error"], headers
        status, body, _ = await fetch(url, "POST", headers={"Authorization": "Bearer s3cret"})
        assert (status, body) == (200, {"done": True})
        assert (await fetch(cl.url(0) + "/status"))[0] == 200  # reading needs no token

    monkeypatch.setenv(TOKEN_ENV, "from-env")  # the environment wins over the file
    cl = LoopbackCluster(LOCAL, 1, admin=True, admin_token="s3cret")
    cl.nodes[0].admin.add_action("/drill", _drill)
    async with cl:
        assert (await fetch(cl.url(0) + "/drill", "POST", headers={"Authorization": "Bearer s3cret"}))[0] == 401
        assert (await fetch(cl.url(0) + "/drill", "POST", headers={"Authorization": "Bearer from-env"}))[0] == 200

    monkeypatch.delenv(TOKEN_ENV)
    cl = LoopbackCluster(LOCAL, 1, admin=True)  # no token configured: no auth
    cl.nodes[0].admin.add_action("/drill", _drill)
    async with cl:
        assert (await fetch(cl.url(0) + "/drill", "POST"))[0] == 200


# -- metrics -------------------------------------------------------------------------------------

FAMILIES = {
    "overlay_ready": "gauge",
    "overlay_state": "gauge",
    "overlay_load_d": "gauge",
    "overlay_load_dc": "gauge",
    "overlay_mean_dc": "gauge",
    "overlay_spread": "gauge",
    "overlay_spread_ratio": "gauge",
    "overlay_capacity": "gauge",
    "overlay_slice_seconds": "gauge",
    "overlay_channels": "gauge",
    "overlay_peer_dc": "gauge",
    "overlay_link_queue_depth": "gauge",
    "overlay_link_connected": "gauge",
    "overlay_inbox_depth": "gauge",
    "overlay_client_queue_depth": "gauge",
    "overlay_outbox_events": "gauge",
    "overlay_events_in": "counter",
    "overlay_events_matched": "counter",
    "overlay_events_notified": "counter",
    "overlay_notifies_sent": "counter",
    "overlay_migrations": "counter",
    "overlay_replications": "counter",
    "overlay_splits": "counter",
    "overlay_merges": "counter",
    "overlay_migrations_aborted": "counter",
    "overlay_migration_bytes": "counter",
    "overlay_subscriptions_moved": "counter",
    "overlay_reforwards": "counter",
    "overlay_events_confirmed": "counter",
    "overlay_events_resent": "counter",
    "overlay_duplicates_dropped": "counter",
    "overlay_rejected": "counter",
    "overlay_dropped": "counter",
    "overlay_slow_consumer_disconnects": "counter",
    "overlay_rate_limit_chokes": "counter",
    "overlay_client_queued_bytes": "gauge",
    "overlay_client_queue_budget_bytes": "gauge",
    "overlay_node_events": "counter",
    "overlay_tested_subscriptions": "histogram",
    "overlay_publish_notify_latency_seconds": "histogram",
}


def _samples(families: dict[str, Any], name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in families[name].samples}


@pytest.mark.timeout(120)  # QUIET_WAIT twice at worst, past the module's 60 s
async def test_metrics_parse_and_hold_every_family() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, **BALANCING) as cl:
        traffic = await Traffic(cl, rate=1500).start()
        pub = await cl.client(0, client_id="bad-publisher")
        for bad in ({"price": 5000.0, "sym": "A"}, {"sym": "A"}):
            with pytest.raises(OverlayError):
                await pub.publish(bad)
        try:
            await wait_until(lambda: cl.stat("migrations") > 0, 30, "a natural migration")
        finally:
            await traffic.stop()
        # Events PubAck'ed by nodes 1 and 2 may still be on their way to their
        # channel's owner: the counters compared below must have stopped.
        await wait_until(lambda: cl.quiet(), QUIET_WAIT, "the nodes quiet")

        status, text, kind = await fetch(cl.url(0) + "/metrics")
        assert status == 200 and kind == "text/plain"
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name, typ in FAMILIES.items():
            assert name in families, f"{name} missing from /metrics"
            assert families[name].type == typ, (name, families[name].type)

        core = cl.nodes[0].core
        assert (
            _samples(families, "overlay_events_in")[("overlay_events_in_total", (("node", "0"),))]
            == core.stats["events_in"]
            > 0
        )
        state = {dict(k[1])["state"]: v for k, v in _samples(families, "overlay_state").items()}
        assert state[core.monitor.state.value] == 1.0 and sum(state.values()) == 1.0
        depth = _samples(families, "overlay_link_queue_depth")
        assert {(dict(k[1])["peer"], dict(k[1])["priority"]) for k in depth} == {
            (p, q) for p in "12" for q in ("high", "normal")
        }
        rejected = {dict(k[1])["reason"]: v for k, v in _samples(families, "overlay_rejected").items()}
        assert rejected.get("bad_event") == 2
        # A session the decaying loads still start after the traffic stops may
        # end between two nodes' scrapes: scrape again until none did.
        for _ in range(20):
            before = cl.stat("migrations")
            total_migrations = 0.0
            for i in cl.nodes:
                fams = {f.name: f for f in text_string_to_metric_families((await fetch(cl.url(i) + "/metrics"))[1])}
                total_migrations += _samples(fams, "overlay_migrations")[
                    ("overlay_migrations_total", (("node", str(i)),))
                ]
            if cl.stat("migrations") == before:
                break
            await wait_until(lambda: cl.quiet(), QUIET_WAIT, "the nodes quiet")
        assert total_migrations == cl.stat("migrations") > 0

        # Histograms: every matched event counted once, with its tested subscriptions.
        tested = _samples(families, "overlay_tested_subscriptions")
        node0 = (("node", "0"),)
        assert tested[("overlay_tested_subscriptions_count", node0)] == core.stats["events_matched"]
        assert tested[("overlay_tested_subscriptions_sum", node0)] > 0
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in tested.items() if k[0].endswith("_bucket"))
        assert buckets[-1] == (float("inf"), core.stats["events_matched"])
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets))
        # The latency histogram is exposed whole: counted, summed, its buckets
        # cumulative up to +Inf.  How large the latencies are is a figure of
        # the machine (a loaded one saw a mean of 6 s here): bench/throughput.py
        # measures it; a pass/fail test does not.
        latency = _samples(families, "overlay_publish_notify_latency_seconds")
        count = latency[("overlay_publish_notify_latency_seconds_count", node0)]
        assert count > 0 and latency[("overlay_publish_notify_latency_seconds_sum", node0)] > 0
        lat_buckets = sorted((float(dict(k[1])["le"]), v) for k, v in latency.items() if k[0].endswith("_bucket"))
        assert lat_buckets[-1] == (float("inf"), count)
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(lat_buckets))


# -- the cluster view and its event stream ------------------------------------------------------


async def _read_events(resp: aiohttp.ClientResponse, n: int) -> list[dict[str, Any]]:
    """The first ``n`` ``cluster`` events of a server-sent event stream."""
    out: list[dict[str, Any]] = []
    event = None
    saw_retry = False
    while len(out) < n:
        line = (await asyncio.wait_for(resp.content.readline(), 10)).decode().rstrip("\n")
        if line.startswith("retry:"):
            saw_retry = True
        elif line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event == "cluster":
            out.append(json.loads(line.split(":", 1)[1]))
    assert saw_retry
    return out


async def test_event_stream_yields_cluster_updates_and_ends_when_the_node_stops() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, **BALANCING) as cl:
        traffic = await Traffic(cl, rate=600).start()
        try:
            async with aiohttp.ClientSession() as http, http.get(cl.url(2) + "/events?interval=0.2") as resp:
                assert resp.status == 200 and resp.content_type == "text/event-stream"
                first, *_, last = await _read_events(resp, 8)
                assert [n["node"] for n in first["nodes"]] == [0, 1, 2]
                assert all(n["reachable"] for n in first["nodes"]) and first["served_by"] == 2
                assert last["time"] > first["time"]
                assert last["totals"]["events_in"] > first["totals"]["events_in"]
                assert first["placement"] and first["da"][0]["name"] == "price"
                # The stream is still open: stopping the node must end it — the
                # stop completes within stop_node's bound and the stream reaches
                # its end.  How soon is the machine's (a 5 s stopwatch here
                # failed on a busy one), not a pass/fail matter.
                await traffic.stop()
                await cl.stop_node(2)
                rest = await asyncio.wait_for(resp.content.read(), WAIT)
                assert resp.content.at_eof(), rest[-200:]
        finally:
            await traffic.stop()


def _node_view(view: dict[str, Any], node: int) -> dict[str, Any]:
    return next(n for n in view["nodes"] if n["node"] == node)


async def test_cluster_view_shows_a_node_that_is_down_from_its_last_liem() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, slice_seconds=0.3, balancing=False) as cl:
        # A slice enters the history once the peers' LIEMs of that slice are in:
        # LIEMs of an earlier slice alone do not make one.
        await wait_until(
            lambda: len(cl.nodes[0].core.monitor.live()) == 2 and cl.nodes[0].admin.history(),
            10,
            "LIEMs from both peers",
        )
        view = await get_json(cl.url(0) + "/cluster")
        assert [(n["node"], n["reachable"]) for n in view["nodes"]] == [(0, True), (1, True), (2, True)]
        assert view["placement"][0]["owners"] == [0] and view["history"]

        await cl.stop_node(2)
        # The view is cached (VIEW_TTL): ask again until a fresh one is served.
        deadline = time.monotonic() + WAIT
        while (down := _node_view(view := await get_json(cl.url(0) + "/cluster"), 2))["reachable"]:
            assert time.monotonic() < deadline, f"node 2 still reachable in the view {WAIT}s after it stopped"
            await asyncio.sleep(VIEW_TTL / 5)
        assert down["reachable"] is False and "did not answer" in down["why"]
        assert down["state"] in ("UNDERLOADED", "STABLE", "OVERLOADED", "BUSY", "UNKNOWN")
        assert _node_view(view, 1)["reachable"] is True


# -- overlay status --------------------------------------------------------------------------------


async def test_overlay_status_prints_a_table_from_the_admin_endpoints() -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, slice_seconds=0.3, balancing=False) as cl:
        await wait_until(
            lambda: all(n.core.last_report is not None for n in cl.nodes.values()), 10, "a slice on every node"
        )
        answers = await node_statuses(cl.config)
        assert all(st is not None for st, _ in answers)
        table = format_status(cl.config, [st for st, _ in answers], [why for _, why in answers])
        lines = table.splitlines()
        assert lines[0].split()[:3] == ["node", "admin", "state"] and "S/dc̄" in lines[0]
        for i in cl.nodes:
            row = next(line for line in lines if line.split()[0] == str(i))
            assert f"http://127.0.0.1:{cl.nodes[i].admin_port}" in row
            assert cl.nodes[i].core.monitor.state.value in row
        assert "cluster 'local': 3/3 nodes answer, 1 channels" in table

        await cl.stop_node(1)
        answers = await node_statuses(cl.config)
        table = format_status(cl.config, [st for st, _ in answers], [why for _, why in answers])
        row = next(line for line in table.splitlines() if line.split()[0] == "1")
        assert "down: nothing listens on http://127.0.0.1:" in row
        assert "2/3 nodes answer" in table
