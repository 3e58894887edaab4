"""overlay.messages.codec: framing, round trips, and every way a frame can be bad.

SPEC §9 and STYLE habit 5: a 4-byte length prefix checked against the maximum
before the body is read; every decode failure is ``RemoteProtocolError``; a
message too large to send is ``LocalProtocolError``.
"""

from __future__ import annotations

import typing

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_schema
from overlay.channels import (
    ChannelId,
    EventSpace,
    ExceptConstraint,
    Interval,
    RangeConstraint,
    RouteEntry,
    SetConstraint,
    parse_subscription,
)
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER,
    ClientUnion,
    client_reader,
    encode,
    encode_frame,
    is_peer_frame,
    peer_reader,
)

SCHEMA = make_schema()
PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CH0 = ChannelId(0, 0)
CH1 = ChannelId(0, 1)
CH2 = ChannelId(2, 7)
WHOLE = EventSpace.whole(SCHEMA)
# A space with every kind of constraint, open ends included.
MIXED = EventSpace.build(
    SCHEMA,
    [
        RangeConstraint("price", Interval(10.0, 500.0, True, False)),
        RangeConstraint("qty", Interval(0, 50)),
        SetConstraint("sym", frozenset({"AB", "CD"})),
    ],
)
REST = EventSpace.build(SCHEMA, [ExceptConstraint("sym", frozenset({"AB", "CD"}))])
FILTER = parse_subscription('price >= 10 and price < 20.5 and sym prefix "AB" and note in {"x", "y"}', SCHEMA)
UNSUB_FILTER = parse_subscription("qty in [1, 5] and tag > 48.1.2.3", SCHEMA)
EVENT = {"price": 12.5, "qty": 3, "sym": "ABC", "tag": (1 << 64) - 1, "note": "x"}
STORED = StoredSubscription("1:1:a:1", FILTER, "client-a", 1)

SUB = pm.Subscription("1:1:a:1", FILTER, "client-a", 1, pm.DispatchSign.SUBSCRIBE_DISPATCHED, CH1, 2)
UNSUB = pm.UnSubscription("1:1:a:1", UNSUB_FILTER, "a", 1, pm.DispatchSign.UNSUBSCRIBE_NEW)
EV = pm.Event("1-42", EVENT, 1, pm.DispatchSign.EVENT_DISPATCHED, CH0, 1700000000.25, 1)
# Every byte value, so no encoding (text, escaping) could pass it unchanged by luck.
PAYLOAD = bytes(range(256))
EVP = msgspec.structs.replace(EV, payload=PAYLOAD)

