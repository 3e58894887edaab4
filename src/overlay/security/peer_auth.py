"""A peer link's challenge–response on the cluster secret, where TLS is off (SPEC §16).

With ``[tls] insecure = true`` nothing is encrypted, but a peer link still
opens only between holders of the cluster secret, and each side learns the
node id the other proved.  Sans-IO: messages in, messages out, no socket.

Theory of operation (the caller dials, the callee accepts):

1. Caller → callee: ``PeerAuth(caller id, cluster, Na)``.  Callee → caller:
   ``PeerChallenge(callee id, Nb, proof_b)``.  Caller → callee:
   ``PeerProof(proof_a)``.  Then the link goes on as any other: the caller's
   PeerHello, the callee's answer (``overlay.net.node`` rule 9).
2. ``proof = HMAC-SHA256(secret, transcript)``, the transcript being the
   protocol label, the role (``callee``/``caller``), the cluster name, both
   node ids and both nonces (``transcript``).  The secret never travels;
   each nonce is fresh (``secrets.token_bytes``), so a recorded proof is no
   use on another link; the role is in the transcript, so a proof cannot be
   reflected back to its maker.
3. The callee proves itself first: a stranger dialling a node learns only a
   proof bound to its own nonce.  The caller checks that the callee is the
   node it dialled before it proves anything.
4. A wrong cluster name, a proof that does not verify, a callee other than
   the one dialled, or the callee's ``PeerError`` raise ``PeerRefused``
   with the reason (``overlay.security.refusals``); a message the state does
   not expect raises ``RemoteProtocolError`` naming it and the state.  Either
   way the state is unchanged and the caller of this module closes the link.
5. Each side is a table over an ``enum.Enum`` state (``CALLER``, ``CALLEE``).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from typing import Final

import msgspec

from overlay.errors import PeerRefused, RemoteProtocolError
from overlay.messages import peer as pm
from overlay.security.refusals import Refusal

__all__ = [
    "MIN_SECRET_LENGTH",
    "NONCE_BYTES",
    "CalleeAuth",
    "CalleeState",
    "CallerAuth",
    "CallerState",
    "proof",
    "transcript",
]

# 256-bit nonces: never repeated by chance over the cluster's life.
NONCE_BYTES: Final = 32
# A recorded handshake lets anyone test guesses of the secret offline; 16
# characters of a password generator put that out of reach, shorter ones may not.
MIN_SECRET_LENGTH: Final = 16
_LABEL: Final = "overlay peer auth v1"


def transcript(role: str, cluster: str, caller: int, callee: int, caller_nonce: bytes, callee_nonce: bytes) -> bytes:
    """What one side's proof covers (rule 2), unambiguously encoded."""
    return msgspec.msgpack.encode((_LABEL, role, cluster, caller, callee, caller_nonce, callee_nonce))


def proof(secret: bytes, role: str, cluster: str, caller: int, callee: int, na: bytes, nb: bytes) -> bytes:
    return hmac.new(secret, transcript(role, cluster, caller, callee, na, nb), hashlib.sha256).digest()


class CallerState(enum.Enum):
    START = "start"
    CHALLENGED = "waiting for the challenge"  # PeerAuth sent
    PROVED = "proved"  # the callee proved itself, and so did we


class CalleeState(enum.Enum):
    WAITING = "waiting for PeerAuth"
    CHALLENGED = "waiting for the proof"  # PeerChallenge sent
    AUTHENTICATED = "authenticated"


CALLER: Final[dict[tuple[CallerState, type[pm.PeerMessage]], CallerState]] = {
    (CallerState.CHALLENGED, pm.PeerChallenge): CallerState.PROVED,
    (CallerState.CHALLENGED, pm.PeerError): CallerState.CHALLENGED,  # refused: rule 4
}
CALLEE: Final[dict[tuple[CalleeState, type[pm.PeerMessage]], CalleeState]] = {
    (CalleeState.WAITING, pm.PeerAuth): CalleeState.CHALLENGED,
    (CalleeState.CHALLENGED, pm.PeerProof): CalleeState.AUTHENTICATED,
}


