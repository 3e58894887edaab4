"""overlay.node.outbox on its own: what completes an event, the bound, re-sends, expiry, receipts.

The outbox runs on a bare ``NodeContext`` (node 0); ``dispatch`` records
what it would send, and the routing table is set by hand (one channel, its
owner changed to move the event's channel)."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest

from overlay.actions import Action, ToClient, ToPeer
from overlay.channels import ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.channels.space import EventSpace
from overlay.config import load_config
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.outbox import Outbox, Receipts

_LOADED = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
EC = ChannelId(0, 0)
VALUES = {"price": 5.0, "sym": "AB"}


class Rig:
    """An outbox of node 0 with sessions 1 and 2 open."""

    def __init__(
        self, *, limit: int = 100, resend_after: float = 1.0, ttl: float = 10.0, byte_limit: int = 1 << 20
    ) -> None:
        cluster = msgspec.structs.replace(
            _LOADED.cluster, outbox_limit=limit, resend_after=resend_after, event_ttl=ttl, outbox_bytes=byte_limit
        )
        self.ctx = NodeContext(msgspec.structs.replace(_LOADED, cluster=cluster), 0, 0)
        self.ctx.routing.set(EC, RouteEntry(EventSpace.whole(self.ctx.schema), (1,)))
        self.sent: list[pm.Event] = []
        self.sessions = {1, 2}
        self.outbox = Outbox(self.ctx, dispatch=lambda ev, out: self.sent.append(ev), sessions=self.sessions)

    def publish(self, eid: str, sid: int = 1, seq: int = 1, now: float = 0.0, payload: bytes = b"") -> list[Action]:
        self.ctx.now = now
        out: list[Action] = []
        ev = pm.Event(eid, VALUES, 0, pm.DispatchSign.EVENT_DISPATCHED, EC, now, hops=2, payload=payload)
        self.outbox.send(ev, sid, seq, out)
        return out


def acks(out: list[Action]) -> list[tuple[int, int, str]]:
    return [(a.session, a.msg.seq, a.msg.event_id) for a in out if type(a) is ToClient and type(a.msg) is cm.PubAck]


def errors(out: list[Action]) -> list[tuple[int, cm.Error]]:
    return [(a.session, a.msg) for a in out if type(a) is ToClient and type(a.msg) is cm.Error]


def test_complete_only_once_matched_and_every_named_node_confirmed() -> None:
    r = Rig()
    assert r.publish("0-1") == [] and [e.event_id for e in r.sent] == ["0-1"]
    out: list[Action] = []
    r.outbox.matched("0-1", (1, 2), out)
    r.outbox.delivered("0-1", 1, out)
    assert out == [] and "0-1" in r.outbox
    r.outbox.delivered("0-1", 2, out)
    assert acks(out) == [(1, 1, "0-1")] and "0-1" not in r.outbox and len(r.outbox) == 0
    assert r.ctx.stats["events_confirmed"] == 1
    r.outbox.delivered("0-1", 2, out)  # late: counted, nothing more
    assert r.ctx.stats["receipts_stale"] == 1 and len(acks(out)) == 1


def test_no_match_completes_at_once() -> None:
    r = Rig()
    r.publish("0-1")
    out: list[Action] = []
    r.outbox.matched("0-1", (), out)
    assert acks(out) == [(1, 1, "0-1")]


def test_confirmations_before_the_match_are_kept() -> None:
    r = Rig()
    r.publish("0-1")
    out: list[Action] = []
    r.outbox.delivered("0-1", 2, out)
    r.outbox.delivered("0-1", 0, out)  # this node's own clients (a Notification to itself)
    assert out == []
    r.outbox.matched("0-1", (0, 2), out)
    assert acks(out) == [(1, 1, "0-1")]


def test_two_reports_the_first_fully_confirmed_completes() -> None:
    """An event sent twice is reported by two owners; either report confirmed suffices."""
    r = Rig()
    r.publish("0-1")
    out: list[Action] = []
    r.outbox.matched("0-1", (1, 2), out)  # the old owner's, whose notification to 2 was lost
    r.outbox.matched("0-1", (3,), out)  # the new owner's
    r.outbox.delivered("0-1", 1, out)
    assert out == []
    r.outbox.delivered("0-1", 3, out)
    assert acks(out) == [(1, 1, "0-1")]


def test_a_report_left_to_the_access_nodes_is_each_ones_confirmation_too() -> None:
    """The owner notified only other nodes: each reports the match (Notification.confirm)."""
    r = Rig()
    r.publish("0-1", seq=1)
    r.publish("0-2", seq=2)
    out: list[Action] = []
    r.outbox.matched("0-1", (2,), out, 2)  # one access node: complete on its report alone
    assert acks(out) == [(1, 1, "0-1")]
    r.outbox.matched("0-2", (2, 3), out, 3)  # two: each one's report confirms it
    assert len(acks(out)) == 1 and "0-2" in r.outbox
    r.outbox.matched("0-2", (2, 3), out, 2)  # the same round from the other one
    assert acks(out)[-1] == (1, 2, "0-2") and len(r.outbox) == 0


def test_a_report_from_a_node_not_named_confirms_nothing() -> None:
    r = Rig()
    r.publish("0-1")
    out: list[Action] = []
    r.outbox.matched("0-1", (2,), out, 3)  # e.g. an owner's own report: 3 is not a subscribers' node
    assert out == [] and "0-1" in r.outbox
    r.outbox.delivered("0-1", 2, out)
    assert acks(out) == [(1, 1, "0-1")]


def test_a_dead_node_is_not_waited_for_now_or_later() -> None:
    r = Rig()
    r.publish("0-1", seq=1)
    r.publish("0-2", seq=2)
    r.publish("0-3", seq=3)
    out: list[Action] = []
    r.outbox.matched("0-1", (2,), out)
    r.outbox.matched("0-2", (2, 3), out)
    r.outbox.node_dead(2, out)
    assert acks(out) == [(1, 1, "0-1")]
    r.outbox.matched("0-3", (2,), out)  # an owner that did not know yet
    assert acks(out) == [(1, 1, "0-1"), (1, 3, "0-3")]
    r.outbox.delivered("0-2", 3, out)
    assert acks(out)[-1] == (1, 2, "0-2")
    r.outbox.node_back(2)  # a new run: waited for again
    r.publish("0-4", seq=4)
    r.outbox.matched("0-4", (2,), out)
    assert "0-4" in r.outbox


def test_the_same_id_published_again_while_kept_waits_with_the_first() -> None:
    r = Rig()
    r.publish("c/1", sid=1, seq=7)
    assert r.outbox.attach("c/1", 2, 3) and r.outbox.waiting("c/1") == [(1, 7), (2, 3)]
    assert not r.outbox.attach("c/2", 2, 4)  # not kept: the caller publishes it
    out: list[Action] = []
    r.outbox.matched("c/1", (), out)
    assert acks(out) == [(1, 7, "c/1"), (2, 3, "c/1")]
    assert len(r.sent) == 1


def test_a_publisher_gone_gets_nothing() -> None:
    r = Rig()
    r.publish("0-1", sid=2)
    r.sessions.discard(2)
    out: list[Action] = []
    r.outbox.matched("0-1", (), out)
    assert out == [] and len(r.outbox) == 0


def test_the_bound() -> None:
    r = Rig(limit=2)
    r.publish("0-1")
    assert not r.outbox.full
    r.publish("0-2")
    assert r.outbox.full  # node.clients answers the next publish with Choke
    out: list[Action] = []
    r.outbox.matched("0-1", (), out)
    assert not r.outbox.full


def test_the_bound_on_payload_bytes() -> None:
    r = Rig(byte_limit=64 * 1024)
    r.publish("0-1", payload=b"a" * 40_000)
    assert not r.outbox.full and r.outbox.bytes == 40_000
    r.publish("0-2", payload=b"b" * 30_000)
    assert r.outbox.full and r.outbox.status()["payload_bytes"] == 70_000  # 2 events, but 70 kB of payload
    out: list[Action] = []
    r.outbox.matched("0-1", (), out)
    assert not r.outbox.full and r.outbox.bytes == 30_000
    r.ctx.now = 100.0
    r.outbox.tick(100.0, out)  # past the ttl: given up, its bytes released too
    assert r.outbox.bytes == 0 and len(r.outbox) == 0


def test_a_re_send_carries_the_payload_unchanged() -> None:
    r = Rig(resend_after=1.0, ttl=10.0)
    r.publish("0-1", payload=bytes(range(256)))
    r.ctx.now = 1.5
    r.outbox.tick(1.5, [])
    assert [e.payload for e in r.sent] == [bytes(range(256))] * 2


def test_re_sent_after_resend_after_to_the_current_owner_with_backoff() -> None:
    r = Rig(resend_after=1.0, ttl=10.0)
    r.publish("0-1", now=0.0)
    r.publish("0-2", now=0.5)
    out: list[Action] = []
    r.outbox.matched("0-2", (), out)  # complete: never re-sent
    r.outbox.tick(0.9, out)
    assert len(r.sent) == 2
    # The channel moved meanwhile: the re-send goes by the current table, hops reset.
    r.ctx.routing.set(EC, RouteEntry(EventSpace.whole(r.ctx.schema), (2,)))
    r.outbox.tick(1.0, out)
    assert [e.event_id for e in r.sent] == ["0-1", "0-2", "0-1"]
    again = r.sent[-1]
    assert again.ch_id == EC and again.hops == 0 and again.dispatch_sign is pm.DispatchSign.EVENT_DISPATCHED
    assert r.ctx.stats["events_resent"] == 1 and r.outbox.resent == 1
    r.outbox.tick(2.9, out)  # the next wait is twice as long: at 3.0
    assert len(r.sent) == 3
    r.outbox.tick(3.0, out)
    assert len(r.sent) == 4
    r.outbox.tick(6.9, out)
    assert len(r.sent) == 4
    r.outbox.tick(7.0, out)  # then 4 s later
    assert len(r.sent) == 5
    assert acks(out) == [(1, 1, "0-2")] and errors(out) == []


def test_resend_all_sends_every_kept_event_now() -> None:
    r = Rig()
    for i in range(3):
        r.publish(f"0-{i}", seq=i)
    out: list[Action] = []
    r.outbox.matched("0-1", (), out)
    r.outbox.resend_all(0.2, out)
    assert [e.event_id for e in r.sent[3:]] == ["0-0", "0-2"]
    r.outbox.tick(1.0, out)  # the first deadlines are void: the next is 2 s after the re-send
    assert len(r.sent) == 5
    r.outbox.tick(2.2, out)
    assert len(r.sent) == 7


def test_past_event_ttl_the_publisher_is_told_undeliverable(caplog: pytest.LogCaptureFixture) -> None:
    r = Rig(resend_after=1.0, ttl=5.0)
    r.publish("0-1", sid=1, seq=4)
    r.outbox.attach("0-1", 2, 9)
    out: list[Action] = []
    r.outbox.matched("0-1", (2,), out)
    with caplog.at_level(logging.WARNING, logger="overlay.node"):
        for t in (1.0, 3.0, 4.9):
            r.outbox.tick(t, out)
        assert errors(out) == [] and len(r.sent) == 3
        r.outbox.tick(5.0, out)  # capped at the event's life
    errs = errors(out)
    assert [(sid, e.seq, e.code) for sid, e in errs] == [(1, 4, "undeliverable"), (2, 9, "undeliverable")]
    assert "0-1" in errs[0][1].message and "not confirmed within 5s" in errs[0][1].message
    assert "0-1" not in r.outbox and r.ctx.stats["events_expired"] == 1 and r.outbox.expired == 1
    assert "waiting for nodes [2]" in caplog.text
    r.outbox.delivered("0-1", 2, out)  # too late
    assert acks(out) == []


def test_a_group_s_undeliverable_error_comes_after_the_pub_ack() -> None:
    r = Rig()
    r.publish("0-1", seq=5)
    assert r.outbox.defer_error("0-1", cm.ErrorCode.UNDELIVERABLE, "no instance of group 'g'")
    assert not r.outbox.defer_error("0-9", cm.ErrorCode.UNDELIVERABLE, "x")
    out: list[Action] = []
    r.outbox.matched("0-1", (), out)
    assert [type(a.msg).__name__ for a in out if type(a) is ToClient] == ["PubAck", "Error"]
    assert errors(out)[0][1].seq == 5


def test_batched_messages_are_checked() -> None:
    r = Rig()
    r.publish("0-1")
    out: list[Action] = []
    with pytest.raises(RemoteProtocolError, match="2 events but 1 node lists"):
        r.outbox.on_matched(1, pm.EventsMatched(("0-1", "0-2"), ((1,),)), out)
    r.outbox.on_matched(3, pm.EventsMatched(("0-1",), ((1,),)), out)
    r.outbox.on_delivered(1, pm.EventsDelivered(("0-1",)), out)
    assert acks(out) == [(1, 1, "0-1")]


def test_receipts_are_batched_per_destination_and_local_ones_are_calls() -> None:
    r = Rig()
    receipts = Receipts(r.ctx, r.outbox)
    r.publish("0-1")
    out: list[Action] = []
    ev = pm.Event("1-5", VALUES, 1, pm.DispatchSign.EVENT_DISPATCHED, EC, 0.0)
    receipts.matched(ev, (2,), out)
    receipts.matched(msgspec.structs.replace(ev, event_id="1-6"), (), out)
    receipts.matched(msgspec.structs.replace(ev, event_id="0-1", access_node=0), (0,), out)  # our own
    receipts.delivered(2, "2-1", out)
    receipts.delivered(0, "0-1", out)  # our own: completes 0-1
    assert acks(out) == [(1, 1, "0-1")] and receipts.pending
    sent = receipts.end_batch()
    assert sent == [
        ToPeer(1, pm.EventsMatched(("1-5", "1-6"), ((2,), ()))),
        ToPeer(2, pm.EventsDelivered(("2-1",))),
    ]
    assert not receipts.pending and receipts.end_batch() == []


def test_a_large_batch_is_cut_below_the_frame_limit() -> None:
    r = Rig()
    r.ctx.config = msgspec.structs.replace(
        r.ctx.config, cluster=msgspec.structs.replace(r.ctx.config.cluster, max_frame_size=4096)
    )
    receipts = Receipts(r.ctx, r.outbox)
    out: list[Action] = []
    for i in range(100):
        receipts.delivered(1, f"1-{i}", out)
    msgs = receipts.end_batch()
    assert len(msgs) > 1 and [e for m in msgs for e in m.msg.event_ids] == [f"1-{i}" for i in range(100)]
    assert all(len(msgspec.msgpack.encode(m.msg)) < 2048 for m in msgs)


def test_a_confirmation_that_completes_nothing_counts_for_a_later_report() -> None:
    r = Rig()
    r.publish("0-1")
    out: list[Action] = []
    r.outbox.on_matched(3, pm.EventsMatched(("0-1",), ((1, 2),)), out)
    r.outbox.on_delivered(1, pm.EventsDelivered(("0-1",)), out)
    assert out == []
    r.outbox.on_matched(4, pm.EventsMatched(("0-1",), ((1,),)), out)  # the new owner's, after a re-send
    assert acks(out) == [(1, 1, "0-1")]