PEER_MESSAGES: list[pm.PeerMessage] = [
    pm.PeerHello(3, "local", True),
    pm.PeerError("protocol_error", "frame too large"),
    pm.RoutingTableInit(
        (
            pm.RouteItem(CH1, RouteEntry(MIXED, (0,))),
            pm.RouteItem(CH2, RouteEntry(REST, (2, 1)), (7 << 32) | (1 << 16) | 2),
        ),
        1712345678901,
        True,
        (pm.ChannelVersion(CH0, 6 << 32),),
    ),
    pm.ReplyRoutingTableInit(2),
    SUB,
    UNSUB,
    pm.SubscriptionApplied("1:1:a:1", CH0, True, (CH1, CH2)),
    EV,
    pm.Notification("1-42", EVENT, ("1:1:a:1", "1:1:b:2"), CH0, 1.5),
    EVP,
    pm.Notification("1-42", EVENT, ("1:1:a:1",), CH0, 1.5, "k", 3, 2, 1, (2,), PAYLOAD),
    pm.Reforward(CH1, (pm.ReforwardItem(pm.ReforwardSign.EVENT_MESSAGE, EVP),), 9),
    pm.KeySync(
        8,
        (
            pm.KeyOp("k", msgspec.structs.replace(EVP, key="k", rank=3, home=2)),
            pm.KeyOp("j", copy=pm.KeyCopy("j", 2, 5, (msgspec.structs.replace(EVP, key="j", rank=2),))),
        ),
        handover=True,
    ),
    pm.NotificationAck("1-42", ("1:1:a:1",)),
    pm.LIEM(1, "UNDERLOADED", 120.0, 0.5, 240.0, 17),
    pm.RequestLoadBalance(300.0, 1.25, 9, True),
    pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_FAIL, 9, "not underloaded"),
    pm.ChannelTransfer((pm.ChannelSpec(CH1, MIXED), pm.ChannelSpec(CH0, WHOLE, (pm.PastOwner(2, 17.5),))), 9),
    pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, (CH1, CH0), 9),
    pm.SubscriptionMove(
        pm.SubscriptionType.COMPOSITE,
        (pm.ChannelSubscriptions(CH1, (STORED,)), pm.ChannelSubscriptions(CH0, ())),
        9,
    ),
    pm.ReplySubscriptionMove(9),
    pm.UpdateRoutingTable((CH0,), (pm.RouteItem(CH1, RouteEntry(MIXED, (2,)), 5 << 32),), 9, 0, -1, (5 << 32,)),
    pm.ReplyUpdateGlobal(9, 0),
    pm.CompleteLoadBalance(9, aborted=True),
    pm.Reforward(
        CH1,
        (
            pm.ReforwardItem(pm.ReforwardSign.SUBSCRIBE, SUB),
            pm.ReforwardItem(pm.ReforwardSign.UNSUBSCRIBE, UNSUB),
            pm.ReforwardItem(pm.ReforwardSign.EVENT_MESSAGE, EV),
        ),
        9,
    ),
    pm.Heartbeat(1712345678901, (2,), (pm.DeadNode(3, 1712345600000),), 1),
    pm.Heartbeat(1, sent=2.5, echo=1.25, table_digest=(1 << 63) - 1, table_clock=42),
    pm.Rebuild(CH1, (SUB.stored(),), last=False, dead=3),
    pm.Rebuild(CH1, (), dead=3, groups=(pm.GroupChoice("1-42", "workers", "1:1:a:1"),)),
    pm.DeliveryHandover(
        9,
        CH1,
        (
            pm.TrackedDelivery(
                EVP,
                (pm.CopyInFlight("1:1:a:1", 2, "workers"), pm.CopyInFlight("1:1:b:2", 1)),
                (pm.GroupTries("workers", ("1:1:c:3", "1:1:a:1"), ("1:1:a:1", "1:1:d:4")),),
            ),
        ),
        (pm.GroupChoice("1-42", "workers", "1:1:a:1"), pm.GroupChoice("1-41", "workers", "1:1:c:3", taken=True)),
    ),
    pm.KeySync(
        7,
        (
            pm.KeyOp("k", msgspec.structs.replace(EV, key="k", rank=3, home=2)),
            pm.KeyOp("k", seq=4),
            pm.KeyOp("j", copy=pm.KeyCopy("j", 2, 5, (msgspec.structs.replace(EV, key="j", rank=2),))),
            pm.KeyOp("i", forget=True),
        ),
        handover=True,
        last=True,
    ),
    pm.KeySynced(7),
    pm.KeyAsk(1712345678901),
    pm.EventsMatched(("0-1", "0-2"), ((1, 2), ())),
    pm.EventsDelivered(("0-1",)),
    pm.LinkAck(1234),
    pm.PeerAuth(3, "local", b"n" * 32),
    pm.PeerChallenge(4, b"m" * 32, b"p" * 32),
    pm.PeerProof(b"q" * 32),
    pm.TableRequest(3, 1712345678901, 12345, (pm.ChannelVersion(CH0, 1 << 32), pm.ChannelVersion(CH1, 9))),
    pm.TableReply(3, 1712345678901, (pm.RouteItem(CH1, RouteEntry(MIXED, (2,)), 5 << 32),), (), last=False),
    pm.TableReply(3, 1712345678901, (), (pm.ChannelVersion(CH0, 6 << 32),)),
    pm.Batch(
        (
            EVP,
            pm.Notification("1-42", EVENT, ("1:1:a:1",), CH0, 1.5, origin=1, confirm=(2,), payload=PAYLOAD),
            pm.NotificationAck("1-42", ("1:1:a:1",)),
            pm.SubscriptionApplied("1:1:a:1", CH0, True),
            pm.EventsMatched(("0-1",), ((1, 2),)),
            pm.EventsDelivered(("0-1",)),
            EV,
        )
    ),
]

