"""Fuzzing the frame reader and the message decoders (issue 17 item 5, SPEC §9, §16).

Whatever bytes a client or a peer sends, ``FrameReader.feed`` either yields
messages of its protocol's union — each one the typed decoder takes again
from its own encoding, so every declared bound holds — or raises
``RemoteProtocolError``: never another exception, never a hang, never a
buffer past one header and one frame.  Inputs: random bytes, valid frames
of every message type with a field replaced (wrong type, NaN, ±inf, 1e308,
huge and negative integers, empty and long strings and tuples, unknown enum
values: ``overlay.testing._mutate``), streams cut short, cut anywhere and
fed in pieces, rewritten length prefixes.  Bounded: a few hundred examples
per test, a few seconds in all.
"""

from __future__ import annotations

import contextlib
import random
import typing

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import LOCAL
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, ClientUnion, FrameReader, client_reader, encode, encode_frame, peer_reader
from overlay.testing import Mutator, samples

pytestmark = pytest.mark.timeout(120)

MAX = 64 * 1024  # a small limit, so oversize is cheap to reach
CLIENT, PEER = samples(LOCAL.schema)
READERS = {"client": (client_reader, CLIENT, ClientUnion), "peer": (peer_reader, PEER, pm.PeerUnion)}
FEW = settings(max_examples=40, deadline=None)
SOME = settings(max_examples=200, deadline=None)


def _name(m: object) -> str:
    return type(m).__name__


def test_the_samples_hold_one_message_of_every_type() -> None:
    assert {type(m) for m in CLIENT} == set(typing.get_args(ClientUnion))
    assert {type(m) for m in PEER} == set(typing.get_args(pm.PeerUnion))


def fed(reader: FrameReader[typing.Any], data: bytes, cuts: list[int], union: object) -> list[object]:
    """Feed ``data`` in pieces; every message out is of ``union`` and decodes
    again from its own encoding (so its bounds hold), or ``feed`` raised
    ``RemoteProtocolError`` (propagated); the buffer never holds more than
    one header and one frame past what was just fed."""
    out: list[object] = []
    prev = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        piece = data[prev:cut]
        prev = cut
        got = reader.feed(piece)
        assert reader.buffered <= HEADER.size + reader.max_size + len(piece)
        for m in got:
            assert isinstance(m, typing.get_args(union))
            again = msgspec.msgpack.Decoder(union).decode(encode(m))
            assert encode(again) == encode(m)  # NaN-safe equality
        out += got
    return out


@SOME
@pytest.mark.parametrize("side", READERS)
@given(data=st.binary(max_size=2048), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_random_bytes_decode_or_raise_a_protocol_error(side: str, data: bytes, cuts: list[int]) -> None:
    make, _, union = READERS[side]
    with contextlib.suppress(RemoteProtocolError):
        fed(make(MAX), data, cuts, union)


@SOME
@pytest.mark.parametrize("side", READERS)
@given(body=st.binary(max_size=512), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_a_well_framed_random_body_decodes_or_raises_a_protocol_error(side: str, body: bytes, cuts: list[int]) -> None:
    """Garbage behind a correct prefix: the decoder, not the splitter, judges it."""
    make, _, union = READERS[side]
    try:
        out = fed(make(MAX), HEADER.pack(len(body)) + body, cuts, union)
    except RemoteProtocolError:
        return
    assert len(out) == 1


@SOME
@pytest.mark.parametrize("side", READERS)
@given(size=st.integers(min_value=MAX + 1, max_value=2**32 - 1), tail=st.binary(max_size=64))
def test_an_oversize_prefix_is_refused_on_its_four_bytes(side: str, size: int, tail: bytes) -> None:
    make, _, _ = READERS[side]
    r = make(MAX)
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        r.feed(HEADER.pack(size) + tail)


@SOME
@pytest.mark.parametrize("side", READERS)
@given(picks=st.lists(st.integers(min_value=0), min_size=1, max_size=6), cuts=st.lists(st.integers(min_value=0)))
def test_valid_frames_split_anywhere_come_out_whole_and_in_order(side: str, picks: list[int], cuts: list[int]) -> None:
    make, msgs, union = READERS[side]
    sent = [msgs[i % len(msgs)] for i in picks]
    data = b"".join(encode_frame(m) for m in sent)
    r = make(MAX)
    assert [encode(m) for m in fed(r, data, cuts, union)] == [encode(m) for m in sent]
    assert r.buffered == 0


@pytest.mark.parametrize("msg", CLIENT + PEER, ids=_name)
def test_every_message_truncated_anywhere_waits_for_the_rest(msg: object) -> None:
    make = client_reader if isinstance(msg, cm.ClientMessage) else peer_reader
    data = encode_frame(msg)  # type: ignore[arg-type]
    for cut in range(len(data)):
        r = make(MAX)
        assert r.feed(data[:cut]) == []
        assert r.buffered == cut
        assert [encode(m) for m in r.feed(data[cut:])] == [encode(msg)]  # type: ignore[arg-type]


@FEW
@pytest.mark.parametrize("msg", CLIENT + PEER, ids=_name)
@given(rng=st.randoms(use_true_random=False), cuts=st.lists(st.integers(min_value=0), max_size=4))
def test_every_message_type_with_mutated_fields_decodes_valid_or_raises(
    msg: msgspec.Struct, rng: random.Random, cuts: list[int]
) -> None:
    """A field anywhere in the message replaced, dropped, added, grown, its
    tag swapped, another message's part spliced in (1–3 times)."""
    side = "client" if isinstance(msg, cm.ClientMessage) else "peer"
    make, donors, union = READERS[side]
    body = Mutator(rng, max_size=MAX).message(msg, list(donors))
    with contextlib.suppress(RemoteProtocolError):
        fed(make(MAX), HEADER.pack(len(body)) + body, cuts, union)


@SOME
@pytest.mark.parametrize("side", READERS)
@given(rng=st.randoms(use_true_random=False), picks=st.lists(st.integers(min_value=0), min_size=1, max_size=4))
def test_mutated_streams_decode_valid_or_raise(side: str, rng: random.Random, picks: list[int]) -> None:
    """Bytes of valid frames cut short, bit-flipped, with bytes inserted or
    deleted, a prefix rewritten, garbage in front, a nesting past the depth
    limit behind."""
    make, msgs, union = READERS[side]
    m = Mutator(rng, max_size=MAX)
    data = m.frames([encode(msgs[i % len(msgs)]) for i in picks])
    with contextlib.suppress(RemoteProtocolError):
        fed(make(MAX), data, [rng.randrange(len(data) + 1) for _ in range(3)], union)
