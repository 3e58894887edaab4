"""The Spark replay (SPEC §13) on local Spark: ``overlay_spark`` (src/overlay_spark).

Three captures, one SparkSession for all (session-scoped, JIT at C1 so the
JVM starts fast):

1. a hand-made capture whose S per slice, S around the migrations and
   Σ mig_cost are computed by hand below;
2. a capture written by a small real cluster run in this test (in-process
   nodes on ephemeral ports, a forced split and migration, real traffic);
3. that capture with one delivery duplicated and another removed: the audit
   must name both and the command must exit non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import socket
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loopback import nodes_quiet, wait_until
from overlay import cli
from overlay.capture import with_capture_dir
from overlay.channels import parse_expression
from overlay.client import Client
from overlay.config import NodeConfig, load_config
from overlay.net.node import Node
from overlay.testing import insecure_tls

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("pyspark")

from overlay_spark.replay import run_replay  # noqa: E402 - after the importorskip

pytestmark = pytest.mark.timeout(900)  # a cold JVM on a busy 2-core machine


@pytest.fixture(scope="session")
def spark() -> Any:
    from overlay_spark.session import make_session

    s = make_session("local[2]", partitions=4, quick_jvm=True, driver_memory="1g")
    yield s
    s.stop()


# -- 1. a capture made by hand ----------------------------------------------------------------

T0 = 1_000_000.0
SUB_A = "1:1:a:1"  # at node 1: price < 100
SUB_B = "2:1:b:1"  # at node 2: sym = "X"
CAPACITY = {0: 1.0, 1: 2.0, 2: 1.0}
# (event, t, price, sym, owner, channel, tested, monitor slice); access node 0.
EVENTS = [
    ("0-1", 0.5, 50.0, "X", 0, "0.0", 20, 0),
    ("0-2", 1.0, 600.0, "Y", 0, "0.0", 20, 0),
    ("0-3", 1.5, 80.0, "Y", 0, "0.0", 20, 0),
    ("0-4", 2.1, 50.0, "X", 0, "0.0", 20, 1),
    ("0-5", 3.0, 700.0, "X", 1, "0.2", 40, 1),
    ("0-6", 3.1, 300.0, "Y", 2, "0.4", 10, 1),
    ("0-7", 4.5, 50.0, "Y", 0, "0.3", 20, 2),
    ("0-8", 4.6, 800.0, "X", 1, "0.2", 20, 2),
    ("0-9", 4.7, 900.0, "Y", 1, "0.2", 20, 2),
    ("0-10", 5.0, 200.0, "X", 2, "0.4", 20, 2),
]
# Slice records (slice numbers as closed): node -> (d, {channel: load}).
SLICES = {
    1: {0: (60.0, {"0.0": 60.0}), 1: (0.0, {}), 2: (0.0, {})},
    2: {0: (20.0, {"0.3": 0.0, "0.1": 20.0}), 1: (40.0, {"0.2": 40.0}), 2: (10.0, {"0.4": 10.0})},
    3: {0: (20.0, {"0.3": 20.0}), 1: (40.0, {"0.2": 40.0}), 2: (20.0, {"0.4": 20.0})},
}
# Migrations (sender, start, done, receiver, channel, subscriptions, bw).
MIGRATIONS = [(0, 2.5, 2.6, 1, "0.2", 30, 200.0), (0, 2.8, 2.85, 2, "0.4", 10, 50.0)]


def _matches(price: float, sym: str) -> list[str]:
    return ([SUB_A] if price < 100 else []) + ([SUB_B] if sym == "X" else [])


def _line(kind: str, node: int, t: float, **fields: Any) -> str:
    return json.dumps({"kind": kind, "node": node, "n": 0, "time": T0 + t, **fields})


def write_hand_capture(run: Path) -> None:
    run.mkdir(parents=True)
    files: dict[int, list[str]] = {i: [] for i in CAPACITY}
    header = {
        "schema_version": 1,
        "run": run.name,
        "cluster": "hand",
        "initializer": 0,
        "slice_seconds": 2.0,
        "nodes": [{"id": i, "capacity": c} for i, c in CAPACITY.items()],
        "bandwidth": {"default": 100.0, "links": [{"a": 0, "b": 1, "bw": 200.0}, {"a": 0, "b": 2, "bw": 50.0}]},
        "schema": {
            "distinguishing": ["price", "sym"],
            "attributes": [
                {"name": "price", "type": "float", "min": 0, "max": 1000},
                {"name": "sym", "type": "string", "min": 1, "max": 8},
            ],
        },
        "balancing": True,
        "delta": 0.1,
    }
    for i in CAPACITY:
        files[i].append(_line("header", i, 0.0, **header))
    for sub, node, text in ((SUB_A, 1, "price < 100"), (SUB_B, 2, 'sym = "X"')):
        files[node].append(
            _line(
                "subscribe", node, 0.1, sub=sub, local=sub.split(":")[2], session=1, subscriber=f"c{node}", filter=text
            )
        )
        files[node].append(_line("subscribed", node, 0.2, sub=sub))
    rank = 0
    for eid, t, price, sym, owner, ch, tested, sl in EVENTS:
        key = None
        if sym == "X":  # the X events form one sequence, ranks in publish order
            rank += 1
            key = "X"
        files[0].append(
            _line(
                "publish",
                0,
                t,
                event=eid,
                channel=ch,
                values={"price": price, "sym": sym},
                key=key,
                rank=rank if key else None,
            )
        )
        matched = _matches(price, sym)
        files[owner].append(
            _line(
                "event",
                owner,
                t + 0.001,
                event=eid,
                access=0,
                channel=ch,
                tested=tested,
                matched=matched,
                slice=sl,
                key=key,
                rank=rank if key else None,
            )
        )
        for sub, node in ((SUB_A, 1), (SUB_B, 2)):
            if sub in matched:
                files[node].append(_line("deliver", node, t + 0.002, event=eid, subs=[sub], orphans=[]))
    for k, per_node in SLICES.items():
        for i, (d, chans) in per_node.items():
            files[i].append(
                _line(
                    "slice",
                    i,
                    2.0 * k,
                    slice=k,
                    d=d,
                    dc=d / CAPACITY[i],
                    mean=0.0,
                    spread=0.0,
                    state="STABLE",
                    channels=chans,
                    slice_seconds=2.0,
                )
            )
    for session, (snd, start, done, rcv, ch, subs, bw) in enumerate(MIGRATIONS, 1):
        files[snd].append(_line("split", snd, start - 0.1, slice=1, parent="0.0", attr="price", children=[]))
        files[snd].append(
            _line(
                "migration",
                snd,
                done,
                slice=1,
                session=session,
                receiver=rcv,
                channels=[ch],
                subscriptions=subs,
                bytes=100 * subs,
                bw=bw,
                mig_cost=subs / bw,
                forced=False,
                duration=done - start,
            )
        )
    for i in CAPACITY:
        files[i].append(_line("end", i, 6.5, records=len(files[i]) + 1, dropped=0))
        (run / f"node-{i}.ndjson").write_text("\n".join(files[i]) + "\n")


def _spread(d: dict[int, float]) -> tuple[float, float]:
    """S and dc̄ of SPEC §5, by hand: dc_i = d_i / c_i."""
    dc = [d[i] / CAPACITY[i] for i in CAPACITY]
    mean = sum(dc) / len(dc)
    return math.sqrt(sum((x - mean) ** 2 for x in dc) / len(dc)), mean


def test_hand_made_capture_gives_the_hand_computed_spread_and_costs(spark: Any, tmp_path: Path) -> None:
    run = tmp_path / "hand"
    write_hand_capture(run)
    res = run_replay(str(run), spark=spark, tail_guard=0.0, stream=None)
    assert res.failed == [], [(c.name, c.detail) for c in res.checks if c.ok is False]
    assert res.exit_code == 0

    # Per slice: slice 1 has all load on node 0; slice 2 dc = (20, 20, 10); slice 3 dc = (20, 20, 20).
    s1, m1 = _spread({0: 60.0, 1: 0.0, 2: 0.0})  # dc (60, 0, 0): dc̄ 20, S = sqrt((40² + 20² + 20²)/3)
    s2, m2 = _spread({0: 20.0, 1: 40.0, 2: 10.0})
    s3, m3 = _spread({0: 20.0, 1: 40.0, 2: 20.0})
    assert (s1, m1) == pytest.approx((math.sqrt(800.0), 20.0))
    assert (s3, m3) == (0.0, 20.0)
    got = {r["slice"]: r for r in res.details["slices"]}
    for k, (s, m) in {1: (s1, m1), 2: (s2, m2), 3: (s3, m3)}.items():
        assert got[k]["complete"]
        assert got[k]["S"] == pytest.approx(s)
        assert got[k]["mean_dc"] == pytest.approx(m)
        assert got[k]["S_over_mean"] == pytest.approx(s / m)
    assert got[2]["d_1"] == 40.0 and got[2]["dc_1"] == 20.0

    # Migrations: Σ mig_cost = 30/200 + 10/50; both ran inside slice 2, so S/dc̄
    # before is slice 1's and after is slice 3's.
    h = res.headline
    assert h["mig_cost"] == pytest.approx(30 / 200 + 10 / 50)
    assert (h["migrations"], h["subscriptions_moved"]) == (2, 40)
    for m in res.details["migrations"]:
        assert (m["slice_before"], m["slice_after"]) == (1, 3)
        assert m["ratio_before"] == pytest.approx(s1 / m1)
        assert m["ratio_after"] == pytest.approx(0.0)

    # Windows of T from the header's time hold the same events as the slices,
    # so the recomputed S/dc̄ is the slices'.  Without migrations all load sits
    # on node 0: dc = (D, 0, 0) gives dc̄ = D/3 and S = D·sqrt(2)/3, S/dc̄ = sqrt(2).
    assert h["ratio_actual"] == pytest.approx((s1 / m1 + s2 / m2 + s3 / m3) / 3)
    assert h["ratio_counterfactual"] == pytest.approx(math.sqrt(2))

    # Re-matching and audit: 9 matching pairs, each delivered once; the X
    # sequence delivered in rank order.
    pairs = res.details["audit"]["pairs"]
    assert (pairs["rematched"], pairs["reported"], pairs["delivered"], pairs["expected"]) == (9, 9, 9, 9)
    # (A gets the X events under 100 too: 2 + 5 deliveries of keyed events.)
    assert res.details["audit"]["order"] == {"deliveries": 7, "keys": 1, "violations": 0}
    report = (res.out / "report.md").read_text()
    assert "all validations passed" in report
    for f in (
        "slices.csv",
        "windows.csv",
        "migrations.csv",
        "node_loads.csv",
        "validations.csv",
        "s_over_mean.png",
        "load_stacked.png",
    ):
        assert (res.out / f).stat().st_size > 0


# -- 2. a capture from a real cluster ---------------------------------------------------------------

SUBSCRIPTIONS = {
    1: ["price < 100", 'sym = "X" and price < 500', "price >= 400 and price < 700"],
    2: ["price >= 900", 'sym prefix "Y"', "qty > 50"],
    # The extended language (issue 18): alternatives on both sides of the
    # price split (one event may match both: delivered and re-matched once),
    # anything-but, presence, case-insensitive and wildcard operators.
    0: [
        'price < 50 or (price > 950 and not sym = "X")',
        'sym not in {"X", "Y"} and not exists venue and (qty < 10 or price in [490, 510])',
        'sym ieq "y1" or sym like "X*"',
    ],
}
EVENTS_PUBLISHED = 600


async def _cluster_run(run: Path) -> dict[str, Any]:
    cfg = load_config(ROOT / "cluster_configs" / "local.toml")
    cfg = with_capture_dir(cfg, str(run))
    cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, slice_seconds=0.5))
    socks, ncfg = [], []
    for n in cfg.nodes:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(128)
        socks.append(s)
        ncfg.append(NodeConfig(n.id, "127.0.0.1", s.getsockname()[1], 0, n.capacity))
    cfg = msgspec.structs.replace(cfg.with_nodes(tuple(ncfg)), tls=insecure_tls())
    nodes = [Node(cfg, n.id, sock=s) for n, s in zip(cfg.nodes, socks)]
    tasks = [asyncio.create_task(n.run()) for n in nodes]
    addr = [(n.host, n.port) for n in cfg.nodes]
    clients = []
    try:
        admin = await Client([addr[0]], client_id="admin").connect()
        clients.append(admin)
        await admin.admin("split", channel="0.0", attr="price", at=500.0)
        subs = []
        for node, exprs in SUBSCRIPTIONS.items():
            c = await Client([addr[node]], client_id=f"sub{node}").connect()
            clients.append(c)
            subs += [(node, await c.subscribe(e)) for e in exprs]
        moved = await admin.admin("place", channel="0.2", node=2)
        # Consume (and so acknowledge) as notifications come: an ordered key's
        # next rank waits for every matched subscriber's ack (SPEC §10).
        # Each subscription gets its own copy: the (client, event,
        # subscription) triples are what the capture's deliveries must match.
        pairs_seen: set[tuple[int, str, str]] = set()
        received = [0]

        payload_of_pair: dict[tuple[int, str, str], int] = {}

        async def consume(node: int, sub: Any) -> None:
            async for note in sub:
                pairs_seen.add((node, note.event_id, sub.sub_id))
                payload_of_pair[(node, note.event_id, sub.sub_id)] = len(note.payload)
                received[0] = len(pairs_seen)

        consumers = [asyncio.create_task(consume(node, s)) for node, s in subs]
        pub = await Client([addr[0]], client_id="pub").connect()
        clients.append(pub)
        for i in range(EVENTS_PUBLISHED):
            # One event in ten is ordered (SPEC §10): three keys, ranks given by their homes.
            key = f"k{i % 3}" if i % 10 == 0 else ""
            # Payloads of 0-49 bytes: the replay accounts for them (audit.payload).
            await pub.publish(
                {"price": float(i * 7 % 1000), "sym": ("X", "Y1", "Z")[i % 3], "qty": i % 100},
                key=key,
                payload=bytes(i % 50),
            )
        # The last notifications arrive (a shortfall is the replay's to report),
        # and every node has reported two slices: the replay's slice table needs
        # a complete one.
        pairs = _pairs(cfg)

        def done() -> bool:
            return received[0] >= pairs and nodes_quiet(nodes) and min(n.core.monitor.slice_no for n in nodes) >= 2

        with contextlib.suppress(AssertionError):
            await wait_until(done, 30, "every notification and two slices")
        for t in consumers:
            t.cancel()
    finally:
        for c in clients:
            await c.close()
        # The nodes capture each session's end before they stop.
        with contextlib.suppress(AssertionError):
            await wait_until(lambda: not any(n.core.sessions for n in nodes), 10, "every client session closed")
        for n in nodes:
            n.stop()
        await asyncio.gather(*tasks)
    return {"moved": moved, "received": received[0], "payload_bytes": sum(payload_of_pair.values())}


def _pairs(cfg: Any) -> int:
    """(event, subscription) pairs the run must deliver: every subscription is
    SubAck'ed before the first publish."""
    filters = [parse_expression(e, cfg.schema) for exprs in SUBSCRIPTIONS.values() for e in exprs]
    events = [
        {"price": float(i * 7 % 1000), "sym": ("X", "Y1", "Z")[i % 3], "qty": i % 100} for i in range(EVENTS_PUBLISHED)
    ]
    return sum(f.matches(ev) for f in filters for ev in events)