CLIENT_MESSAGES: list[cm.ClientMessage] = [
    cm.Hello("client-a", 1),
    cm.Hello("operator", 1, "s3cret"),
    cm.Welcome(0, 4, True, "local"),
    cm.Welcome(0, 4, True, "local", 2.0),
    cm.Publish(1, '{price: 12.5, sym: "AB"}', 3.5),
    cm.Publish(2, {"price": 12.5, "qty": 3, "sym": "AB", "tag": 5}),
    cm.Publish(3, {"price": 12.5, "sym": "AB"}, 3.5, "k", 2, "e-7", PAYLOAD),
    cm.Welcome(0, 4, True, "local", 2.0, 65536),
    cm.PubAck(1, "0-1"),
    cm.PubAcks((1, 2, 5), ("0-1", "0-2", "pub/e-5")),
    cm.Hello("client-b", cm.PROTOCOL_VERSION),
    cm.Subscribe(3, "s1", 'price < 10 and sym = "AB"'),
    cm.SubAck(3, "s1", 2),
    cm.Unsubscribe(4, "s1"),
    cm.UnsubAck(4, "s1"),
    cm.Notify("0-1", {"price": 12.5, "sym": "AB"}, ("s1", "s2"), 3.5),
    cm.Notify("0-2", {"price": 1.0, "sym": "AB"}, ("g1",), 3.5, "k", 4, 17),
    cm.Notify("0-3", {"price": 1.0, "sym": "AB"}, ("s1",), 3.5, "k", 4, 17, PAYLOAD),
    cm.Ack("0-1"),
    cm.Ack("0-2", 0.5, 17, declined=True),
    cm.Revoke(17, "0-2"),
    cm.Choke(5, 0.01),
    cm.Error(6, cm.ErrorCode.BAD_EXPRESSION, "expected a value", 7, False),
    cm.Admin(7, "place", {"channel": "0.2", "node": 2, "nested": [1, {"a": None}]}),
    cm.AdminReply(7, {"session": 3, "channels": ["0.2"]}),
]


def frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def _id(m: object) -> str:
    return type(m).__name__


# -- coverage of the message sets ----------------------------------------------------------


def test_samples_cover_every_peer_message_type():
    assert {type(m) for m in PEER_MESSAGES} == set(typing.get_args(pm.PeerUnion))


def test_a_batch_holds_only_the_hot_paths_normal_messages():
    # net.peer_link rule 7: never a high one (it would wait behind normal
    # ones), never a Batch in a Batch, never one of the large rare ones.
    assert not pm.BATCHED & pm.HIGH
    assert set(typing.get_args(pm.Batched)) == pm.BATCHED
    for msg in (pm.Heartbeat(), pm.Batch(()), pm.Rebuild(CH0, ())):
        body = msgspec.msgpack.encode(["Batch", [msgspec.msgpack.decode(encode(msg))]])
        with pytest.raises(RemoteProtocolError):
            peer_reader().feed(frame(body))


