"""A test playing a node on a peer link: the link's opening done as a node does it (SPEC §16).

A node admits a peer link only from a cluster member (``overlay.net.admission``):
a test that plays node ``n`` to a real node, or that answers a real node's
link on a placeholder's socket, opens it as node ``n`` would — TLS with
node ``n``'s certificate, or the challenge on the cluster secret — using the
same code as the nodes.  Then it speaks the peer protocol on its own.
"""

from __future__ import annotations

import asyncio

from overlay.config import ClusterConfig
from overlay.errors import RemoteProtocolError
from overlay.messages import peer as pm
from overlay.messages.codec import FrameReader, encode_frame, peer_reader
from overlay.net.admission import Admission
from overlay.net.node import PEER_MAGIC
from overlay.security import CalleeAuth, node_security

__all__ = ["accept_peer", "dial_peer"]


def _admission(config: ClusterConfig, node_id: int) -> Admission:
    security = node_security(config, node_id)
    return Admission(
        node_id,
        config.cluster.name,
        security,
        live_within=config.cluster.suspect_timeout,
        max_frame=config.cluster.max_frame_size,
    )


async def dial_peer(config: ClusterConfig, node_id: int, to: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A link from node ``node_id`` (played by the test) to node ``to`` of
    ``config``, opened and proved; the test writes its PeerHello next."""
    return await _admission(config, node_id).dial(config.node(to))


async def accept_peer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, config: ClusterConfig, node_id: int
) -> tuple[FrameReader[pm.PeerMessage], list[pm.PeerMessage]]:
    """The opening of a link a real node dialled to node ``node_id`` (played
    by the test, on a server with ``node_security(config, node_id).server``
    as its ssl context when the cluster has TLS): the preamble and, without
    TLS, the challenge.  Returns the link's frame reader and the messages
    read past the opening (its hello, usually)."""
    if await reader.readexactly(4) != PEER_MAGIC:
        raise RemoteProtocolError("not a peer link")
    frames = peer_reader(config.cluster.max_frame_size)
    security = node_security(config, node_id)
    if not security.insecure:
        return frames, []
    auth = CalleeAuth(security.secret, config.cluster.name, node_id)
    while True:
        data = await reader.read(65536)
        if not data:
            raise ConnectionResetError("the node closed the link during the challenge")
        msgs = frames.feed(data)
        while msgs and auth.caller is None:
            reply = auth.receive(msgs.pop(0))
            if reply is not None:
                writer.write(encode_frame(reply))
        if auth.caller is not None:
            return frames, msgs
