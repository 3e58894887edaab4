"""overlay.security.peer_auth: the peers' challenge–response on the cluster secret, without an event loop.

The two sides are joined in memory, message by message (STYLE habit 10):
the exact messages each emits, a wrong secret on either side, a reflected
proof, a recorded proof replayed, a wrong cluster or callee, and every
message out of order (a protocol error naming it and the state, the state
unchanged).  The secret is never in an encoded frame.
"""

from __future__ import annotations

import pytest

from overlay.errors import PeerRefused, RemoteProtocolError
from overlay.messages import peer as pm
from overlay.messages.codec import encode_frame
from overlay.security.peer_auth import (
    NONCE_BYTES,
    CalleeAuth,
    CalleeState,
    CallerAuth,
    CallerState,
    proof,
    transcript,
)
from overlay.security.refusals import Refusal

SECRET = b"the cluster secret, 32 bytes ok."
CLUSTER = "local"


def pair(
    caller_secret: bytes = SECRET, callee_secret: bytes = SECRET, callee: int = 0
) -> tuple[CallerAuth, CalleeAuth]:
    return CallerAuth(caller_secret, CLUSTER, 1, callee), CalleeAuth(callee_secret, CLUSTER, 0)


def test_both_sides_prove_the_secret_and_learn_each_others_id() -> None:
    caller, callee = pair()
    hello = caller.start()
    assert (hello.node_id, hello.cluster, len(hello.nonce)) == (1, CLUSTER, NONCE_BYTES)
    challenge = callee.receive(hello)
    assert isinstance(challenge, pm.PeerChallenge) and challenge.node_id == 0
    assert challenge.proof == proof(SECRET, "callee", CLUSTER, 1, 0, hello.nonce, challenge.nonce)
    answer = caller.receive(challenge)
    assert caller.state is CallerState.PROVED
    assert answer.proof == proof(SECRET, "caller", CLUSTER, 1, 0, hello.nonce, challenge.nonce)
    assert callee.receive(answer) is None
    assert (callee.state, callee.caller) == (CalleeState.AUTHENTICATED, 1)
    wire = b"".join(encode_frame(m) for m in (hello, challenge, answer))
    assert SECRET not in wire


def test_nonces_are_fresh_on_every_link() -> None:
    a, _ = pair()
    b, _ = pair()
    assert a.start().nonce != b.start().nonce


def test_a_caller_without_the_secret_is_refused_by_the_callee() -> None:
    caller, callee = pair(caller_secret=b"a guess, a guess, a good guess")
    challenge = callee.receive(caller.start())
    assert challenge is not None
    # The caller sees first that the callee's proof is not of its (wrong) secret …
    with pytest.raises(PeerRefused) as info:
        caller.receive(challenge)
    assert info.value.reason == Refusal.BAD_PROOF and not info.value.by_peer
    assert caller.state is CallerState.CHALLENGED  # unchanged
    # … and a proof made with the wrong secret anyway is refused by the callee.
    forged = pm.PeerProof(proof(b"a guess", "caller", CLUSTER, 1, 0, caller._nonce, challenge.nonce))
    with pytest.raises(PeerRefused) as info:
        callee.receive(forged)
    assert info.value.reason == Refusal.BAD_PROOF
    assert (callee.state, callee.caller) == (CalleeState.CHALLENGED, None)


def test_a_callee_without_the_secret_learns_nothing_it_can_use() -> None:
    caller, impostor = pair(callee_secret=b"not the secret at all, no no no")
    challenge = impostor.receive(caller.start())
    assert challenge is not None
    with pytest.raises(PeerRefused, match="does not know the cluster secret"):
        caller.receive(challenge)  # the caller proves nothing to it


def test_a_reflected_proof_does_not_pass() -> None:
    # The callee's own proof sent back as the caller's: the role is in the transcript.
    caller, callee = pair()
    challenge = callee.receive(caller.start())
    assert challenge is not None
    with pytest.raises(PeerRefused, match="bad_proof"):
        callee.receive(pm.PeerProof(challenge.proof))