def test_a_batch_over_its_item_bound_is_refused():
    item = msgspec.msgpack.decode(encode(pm.NotificationAck("e", ())))
    body = msgspec.msgpack.encode(["Batch", [item] * (pm.MAX_BATCH_ITEMS + 1)])
    with pytest.raises(RemoteProtocolError):
        peer_reader().feed(frame(body))
    body = msgspec.msgpack.encode(["Batch", [item] * pm.MAX_BATCH_ITEMS])
    (ok,) = peer_reader().feed(frame(body))
    assert len(ok.messages) == pm.MAX_BATCH_ITEMS


def test_samples_cover_every_client_message_type():
    assert {type(m) for m in CLIENT_MESSAGES} == set(typing.get_args(ClientUnion))


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("msg", PEER_MESSAGES, ids=_id)
def test_peer_message_round_trip(msg):
    data = encode_frame(msg)
    assert HEADER.unpack_from(data)[0] == len(data) - HEADER.size == len(encode(msg))
    out = peer_reader().feed(data)
    assert out == [msg]
    assert type(out[0]) is type(msg)


@pytest.mark.parametrize("msg", CLIENT_MESSAGES, ids=_id)
def test_client_message_round_trip(msg):
    out = client_reader().feed(encode_frame(msg))
    assert out == [msg]
    assert type(out[0]) is type(msg)


def test_round_trip_keeps_value_types():
    # An int stays an int and a float a float: the schema never coerces (schema rule 4).
    ev = pm.Event("e", {"price": 10, "qty": 3, "sym": "A", "tag": 1 << 63}, 0, pm.DispatchSign.EVENT_NEW)
    (out,) = peer_reader().feed(encode_frame(ev))
    assert [type(v) for v in out.event_exp.values()] == [int, int, str, int]
    ev = pm.Event("e", {"price": 10.0}, 0, pm.DispatchSign.EVENT_NEW)
    (out,) = peer_reader().feed(encode_frame(ev))
    assert type(out.event_exp["price"]) is float


def test_defaults_fill_fields_an_older_peer_did_not_send():
    # An older peer sends Event without publish_time and hops (new fields at the end).
    body = msgspec.msgpack.encode(["Event", "e1", {"price": 1.0}, 0, "EVENT_NEW"])
    (out,) = peer_reader().feed(frame(body))
    assert out == pm.Event("e1", {"price": 1.0}, 0, pm.DispatchSign.EVENT_NEW, None, 0.0, 0)


@pytest.mark.parametrize(
    "msg",
    [m for m in PEER_MESSAGES + CLIENT_MESSAGES if isinstance(m, (pm.Event, pm.Notification, cm.Publish, cm.Notify))],
    ids=_id,
)
def test_a_payload_round_trips_as_the_same_bytes(msg):
    make = peer_reader if isinstance(msg, pm.PeerMessage) else client_reader
    (out,) = make().feed(encode_frame(msg))
    assert type(out.payload) is bytes and out.payload == msg.payload


def test_an_empty_payload_costs_two_bytes_on_the_wire():
    # The issue-19 hot path: an event without a payload costs ~nothing more.
    without = encode(EV)
    older = msgspec.msgpack.encode(msgspec.msgpack.decode(without)[:-1])  # the Event before payloads
    assert len(without) - len(older) == 2  # bin8 of length 0
    assert len(encode(EVP)) - len(without) == len(PAYLOAD) + 1  # the bytes, and bin16's longer header


def test_messages_of_a_peer_without_payloads_decode_with_an_empty_one():
    # An older node or client sends Publish / Notify / Event / Notification without the field.
    body = msgspec.msgpack.encode(["Publish", 1, {"price": 1.0}, 0.0, "", 0, "e1"])
    assert client_reader().feed(frame(body)) == [cm.Publish(1, {"price": 1.0}, 0.0, "", 0, "e1", b"")]
    body = msgspec.msgpack.encode(["Notify", "e", {"price": 1.0}, ["s"], 0.0, "", 0, 0])
    (note,) = client_reader().feed(frame(body))
    assert note.payload == b""
    body = msgspec.msgpack.encode(["Event", "e1", {"price": 1.0}, 0, "EVENT_NEW", None, 0.0, 0, "", 0, -1])
    (ev,) = peer_reader().feed(frame(body))
    assert ev.payload == b""


