"""Keys and tokens for the tests of client authentication (``overlay.auth``):
one key pair per test process, in a temporary directory."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from conftest import LOCAL
from overlay.auth import generate_keys, issue, load_signing_key

_DIR: Final = Path(tempfile.mkdtemp(prefix="overlay-auth-"))
atexit.register(shutil.rmtree, _DIR, True)
PRIVATE, PUBLIC = generate_keys(_DIR / "cluster")
OTHER_PRIVATE, OTHER_PUBLIC = generate_keys(_DIR / "other")  # another cluster's pair
KEY: Final = load_signing_key(PRIVATE)
OTHER_KEY: Final = load_signing_key(OTHER_PRIVATE)


def auth(*, required: bool = True, leeway: float = 0.0) -> dict[str, Any]:
    """``LoopbackCluster(..., auth=auth())``: the nodes check tokens of ``KEY``."""
    return {"public_keys": [str(PUBLIC)], "signing_key": str(PRIVATE), "required": required, "leeway": leeway}


def token(
    subject: str = "alice",
    *roles: str,
    scopes: dict[str, str] | None = None,
    ttl: float = 600.0,
    key: Any = KEY,
    audience: str = LOCAL.cluster.name,
    limits: dict[str, float] | None = None,
) -> str:
    """A token of ``subject`` with ``roles`` (default publish and subscribe)
    and, with ``limits``, a claim overriding the cluster's ``[limits]``."""
    return issue(
        key,
        subject=subject,
        roles=roles or ("publish", "subscribe"),
        scopes=scopes,
        audience=audience,
        ttl=ttl,
        now=time.time(),
        schema=LOCAL.schema,
        limits=limits,
    )
