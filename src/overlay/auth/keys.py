"""Ed25519 key files for client tokens: read them, and make a pair for development.

``local_token`` signs a token for the operator's own tools (``cluster up``,
the demo, ``status``) with the config's signing key: the machine that holds
it may issue any token anyway.

Keys are PEM files: the signing key PKCS#8 (written readable by its owner
only), the public key SubjectPublicKeyInfo — what ``openssl genpkey
-algorithm ed25519`` and ``openssl pkey -pubout`` write, so either tool
makes them.  Every failure is a ``ConfigError`` naming the file and what to
do: a node with a key it cannot read must not start.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from overlay.auth.tokens import Verifier, issue
from overlay.config import ClusterConfig
from overlay.errors import ConfigError

__all__ = [
    "LOCAL_TTL",
    "PRIVATE_NAME",
    "PUBLIC_NAME",
    "generate_keys",
    "load_public_key",
    "load_signing_key",
    "local_token",
    "verifier_for",
]

# The files ``generate_keys`` writes in its directory.
PRIVATE_NAME: Final = "auth.key"
PUBLIC_NAME: Final = "auth.pub"
# The life of the tokens the local tools sign themselves (``local_token``):
# their clients take a new one at each reconnect.
LOCAL_TTL: Final = 3600.0
# A key file is a few hundred bytes: a bigger one is not a key.
MAX_KEY_FILE: Final = 64 * 1024


def _read(path: str | Path, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEY_FILE + 1)
    except FileNotFoundError:
        raise ConfigError(
            f"{what} {path} does not exist (`overlay token keys DIR` makes a pair, or "
            "`openssl genpkey -algorithm ed25519`)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_KEY_FILE:
        raise ConfigError(f"{what} {path} is larger than {MAX_KEY_FILE} bytes: not a PEM key")
    return data


def load_signing_key(path: str | Path) -> Ed25519PrivateKey:
    try:
        key = load_pem_private_key(_read(path, "signing key"), password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"signing key {path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"signing key {path} is a {type(key).__name__}; tokens are signed with Ed25519 keys")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    try:
        key = load_pem_public_key(_read(path, "public key"))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"public key {path} is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"public key {path} is a {type(key).__name__}; tokens are verified with Ed25519 keys")
    return key


def generate_keys(directory: str | Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """A new key pair in ``directory`` (made if missing): ``auth.key`` (mode
    0600) and ``auth.pub``.  An existing pair is kept unless ``overwrite``:
    replacing a signing key voids every token it signed."""
    d = Path(directory)
    private, public = d / PRIVATE_NAME, d / PUBLIC_NAME
    if not overwrite and (private.exists() or public.exists()):
        raise ConfigError(f"{private} or {public} exists already; remove them first to make a new pair")
    d.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return private, public


def verifier_for(config: ClusterConfig) -> Verifier | None:
    """The cluster's token verifier (``[auth] public_keys``), None when auth is off."""
    auth = config.auth
    if not auth.public_keys:
        return None
    keys = [load_public_key(p) for p in auth.public_keys]
    return Verifier(keys, audience=config.cluster.name, schema=config.schema, leeway=auth.leeway)


def local_token(config: ClusterConfig, subject: str, *roles: str, ttl: float = LOCAL_TTL) -> str:
    """A token the operator's own tools sign for themselves — ``cluster up``
    checking its nodes, the demo's traffic — with the config's ``[auth]
    signing_key``; ``""`` when the cluster has no ``[auth]``.  A
    ``ConfigError`` when it has one but no signing key to sign with."""
    auth = config.auth
    if not auth.enabled:
        return ""
    if not auth.signing_key:
        raise ConfigError(
            f"{config.path or 'the config'}: [auth] has no signing_key, and the local tools sign their own "
            "tokens with it (cluster up, demo, status); add it on the operator's machine"
        )
    key = load_signing_key(auth.signing_key)
    return issue(
        key,
        subject=subject,
        roles=roles,
        audience=config.cluster.name,
        ttl=min(ttl, auth.max_ttl),
        now=time.time(),
        schema=config.schema,
    )