@pytest.fixture(scope="module")
def cluster_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run = tmp_path_factory.mktemp("cluster") / "run"
    info = asyncio.run(_cluster_run(run))
    return run, info


def test_capture_of_a_real_cluster_run_replays_clean(spark: Any, cluster_capture: tuple[Path, dict[str, Any]]) -> None:
    run, info = cluster_capture
    assert sorted(p.name for p in run.glob("node-*.ndjson")) == ["node-0.ndjson", "node-1.ndjson", "node-2.ndjson"]
    res = run_replay(str(run), spark=spark, tail_guard=0.0, stream=None)
    assert res.failed == [], [(c.name, c.detail) for c in res.checks if c.ok is False]
    h = res.headline
    assert h["published"] == EVENTS_PUBLISHED and h["matched_events"] == EVENTS_PUBLISHED
    pairs = res.details["audit"]["pairs"]
    assert pairs["delivered"] == pairs["reported"] == pairs["rematched"] == info["received"] > 0
    # The forced move is in the capture with its cost (SPEC §5: subscriptions / bw).
    forced = [m for m in res.details["migrations"] if m["forced"]]
    assert len(forced) >= 1 and forced[0]["channels"] == "0.2" and forced[0]["receiver"] == 2
    assert forced[0]["subscriptions"] == info["moved"]["subscriptions_moved"]
    assert h["mig_cost"] == pytest.approx(sum(m["subscriptions"] / m["bw"] for m in res.details["migrations"]))
    assert any(r["complete"] for r in res.details["slices"])
    assert {c.name: c.ok for c in res.checks}["costs.slices"] is True
    # Keyed events: the owners' records carry the homes' ranks, delivered in order.
    order = res.details["audit"]["order"]
    assert res.details["audit"]["events"]["keyed"] == EVENTS_PUBLISHED // 10
    assert order is not None and order["keys"] >= 1 and order["violations"] == 0
    # Payloads: every byte published accounted for, and delivered whole.
    pl = res.details["audit"]["payloads"]
    assert pl["published_bytes"] == sum(i % 50 for i in range(EVENTS_PUBLISHED))
    assert pl["delivered_bytes"] == info["payload_bytes"] > 0 and pl["mismatched"] == 0


