"""overlay.capture and its writer (SPEC §13): the records a node makes, and the file.

The sans-IO buffer is tested alone and inside cores joined by the in-memory
``CoreLink`` (no event loop); the writer with a real event loop and a
temporary directory.  The Spark side is ``test_replay.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import msgspec
import pytest

from overlay import capture, cli
from overlay.capture import (
    SCHEMA_VERSION,
    CaptureBuffer,
    Deliver,
    Matched,
    Publish,
    capture_file_name,
    header_for,
    with_capture_dir,
)
from overlay.config import load_config
from overlay.messages import client as cm
from overlay.net.capture_writer import CaptureWriter
from overlay.testing import free_ports, wait_until
from overlay.testing.corelink import CoreLink

ROOT = Path(__file__).resolve().parent.parent
_LOADED = load_config(ROOT / "cluster_configs" / "local.toml")
# The balancer stays off: the records below come from the test's own traffic.
CONFIG = msgspec.structs.replace(_LOADED, cluster=msgspec.structs.replace(_LOADED.cluster, balancing=False))


class _Sub:
    def __init__(self, id: str) -> None:
        self.id = id


# -- the buffer ------------------------------------------------------------------------------


def _lines(buf: CaptureBuffer) -> list[dict]:
    """What the writer would put in the file, decoded."""
    return [json.loads(line) for chunk in buf.take() for line in chunk.decode().splitlines()]


def test_records_carry_node_counter_and_the_time_set_by_the_driver() -> None:
    buf = CaptureBuffer(3)
    buf.now = 10.5
    buf.publish("3-1", "0.0", {"price": 1.0})
    buf.now = 11.0
    buf.event("3-1", 3, "0.0", 7, [_Sub("a"), _Sub("b")], 4)
    assert buf.records == [
        Publish(3, 1, 10.5, "3-1", "0.0", {"price": 1.0}),
        Matched(3, 2, 11.0, "3-1", 3, "0.0", 7, ("a", "b"), 4),
    ]
    assert _lines(buf) == [
        # No key and rank yet: fields at their default are not written.
        {
            "kind": "publish",
            "node": 3,
            "n": 1,
            "time": 10.5,
            "event": "3-1",
            "channel": "0.0",
            "values": {"price": 1.0},
        },
        {
            "kind": "event",
            "node": 3,
            "n": 2,
            "time": 11.0,
            "event": "3-1",
            "access": 3,
            "channel": "0.0",
            "tested": 7,
            "matched": ["a", "b"],
            "slice": 4,
        },
    ]
    assert buf.take() == [] and buf.pending == 0  # taken records are gone; the counter goes on
    buf.applied("a", True)
    assert buf.records[0].n == 3


def test_deliver_separates_orphans_from_subscriptions_still_served() -> None:
    buf = CaptureBuffer(1)
    buf.deliver("0-1", ("a", "gone", "b"), {"a": (1, "x"), "b": (2, "y")})
    buf.deliver("0-2", ["a"], {"a": (1, "x")})
    first, second = buf.records
    assert (first.subs, first.orphans) == (("a", "b"), ("gone",))
    assert (second.subs, second.orphans) == (("a",), ())
    assert "orphans" not in _lines(buf)[1]


def test_journal_records_are_copied_with_the_counter() -> None:
    buf = CaptureBuffer(0)
    entry = {"kind": "split", "node": 0, "time": 1.0, "slice": 2, "parent": "0.0"}
    buf.journal(entry)
    assert buf.records == [{**entry, "n": 1}]
    assert "n" not in entry  # the journal's own dict is untouched


def test_records_are_encoded_in_chunks_as_they_come(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "ENCODE_EVERY", 3)
    buf = CaptureBuffer(0)
    for i in range(7):
        buf.publish(f"0-{i}", "0.0", {})
    # Two chunks of three sealed as objects piled up; one record still an object.
    assert (len(buf.chunks), buf.sealed, len(buf.records), buf.pending) == (2, 6, 1, 7)
    assert [x["event"] for x in _lines(buf)] == [f"0-{i}" for i in range(7)]


def test_a_full_buffer_drops_and_counts_never_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "ENCODE_EVERY", 2)
    buf = CaptureBuffer(0, max_pending=2)
    for i in range(5):
        buf.publish(f"0-{i}", "0.0", {})
    assert buf.dropped == 1 and buf.pending == 4
    assert buf.n == 5  # a gap in n marks the drop
    assert [x["n"] for x in _lines(buf)] == [1, 2, 3, 4]
    buf.publish("0-9", "0.0", {})
    assert buf.records[0].n == 6


def test_records_encode_as_one_json_object_per_line_kind_first() -> None:
    buf = CaptureBuffer(2)
    buf.subscribe("2:1:s:1", "s", 1, "client", 'sym = "A"')
    buf.deliver("0-1", ["2:1:s:1"], {"2:1:s:1": None})
    lines = b"".join(buf.take()).decode().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["subscribe", "deliver"]
    assert all(line.startswith('{"kind":') for line in lines)


def test_header_describes_the_cluster_for_the_replay() -> None:
    h = msgspec.to_builtins(header_for(CONFIG, 1, "runX", 5.0))
    assert h["kind"] == "header" and h["schema_version"] == SCHEMA_VERSION
    assert (h["node"], h["run"], h["initializer"], h["slice_seconds"]) == (1, "runX", 0, 2.0)
    assert [n["id"] for n in h["nodes"]] == [0, 1, 2]
    assert h["schema"]["distinguishing"] == ["price", "sym"]
    assert {a["name"]: a["type"] for a in h["schema"]["attributes"]}["price"] == "float"


# -- the core's hooks --------------------------------------------------------------------------


def _captured_world() -> tuple[CoreLink, dict[int, CaptureBuffer]]:
    net = CoreLink(CONFIG, now=100.0)
    bufs = {}
    for i, core in net.cores.items():
        core.capture = bufs[i] = CaptureBuffer(i)
    net.start()
    return net, bufs


def _kinds(buf: CaptureBuffer) -> list[str]:
    return [r["kind"] if isinstance(r, dict) else msgspec.to_builtins(r)["kind"] for r in buf.records]


def test_core_records_publish_match_delivery_and_subscription_lifetime() -> None:
    net, bufs = _captured_world()
    # Put the high half of the space on node 2, so events cross the overlay.
    admin = net.open_client(0, "op")
    net.request(0, admin, cm.Admin(1, "split", {"channel": "0.0", "attr": "price", "at": 500.0}))
    net.request(0, admin, cm.Admin(2, "place", {"channel": "0.2", "node": 2}))
    sub = net.open_client(1, "subscriber")
    net.now = 101.0
    assert isinstance(net.request(1, sub, cm.Subscribe(1, "cheap", "price < 100"))[-1], cm.SubAck)
    assert isinstance(net.request(1, sub, cm.Subscribe(2, "x", 'sym = "X"'))[-1], cm.SubAck)
    pub = net.open_client(0, "publisher")
    net.now = 102.0
    net.request(0, pub, cm.Publish(1, {"price": 50.0, "sym": "X"}))
    net.request(0, pub, cm.Publish(2, {"price": 700.0, "sym": "X"}))
    net.request(0, pub, cm.Publish(3, {"price": 700.0, "sym": "Y"}))
    net.now = 103.0
    net.request(1, sub, cm.Unsubscribe(3, "x"))

    # Access node 0: the publishes, with values and the channel routed to.
    pubs = [r for r in bufs[0].records if isinstance(r, Publish)]
    assert [(p.event, p.channel, p.values) for p in pubs] == [
        ("0-1", "0.1", {"price": 50.0, "sym": "X"}),
        ("0-2", "0.2", {"price": 700.0, "sym": "X"}),
        ("0-3", "0.2", {"price": 700.0, "sym": "Y"}),
    ]
    assert all(p.time == 102.0 and p.key is None and p.rank is None for p in pubs)
    # Owners: 0.1 stayed on node 0, 0.2 moved to node 2; tested counts from the index.
    ev = {r.event: r for b in bufs.values() for r in b.records if isinstance(r, Matched)}
    assert (ev["0-1"].node, ev["0-1"].channel, ev["0-1"].access) == (0, "0.1", 0)
    assert (ev["0-2"].node, ev["0-3"].node) == (2, 2)
    assert sorted(ev["0-1"].matched) == ["1:1:cheap:1", "1:1:x:2"]
    assert ev["0-2"].matched == ("1:1:x:2",) and ev["0-3"].matched == ()
    assert all(r.tested >= len(r.matched) for r in ev.values())
    # Subscriber's access node 1: one deliver record per notification.
    dl = [r for r in bufs[1].records if isinstance(r, Deliver)]
    assert [(d.event, sorted(d.subs), d.orphans) for d in dl] == [
        ("0-1", ["1:1:cheap:1", "1:1:x:2"], ()),
        ("0-2", ["1:1:x:2"], ()),
    ]
    # The subscription lifetime: asked, applied everywhere, asked to end, ended.
    life = [
        (k, r.sub, r.time)
        for r in bufs[1].records
        if (k := msgspec.to_builtins(r)["kind"]) in ("subscribe", "subscribed", "unsubscribe", "unsubscribed")
    ]
    assert [k for k, s, _ in life if s == "1:1:x:2"] == ["subscribe", "subscribed", "unsubscribe", "unsubscribed"]
    sub_rec = next(r for r in bufs[1].records if msgspec.to_builtins(r)["kind"] == "subscribe" and r.sub == "1:1:x:2")
    assert (sub_rec.filter, sub_rec.subscriber, sub_rec.local, sub_rec.time) == ('sym = "X"', "subscriber", "x", 101.0)
    # Balancing journal: the operator's split and migration are captured too.
    assert "split" in _kinds(bufs[0]) and "migration" in _kinds(bufs[0])
    mig = next(r for r in bufs[0].records if isinstance(r, dict) and r["kind"] == "migration")
    assert mig["receiver"] == 2 and mig["mig_cost"] == mig["subscriptions"] / mig["bw"]


def test_closing_a_client_records_its_unsubscriptions() -> None:
    net, bufs = _captured_world()
    sid = net.open_client(2, "leaver")
    net.request(2, sid, cm.Subscribe(1, "a", "price > 10"))
    net.close_client(2, sid)
    net.run()
    kinds = [
        (k, r.reason if k == "unsubscribe" else None)
        for r in bufs[2].records
        if (k := msgspec.to_builtins(r)["kind"]) in ("unsubscribe", "unsubscribed")
    ]
    assert kinds == [("unsubscribe", "closed"), ("unsubscribed", None)]


def test_capture_off_costs_nothing_and_changes_nothing() -> None:
    net = CoreLink(CONFIG)
    net.start()
    assert all(c.capture is None for c in net.cores.values())
    sid = net.open_client(0, "p")
    assert isinstance(net.request(0, sid, cm.Publish(1, {"price": 1.0, "sym": "A"}))[-1], cm.PubAck)


# -- the writer ---------------------------------------------------------------------------------


def test_writer_writes_header_batches_and_end_and_keeps_an_old_file(tmp_path: Path) -> None:
    run = tmp_path / "run1"
    run.mkdir()
    (run / capture_file_name(1)).write_text("earlier run\n")

    async def scenario() -> CaptureWriter:
        w = CaptureWriter(CONFIG, 1, run)
        w.open(50.0)
        task = asyncio.create_task(w.run())
        for i in range(3):
            w.buffer.now = 51.0 + i
            w.buffer.publish(f"1-{i}", "0.0", {"price": float(i)})
        # The run loop writes them as one batch (a flush period on): the header and 3.
        await wait_until(lambda: w.written == 4, what="the first batch written")
        w.buffer.publish("1-9", "0.0", {"price": 9.0})
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        w.close(60.0)
        return w

    w = asyncio.run(scenario())
    lines = [json.loads(x) for x in (run / capture_file_name(1)).read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["header", "publish", "publish", "publish", "publish", "end"]
    assert lines[0]["run"] == "run1" and lines[0]["node"] == 1
    assert lines[-1] == {"kind": "end", "node": 1, "n": 5, "time": 60.0, "records": 6, "dropped": 0}
    assert w.written == 6
    assert (run / (capture_file_name(1) + ".old")).read_text() == "earlier run\n"


def test_cli_capture_flags_reach_node_and_cluster(tmp_path: Path) -> None:
    p = cli.build_parser()
    a = p.parse_args(["node", "--config", "c.toml", "--id", "1", "--capture", "runs/x"])
    assert a.capture == "runs/x"
    a = p.parse_args(["cluster", "up", "c.toml", "--capture", "runs/y", "--duration", "60"])
    assert (a.capture, a.duration, a.traffic) == ("runs/y", 60.0, False)
    a = p.parse_args(["replay", "runs/y", "--master", "spark://h:7077", "--out", "r"])
    assert (a.run_dir, a.master, a.out) == ("runs/y", "spark://h:7077", "r")
    assert with_capture_dir(CONFIG, "runs/z").cluster.capture_dir == "runs/z"
    lc = cli.LocalCluster(str(ROOT / "cluster_configs" / "local.toml"), capture=str(tmp_path))
    assert lc.capture == str(tmp_path)


# -- payloads (rule 3) -------------------------------------------------------------------------


def test_a_payload_is_recorded_by_its_size_not_its_content() -> None:
    buf = CaptureBuffer(0)
    buf.publish("0-1", None, {"price": 1.0}, payload=b"\x00secret\xff")
    buf.publish("0-2", None, {"price": 2.0})
    buf.deliver("0-1", ["1:1:s:1", "1:1:t:2"], {"1:1:s:1": None, "1:1:t:2": None}, 8)
    lines = _lines(buf)
    assert [(r["event"], r.get("payload_bytes"), "payload" in r) for r in lines] == [
        ("0-1", 8, False),
        ("0-2", None, False),  # no payload: nothing written, readers take 0
        ("0-1", 8, False),
    ]
    assert b"secret" not in json.dumps(lines).encode()


def test_capture_payload_records_the_content_as_base64() -> None:
    buf = CaptureBuffer(0, payloads=True)
    buf.publish("0-1", None, {"price": 1.0}, payload=b"\x00secret\xff")
    buf.publish("0-2", None, {"price": 2.0})
    one, two = _lines(buf)
    assert (one["payload_bytes"], base64.b64decode(one["payload"])) == (8, b"\x00secret\xff")
    assert "payload" not in two and "payload_bytes" not in two


def test_core_records_payload_sizes_at_publish_and_delivery_on_every_node() -> None:
    net, bufs = _captured_world()
    admin = net.open_client(0, "op")
    net.request(0, admin, cm.Admin(1, "split", {"channel": "0.0", "attr": "price", "at": 500.0}))
    net.request(0, admin, cm.Admin(2, "place", {"channel": "0.2", "node": 2}))
    sub = net.open_client(1, "subscriber")
    assert isinstance(net.request(1, sub, cm.Subscribe(1, "all", "price >= 0"))[-1], cm.SubAck)
    pub = net.open_client(0, "publisher")
    net.request(0, pub, cm.Publish(1, {"price": 50.0, "sym": "X"}, payload=b"a" * 300))
    net.request(0, pub, cm.Publish(2, {"price": 700.0, "sym": "X"}, payload=b"\x00" * 7))
    net.request(0, pub, cm.Publish(3, {"price": 701.0, "sym": "X"}, key="k", payload=b"keyed"))
    pubs = {r.event: r.payload_bytes for r in bufs[0].records if isinstance(r, Publish)}
    assert sorted(pubs.values()) == [5, 7, 300]
    dl = {r.event: r.payload_bytes for r in bufs[1].records if isinstance(r, Deliver)}
    assert dl == pubs
    assert all(r.payload is None for r in bufs[0].records if isinstance(r, Publish))


def test_cli_capture_payload_needs_a_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = cli.build_parser().parse_args(["node", "--config", "c.toml", "--id", "1", "--capture-payload"])
    assert a.capture_payload
    assert capture.with_capture_payload(CONFIG).cluster.capture_payload
    cfg = tmp_path / "c.toml"
    text = (ROOT / "cluster_configs" / "local.toml").read_text()
    ports = free_ports(6)
    for old, new in zip(("7100", "7101", "7102", "8100", "8101", "8102"), ports, strict=True):
        text = text.replace(f"port = {old}", f"port = {new}")
    cfg.write_text(text.replace('"certs/', f'"{ROOT}/cluster_configs/certs/'))
    assert cli.main(["node", "--config", str(cfg), "--id", "0", "--capture-payload"]) == 2
    assert "--capture-payload needs a capture" in capsys.readouterr().err