def test_a_recorded_proof_is_no_use_on_another_link() -> None:
    caller, callee = pair()
    challenge = callee.receive(caller.start())
    assert challenge is not None
    recorded = caller.receive(challenge)
    # A replay on a new link: the callee's nonce is new, the old proof does not cover it.
    _, callee2 = pair()
    replayed_auth = pm.PeerAuth(1, CLUSTER, caller._nonce)
    assert callee2.receive(replayed_auth) is not None
    with pytest.raises(PeerRefused, match="bad_proof"):
        callee2.receive(recorded)


def test_the_callee_must_be_the_node_dialled() -> None:
    caller, callee = pair(callee=2)  # dialled node 2; node 0 answers
    challenge = callee.receive(caller.start())
    assert challenge is not None
    with pytest.raises(PeerRefused) as info:
        caller.receive(challenge)
    assert info.value.reason == Refusal.IDENTITY_MISMATCH


def test_another_cluster_and_this_nodes_own_id_are_refused() -> None:
    _, callee = pair()
    with pytest.raises(PeerRefused) as info:
        callee.receive(pm.PeerAuth(1, "elsewhere", b"n" * NONCE_BYTES))
    assert info.value.reason == Refusal.WRONG_CLUSTER
    _, callee = pair()
    with pytest.raises(PeerRefused) as info:
        callee.receive(pm.PeerAuth(0, CLUSTER, b"n" * NONCE_BYTES))
    assert info.value.reason == Refusal.IDENTITY_MISMATCH


def test_a_link_that_skips_the_challenge_is_unauthenticated() -> None:
    _, callee = pair()
    with pytest.raises(PeerRefused) as info:
        callee.receive(pm.PeerHello(1, CLUSTER))
    assert info.value.reason == Refusal.UNAUTHENTICATED
    assert callee.state is CalleeState.WAITING


@pytest.mark.parametrize(
    "msg",
    [pm.PeerAuth(1, CLUSTER, b"n" * NONCE_BYTES), pm.PeerHello(1, CLUSTER), pm.LinkAck(3)],
    ids=["PeerAuth twice", "PeerHello", "LinkAck"],
)
def test_out_of_order_messages_are_protocol_errors_that_change_nothing(msg: pm.PeerMessage) -> None:
    caller, callee = pair()
    challenge = callee.receive(caller.start())
    assert challenge is not None
    with pytest.raises(RemoteProtocolError, match=f"{type(msg).__name__} while the peer link is waiting for the proof"):
        callee.receive(msg)
    assert callee.state is CalleeState.CHALLENGED
    assert callee.receive(caller.receive(challenge)) is None  # the handshake still completes


def test_the_caller_refuses_what_it_did_not_ask_for() -> None:
    caller, _ = pair()
    with pytest.raises(RemoteProtocolError, match="PeerChallenge while the peer link is start"):
        caller.receive(pm.PeerChallenge(0, b"n" * NONCE_BYTES, b"p" * 32))
    caller.start()
    with pytest.raises(RemoteProtocolError, match="PeerAuth sent twice"):
        caller.start()
    with pytest.raises(RemoteProtocolError, match="PeerHello while"):
        caller.receive(pm.PeerHello(0, CLUSTER))
    # The callee's PeerError: it refused us (counted there, not here).
    with pytest.raises(PeerRefused) as info:
        caller.receive(pm.PeerError("wrong_cluster", "no"))
    assert info.value.by_peer and info.value.reason == "wrong_cluster"


def test_the_transcript_binds_every_field() -> None:
    base = ("callee", CLUSTER, 1, 0, b"a" * 32, b"b" * 32)
    variants = [
        ("caller", *base[1:]),
        (base[0], "other", *base[2:]),
        (*base[:2], 2, *base[3:]),
        (*base[:3], 3, *base[4:]),
        (*base[:4], b"c" * 32, base[5]),
        (*base[:5], b"c" * 32),
    ]
    assert len({transcript(*v) for v in [base, *variants]}) == 1 + len(variants)
