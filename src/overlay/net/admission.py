"""Who may open a peer link to this node, and whom its own links reach (SPEC §16; ``overlay.net.node`` rules 2, 9).

Rules:

1. Inbound, with TLS: the peer preamble needs a verified certificate naming
   exactly one node id (``not_a_node`` otherwise: none, a client's, or an
   ambiguous one), and the PeerHello must claim that id
   (``identity_mismatch``).
2. Inbound, without TLS: the link opens with the challenge–response on the
   cluster secret (``overlay.security.peer_auth``), and the PeerHello must
   claim the id the caller proved.
3. Both: the hello names this cluster (``wrong_cluster``) and another node
   than this one; and no other *live* inbound link of that id is open
   (``duplicate_id``).  A link is live while frames arrive on it: a working
   one carries a heartbeat every ``heartbeat_interval``, so one silent for
   ``suspect_timeout`` is taken for a connection its peer gave up on
   unseen (a crash, a cut cable, a restart): it is closed, and the newcomer
   admitted.
4. Until admitted nothing of a link reaches the inbox: a refused stranger
   changes no table, and no link is opened back to it (a join is a hello
   that passed rules 1–3: from a holder of a CA-signed certificate for its
   id, or of the secret).  The caller of ``admit`` counts the refusal,
   logs it with the remote address and answers with a PeerError naming the
   reason before it closes the connection.
5. Outbound (``dial``): with TLS, the dialled node's certificate must name
   the id dialled (``identity_mismatch``; one the CA does not verify fails
   the handshake); without TLS, the callee proves the secret under that id
   before this node proves anything (``peer_auth`` rule 3).  The preamble
   (and without TLS this node's proof) is written; the link's hello follows
   (``overlay.net.peer_link``).
"""

from __future__ import annotations

import asyncio
import logging

from overlay.config import NodeConfig
from overlay.errors import PeerRefused, RemoteProtocolError
from overlay.messages import peer as pm
from overlay.messages.codec import encode_frame, peer_reader
from overlay.net.inbox import READ_CHUNK
from overlay.net.peer_link import PEER_MAGIC
from overlay.net.writer import write_frames
from overlay.security import CalleeAuth, CallerAuth, Identity, NodeSecurity, Refusal, identity_of

__all__ = ["Admission", "InboundLink"]

log = logging.getLogger("overlay.net")


class InboundLink:
    """One admitted inbound peer connection (rule 3's bookkeeping)."""

    __slots__ = ("address", "last_seen", "node", "writer")

    def __init__(self, node: int, writer: asyncio.StreamWriter, address: str, now: float) -> None:
        self.node = node
        self.writer = writer
        self.address = address
        self.last_seen = now  # monotonic: the last read that brought bytes


class Admission:
    """Rules 1–5 for one node.

    Invariant: ``inbound`` holds at most one link per node id, and only
    admitted ones.
    """

    def __init__(
        self, node_id: int, cluster: str, security: NodeSecurity, *, live_within: float, max_frame: int
    ) -> None:
        self.node_id = node_id
        self.cluster = cluster
        self.security = security
        self.live_within = live_within
        self.max_frame = max_frame
        self.inbound: dict[int, InboundLink] = {}

    # -- inbound (rules 1–4) -------------------------------------------------------------

    def opened(self, identity: Identity) -> CalleeAuth | None:
        """A connection sent the peer preamble: rule 1's certificate check, or
        rule 2's handshake to run (its state machine)."""
        if self.security.insecure:
            return CalleeAuth(self.security.secret, self.cluster, self.node_id)
        if identity.node is None:
            raise PeerRefused(
                Refusal.NOT_A_NODE,
                f"a peer link needs a node certificate of the cluster CA; this one names {identity.describe()}"
                if identity.nodes or identity.clients
                else "a peer link needs a node certificate of the cluster CA; none was presented",
            )
        return None

    def admit(
        self, hello: pm.PeerMessage, proven: int, writer: asyncio.StreamWriter, address: str, now: float
    ) -> InboundLink:
        """The first message after the preamble (and the handshake): rules 1–3."""
        if not isinstance(hello, pm.PeerHello):
            raise RemoteProtocolError(f"peer link opened with {type(hello).__name__}, not PeerHello")
        if hello.node_id != proven:
            proof = "proved" if self.security.insecure else "whose certificate names"
            raise PeerRefused(
                Refusal.IDENTITY_MISMATCH, f"the hello claims node {hello.node_id}, from node {proven} {proof} it"
            )
        if hello.cluster != self.cluster:
            raise PeerRefused(
                Refusal.WRONG_CLUSTER, f"node {proven} belongs to cluster {hello.cluster!r}, not {self.cluster!r}"
            )
        if proven == self.node_id:
            raise PeerRefused(Refusal.IDENTITY_MISMATCH, f"the caller claims this node's own id {proven}")
        old = self.inbound.get(proven)
        if old is not None:
            silent = now - old.last_seen
            if silent < self.live_within:
                raise PeerRefused(
                    Refusal.DUPLICATE_ID,
                    f"node {proven} has a live link from {old.address} already (a frame {silent:.2f}s ago): "
                    "two processes run as one node id?",
                )
            log.info(
                "node %d: node %d's link from %s was silent for %.1fs: closed, its new one from %s taken",
                self.node_id,
                proven,
                old.address,
                silent,
                address,
            )
            old.writer.transport.abort()
        link = self.inbound[proven] = InboundLink(proven, writer, address, now)
        return link

    def closed(self, link: InboundLink) -> None:
        if self.inbound.get(link.node) is link:
            del self.inbound[link.node]

    # -- outbound (rule 5) ----------------------------------------------------------------

    async def dial(self, peer: NodeConfig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``peer`` that proved to be it, the preamble written."""
        security = self.security
        # Bounded by the link's hello timeout, the TLS handshake included (net.peer_link rule 2).
        reader, writer = await asyncio.open_connection(peer.host, peer.port, ssl=security.dial, limit=READ_CHUNK)
        try:
            if security.insecure:
                await self._prove(peer, reader, writer)
            else:
                named = identity_of(writer.get_extra_info("ssl_object").getpeercert())
                if named.node != peer.id:
                    raise PeerRefused(
                        Refusal.IDENTITY_MISMATCH,
                        f"dialled node {peer.id} at {peer.host}:{peer.port}, whose certificate names {named.describe()}",
                    )
                write_frames(writer, [PEER_MAGIC])
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _prove(self, peer: NodeConfig, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        auth = CallerAuth(self.security.secret, self.cluster, self.node_id, peer.id)
        write_frames(writer, [PEER_MAGIC + encode_frame(auth.start())])
        frames = peer_reader(self.max_frame)
        msgs: list[pm.PeerMessage] = []
        while not msgs:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionResetError(f"node {peer.id} closed the link during the challenge")
            msgs = frames.feed(data)
        if len(msgs) > 1:  # the callee says nothing more until our hello
            raise RemoteProtocolError(f"node {peer.id} sent {type(msgs[1]).__name__} behind its challenge")
        write_frames(writer, [encode_frame(auth.receive(msgs[0]))])
