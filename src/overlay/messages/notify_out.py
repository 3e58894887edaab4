"""``client.Notify`` as rule 4 of ``overlay.messages.codec`` encodes it: its
event and payload already encoded.

Kept out of ``codec``, which the compiled build (mypyc, setup.py) compiles:
mypyc drops the class keywords of a msgspec Struct it compiles (frozen,
array_like, tag, order), which would change the wire format silently.
"""

from __future__ import annotations

import msgspec

__all__ = ["NotifyOut"]


class NotifyOut(msgspec.Struct, frozen=True, tag="Notify", array_like=True):
    """Rule 4: ``client.Notify`` as it is encoded, its event and payload already encoded."""

    event_id: str
    event: msgspec.Raw
    sub_ids: tuple[str, ...]
    publish_time: float
    key: str
    rank: int
    tag: int
    payload: msgspec.Raw
