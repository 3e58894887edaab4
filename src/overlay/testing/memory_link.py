"""One direction between two node cores, held in memory (SPEC §1.1's link model).

The core-pair harness (``tests/corelink.py``) and the deterministic simulator
(``overlay.testing.sim``, SPEC §15) drive ``NodeCore``s without sockets; both carry
peer messages on these links:

* two levels, high and normal (``overlay.messages.peer.is_high``): high goes
  first, each level is FIFO;
* every message is stamped when sent (a sequence number, or the virtual time
  it may be delivered at); ``head`` tells the next one's stamp, so a driver
  picks the link to deliver from;
* a link can be paused (nothing delivered until released) or blocked until a
  virtual time (a slow link);
* ``carry`` puts a message through the real codec with a deterministic
  encoder (sets and dicts sorted, so the bytes do not depend on
  ``PYTHONHASHSEED``) and the link's own frame reader: what arrives is what
  a peer would decode.
"""

from __future__ import annotations

from collections import deque

import msgspec

from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, peer_reader

__all__ = ["MemoryLink"]

_encoder = msgspec.msgpack.Encoder(order="deterministic")


class MemoryLink:
    __slots__ = ("blocked_until", "high", "normal", "paused", "reader")

    def __init__(self) -> None:
        self.high: deque[tuple[float, pm.PeerMessage]] = deque()
        self.normal: deque[tuple[float, pm.PeerMessage]] = deque()
        self.paused = False
        self.blocked_until = 0.0
        self.reader = peer_reader()

    def push(self, stamp: float, msg: pm.PeerMessage) -> None:
        """Queue ``msg`` at its level, stamped ``stamp`` — never before the
        one queued ahead of it at that level (FIFO)."""
        q = self.high if pm.is_high(msg) else self.normal
        if q and q[-1][0] > stamp:
            stamp = q[-1][0]
        q.append((stamp, msg))

    def head(self) -> tuple[float, pm.PeerMessage] | None:
        """The message delivered next, with its stamp."""
        q = self.high or self.normal
        return q[0] if q else None

    def head_ready(self) -> float | None:
        """When the next message may go: its stamp, or later while blocked."""
        head = self.head()
        return None if head is None else max(head[0], self.blocked_until)

    def pop(self) -> pm.PeerMessage:
        return (self.high or self.normal).popleft()[1]

    def queued(self) -> list[pm.PeerMessage]:
        """What is on the link, in delivery order."""
        return [m for _, m in [*self.high, *self.normal]]

    def carry(self, msg: pm.PeerMessage) -> tuple[bytes, list[pm.PeerMessage]]:
        """``msg`` through the codec: its encoded body and what the reader decoded."""
        body = _encoder.encode(msg)
        return body, self.reader.feed(HEADER.pack(len(body)) + body)

    def __len__(self) -> int:
        return len(self.high) + len(self.normal)
