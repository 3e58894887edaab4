"""overlay.messages.codec rule 4: one event's Notifies, encoded once.

``NotifyFrames`` encodes an event and its payload once and splices each
session's ``sub_ids`` around them; the frames must be byte for byte what
``encode_frame`` makes of the whole Notify, and keep its size limit.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.errors import LocalProtocolError
from overlay.messages import client as cm
from overlay.messages.codec import NotifyFrames, client_reader, encode_frame

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- rule 4: one event's Notifies, encoded once ------------------------------------------------

_event_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
_local_ids = st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=5).map(tuple)


@PROPS
@given(
    event=st.dictionaries(st.text(max_size=12), _event_values, max_size=8),
    ids=st.lists(_local_ids, min_size=1, max_size=6),
    publish_time=st.floats(allow_nan=True, allow_infinity=True),
    key=st.text(max_size=20),
    rank=st.integers(min_value=0, max_value=2**53),
    tag=st.integers(min_value=0, max_value=2**40),
    payload=st.binary(max_size=300),
)
def test_notify_frames_are_byte_for_byte_the_plain_encoding(event, ids, publish_time, key, rank, tag, payload):
    """Rule 4: every frame NotifyFrames splices equals encode_frame of the whole
    Notify with those sub_ids, and decodes back to it."""
    msg = cm.Notify("7-kx-12", event, ids[0], publish_time, key, rank, tag, payload)
    frames = NotifyFrames(msg)
    for sub_ids in ids:
        whole = msgspec.structs.replace(msg, sub_ids=sub_ids)
        assert frames.frame(sub_ids) == encode_frame(whole)
        assert frames.notify(sub_ids) == whole
        (back,) = client_reader().feed(frames.frame(sub_ids))
        assert back.sub_ids == sub_ids and back.payload == payload and back.event_id == msg.event_id


def test_notify_frames_share_one_frame_per_distinct_sub_ids():
    msg = cm.Notify("e1", {"price": 1.0}, ("s1",), 2.5, payload=b"x" * 100)
    frames = NotifyFrames(msg)
    assert frames.frame(("s1",)) is frames.frame(("s1",))
    other = frames.frame(("s2", "s3"))
    assert frames.frame(("s2", "s3")) is other
    assert other == encode_frame(cm.Notify("e1", {"price": 1.0}, ("s2", "s3"), 2.5, payload=b"x" * 100))
    assert frames.notify(("s1",)) is msg


def test_a_notify_frame_over_the_limit_is_a_local_error():
    """Rule 4 keeps encode_frame's limit: a frame too large to send is the sender's error."""
    msg = cm.Notify("e", {"price": 1.0}, ("s",), payload=b"x" * 900)
    frames = NotifyFrames(msg, max_size=1000)
    assert len(frames.frame(("s",))) < 1000
    with pytest.raises(LocalProtocolError, match="over the frame limit 1000"):
        frames.frame(tuple(f"sub-{i}" for i in range(20)))
