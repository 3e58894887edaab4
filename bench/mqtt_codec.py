"""A small MQTT 3.1.1 codec for the throughput bench's raw client: bytes in,
packets out, and packets to bytes — no socket, no event loop, no clock.

paho-mqtt, the client the bench used, spends enough CPU per message that on
a 2-core machine it, not Mosquitto, set the pace (issue 19 item 2).  The
bench only needs a handful of packets, so it speaks them itself.

Rules:

1. **The packets**: CONNECT, CONNACK, SUBSCRIBE, SUBACK, PUBLISH at QoS 0
   and 1, PUBACK, PINGREQ, PINGRESP and DISCONNECT, as MQTT 3.1.1 (OASIS
   standard, §3) lays them out; each is a ``msgspec.Struct`` and ``encode``
   turns any of them into one whole packet.  QoS 1 is there so the bench can
   set Mosquitto beside the overlay with the same guarantees: an
   acknowledgement to the publisher and one from the subscriber.  Anything
   else — another packet type, QoS 2, a CONNECT with a will, user name or
   password, reserved flags set — is refused with ``MqttProtocolError``
   naming it, never guessed at.
2. **Decoding is incremental**: ``MqttDecoder.feed(data)`` returns the
   packets ``data`` completes, in order, and keeps the partial one; bytes
   may arrive split anywhere (one at a time included).
3. **Bounded**: a packet whose remaining length exceeds the decoder's
   ``max_packet`` is refused as soon as its length is read, before its body
   is buffered; a remaining length longer than four bytes (the standard's
   limit) is refused; so the buffer never holds more than one packet plus
   what one ``feed`` brought.
4. **After an error the decoder is done**: the stream has lost its framing,
   so every later ``feed`` raises too (the caller closes the connection).
5. **The hot path is PUBLISH**: it is decoded inline in ``feed`` and its
   remaining length of one byte (≤ 127, the bench's 109) takes no loop.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

# The standard caps the remaining length at four bytes of seven bits.
MAX_REMAINING: Final = 268_435_455
# The bench's messages are ~110 bytes; a megabyte is far beyond any of them
# and still small enough to buffer.
MAX_PACKET: Final = 1 << 20
PROTOCOL_NAME: Final = b"MQTT"
PROTOCOL_LEVEL: Final = 4  # 3.1.1
# CONNECT flags (§3.1.2.3): bit 1 clean session; bits 2–7 will, user, password.
CLEAN_SESSION: Final = 0x02
UNSUPPORTED_CONNECT_FLAGS: Final = 0xFD  # everything but clean session; bit 0 is reserved

# Packet types (§2.2.1), the high nibble of the first byte.
CONNECT: Final = 1
CONNACK: Final = 2
PUBLISH: Final = 3
PUBACK: Final = 4
SUBSCRIBE: Final = 8
SUBACK: Final = 9
PINGREQ: Final = 12
PINGRESP: Final = 13
DISCONNECT: Final = 14
_NAMES: Final = {
    1: "CONNECT",
    2: "CONNACK",
    3: "PUBLISH",
    4: "PUBACK",
    5: "PUBREC",
    6: "PUBREL",
    7: "PUBCOMP",
    8: "SUBSCRIBE",
    9: "SUBACK",
    10: "UNSUBSCRIBE",
    11: "UNSUBACK",
    12: "PINGREQ",
    13: "PINGRESP",
    14: "DISCONNECT",
}

_U16: Final = struct.Struct(">H")


class MqttProtocolError(ValueError):
    """Bytes that are not a packet this codec speaks (rule 1), or a packet
    beyond its bounds (rule 3); the message names which."""


class Connect(msgspec.Struct, frozen=True):
    client_id: str
    keepalive: int = 60  # seconds; 0 turns the broker's keep-alive off
    clean_session: bool = True


class ConnAck(msgspec.Struct, frozen=True):
    return_code: int = 0  # 0 accepted; 1–5 refused (§3.2.2.3)
    session_present: bool = False


class Subscribe(msgspec.Struct, frozen=True):
    packet_id: int
    topics: tuple[tuple[str, int], ...]  # (filter, requested QoS)


class SubAck(msgspec.Struct, frozen=True):
    packet_id: int
    return_codes: tuple[int, ...]  # granted QoS, or 0x80 for a failure


class Publish(msgspec.Struct, frozen=True):
    """A PUBLISH at QoS 0 (no packet id: ``packet_id`` 0) or QoS 1 (a packet
    id of 1–65535, §2.3.1; the receiver answers it with a ``PubAck``).
    ``dup`` (§3.3.1.1) may only be set at QoS 1."""

    topic: str
    payload: bytes
    retain: bool = False
    qos: int = 0
    packet_id: int = 0
    dup: bool = False


class PubAck(msgspec.Struct, frozen=True):
    """The answer to a QoS 1 PUBLISH (§3.4)."""

    packet_id: int


class PingReq(msgspec.Struct, frozen=True):
    pass


class PingResp(msgspec.Struct, frozen=True):
    pass


class Disconnect(msgspec.Struct, frozen=True):
    pass


Packet = Connect | ConnAck | Subscribe | SubAck | Publish | PubAck | PingReq | PingResp | Disconnect


# == encoding ========================================================================


def _remaining(n: int) -> bytes:
    if not 0 <= n <= MAX_REMAINING:
        raise MqttProtocolError(f"remaining length {n} is outside MQTT's 0..{MAX_REMAINING}")
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(s: str) -> bytes:
    raw = s.encode()
    if len(raw) > 0xFFFF:
        raise MqttProtocolError(f"a string of {len(raw)} UTF-8 bytes: MQTT's strings hold at most 65,535")
    return _U16.pack(len(raw)) + raw


def _u16(n: int, what: str) -> bytes:
    if not 0 <= n <= 0xFFFF:
        raise MqttProtocolError(f"{what} {n} is outside 0..65535")
    return _U16.pack(n)


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _remaining(len(body)) + body


def publish_prefix(topic: str, payload_len: int, qos: int = 0) -> bytes:
    """The bytes of a PUBLISH of ``topic`` before its payload of
    ``payload_len`` bytes: a publisher appends each payload to it instead of
    encoding the same header per message.  At QoS 1 the packet id comes
    between the two: the publisher appends its two bytes, then the payload."""
    if qos not in (0, 1):
        raise MqttProtocolError(f"PUBLISH at QoS {qos}: this codec speaks QoS 0 and 1")
    head = _string(topic)
    return bytes([PUBLISH << 4 | qos << 1]) + _remaining(len(head) + 2 * qos + payload_len) + head


def puback(packet_id: int) -> bytes:
    """A PUBACK's four bytes (the subscriber's hot path: no Struct)."""
    return b"\x40\x02" + _u16(packet_id, "packet id")


def encode(p: Packet) -> bytes:
    """One whole packet (rule 1)."""
    match p:
        case Publish(topic, payload, retain, 0, packet_id, dup):
            if packet_id or dup:
                raise MqttProtocolError("a QoS 0 PUBLISH has no packet id and no DUP flag (§2.3.1, §3.3.1.1)")
            return _packet(PUBLISH << 4 | int(retain), _string(topic) + payload)
        case Publish(topic, payload, retain, 1, packet_id, dup):
            if not packet_id:
                raise MqttProtocolError("a QoS 1 PUBLISH needs a packet id of 1..65535 (§2.3.1)")
            first = PUBLISH << 4 | int(dup) << 3 | 1 << 1 | int(retain)
            return _packet(first, _string(topic) + _u16(packet_id, "packet id") + payload)
        case Publish(qos=qos):
            raise MqttProtocolError(f"PUBLISH at QoS {qos}: this codec speaks QoS 0 and 1")
        case PubAck(packet_id):
            if not packet_id:
                raise MqttProtocolError("PUBACK of packet id 0: packet ids are 1..65535 (§2.3.1)")
            return _packet(PUBACK << 4, _u16(packet_id, "packet id"))
        case Connect(client_id, keepalive, clean):
            flags = CLEAN_SESSION if clean else 0
            return _packet(
                CONNECT << 4,
                _string(PROTOCOL_NAME.decode())
                + bytes([PROTOCOL_LEVEL, flags])
                + _u16(keepalive, "keep-alive")
                + _string(client_id),
            )
        case ConnAck(code, present):
            if not 0 <= code <= 0xFF:
                raise MqttProtocolError(f"CONNACK return code {code} is not a byte")
            return _packet(CONNACK << 4, bytes([int(present), code]))
        case Subscribe(packet_id, topics):
            if not topics:
                raise MqttProtocolError("a SUBSCRIBE needs at least one topic filter (§3.8.3)")
            body = _u16(packet_id, "packet id")
            for topic, qos in topics:
                if qos not in (0, 1, 2):
                    raise MqttProtocolError(f"requested QoS {qos} for {topic!r}: MQTT has 0, 1 and 2")
                body += _string(topic) + bytes([qos])
            return _packet(SUBSCRIBE << 4 | 0x02, body)
        case SubAck(packet_id, codes):
            bad = [c for c in codes if c not in (0, 1, 2, 0x80)]
            if bad or not codes:
                raise MqttProtocolError(f"SUBACK return codes {list(codes)}: each must be 0, 1, 2 or 0x80")
            return _packet(SUBACK << 4, _u16(packet_id, "packet id") + bytes(codes))
        case PingReq():
            return bytes([PINGREQ << 4, 0])
        case PingResp():
            return bytes([PINGRESP << 4, 0])
        case Disconnect():
            return bytes([DISCONNECT << 4, 0])
    raise TypeError(f"not an MQTT packet of this codec: {p!r}")


# == decoding ========================================================================


class MqttDecoder:
    """Packets out of a byte stream (rules 2–5)."""

    __slots__ = ("_buf", "_failed", "max_packet")

    def __init__(self, max_packet: int = MAX_PACKET) -> None:
        if not 127 <= max_packet <= MAX_REMAINING:
            # A one-byte length (≤ 127) is taken without a check (rule 5).
            raise ValueError(f"max_packet {max_packet}: must be within 127..{MAX_REMAINING}")
        self.max_packet = max_packet
        self._buf = b""
        self._failed: MqttProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of a packet not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Packet]:
        if self._failed is not None:
            raise MqttProtocolError(f"the stream already failed ({self._failed}); close the connection")
        buf = self._buf + data if self._buf else bytes(data)
        out: list[Packet] = []
        n, pos = len(buf), 0
        try:
            while n - pos >= 2:
                first, b = buf[pos], buf[pos + 1]
                if b < 0x80:
                    length, start = b, pos + 2
                else:
                    length, start = self._long_length(buf, pos)
                    if start < 0:
                        break  # the length itself is not all here yet
                end = start + length
                if end > n:
                    break
                if first >> 4 == PUBLISH:  # rule 5
                    qos = (first >> 1) & 3
                    if length < 2:
                        raise MqttProtocolError(f"PUBLISH of {length} bytes has no room for its topic")
                    topic_end = start + 2 + (buf[start] << 8 | buf[start + 1])
                    if topic_end > end:
                        raise MqttProtocolError("PUBLISH topic runs past the end of its packet")
                    topic = _text(buf[start + 2 : topic_end], "topic")
                    if not qos:
                        if first & 0x08:
                            raise MqttProtocolError("PUBLISH with DUP set at QoS 0 (§3.3.1.1 forbids it)")
                        out.append(Publish(topic, buf[topic_end:end], bool(first & 1)))
                    elif qos == 1:
                        if topic_end + 2 > end:
                            raise MqttProtocolError("QoS 1 PUBLISH without room for its packet id")
                        pid = buf[topic_end] << 8 | buf[topic_end + 1]
                        if not pid:
                            raise MqttProtocolError("QoS 1 PUBLISH with packet id 0 (§2.3.1)")
                        payload = buf[topic_end + 2 : end]
                        out.append(Publish(topic, payload, bool(first & 1), 1, pid, bool(first & 0x08)))
                    else:
                        raise MqttProtocolError(f"PUBLISH at QoS {qos}: this codec speaks QoS 0 and 1")
                else:
                    out.append(_decode_other(first, buf[start:end]))
                pos = end
        except MqttProtocolError as exc:
            self._failed = exc
            raise
        self._buf = buf[pos:]
        return out

    def _long_length(self, buf: bytes, pos: int) -> tuple[int, int]:
        """The remaining length at ``buf[pos + 1:]`` and where the body starts,
        or (0, -1) when its bytes are not all here."""
        length, shift, i = 0, 0, pos + 1
        while True:
            if i >= len(buf):
                return 0, -1
            b = buf[i]
            length |= (b & 0x7F) << shift
            i += 1
            if not b & 0x80:
                break
            shift += 7
            if shift >= 28:
                raise MqttProtocolError("remaining length longer than four bytes (§2.2.3)")
        if length > self.max_packet:
            raise MqttProtocolError(
                f"{_NAMES.get(buf[pos] >> 4, 'packet')} of {length:,} bytes exceeds this decoder's {self.max_packet:,}"
            )
        return length, i


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise MqttProtocolError(f"{what} is not UTF-8: {raw[:40]!r}") from exc


def _read_string(body: bytes, pos: int, what: str) -> tuple[str, int]:
    if pos + 2 > len(body):
        raise MqttProtocolError(f"{what}: its length runs past the end of the packet")
    end = pos + 2 + (body[pos] << 8 | body[pos + 1])
    if end > len(body):
        raise MqttProtocolError(f"{what} runs past the end of the packet")
    return _text(body[pos + 2 : end], what), end


def _empty(kind: int, first: int, body: bytes) -> None:
    if first & 0x0F or body:
        raise MqttProtocolError(
            f"{_NAMES[kind]} must be two bytes, flags 0 (got flags {first & 0x0F}, {len(body)} more)"
        )


def _decode_other(first: int, body: bytes) -> Packet:
    kind, flags = first >> 4, first & 0x0F
    match kind:
        case 2:  # CONNACK
            if flags or len(body) != 2 or body[0] & 0xFE:
                raise MqttProtocolError(f"malformed CONNACK: flags {flags}, body {body!r}")
            return ConnAck(body[1], bool(body[0]))
        case 4:  # PUBACK
            if flags or len(body) != 2:
                raise MqttProtocolError(f"malformed PUBACK: flags {flags}, {len(body)} bytes (must be 0 and 2)")
            if not body[0] << 8 | body[1]:
                raise MqttProtocolError("PUBACK of packet id 0 (§2.3.1)")
            return PubAck(body[0] << 8 | body[1])
        case 9:  # SUBACK
            if flags or len(body) < 3:
                raise MqttProtocolError(f"malformed SUBACK: flags {flags}, {len(body)} bytes")
            codes = tuple(body[2:])
            if any(c not in (0, 1, 2, 0x80) for c in codes):
                raise MqttProtocolError(f"SUBACK return codes {list(codes)}: each must be 0, 1, 2 or 0x80")
            return SubAck(body[0] << 8 | body[1], codes)
        case 12 | 13 | 14:  # PINGREQ, PINGRESP, DISCONNECT
            _empty(kind, first, body)
            return PingReq() if kind == PINGREQ else PingResp() if kind == PINGRESP else Disconnect()
        case 1:  # CONNECT
            if flags:
                raise MqttProtocolError(f"CONNECT with flags {flags} (must be 0)")
            name, pos = _read_string(body, 0, "CONNECT protocol name")
            if name != PROTOCOL_NAME.decode() or pos + 4 > len(body) or body[pos] != PROTOCOL_LEVEL:
                raise MqttProtocolError(f"CONNECT for protocol {name!r} level {body[pos : pos + 1]!r}: only MQTT 3.1.1")
            cflags = body[pos + 1]
            if cflags & UNSUPPORTED_CONNECT_FLAGS:
                raise MqttProtocolError(
                    f"CONNECT flags {cflags:#04x}: a will, user name or password is not spoken by this codec"
                )
            keepalive = body[pos + 2] << 8 | body[pos + 3]
            client_id, end = _read_string(body, pos + 4, "CONNECT client id")
            if end != len(body):
                raise MqttProtocolError(f"CONNECT has {len(body) - end} bytes after its client id")
            return Connect(client_id, keepalive, bool(cflags & CLEAN_SESSION))
        case 8:  # SUBSCRIBE
            if flags != 0x02:
                raise MqttProtocolError(f"SUBSCRIBE with flags {flags} (must be 2, §3.8.1)")
            if len(body) < 2:
                raise MqttProtocolError("SUBSCRIBE without a packet id")
            topics: list[tuple[str, int]] = []
            pos = 2
            while pos < len(body):
                topic, pos = _read_string(body, pos, "SUBSCRIBE topic filter")
                if pos >= len(body) or body[pos] > 2:
                    raise MqttProtocolError(f"SUBSCRIBE of {topic!r}: a requested QoS 0, 1 or 2 must follow")
                topics.append((topic, body[pos]))
                pos += 1
            if not topics:
                raise MqttProtocolError("a SUBSCRIBE needs at least one topic filter (§3.8.3)")
            return Subscribe(body[0] << 8 | body[1], tuple(topics))
    raise MqttProtocolError(f"{_NAMES.get(kind, f'reserved packet type {kind}')} is not spoken by this codec")
