"""Why a connection was refused before it reached a node core (SPEC §16).

Every refusal is counted under one of these reasons — stats key
``tls_refused_<reason>`` or ``peer_refused_<reason>``, Prometheus families
``overlay_tls_refused_total{reason}`` and ``overlay_peer_refused_total{reason}``
(``overlay.net.metrics``) — and logged at WARNING with the remote address
(``overlay.net.listener``, ``overlay.net.admission``), within ``RefusalLog``'s
bound: a stranger is refused as fast as it connects, and its refusals must
not fill the node's disk with log lines.
"""

from __future__ import annotations

import enum
import logging
from typing import Final

__all__ = ["LOG_EVERY", "PEER_REFUSALS", "TLS_REFUSALS", "Refusal", "RefusalLog", "stats_key"]


class Refusal(enum.StrEnum):
    # Before any preamble: the TLS layer.
    NOT_TLS = "not_tls"  # plain bytes on a TLS port
    BAD_CERTIFICATE = "bad_certificate"  # a certificate that does not verify against the cluster CA
    TLS_HANDSHAKE = (
        "tls_handshake"  # any other failed handshake: no certificate when one is required, timeout, protocol
    )
    TLS_ON_PLAIN_PORT = "tls_on_plain_port"  # a TLS ClientHello on an insecure node's plain port
    NO_CLIENT_CERTIFICATE = "no_client_certificate"  # [tls] verify_clients, and a client showed none
    # A peer link: who may open one.
    NOT_A_NODE = "not_a_node"  # the peer preamble without a node certificate (none, or a client's)
    IDENTITY_MISMATCH = (
        "identity_mismatch"  # a node id other than the certificate's (or the proof's), or the dialled one
    )
    BAD_PROOF = "bad_proof"  # insecure mode: the challenge on the cluster secret failed
    UNAUTHENTICATED = "unauthenticated"  # insecure mode: a link that skipped the challenge
    WRONG_CLUSTER = "wrong_cluster"  # a PeerHello (or PeerAuth) naming another cluster
    DUPLICATE_ID = "duplicate_id"  # a node id whose live link is open already
    OPENING_TIMEOUT = "opening_timeout"  # a peer link's challenge and hello not done within peer_timeout
    PEER_MESSAGE_ON_CLIENT = "peer_message_on_client"  # a node-to-node message on a client connection


TLS_REFUSALS: Final = (
    Refusal.NOT_TLS,
    Refusal.BAD_CERTIFICATE,
    Refusal.TLS_HANDSHAKE,
    Refusal.TLS_ON_PLAIN_PORT,
    Refusal.NO_CLIENT_CERTIFICATE,
)
PEER_REFUSALS: Final = tuple(r for r in Refusal if r not in TLS_REFUSALS)


def stats_key(reason: Refusal) -> str:
    """The node counter a refusal is counted under."""
    return f"{'tls' if reason in TLS_REFUSALS else 'peer'}_refused_{reason.value}"


# A stranger is refused as fast as it can connect — 800 a second from one
# process on a busy 2-core machine, each a WARNING line of 80-200 bytes — so
# after the first refusal of a kind, one line per kind per this many seconds.
LOG_EVERY: Final = 10.0


class RefusalLog:
    """Which refusals get a log line (sans-IO: the caller passes ``now``).

    The first refusal of each kind is logged; after it, at most one per
    ``every`` seconds, which says how many were only counted since the last
    line.  The counters (``stats_key``) count every one.

    Invariant: ``_held[kind]`` is the number of refusals of ``kind`` not
    logged since its last line at ``_last[kind]``; the kinds are the
    callers' few fixed names (the ``Refusal`` values and the like), so both
    maps stay small."""

    __slots__ = ("_held", "_last", "every")

    def __init__(self, every: float = LOG_EVERY) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def admit(self, kind: str, now: float) -> int | None:
        """None: count this refusal only.  Otherwise log it, saying that this
        many refusals of ``kind`` (0 or more) were only counted before it."""
        last = self._last.get(kind)
        if last is not None and now - last < self.every:
            self._held[kind] = self._held.get(kind, 0) + 1
            return None
        self._last[kind] = now
        return self._held.pop(kind, 0)

    @staticmethod
    def more(held: int) -> str:
        """What a logged line adds about the refusals only counted before it."""
        return f" ({held} more since the last line, counted only)" if held else ""

    def warn(self, logger: logging.Logger, kind: str, now: float, msg: str, *args: object) -> None:
        """``logger.warning(msg, *args)`` if ``admit`` says so, with ``more``'s words at its end."""
        held = self.admit(kind, now)
        if held is not None:
            logger.warning(msg + "%s", *args, self.more(held))
