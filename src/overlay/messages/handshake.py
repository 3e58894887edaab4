"""Peer messages that open, acknowledge and refuse a link (SPEC §16):
the hello each way, the receiver's frame count, an error, and — without
TLS — the challenge–response on the cluster secret.

Rules this module keeps:

1. ``PeerHello`` is the first frame a node core sees on a link; its trailing
   fields are optional, so an old peer's hello still decodes
   (``peer_base`` rule 2).
2. ``LinkAck``, ``PeerAuth``, ``PeerChallenge`` and ``PeerProof`` belong to
   the link (``net.peer_link``, ``security.peer_auth``): none reaches a
   node core.
3. Nonces and proofs are bounded in their type: a short nonce or an
   oversized proof fails at the codec.
4. A link's opening frames (``PeerAuth``, ``PeerProof``, ``PeerHello``) are
   small: a frame declaring more than ``MAX_OPENING_FRAME`` before the link
   is admitted is refused at its header (``net.inbound`` rule 3).
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from overlay.messages.peer_base import Capacity, Ident, NodeId, PeerMessage, Port

__all__ = [
    "MAX_OPENING_FRAME",
    "LinkAck",
    "Nonce",
    "PeerAuth",
    "PeerChallenge",
    "PeerError",
    "PeerHello",
    "PeerProof",
    "Proof",
]


# Rule 4: the opening's messages are a few hundred bytes (a hello's host is a
# host name); the bound keeps what a stranger makes a node hold before it
# proves anything far below ``max_frame_size``.
MAX_OPENING_FRAME: Final = 64 * 1024


class PeerHello(PeerMessage, frozen=True):
    """First frame on a peer link: who is calling, and whether it holds a table."""

    node_id: NodeId
    cluster: Ident
    has_routing_table: bool = False
    # The caller's address, so a node that does not know it can add it (a node
    # joining a running cluster, overlay.node.membership rule 5).  Optional
    # and trailing: an old peer's hello still decodes.
    host: Ident = ""
    port: Port = 0
    admin_port: Port = 0
    capacity: Capacity = 0.0
    # The caller drained and is leaving: drop it from the peers (node.membership rule 6).
    leaving: bool = False
    # This run of the caller's process (its start time in ms): a new value means
    # it restarted, and what was queued for or held on behalf of the old run
    # is stale (node.core rule 7).  0: unknown (tests, the simulator).
    incarnation: Annotated[int, msgspec.Meta(ge=0)] = 0
    # The epoch of the caller's table (node.boot rule 3), when it holds one.
    epoch: Annotated[int, msgspec.Meta(ge=0)] = 0
    # In the callee's answering hello: how many frames it has received from
    # the caller's current run on earlier connections of this link; the
    # caller sends again what it wrote after those (net.peer_link rule 6).
    received: Annotated[int, msgspec.Meta(ge=0)] = 0


class LinkAck(PeerMessage, frozen=True):
    """The receiving end of a peer link → its sender, on the same connection:
    this many frames of the sender's current run have arrived (net.peer_link
    rule 6).  Never reaches a node core."""

    received: Annotated[int, msgspec.Meta(ge=0)]


class PeerError(PeerMessage, frozen=True):
    """The sender refuses something we sent; the link is closed after it."""

    code: Ident
    message: str


# Without TLS (``[tls] insecure = true``) a peer link opens with a
# challenge–response on the cluster secret before the hello
# (``overlay.security.peer_auth``): the caller's PeerAuth, the callee's
# PeerChallenge, the caller's PeerProof.  None reaches a node core.
Nonce = Annotated[bytes, msgspec.Meta(min_length=16, max_length=64)]
Proof = Annotated[bytes, msgspec.Meta(min_length=32, max_length=64)]


class PeerAuth(PeerMessage, frozen=True):
    """Caller → callee, first frame: who calls, for which cluster, and a fresh nonce."""

    node_id: NodeId
    cluster: Ident
    nonce: Nonce


class PeerChallenge(PeerMessage, frozen=True):
    """Callee → caller: its own nonce, and its proof of the secret over both nonces."""

    node_id: NodeId
    nonce: Nonce
    proof: Proof


class PeerProof(PeerMessage, frozen=True):
    """Caller → callee: the caller's proof of the secret over both nonces."""

    proof: Proof