class CallerAuth:
    """The dialling side of one link (rules 1–4).

    Invariant: ``state`` is PROVED only once the callee proved the secret
    under the id dialled.
    """

    def __init__(self, secret: bytes, cluster: str, me: int, callee: int) -> None:
        self._secret = secret
        self.cluster = cluster
        self.me = me
        self.callee = callee
        self.state = CallerState.START
        self._nonce = b""

    def start(self) -> pm.PeerAuth:
        if self.state is not CallerState.START:
            raise RemoteProtocolError(f"PeerAuth sent twice (state: {self.state.value})")
        self._nonce = secrets.token_bytes(NONCE_BYTES)
        self.state = CallerState.CHALLENGED
        return pm.PeerAuth(self.me, self.cluster, self._nonce)

    def receive(self, msg: pm.PeerMessage) -> pm.PeerProof:
        """The callee's answer to our PeerAuth: our proof, once it proved itself."""
        new = CALLER.get((self.state, type(msg)))
        if new is None:
            raise RemoteProtocolError(f"{type(msg).__name__} while the peer link is {self.state.value}")
        if isinstance(msg, pm.PeerError):
            raise PeerRefused(msg.code, f"node {self.callee} refused the link: {msg.message}", by_peer=True)
        assert isinstance(msg, pm.PeerChallenge)
        if msg.node_id != self.callee:
            raise PeerRefused(Refusal.IDENTITY_MISMATCH, f"dialled node {self.callee}, but node {msg.node_id} answered")
        args = (self.cluster, self.me, self.callee, self._nonce, msg.nonce)
        if not hmac.compare_digest(msg.proof, proof(self._secret, "callee", *args)):
            raise PeerRefused(Refusal.BAD_PROOF, f"node {self.callee} does not know the cluster secret")
        self.state = new
        return pm.PeerProof(proof(self._secret, "caller", *args))


class CalleeAuth:
    """The accepting side of one link (rules 1–4).

    Invariant: ``caller`` is the id the caller proved once ``state`` is
    AUTHENTICATED, and None before.
    """

    def __init__(self, secret: bytes, cluster: str, me: int) -> None:
        self._secret = secret
        self.cluster = cluster
        self.me = me
        self.state = CalleeState.WAITING
        self.claimed: int | None = None  # the id PeerAuth claims, proved or not
        self.caller: int | None = None
        self._nonces = (b"", b"")

    def receive(self, msg: pm.PeerMessage) -> pm.PeerChallenge | None:
        """A message of the handshake: the challenge to send, or None once the caller proved itself."""
        new = CALLEE.get((self.state, type(msg)))
        if new is None:
            if self.state is CalleeState.WAITING:
                raise PeerRefused(
                    Refusal.UNAUTHENTICATED,
                    f"the link opened with {type(msg).__name__}: this cluster runs without TLS, and a peer "
                    "proves the cluster secret first (is the caller configured with [tls] insecure = true?)",
                )
            raise RemoteProtocolError(f"{type(msg).__name__} while the peer link is {self.state.value}")
        if isinstance(msg, pm.PeerAuth):
            self.claimed = msg.node_id
            if msg.cluster != self.cluster:
                raise PeerRefused(
                    Refusal.WRONG_CLUSTER, f"the caller belongs to cluster {msg.cluster!r}, not {self.cluster!r}"
                )
            if msg.node_id == self.me:
                raise PeerRefused(Refusal.IDENTITY_MISMATCH, f"the caller claims this node's own id {self.me}")
            mine = secrets.token_bytes(NONCE_BYTES)
            self._nonces = (msg.nonce, mine)
            self.state = new
            own = proof(self._secret, "callee", self.cluster, msg.node_id, self.me, msg.nonce, mine)
            return pm.PeerChallenge(self.me, mine, own)
        assert isinstance(msg, pm.PeerProof) and self.claimed is not None
        expected = proof(self._secret, "caller", self.cluster, self.claimed, self.me, *self._nonces)
        if not hmac.compare_digest(msg.proof, expected):
            raise PeerRefused(
                Refusal.BAD_PROOF, f"the caller (claiming node {self.claimed}) does not know the cluster secret"
            )
        self.state = new
        self.caller = self.claimed
        return None
