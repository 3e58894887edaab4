"""Who a certificate says its holder is (SPEC §16): SAN URIs.

A node's certificate names ``overlay://node/<id>``, a client's
``overlay://client/<name>`` (``overlay.security.certs`` makes such ones for
development; a production CA puts the same URIs in).  A node accepts a peer
link only under the node id its certificate names, and dials a peer only to
find the id it dialled there (``overlay.net.admission``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

__all__ = ["CLIENT_PREFIX", "NODE_PREFIX", "Identity", "client_uri", "identity_from_uris", "identity_of", "node_uri"]

NODE_PREFIX: Final = "overlay://node/"
CLIENT_PREFIX: Final = "overlay://client/"


def node_uri(node_id: int) -> str:
    return f"{NODE_PREFIX}{node_id}"


def client_uri(name: str) -> str:
    return f"{CLIENT_PREFIX}{name}"


class Identity(NamedTuple):
    """What a verified certificate names: node ids and client names (usually
    one of them).  ``certified``: a certificate was presented and verified
    against the cluster CA, whatever it names."""

    nodes: frozenset[int] = frozenset()
    clients: frozenset[str] = frozenset()
    certified: bool = False

    @property
    def node(self) -> int | None:
        """The one node id named, or None (none, or an ambiguous certificate naming several)."""
        return next(iter(self.nodes)) if len(self.nodes) == 1 else None

    def describe(self) -> str:
        names = [node_uri(n) for n in sorted(self.nodes)] + [client_uri(c) for c in sorted(self.clients)]
        return ", ".join(names) or "no overlay identity"


def identity_from_uris(uris: Iterable[str], *, certified: bool = False) -> Identity:
    nodes: set[int] = set()
    clients: set[str] = set()
    for uri in uris:
        if uri.startswith(NODE_PREFIX):
            rest = uri[len(NODE_PREFIX) :]
            # Canonical ASCII digits only: "01" or a non-ASCII digit is not quietly node 1.
            if rest.isascii() and rest.isdigit() and len(rest) <= 5 and str(int(rest)) == rest:
                nodes.add(int(rest))
        elif uri.startswith(CLIENT_PREFIX) and len(uri) > len(CLIENT_PREFIX):
            clients.add(uri[len(CLIENT_PREFIX) :])
    return Identity(frozenset(nodes), frozenset(clients), certified)


def identity_of(peercert: Mapping[str, Any] | None) -> Identity:
    """The identity in ``ssl.SSLObject.getpeercert()`` — a certificate the handshake verified — or an empty one."""
    if not peercert:
        return Identity()
    uris = (value for kind, value in peercert.get("subjectAltName", ()) if kind == "URI")
    return identity_from_uris(uris, certified=True)
