"""The wire: peer and client messages and their framing (SPEC §9)."""

from overlay.messages import client, peer
from overlay.messages.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameReader,
    client_reader,
    encode,
    encode_frame,
    peer_reader,
)

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FrameReader",
    "client",
    "client_reader",
    "encode",
    "encode_frame",
    "peer",
    "peer_reader",
]