def test_a_payload_that_is_not_bytes_is_a_remote_protocol_error():
    body = msgspec.msgpack.encode(["Publish", 1, {"price": 1.0}, 0.0, "", 0, "e1", "text, not bin"])
    with pytest.raises(RemoteProtocolError):
        client_reader().feed(frame(body))


def test_a_newer_peers_extra_trailing_field_is_ignored():
    # Every field this version knows, then one from a future version.
    known = msgspec.msgpack.decode(msgspec.msgpack.encode(pm.PeerHello(1, "local", True)))
    body = msgspec.msgpack.encode([*known, "a field from the future"])
    assert peer_reader().feed(frame(body)) == [pm.PeerHello(1, "local", True)]


def test_an_older_peers_hello_without_trailing_fields_decodes_with_defaults():
    body = msgspec.msgpack.encode(["PeerHello", 1, "local", True])
    assert peer_reader().feed(frame(body)) == [pm.PeerHello(1, "local", True)]


# -- split frames ---------------------------------------------------------------------------

ALL_FRAMES = [(peer_reader, m) for m in PEER_MESSAGES] + [(client_reader, m) for m in CLIENT_MESSAGES]


@pytest.mark.parametrize(("make", "msg"), ALL_FRAMES, ids=lambda x: _id(x) if not callable(x) else x.__name__)
def test_frame_split_at_every_offset(make, msg):
    data = encode_frame(msg)
    for cut in range(len(data) + 1):
        r = make()
        first = r.feed(data[:cut])
        second = r.feed(data[cut:])
        if cut == len(data):
            assert first == [msg] and second == []
        else:
            assert first == [] and second == [msg], cut
        assert r.buffered == 0


@pytest.mark.parametrize(("make", "msg"), ALL_FRAMES, ids=lambda x: _id(x) if not callable(x) else x.__name__)
def test_frame_fed_byte_by_byte(make, msg):
    data = encode_frame(msg)
    r = make()
    for i in range(len(data) - 1):
        assert r.feed(data[i : i + 1]) == []
        assert r.buffered == i + 1
    assert r.feed(data[-1:]) == [msg]
    assert r.buffered == 0


def test_several_frames_in_one_feed():
    data = b"".join(encode_frame(m) for m in PEER_MESSAGES)
    assert peer_reader().feed(data) == PEER_MESSAGES
    data = b"".join(encode_frame(m) for m in CLIENT_MESSAGES)
    assert client_reader().feed(data) == CLIENT_MESSAGES


def test_several_frames_and_a_partial_one():
    whole = [encode_frame(m) for m in PEER_MESSAGES[:3]]
    tail = encode_frame(PEER_MESSAGES[3])
    r = peer_reader()
    assert r.feed(b"".join(whole) + tail[:5]) == PEER_MESSAGES[:3]
    assert r.buffered == 5
    assert r.feed(tail[5:]) == [PEER_MESSAGES[3]]
    assert r.buffered == 0


def test_empty_feed_yields_nothing():
    r = peer_reader()
    assert r.feed(b"") == []
    assert r.buffered == 0


@PROPS
@given(st.lists(st.integers(min_value=0), max_size=40))
def test_stream_cut_anywhere_yields_every_message_in_order(cuts):
    data = b"".join(encode_frame(m) for m in PEER_MESSAGES)
    points = sorted({c % (len(data) + 1) for c in cuts})
    r = peer_reader()
    out: list[pm.PeerMessage] = []
    prev = 0
    for p in [*points, len(data)]:
        out += r.feed(data[prev:p])
        prev = p
    assert out == PEER_MESSAGES
    assert r.buffered == 0


# -- size limits ------------------------------------------------------------------------------


