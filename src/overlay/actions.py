"""What a node core asks its shell to do: the outputs of every core handler.

Rules:

1. Six kinds of action, one class each; ``Action`` is their union.  The
   shells (``overlay.net.node``, the simulator, ``testing.corelink``) tell
   them apart by ``type(act) is …`` and read their fields by name: an action
   is not a tuple (no unpacking, no indexing).
2. Two or more actions are built per event on a node's hottest path (a
   ``ToClient`` for the Notify, another for the PubAck; ``ToPeer`` between
   nodes), so each is a ``msgspec.Struct`` with ``gc=False``: built in C
   (≈ 60 ns, against ≈ 300 ns for the ``NamedTuple`` they were, whose
   ``__new__`` is Python code), and never tracked by the cyclic GC (no
   cycles: an action holds ints, strings and messages, and nothing holds an
   action but the list it is returned in).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from overlay.config import NodeConfig
from overlay.messages import client as cm
from overlay.messages import peer as pm

__all__ = ["Action", "AddPeer", "CloseClient", "Notifies", "Rejoin", "ToClient", "ToPeer"]


class ToPeer(msgspec.Struct, gc=False):
    """Send ``msg`` to peer ``node``."""

    node: int
    msg: pm.PeerMessage


class ToClient(msgspec.Struct, gc=False):
    """Send ``msg`` to the client of session ``session``."""

    session: int
    msg: cm.ClientMessage


class Notifies(msgspec.Struct, gc=False):
    """Send one event's untagged Notify to the client of each session in
    ``sessions``, the i-th listing ``sub_ids[i]`` (``msg`` lists the first's):
    what a ``ToClient`` per session would send, in one action the shell
    encodes once (``overlay.messages.codec`` rule 4)."""

    msg: cm.Notify
    sessions: list[int]
    sub_ids: list[tuple[str, ...]]

    def each(self) -> Iterator[ToClient]:
        """One ``ToClient`` per session, as a shell without the shortcut sends them."""
        msg = self.msg
        for sid, ids in zip(self.sessions, self.sub_ids, strict=True):
            yield ToClient(sid, msg if ids == msg.sub_ids else msgspec.structs.replace(msg, sub_ids=ids))


class CloseClient(msgspec.Struct, gc=False):
    """Close a client's session (after what was queued for it), saying why in the log."""

    session: int
    reason: str


class AddPeer(msgspec.Struct, gc=False):
    """Open an outbound peer link to a node that joined (``node.membership`` rule 5)."""

    peer: NodeConfig


class Rejoin(msgspec.Struct, gc=False):
    """A majority declared this run of the node dead (``node.liveness`` rule 5):
    its tables and channels are stale.  The shell closes its clients and starts
    a new, empty run of the node, which fetches the table and joins again."""

    reason: str


Action = ToPeer | ToClient | Notifies | CloseClient | AddPeer | Rejoin
