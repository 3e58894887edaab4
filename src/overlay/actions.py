"""What a node core asks its shell to do: the outputs of every core handler."""

from __future__ import annotations

from typing import NamedTuple

from overlay.messages import client as cm
from overlay.messages import peer as pm

__all__ = ["Action", "CloseClient", "ToClient", "ToPeer"]


class ToPeer(NamedTuple):
    node: int
    msg: pm.PeerMessage


class ToClient(NamedTuple):
    session: int
    msg: cm.ClientMessage


class CloseClient(NamedTuple):
    session: int
    reason: str


Action = ToPeer | ToClient | CloseClient