def _error_of_size(size: int) -> pm.PeerError:
    """A PeerError whose body is exactly ``size`` bytes."""
    base = len(encode(pm.PeerError("c", "")))
    for n in range(size - base - 4, size - base + 1):
        msg = pm.PeerError("c", "x" * n)
        if len(encode(msg)) == size:
            return msg
    raise AssertionError(size)


def test_oversize_prefix_rejected_before_the_body_arrives():
    r = peer_reader(max_size=1024)
    with pytest.raises(RemoteProtocolError, match="1025 bytes"):
        r.feed(HEADER.pack(1025))  # no body at all: the header alone is enough


def test_oversize_prefix_rejected_byte_by_byte():
    r = client_reader(max_size=1024)
    header = HEADER.pack(0xFFFFFFFF)
    for b in header[:-1]:
        assert r.feed(bytes([b])) == []
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        r.feed(header[-1:])


def test_oversize_prefix_after_a_good_frame_in_the_same_feed():
    r = peer_reader(max_size=1024)
    with pytest.raises(RemoteProtocolError):
        r.feed(encode_frame(PEER_MESSAGES[0]) + HEADER.pack(1 << 30) + b"\x00" * 10)


def test_default_limit_is_one_mebibyte():
    r = peer_reader()
    assert r.max_size == DEFAULT_MAX_FRAME_SIZE == 1 << 20
    with pytest.raises(RemoteProtocolError):
        r.feed(HEADER.pack(DEFAULT_MAX_FRAME_SIZE + 1))


def test_frame_of_exactly_the_limit_is_accepted():
    msg = _error_of_size(1024)
    data = encode_frame(msg, max_size=1024)
    assert peer_reader(max_size=1024).feed(data) == [msg]
    with pytest.raises(RemoteProtocolError):
        peer_reader(max_size=1023).feed(data)


def test_encode_frame_of_an_oversize_message_is_a_local_error():
    msg = _error_of_size(1025)
    with pytest.raises(LocalProtocolError, match="PeerError encodes to 1025 bytes"):
        encode_frame(msg, max_size=1024)
    big = cm.Notify("e", {"note": "x" * DEFAULT_MAX_FRAME_SIZE}, ("s",))
    with pytest.raises(LocalProtocolError):
        encode_frame(big)


# -- bad frames --------------------------------------------------------------------------------

BAD_PEER_BODIES = {
    "garbage": b"\xc1\xc1\xc1",  # 0xc1 is never used by msgpack
    "truncated msgpack": msgspec.msgpack.encode(["PeerHello", 1, "local"])[:-2],
    "empty body": b"",
    "not an array": msgspec.msgpack.encode({"PeerHello": 1}),
    "unknown tag": msgspec.msgpack.encode(["Bogus", 1, 2]),
    "client tag on a peer link": encode(cm.Hello("x")),
    "tag of wrong type": msgspec.msgpack.encode([7, 1, "local"]),
    "wrong field type": msgspec.msgpack.encode(["PeerHello", "one", "local"]),
    "missing field": msgspec.msgpack.encode(["PeerHello", 1]),
    "node id out of range": msgspec.msgpack.encode(["PeerHello", 70000, "local"]),
    "bad enum value": msgspec.msgpack.encode(["Event", "e", {}, 0, "EVENT_SOMETIMES"]),
    "bad nested struct": msgspec.msgpack.encode(
        ["Subscription", "s", [[["price", "~~", [1]]]], "c", 0, "SUBSCRIBE_NEW"]
    ),
    "event value of wrong type": msgspec.msgpack.encode(["Event", "e", {"price": [1]}, 0, "EVENT_NEW"]),
    "bad channel id": msgspec.msgpack.encode(["ReplyChannelTransfer", "REPLY_SUCCESS", [["0", "1"]]]),
    "identifier too long": msgspec.msgpack.encode(["NotificationAck", "e" * 300, []]),
    "deeply nested": b"\x94\xa5Event\xa1e\x81\xa5price" + b"\x91" * 5000 + b"\x01",
    "invalid utf-8 in the tag": b"\x91\xa2\x00\x80",
    "invalid utf-8 in a field": b"\x93\xa9PeerHello\x01\xa2\x00\x80",
    "a nonce too short to be fresh": msgspec.msgpack.encode(["PeerAuth", 1, "local", b"n" * 8]),
    "a proof too short": msgspec.msgpack.encode(["PeerProof", b"p" * 4]),
}