# -- 3. an injected duplicate and a lost delivery -------------------------------------------------------


def test_audit_catches_an_injected_duplicate_and_a_lost_delivery(
    cluster_capture: tuple[Path, dict[str, Any]], tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = cluster_capture
    bad = tmp_path / "bad"
    shutil.copytree(src, bad, ignore=shutil.ignore_patterns("report"))
    f = bad / "node-1.ndjson"
    lines = f.read_text().splitlines()
    deliveries = [i for i, x in enumerate(lines) if x.startswith('{"kind":"deliver"') and '"subs":[]' not in x]
    dup, gone = deliveries[len(deliveries) // 4], deliveries[len(deliveries) // 2]
    lines.insert(dup + 1, lines[dup])  # delivered twice
    del lines[gone + 1]  # never delivered
    f.write_text("\n".join(lines) + "\n")

    rc = cli.main(["replay", str(bad), "--tail-guard", "0", "--quiet"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "audit.duplicates" in err and "audit.lost" in err
    report = (bad / "report" / "report.md").read_text()
    assert "FAILED: " in report and "audit.duplicates" in report and "audit.lost" in report
    rows = (bad / "report" / "validations.csv").read_text()
    assert "audit.duplicates,FAIL" in rows and "audit.lost,FAIL" in rows
    assert "rematch.missing,PASS" in rows  # the owners did match: only delivery broke


def test_audit_catches_a_payload_that_did_not_arrive_whole(
    cluster_capture: tuple[Path, dict[str, Any]], tmp_path: Path, spark: Any
) -> None:
    src, _ = cluster_capture
    bad = tmp_path / "short"
    shutil.copytree(src, bad, ignore=shutil.ignore_patterns("report"))
    f = bad / "node-1.ndjson"
    lines = f.read_text().splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith('{"kind":"deliver"') and '"payload_bytes":' in x)
    lines[i] = re.sub(r'"payload_bytes":(\d+)', lambda m: f'"payload_bytes":{int(m[1]) - 1}', lines[i])
    f.write_text("\n".join(lines) + "\n")
    res = run_replay(str(bad), spark=spark, tail_guard=0.0, stream=None)
    assert res.failed == ["audit.payload"]
    assert res.details["audit"]["payloads"]["mismatched"] == 1


# -- 4. the extended filter language, re-matched independently ----------------------------------------

EXTENDED = [
    'price < 100 or sym ieq "x"',
    'not exists qty and sym like "X*"',
    "qty not in [10, 20] and price >= 500",
    'sym not in {"A", "B"} and venue iprefix "ny"',
    'not (price < 300 or sym = "A")',
    'venue isuffix "SE" or qty = 5',
    'not sym prefix "X" and exists venue',
    'sym contains "B" or not sym like "*Z"',
    "price in [10.5, 20.5] or price not in [0, 990]",
    'sym like "A.*" or not venue ieq "nyse"',
    "qty != 3 or not exists venue",
    'not (venue isuffix "se" or sym iprefix "a")',
]


def test_extended_language_subscriptions_are_re_matched_like_the_nodes_do(spark: Any, tmp_path: Path) -> None:
    """Subscriptions with or, not, exists, anything-but, case-insensitive and
    wildcard operators; events that leave optional attributes out.  The
    "owners" report what the node's own matcher says; the replay's Spark
    expressions must find exactly those pairs (rematch.missing and
    rematch.extra both pass, and the counts agree)."""
    import random

    from overlay.channels import Attribute, Kind, Schema
    from overlay.channels.expressions import parse_expression

    schema = Schema(
        [
            Attribute("price", Kind.FLOAT, 0, 1000),
            Attribute("sym", Kind.STRING, 1, 8),
            Attribute("qty", Kind.INT, 0, 100),
            Attribute("venue", Kind.STRING, 0, 16),
        ],
        ["price", "sym"],
    )
    exprs = {f"0:1:x{i}:{i}": parse_expression(t, schema) for i, t in enumerate(EXTENDED)}
    texts = {f"0:1:x{i}:{i}": t for i, t in enumerate(EXTENDED)}
    rng = random.Random(3)
    run = tmp_path / "ext"
    run.mkdir()
    header = {
        "schema_version": 1,
        "run": "ext",
        "cluster": "ext",
        "initializer": 0,
        "slice_seconds": 100.0,
        "nodes": [{"id": 0, "capacity": 1.0}],
        "bandwidth": {"default": 100.0, "links": []},
        "schema": {
            "distinguishing": ["price", "sym"],
            "attributes": [
                {"name": "price", "type": "float", "min": 0, "max": 1000},
                {"name": "sym", "type": "string", "min": 1, "max": 8},
                {"name": "qty", "type": "int", "min": 0, "max": 100},
                {"name": "venue", "type": "string", "min": 0, "max": 16},
            ],
        },
        "balancing": False,
        "delta": 0.1,
    }
    lines = [_line("header", 0, 0.0, **header)]
    for sub, text in texts.items():
        lines.append(
            _line("subscribe", 0, 0.1, sub=sub, local=sub.split(":")[2], session=1, subscriber="c", filter=text)
        )
        lines.append(_line("subscribed", 0, 0.2, sub=sub))
    pairs = 0
    for e in range(400):
        values: dict[str, Any] = {
            "price": round(rng.choice([rng.uniform(0, 1000), rng.uniform(5, 25), 995.0]), 1),
            "sym": rng.choice(["A", "B", "X", "XZ", "AB", "a.", "A.b", "Zx", "xbZ"]),
        }
        if rng.random() < 0.6:
            values["qty"] = rng.choice([3, 5, 10, 15, 20, 21, 50])
        if rng.random() < 0.6:
            values["venue"] = rng.choice(["NYSE", "nyse", "ny", "LSE", "xse", "NASDAQ"])
        matched = [sub for sub, ex in exprs.items() if ex.matches(values)]
        pairs += len(matched)
        t = 1.0 + e * 0.01
        eid = f"0-{e + 1}"
        lines.append(_line("publish", 0, t, event=eid, channel="0.0", values=values))
        lines.append(
            _line(
                "event", 0, t + 0.001, event=eid, access=0, channel="0.0", tested=len(exprs), matched=matched, slice=0
            )
        )
        if matched:
            lines.append(_line("deliver", 0, t + 0.002, event=eid, subs=matched, orphans=[]))
    lines.append(_line("end", 0, 9.0, records=len(lines) + 1, dropped=0))
    (run / "node-0.ndjson").write_text("\n".join(lines) + "\n")
    assert pairs > 100
    res = run_replay(str(run), spark=spark, tail_guard=0.0, stream=None)
    checks = {c.name: (c.ok, c.detail) for c in res.checks}
    for name in ("rematch.parse", "rematch.missing", "rematch.extra", "audit.lost", "audit.duplicates"):
        assert checks[name][0] is True, (name, checks[name][1], res.details["audit"]["examples"])
    got = res.details["audit"]["pairs"]
    assert got["rematched"] == got["reported"] == got["delivered"] == pairs
    # Each conjunct is looked up on its own (an `or` of keyed parts stays keyed).
    by_key = res.details["rematch"]["by_key"]
    assert sum(by_key.values()) == sum(len(ex.conjuncts) for ex in exprs.values())
    assert by_key["range"] >= 3 and by_key["points"] >= 1
