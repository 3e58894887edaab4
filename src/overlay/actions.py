"""What a node core asks its shell to do: the outputs of every core handler."""

from __future__ import annotations

from typing import NamedTuple

from overlay.config import NodeConfig
from overlay.messages import client as cm
from overlay.messages import peer as pm

__all__ = ["Action", "AddPeer", "CloseClient", "Rejoin", "ToClient", "ToPeer"]


class ToPeer(NamedTuple):
    """Send ``msg`` to peer ``node``."""

    node: int
    msg: pm.PeerMessage


class ToClient(NamedTuple):
    """Send ``msg`` to the client of session ``session``."""

    session: int
    msg: cm.ClientMessage


class CloseClient(NamedTuple):
    """Close a client's session (after what was queued for it), saying why in the log."""

    session: int
    reason: str


class AddPeer(NamedTuple):
    """Open an outbound peer link to a node that joined (``node.membership`` rule 5)."""

    peer: NodeConfig


class Rejoin(NamedTuple):
    """A majority declared this run of the node dead (``node.liveness`` rule 5):
    its tables and channels are stale.  The shell closes its clients and starts
    a new, empty run of the node, which fetches the table and joins again."""

    reason: str


Action = ToPeer | ToClient | CloseClient | AddPeer | Rejoin
