"""TLS contexts of nodes and clients from a config's ``[tls]`` table (SPEC §16).

Rules:

1. A node listens with TLS on both its ports.  Its peer/client port asks a
   connecting party for a certificate and verifies any it gets against the
   cluster CA (``CERT_OPTIONAL``): peers must present one
   (``overlay.net.admission``), clients only with ``verify_clients`` —
   enforced after the handshake (``NodeSecurity.verify_clients``), where a
   client can be told why in its own protocol.  The admin port never asks
   (browsers); what changes the cluster there needs the admin token.
2. A node dials its peers with its own certificate (mutual TLS) and verifies
   theirs against the CA; the host name is not checked — the node id in the
   certificate is, which is what the link is for.  Its requests to other
   nodes' admin ports verify host names as any HTTPS client does.
3. A client verifies the node's certificate against the CA and its host
   name (``client_context``); ``client_ssl`` builds that from a config.
4. Every problem with the files is a ``ConfigError`` naming the key, the
   path and what to do — at start, before anything listens: a missing or
   unreadable file, a key that is not the certificate's, a node certificate
   that does not name its node (peers would refuse every link) or has
   expired.
5. ``insecure = true``: no context at all, plain TCP, and the cluster
   secret (``OVERLAY_CLUSTER_SECRET`` wins over ``[tls] secret``, which then
   need not be in a file) for the peers' challenge (``peer_auth``).
6. Paths are relative to the config file's directory; ``{id}`` in ``cert``
   and ``key`` is the node id.
"""

from __future__ import annotations

import datetime
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from overlay.config import ClusterConfig
from overlay.errors import ConfigError
from overlay.security.identity import identity_from_uris, node_uri
from overlay.security.peer_auth import MIN_SECRET_LENGTH

__all__ = [
    "SECRET_ENV",
    "NodeSecurity",
    "check_configured",
    "client_context",
    "client_ssl",
    "node_security",
    "tls_path",
]

SECRET_ENV: Final = "OVERLAY_CLUSTER_SECRET"
# TLS 1.2 is the oldest version without known breaks; every client we ship speaks 1.3.
MIN_VERSION: Final = ssl.TLSVersion.TLSv1_2
DEV_HINT: Final = "`overlay certs dev DIR --config {path}` makes development certificates"


def _where(config: ClusterConfig) -> str:
    return config.path or "the config"


def check_configured(config: ClusterConfig) -> None:
    """A node or a client needs the file to say how to talk (``config`` rule 5)."""
    if not config.tls.configured:
        raise ConfigError(
            f"{_where(config)}: no [tls] table: nodes and clients need the cluster's CA and certificates "
            f"({DEV_HINT.format(path=_where(config))}, then add the [tls] table it prints), "
            "or `[tls] insecure = true` and a secret for plain TCP on a network you trust"
        )


def tls_path(config: ClusterConfig, template: str, node_id: int | None = None) -> Path:
    """Rule 6."""
    name = template.replace("{id}", str(node_id)) if node_id is not None else template
    path = Path(name).expanduser()
    if not path.is_absolute() and config.path and not config.path.startswith("<"):
        path = Path(config.path).resolve().parent / path
    return path


def _existing(config: ClusterConfig, key: str, path: Path) -> str:
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a file"
        hint = DEV_HINT.replace("DIR", str(path.parent)).format(path=_where(config))
        raise ConfigError(f"{_where(config)}: [tls] {key}: {path} {what}; {hint}")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{_where(config)}: [tls] {key}: {path} is not readable by this user")
    return str(path)


def _load_ca(ctx: ssl.SSLContext, config: ClusterConfig, ca: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise ConfigError(f"{_where(config)}: [tls] ca: {ca} holds no PEM certificate ({exc.reason or exc})") from exc


def _load_chain(ctx: ssl.SSLContext, config: ClusterConfig, keys: str, cert: str, key: str) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{_where(config)}: [tls] {keys}: {cert} and {key} are not a PEM certificate and its own private key "
            f"({exc.reason or exc})"
        ) from exc


