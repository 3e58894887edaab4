"""Client authentication: signed tokens with roles and content scopes (SPEC §16).

``tokens`` is the pure part — issue, verify, and the rights a token gives;
``keys`` reads (and, for development, makes) the Ed25519 key files the
``[auth]`` table names.
"""

from __future__ import annotations

from overlay.auth.keys import generate_keys, load_public_key, load_signing_key, verifier_for
from overlay.auth.tokens import ALGORITHM, LEEWAY, MAX_TTL, Claims, Rights, Role, Verifier, issue, key_id, parse_roles

__all__ = [
    "ALGORITHM",
    "LEEWAY",
    "MAX_TTL",
    "Claims",
    "Rights",
    "Role",
    "Verifier",
    "generate_keys",
    "issue",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "parse_roles",
    "verifier_for",
]
