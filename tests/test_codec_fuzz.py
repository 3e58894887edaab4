"""overlay.messages.codec under fuzzing: whatever bytes arrive, only ``RemoteProtocolError``.

SPEC §9 and STYLE habit 5: every decode failure of a frame from the network is
``RemoteProtocolError``, never another exception; what does decode is a
well-typed message that encodes again. (Framing, round trips and the named bad
frames are in ``test_codec``.)
"""

from __future__ import annotations

import typing

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.errors import RemoteProtocolError
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, ClientUnion, client_reader, encode_frame, peer_reader

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


# -- fuzz --------------------------------------------------------------------------------------


def _feed_all(make, data: bytes, chunk: int) -> None:
    r = make()
    try:
        for i in range(0, len(data), chunk):
            r.feed(data[i : i + chunk])
    except RemoteProtocolError:
        pass  # the one allowed failure


@PROPS
@given(st.binary(max_size=2048), st.integers(min_value=1, max_value=64))
def test_fuzz_raw_bytes_raise_only_remote_protocol_errors(data, chunk):
    for make in (peer_reader, client_reader):
        _feed_all(make, data, chunk)


@PROPS
@given(st.binary(max_size=2048))
def test_fuzz_framed_bytes_raise_only_remote_protocol_errors(body):
    # With a correct length prefix the body reaches the decoder.
    for make in (peer_reader, client_reader):
        _feed_all(make, frame(body), len(body) + 4)


_TAGS = [cls.__name__ for cls in typing.get_args(pm.PeerUnion)] + [cls.__name__ for cls in typing.get_args(ClientUnion)]
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=8)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(PROPS, max_examples=150)
@given(st.sampled_from(_TAGS), st.lists(_values, max_size=8))
def test_fuzz_tagged_arrays_raise_only_remote_protocol_errors(tag, fields):
    body = msgspec.msgpack.encode([tag, *fields])
    for make in (peer_reader, client_reader):
        r = make()
        try:
            out = r.feed(frame(body))
        except RemoteProtocolError:
            continue
        # Whatever decodes is a well-typed message that encodes again.
        assert len(out) == 1
        assert make().feed(encode_frame(out[0], max_size=1 << 30)) == out