BAD_CLIENT_BODIES = {
    "garbage": b"\xc1",
    "unknown tag": msgspec.msgpack.encode(["Bogus"]),
    "peer tag on a client link": encode(pm.PeerHello(1, "local")),
    "wrong field type": msgspec.msgpack.encode(["Publish", "one", "{price: 1}"]),
    "negative seq": msgspec.msgpack.encode(["Subscribe", -1, "s", "price < 1"]),
    "empty client id": msgspec.msgpack.encode(["Hello", ""]),
    "event map value of wrong type": msgspec.msgpack.encode(["Publish", 1, {"price": None}]),
    "unhashable map key": b"\x94\xa5Admin\x01\xa1x\x81\xa1a\x81\x81\x01\x02\x01",
    "invalid utf-8 in an event key": b"\x93\xa7Publish\x01\x81\xa2\xff\xfe\x01",
    "invalid utf-8 in free-form args": b"\x94\xa5Admin\x01\xa1x\x81\xa1a\xa2\xff\xfe",
    # Admin args are free-form, so only the decoder's depth limit stops this one.
    "deeply nested admin args": b"\x94\xa5Admin\x01\xa1x\x81\xa1a" + b"\x91" * 5000 + b"\x01",
}


@pytest.mark.parametrize("body", BAD_PEER_BODIES.values(), ids=BAD_PEER_BODIES.keys())
def test_bad_peer_frame_is_a_remote_protocol_error(body):
    with pytest.raises(RemoteProtocolError) as info:
        peer_reader().feed(frame(body))
    # Wrapped once, at the codec, from the msgspec error (STYLE habit 3).
    assert isinstance(info.value.__cause__, (msgspec.MsgspecError, RecursionError, UnicodeDecodeError))


@pytest.mark.parametrize("body", BAD_CLIENT_BODIES.values(), ids=BAD_CLIENT_BODIES.keys())
def test_bad_client_frame_is_a_remote_protocol_error(body):
    with pytest.raises(RemoteProtocolError):
        client_reader().feed(frame(body))


def test_the_reader_keeps_the_frame_that_failed_and_tells_a_peer_message_from_garbage():
    # A node refuses a peer message on a client connection as such (net.clients rule 5).
    r = client_reader()
    peer_body = encode(pm.PeerHello(1, "local"))
    with pytest.raises(RemoteProtocolError):
        r.feed(encode_frame(cm.Ack("e")) + frame(peer_body))
    assert r.bad == peer_body and is_peer_frame(r.bad)
    g = client_reader()
    with pytest.raises(RemoteProtocolError):
        g.feed(frame(b"\xc1"))
    assert g.bad == b"\xc1" and not is_peer_frame(g.bad)
    assert client_reader().bad is None


def test_bad_frame_fed_byte_by_byte_fails_only_when_complete():
    data = frame(BAD_CLIENT_BODIES["unknown tag"])
    r = client_reader()
    for i in range(len(data) - 1):
        assert r.feed(data[i : i + 1]) == []
    with pytest.raises(RemoteProtocolError, match="invalid message"):
        r.feed(data[-1:])


def test_moderate_nesting_in_free_form_fields_still_decodes():
    args: object = 1
    for _ in range(50):
        args = [args]
    msg = cm.Admin(1, "status", {"a": args})
    assert client_reader().feed(encode_frame(msg)) == [msg]
