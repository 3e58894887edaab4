"""The throughput bench's MQTT 3.1.1 codec (bench/mqtt_codec.py): every packet
it speaks survives encode → decode, split anywhere; the bytes are the
standard's; what it does not speak, and what exceeds its bounds, is refused
by name and poisons the stream."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

# bench/ is not a package: its modules import each other by bare name.
from mqtt_codec import (
    ConnAck,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttProtocolError,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    encode,
    puback,
    publish_prefix,
)

PACKETS: list[Packet] = [
    Connect("pub-1", 60),
    Connect("", 0, clean_session=False),
    ConnAck(),
    ConnAck(5, session_present=True),
    Subscribe(1, (("bench/t", 0),)),
    Subscribe(65535, (("a/#", 1), ("b/+/c", 2))),
    SubAck(1, (0,)),
    SubAck(7, (0, 1, 0x80)),
    Publish("bench/t", b"x" * 100),
    Publish("t", b"", retain=True),
    Publish("ü/ß", bytes(range(256)) * 3),  # a two-byte remaining length
    Publish("bench/t", b"q" * 100, qos=1, packet_id=1),
    Publish("t", b"", retain=True, qos=1, packet_id=65535, dup=True),
    PubAck(1),
    PubAck(65535),
    PingReq(),
    PingResp(),
    Disconnect(),
]


@pytest.mark.parametrize("packet", PACKETS, ids=lambda p: type(p).__name__)
def test_round_trip(packet: Packet) -> None:
    assert MqttDecoder().feed(encode(packet)) == [packet]


def test_a_stream_fed_byte_by_byte_gives_every_packet_in_order() -> None:
    stream = b"".join(encode(p) for p in PACKETS)
    dec = MqttDecoder()
    out: list[Packet] = []
    for i in range(len(stream)):
        out += dec.feed(stream[i : i + 1])
    assert out == PACKETS
    assert dec.buffered == 0


def test_a_stream_split_at_every_point() -> None:
    stream = encode(PACKETS[10]) + encode(PACKETS[8])  # a long length, then a short one
    for cut in range(len(stream) + 1):
        dec = MqttDecoder()
        assert dec.feed(stream[:cut]) + dec.feed(stream[cut:]) == [PACKETS[10], PACKETS[8]]


def test_the_standards_bytes() -> None:
    # MQTT 3.1.1 §3.1, §3.2, §3.8, §3.9, §3.3, §3.12–3.14.
    assert encode(Connect("c", 60)) == b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"
    assert encode(ConnAck()) == b"\x20\x02\x00\x00"
    assert encode(Subscribe(10, (("a/b", 0),))) == b"\x82\x08\x00\x0a\x00\x03a/b\x00"
    assert encode(SubAck(10, (0,))) == b"\x90\x03\x00\x0a\x00"
    assert encode(Publish("a", b"hi")) == b"\x30\x05\x00\x01ahi"
    assert encode(PingReq()) == b"\xc0\x00"
    assert encode(PingResp()) == b"\xd0\x00"
    assert encode(Disconnect()) == b"\xe0\x00"
    # 128 bytes of remaining length take two bytes: 0x80 0x01.
    assert encode(Publish("a", b"x" * 125))[:2] == b"\x30\x80"


def test_publish_prefix_is_the_packet_before_its_payload() -> None:
    body = b"y" * 100
    assert publish_prefix("bench/t", len(body)) + body == encode(Publish("bench/t", body))
    # At QoS 1 the packet id comes between the prefix and the payload.
    q1 = Publish("bench/t", body, qos=1, packet_id=0x1234)
    assert publish_prefix("bench/t", len(body), qos=1) + b"\x12\x34" + body == encode(q1)
    with pytest.raises(MqttProtocolError, match="QoS 2"):
        publish_prefix("bench/t", 1, qos=2)


def test_qos1_bytes_and_puback() -> None:
    # MQTT 3.1.1 §3.3 (QoS bits 01, the packet id after the topic) and §3.4.
    assert encode(Publish("a", b"hi", qos=1, packet_id=10)) == b"\x32\x07\x00\x01a\x00\x0ahi"
    assert encode(PubAck(10)) == b"\x40\x02\x00\x0a" == puback(10)


@given(
    topic=st.text(max_size=60),
    payload=st.binary(max_size=600),
    retain=st.booleans(),
    packet_id=st.integers(min_value=0, max_value=65535),
    cuts=st.lists(st.integers(min_value=0, max_value=700), max_size=4),
)
def test_publish_round_trips_however_the_bytes_are_split(
    topic: str, payload: bytes, retain: bool, packet_id: int, cuts: list[int]
) -> None:
    # packet_id 0: QoS 0; otherwise QoS 1 with that id.
    packet = Publish(topic, payload, retain, qos=1 if packet_id else 0, packet_id=packet_id)
    data = encode(packet) * 2
    dec = MqttDecoder()
    out: list[Packet] = []
    prev = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        out += dec.feed(data[prev:cut])
        prev = cut
    assert out == [packet, packet]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x34\x07\x00\x01a\x00\x01hi", "QoS 2"),
        (b"\x36\x07\x00\x01a\x00\x01hi", "QoS 3"),
        (b"\x38\x05\x00\x01ahi", "DUP"),
        (b"\x32\x07\x00\x01a\x00\x00hi", "packet id 0"),
        (b"\x32\x04\x00\x01a\x00", "room for its packet id"),
        (b"\x40\x02\x00\x00", "PUBACK of packet id 0"),
        (b"\x42\x02\x00\x01", "malformed PUBACK"),
        (b"\x40\x03\x00\x01\x00", "malformed PUBACK"),
        (b"\x50\x02\x00\x01", "PUBREC"),
        (b"\x00\x00", "reserved packet type 0"),
        (b"\x80\x06\x00\x01\x00\x01a\x00", "SUBSCRIBE with flags 0"),
        (b"\x10\x0d\x00\x04MQTT\x04\xc2\x00\x3c\x00\x01c", "user name or password"),
        (b"\x10\x0c\x00\x06MQIsdp\x03\x02\x00\x3c", "only MQTT 3.1.1"),
        (b"\x30\x05\x00\x09ahi", "runs past the end"),
        (b"\x30\x05\x00\x02\xff\xfehi", "not UTF-8"),
        (b"\xc0\x01\x00", "PINGREQ must be two bytes"),
        (b"\x90\x03\x00\x01\x07", "SUBACK return codes"),
        (b"\x30\xff\xff\xff\xff\x01", "longer than four bytes"),
        (b"\x30\x81\x80\x40", "exceeds this decoder's"),
    ],
)
def test_refused_by_name(data: bytes, words: str) -> None:
    dec = MqttDecoder()
    with pytest.raises(MqttProtocolError, match=words):
        dec.feed(data)
    # The framing is lost: the decoder stays failed (rule 4).
    with pytest.raises(MqttProtocolError, match="already failed"):
        dec.feed(encode(PingResp()))


def test_an_oversize_packet_is_refused_before_its_body_arrives() -> None:
    dec = MqttDecoder(max_packet=1000)
    head = encode(Publish("t", b"z" * 5000))[:3]  # the type and the length only
    with pytest.raises(MqttProtocolError, match="5,003 bytes exceeds"):
        dec.feed(head)


@pytest.mark.parametrize(
    "packet",
    [
        Subscribe(1, ()),
        Subscribe(1, (("t", 3),)),
        Subscribe(70000, (("t", 0),)),
        SubAck(1, (5,)),
        ConnAck(256),
        Connect("c", -1),
        Publish("t" * 70000, b""),
        Publish("t", b"", qos=2, packet_id=1),
        Publish("t", b"", packet_id=1),
        Publish("t", b"", dup=True),
        Publish("t", b"", qos=1),
        Publish("t", b"", qos=1, packet_id=70000),
        PubAck(0),
        PubAck(70000),
    ],
    ids=repr,
)
def test_encode_refuses_what_mqtt_cannot_say(packet: Packet) -> None:
    with pytest.raises(MqttProtocolError):
        encode(packet)


def test_a_decoder_bound_below_a_one_byte_packet_is_refused() -> None:
    with pytest.raises(ValueError, match="max_packet"):
        MqttDecoder(max_packet=10)