def client_context(ca: str | os.PathLike[str], cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """Rule 3: what a client connects with — the cluster CA, and optionally its own certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the host name
    ctx.minimum_version = MIN_VERSION
    ctx.load_verify_locations(cafile=os.fspath(ca))
    if cert:
        ctx.load_cert_chain(cert, key or None)
    return ctx


def client_ssl(config: ClusterConfig) -> ssl.SSLContext | None:
    """Rule 3 from a config: None when the cluster is insecure (plain TCP)."""
    check_configured(config)
    tls = config.tls
    if tls.insecure:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = MIN_VERSION
    _load_ca(ctx, config, _existing(config, "ca", tls_path(config, tls.ca)))
    if tls.client_cert:
        cert = _existing(config, "client_cert", tls_path(config, tls.client_cert))
        key = _existing(config, "client_key", tls_path(config, tls.client_key))
        _load_chain(ctx, config, "client_cert/client_key", cert, key)
    return ctx


@dataclass(frozen=True)
class NodeSecurity:
    """How one node talks (rules 1, 2, 5).

    Invariant: with TLS, all four contexts are set and ``secret`` is empty;
    insecure, no context is set and ``secret`` is at least
    ``MIN_SECRET_LENGTH`` bytes.
    """

    node_id: int
    server: ssl.SSLContext | None = None  # the peer/client port
    dial: ssl.SSLContext | None = None  # links to peers
    admin: ssl.SSLContext | None = None  # the admin HTTP port
    http: ssl.SSLContext | None = None  # requests to other nodes' admin ports
    secret: bytes = b""
    verify_clients: bool = False  # rule 1: clients must show a certificate of the CA

    @property
    def insecure(self) -> bool:
        return self.server is None

    @property
    def scheme(self) -> str:
        """The admin endpoints' URL scheme."""
        return "http" if self.insecure else "https"


def _secret(config: ClusterConfig) -> bytes:
    secret = os.environ.get(SECRET_ENV) or config.tls.secret
    if not secret:
        raise ConfigError(
            f"{_where(config)}: [tls] insecure = true needs the cluster secret its peers prove to each other: "
            f"set [tls] secret (at least {MIN_SECRET_LENGTH} characters) or {SECRET_ENV}"
        )
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"{_where(config)}: the cluster secret has {len(secret)} characters; at least {MIN_SECRET_LENGTH}, "
            "as a recorded handshake lets anyone test guesses of it offline"
        )
    return secret.encode()


def _check_own_certificate(config: ClusterConfig, node_id: int, cert: str) -> None:
    """Rule 4: the node's certificate names it and is valid now."""
    # Imported here: cryptography is for nodes and `overlay certs`, clients never load it.
    from cryptography import x509

    from overlay.security.certs import certificate_uris

    try:
        parsed = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except ValueError as exc:
        raise ConfigError(f"{_where(config)}: [tls] cert: {cert} is not a PEM certificate ({exc})") from exc
    named = identity_from_uris(certificate_uris(parsed))
    if named.node != node_id:
        raise ConfigError(
            f"{_where(config)}: [tls] cert: {cert} names {named.describe()}, not {node_uri(node_id)}: "
            f"peers would refuse node {node_id}'s links (is {{id}} in the path?)"
        )
    now = datetime.datetime.now(datetime.UTC)
    if not parsed.not_valid_before_utc <= now <= parsed.not_valid_after_utc:
        raise ConfigError(
            f"{_where(config)}: [tls] cert: {cert} is valid from {parsed.not_valid_before_utc:%Y-%m-%d} "
            f"to {parsed.not_valid_after_utc:%Y-%m-%d}, not now: peers and clients would refuse it"
        )


def node_security(config: ClusterConfig, node_id: int) -> NodeSecurity:
    """Rules 1, 2, 4, 5 for node ``node_id`` of ``config``."""
    check_configured(config)
    tls = config.tls
    if tls.insecure:
        return NodeSecurity(node_id, secret=_secret(config))
    ca = _existing(config, "ca", tls_path(config, tls.ca))
    cert = _existing(config, "cert", tls_path(config, tls.cert, node_id))
    key = _existing(config, "key", tls_path(config, tls.key, node_id))
    _check_own_certificate(config, node_id, cert)

    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = MIN_VERSION
    _load_chain(server, config, "cert/key", cert, key)
    _load_ca(server, config, ca)
    server.verify_mode = ssl.CERT_OPTIONAL  # rule 1: verify_clients is enforced after the handshake

    dial = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    dial.minimum_version = MIN_VERSION
    dial.check_hostname = False  # rule 2: the node id in the certificate is checked instead
    dial.verify_mode = ssl.CERT_REQUIRED
    _load_chain(dial, config, "cert/key", cert, key)
    _load_ca(dial, config, ca)

    admin = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    admin.minimum_version = MIN_VERSION
    _load_chain(admin, config, "cert/key", cert, key)  # verify_mode stays CERT_NONE: rule 1

    http = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    http.minimum_version = MIN_VERSION
    _load_ca(http, config, ca)
    return NodeSecurity(node_id, server=server, dial=dial, admin=admin, http=http, verify_clients=tls.verify_clients)
