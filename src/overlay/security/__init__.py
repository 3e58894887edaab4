"""Who may talk to a node, and how (SPEC §16): TLS, identities, the peers' challenge.

* ``tls`` — the TLS contexts of a node (its port, its links, its admin
  port) and of clients, from the config's ``[tls]`` table;
* ``identity`` — node and client identities as certificate SAN URIs;
* ``peer_auth`` — the challenge–response on the cluster secret where TLS is
  off (sans-IO);
* ``refusals`` — why a connection was refused, as it is counted;
* ``certs`` — development certificates (``overlay certs dev``).  Not
  re-exported here: it needs ``cryptography``, which clients never load.
"""

from overlay.security.identity import Identity, client_uri, identity_of, node_uri
from overlay.security.peer_auth import MIN_SECRET_LENGTH, CalleeAuth, CallerAuth
from overlay.security.refusals import PEER_REFUSALS, TLS_REFUSALS, Refusal, RefusalLog, stats_key
from overlay.security.tls import (
    SECRET_ENV,
    NodeSecurity,
    check_configured,
    client_context,
    client_ssl,
    node_security,
    tls_path,
)

__all__ = [
    "MIN_SECRET_LENGTH",
    "PEER_REFUSALS",
    "SECRET_ENV",
    "TLS_REFUSALS",
    "CalleeAuth",
    "CallerAuth",
    "Identity",
    "NodeSecurity",
    "Refusal",
    "RefusalLog",
    "check_configured",
    "client_context",
    "client_ssl",
    "client_uri",
    "identity_of",
    "node_security",
    "node_uri",
    "stats_key",
    "tls_path",
]
