"""Fuzzing token verification (issue 17 item 5, ``overlay.auth``, SPEC §16).

A token arrives in any client's Hello: random strings, a valid token with
characters changed in its header, claims or signature, segments swapped or
dropped, and tokens signed with the cluster's own key over mutated claims
(every claim replaced by a value of another type, NaN, ±inf, 1e308, huge
integers, long strings, nestings; roles and scopes that do not parse).
``Verifier.verify`` returns ``Rights`` or raises ``TokenError`` (its
subclasses included) — never another exception; ``unverified_subject``
returns a string or None.
"""

from __future__ import annotations

import contextlib
import random
import string

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import LOCAL
from overlay.auth.tokens import Rights, Verifier, issue, key_id, unverified_subject
from overlay.errors import TokenError
from overlay.testing import Mutator

pytestmark = pytest.mark.timeout(120)

NOW = 1_700_000_000.0
KEY = Ed25519PrivateKey.generate()
SCHEMA = LOCAL.schema
CLAIMS = {
    "sub": "alice",
    "aud": LOCAL.cluster.name,
    "iat": NOW,
    "exp": NOW + 600,
    "nbf": NOW - 10,
    "jti": "j1",
    "roles": ["publish", "subscribe"],
    "scope": {"publish": 'sym = "A"', "subscribe": "price < 100"},
}
GOOD = issue(
    KEY,
    subject="alice",
    roles=["publish", "subscribe"],
    audience=LOCAL.cluster.name,
    ttl=600,
    now=NOW,
    schema=SCHEMA,
    scopes=CLAIMS["scope"],  # type: ignore[arg-type]
)
SOME = settings(max_examples=300, deadline=None)
B64 = string.ascii_letters + string.digits + "-_=.+/ "


def verify(token: object) -> None:
    """The contract: Rights, or a TokenError; a fresh verifier each time (no cache)."""
    v = Verifier([KEY.public_key()], audience=LOCAL.cluster.name, schema=SCHEMA)
    with contextlib.suppress(TokenError):
        assert isinstance(v.verify(token, NOW), Rights)  # type: ignore[arg-type]
    sub = unverified_subject(token)  # type: ignore[arg-type]
    assert sub is None or isinstance(sub, str)


def test_the_unmutated_token_verifies() -> None:
    v = Verifier([KEY.public_key()], audience=LOCAL.cluster.name, schema=SCHEMA)
    assert v.verify(GOOD, NOW).subject == "alice"


@SOME
@given(st.text(max_size=300))
def test_random_strings(text: str) -> None:
    verify(text)


@SOME
@given(st.lists(st.text(B64, max_size=60), min_size=1, max_size=5))
def test_random_dotted_segments(parts: list[str]) -> None:
    verify(".".join(parts))


@SOME
@given(st.randoms(use_true_random=False))
def test_a_valid_token_tampered_with(rng: random.Random) -> None:
    token = list(GOOD)
    for _ in range(rng.choice((1, 2, 4))):
        at = rng.randrange(len(token))
        op = rng.randrange(4)
        if op == 0:
            token[at] = rng.choice(B64)
        elif op == 1:
            del token[at]
        elif op == 2:
            token.insert(at, rng.choice(B64))
        else:
            parts = "".join(token).split(".")
            rng.shuffle(parts)
            token = list(".".join(parts[: rng.randrange(1, len(parts) + 1)]))
    verify("".join(token))


@SOME
@given(st.randoms(use_true_random=False))
def test_claims_mutated_and_signed_with_the_trusted_key(rng: random.Random) -> None:
    """The signature holds, so every claim reaches the checks."""
    claims = Mutator(rng).tree(CLAIMS)  # type: ignore[arg-type]
    if not isinstance(claims, dict) or not all(isinstance(k, str) for k in claims):
        claims = {"claims": repr(claims)}
    try:
        token = jwt.encode(claims, KEY, algorithm="EdDSA", headers={"kid": key_id(KEY)})
    except (TypeError, ValueError, OverflowError):  # bytes, a non-str key deeper in: no JSON for them
        return
    verify(token)


@SOME
@given(st.randoms(use_true_random=False))
def test_headers_mutated_and_signed_with_the_trusted_key(rng: random.Random) -> None:
    header = Mutator(rng).tree({"kid": key_id(KEY), "typ": "JWT", "alg": "EdDSA"})  # type: ignore[arg-type]
    if not isinstance(header, dict) or not all(isinstance(k, str) for k in header):
        return
    header.pop("alg", None)  # pyjwt writes its own
    try:
        token = jwt.encode(CLAIMS, KEY, algorithm="EdDSA", headers=header)
    except (TypeError, ValueError, OverflowError, jwt.PyJWTError):
        return
    verify(token)
