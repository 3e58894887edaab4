"""overlay.client.limits: the checks of a caller's arguments, refused before anything is sent."""

from __future__ import annotations

import pytest

from overlay.client.limits import check_payload
from overlay.errors import LocalProtocolError, RequestError
from overlay.messages import client as cm


def test_bytes_pass_through_without_a_copy() -> None:
    data = bytes(range(256)) * 4
    assert check_payload(data) is data
    assert check_payload(b"") == b""


def test_text_is_sent_as_utf8_and_buffers_are_copied_once() -> None:
    assert check_payload("café ✓") == "café ✓".encode()
    assert check_payload(bytearray(b"\x00\x01")) == b"\x00\x01"
    assert check_payload(memoryview(b"abc")[1:]) == b"bc"
    assert type(check_payload(bytearray(b"a"))) is bytes


@pytest.mark.parametrize("bad", [None, 3, 1.5, ["a"], {"a": 1}, object()])
def test_anything_else_is_a_local_error_naming_the_type(bad: object) -> None:
    with pytest.raises(LocalProtocolError, match="a payload is bytes or str"):
        check_payload(bad)


def test_over_the_nodes_limit_is_refused_as_the_node_would() -> None:
    assert len(check_payload(b"x" * 10, 10)) == 10
    with pytest.raises(RequestError) as err:
        check_payload(b"x" * 11, 10)
    assert err.value.code == cm.ErrorCode.PAYLOAD_TOO_LARGE
    assert "11 bytes" in str(err.value) and "max_payload" in str(err.value)
    assert len(check_payload(b"x" * 1000, 0)) == 1000  # 0: the limit is not known yet, the node judges
