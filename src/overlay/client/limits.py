"""The client library's named limits, and the checks of a caller's arguments
that are refused before anything is sent (``LocalProtocolError``)."""

from __future__ import annotations

from typing import Final

from overlay.errors import LocalProtocolError, RequestError
from overlay.messages import client as cm

__all__ = [
    "CLIENT_MAGIC",
    "DEFAULT_QUEUE",
    "MAX_KEY",
    "MAX_TIMEOUT",
    "NOT_READY_RETRY",
    "PUBLISH_WINDOW",
    "PUBLISH_WINDOW_BYTES",
    "REQUEST_TIMEOUT",
    "check_event",
    "check_order",
    "check_payload",
    "check_timeout",
]

# The preamble of a client connection, before the Hello (the node's is the same).
CLIENT_MAGIC: Final = b"OVC1"
# Notifications a subscription queues for the application before it drops them.
DEFAULT_QUEUE: Final = 10_000
# A request's default timeout (seconds): long enough for a loaded cluster's
# subscribe, which waits for every channel holding it.
REQUEST_TIMEOUT: Final = 10.0
# The pause before a request the cluster answered not_ready is sent again.
NOT_READY_RETRY: Final = 0.05
# Unacknowledged publish_windowed() calls before the caller waits.  A PubAck
# comes once the event reached every subscribers' access node (SPEC §16): a
# round trip through the owner and back, tens of ms under load, so the window
# must cover that at the node's full rate (4,000 at 30k events/s: 130 ms) —
# and stay below the node's choke threshold (8,000 by default) so a lone
# publisher is paced by PubAcks rather than by Chokes.
PUBLISH_WINDOW: Final = 4_000
# Payload bytes the unacknowledged pipelined publishes may hold together
# before the caller waits (the client keeps each until its PubAck, to send it
# again): 4,000 publishes of 64 KiB would be 256 MiB; this keeps a publisher
# of large payloads to a few MiB in flight, which still fills any link.
PUBLISH_WINDOW_BYTES: Final = 16 << 20
# The protocol's bound on a sequence key (messages.client.Publish): checked
# here, as a frame over it would be a protocol error that closes the session.
MAX_KEY: Final = 256
# The longest wait a caller may ask for: a day (a NaN, an infinity or 1e308
# would wait forever, or not at all).
MAX_TIMEOUT: Final = 86_400.0


def check_timeout(timeout: object) -> float:
    """A timeout is a positive, finite number of seconds, at most ``MAX_TIMEOUT``."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise LocalProtocolError(f"a timeout is a number of seconds in (0, {MAX_TIMEOUT:g}], got {timeout!r}")
    return float(timeout)


def check_order(key: str, rank: object) -> None:
    """Refuse what the node's decoder would treat as a protocol error."""
    if len(key) > MAX_KEY:
        raise LocalProtocolError(f"a sequence key has at most {MAX_KEY} characters, got {len(key)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= cm.MAX_RANK:
        raise LocalProtocolError(
            f"a rank is an integer in [1, {cm.MAX_RANK}] (0: let the key's home assign one), got {rank!r}"
        )


def check_event(event: object) -> None:
    """A pipelined publish's event as the node's decoder takes it (text, or a
    map of names to int, float or str): one it would refuse is a protocol
    error that closes the session — and the window sends it again on the next
    connection, and again.  Cheaper than a decode, for the hot path."""
    if type(event) is str:
        return
    if type(event) is not dict:
        raise LocalProtocolError(f"an event is text or a dict, got {type(event).__name__}")
    for name, value in event.items():
        kind = type(value)
        if kind is float or kind is str or (kind is int and -(2**63) <= value < 2**64):
            if type(name) is str:
                continue
            raise LocalProtocolError(f"an event's attribute names are str, got {name!r}")
        raise LocalProtocolError(
            f"attribute {name!r}: a value is an int (64-bit), a float or a str, got {type(value).__name__} {value!r:.60}"
        )


def check_payload(payload: object, limit: int = 0) -> bytes:
    """A publish's payload as the bytes to send: ``bytes`` as they are (no
    copy), a ``str`` as its UTF-8, a ``bytearray`` or ``memoryview`` copied
    once.  Anything else is ``LocalProtocolError``; one over ``limit`` (the
    node's ``max_payload`` from its Welcome; 0: not known yet) is refused
    here as the node would refuse it, ``RequestError(payload_too_large)``."""
    if type(payload) is bytes:
        data = payload
    elif isinstance(payload, str):
        data = payload.encode()
    elif isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
    else:
        raise LocalProtocolError(f"a payload is bytes or str (sent as UTF-8), got {type(payload).__name__}")
    if limit and len(data) > limit:
        raise RequestError(
            cm.ErrorCode.PAYLOAD_TOO_LARGE,
            f"the payload is {len(data)} bytes; this cluster takes at most {limit} ([cluster] max_payload)",
        )
    return data
