"""The one exception hierarchy of overlay.

Every error a user can cause or see is an ``OverlayError``; nothing else is
meant to escape a parser, a codec or a core.  Exceptions carry fields, not only
text, so callers (and the wire protocol) can act on them.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BadScope",
    "ConfigError",
    "ConnectionLost",
    "ExpressionError",
    "Forbidden",
    "LimitExceeded",
    "LocalProtocolError",
    "NotReady",
    "OverlayError",
    "PeerRefused",
    "RemoteProtocolError",
    "RequestError",
    "SchemaError",
    "SlowConsumerError",
    "TlsError",
    "TokenError",
    "TokenExpired",
    "UnknownRole",
]


class OverlayError(Exception):
    """Base class of every error raised by overlay."""


class RemoteProtocolError(OverlayError):
    """The peer misbehaved: answer with an error message and close cleanly."""


class PeerRefused(RemoteProtocolError):
    """A peer link was refused before anything of it reached the node core:
    the other side could not prove it is the cluster member it claims to be
    (SPEC §16, ``overlay.security``).  ``reason`` is one of
    ``overlay.security.Refusal`` — the label it is counted under.
    ``by_peer``: the other side refused us (its PeerError), so this node
    counts nothing."""

    def __init__(self, reason: str, message: str, *, by_peer: bool = False) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.detail = message
        self.by_peer = by_peer


class LocalProtocolError(OverlayError):
    """A caller misused an API of ours (a bug on our side of the connection)."""


class ConfigError(OverlayError):
    """A cluster configuration file is invalid."""


class SchemaError(OverlayError):
    """A value does not fit the schema: unknown attribute, wrong type, out of range,
    or a distinguishing attribute missing from an event.

    ``attr`` names the attribute concerned when there is one.
    """

    def __init__(self, message: str, *, attr: str | None = None) -> None:
        super().__init__(message)
        self.attr = attr


class ExpressionError(OverlayError):
    """A textual subscription or event expression is malformed or invalid.

    ``position`` is the 0-based character offset of the offending token in
    ``text``; ``str(exc)`` shows the expression with a caret under it.
    """

    def __init__(self, message: str, *, text: str, position: int) -> None:
        self.reason = message
        self.text = text
        self.position = position
        super().__init__(self._render())

    def _render(self) -> str:
        return f"{self.reason} at position {self.position}\n  {self.text}\n  {' ' * self.position}^"


class NotReady(OverlayError):
    """The cluster (or node) is not ready to serve clients yet; retry later."""


class SlowConsumerError(OverlayError):
    """Notifications were dropped because the application does not keep up.

    The client library hands it to the application's error callback
    (``Client(error_cb=...)``, docs/client.md) — it is never raised.
    ``subscriber`` is the subscription whose bounded queue was full, or
    ``""`` when the access node ``node_id`` dropped notifications queued for
    this client's connection (its ``[cluster] client_queue``).  ``queued`` and
    ``limit`` are that subscription queue's length and capacity at the first
    drop of the report; ``dropped`` counts the notifications dropped since
    the previous report (0 when the node does not say), ``event_id`` names the
    first of them (``""`` when unknown).  ``disconnected`` is True when the
    node went further and closed the connection (it had not read for
    ``[limits] slow_consumer_grace``, or held more than its share of the
    node's queue budget): ``reason`` is the node's word on it, and the
    client reconnects and subscribes again.
    """

    def __init__(
        self,
        subscriber: str,
        queued: int = 0,
        limit: int = 0,
        *,
        dropped: int = 0,
        event_id: str = "",
        node_id: int | None = None,
        disconnected: bool = False,
        reason: str = "",
    ) -> None:
        where = f"node {node_id}" if node_id is not None else "the access node"
        if subscriber:
            text = (
                f"subscription {subscriber!r} is a slow consumer: {dropped} notification(s) dropped"
                f" (its queue held {queued} of {limit})"
            )
        elif disconnected:
            text = f"{where}: {reason or 'disconnected as a slow consumer'}"
        else:
            text = f"{where} dropped notifications for this client: its queue for the connection is full"
        super().__init__(text)
        self.subscriber = subscriber
        self.queued = queued
        self.limit = limit
        self.dropped = dropped
        self.event_id = event_id
        self.node_id = node_id
        self.disconnected = disconnected
        self.reason = reason


class RequestError(OverlayError):
    """A node refused a client request; ``code`` is one of
    ``overlay.messages.client.ErrorCode`` and ``position`` points into the
    expression when the expression was at fault (-1 otherwise)."""

    def __init__(self, code: str, message: str, position: int = -1) -> None:
        super().__init__(f"{code}: {message}" + (f" (at position {position})" if position >= 0 else ""))
        self.code = code
        self.reason = message
        self.position = position


class TlsError(OverlayError):
    """A TLS connection could not be set up: the node's certificate does not
    verify against the CA we were given, the node wants TLS and we spoke
    plain TCP (or the reverse), or it wants a client certificate.  The
    message says which, and what to configure."""


class ConnectionLost(OverlayError):
    """The connection to the access node is gone and could not be re-established."""


class AuthError(OverlayError):
    """A client's credentials do not allow what it asked (SPEC §16, ``overlay.auth``)."""


class TokenError(AuthError):
    """The token itself is refused: missing, malformed, signed by a key the
    cluster does not trust, for another cluster, or not valid yet.  A node
    answers ``unauthorized``."""


class TokenExpired(TokenError):
    """The token's ``exp`` has passed (beyond the leeway).  ``expired_at`` is
    its ``exp`` (Unix seconds)."""

    def __init__(self, message: str, *, expired_at: float) -> None:
        super().__init__(message)
        self.expired_at = expired_at


class UnknownRole(TokenError):
    """The token (or ``overlay token create``) names a role that is not
    ``publish``, ``subscribe`` or ``admin``."""

    def __init__(self, message: str, *, role: str) -> None:
        super().__init__(message)
        self.role = role


class BadScope(TokenError):
    """A content scope is not an expression of this cluster's schema, or names
    a role the token does not have.  ``role`` is the scope's role; ``position``
    points into ``text`` when the expression was at fault (-1 otherwise)."""

    def __init__(self, message: str, *, role: str, text: str = "", position: int = -1) -> None:
        super().__init__(message)
        self.role = role
        self.text = text
        self.position = position


class Forbidden(AuthError):
    """A valid token that does not allow the request: the role is missing, or
    the subscription or event lies outside the role's content scope
    (``scope`` is its text, ``""`` for a missing role).  A node answers
    ``forbidden``; the session stays open."""

    def __init__(self, message: str, *, role: str, scope: str = "") -> None:
        super().__init__(message)
        self.role = role
        self.scope = scope


class LimitExceeded(OverlayError):
    """A client went past one of its limits (SPEC §16, ``overlay.limits``):
    ``code`` is the wire's error code (``too_many_connections``,
    ``too_many_subscriptions``, ``expression_too_large``), ``key`` the
    ``[limits]`` setting (or token claim) that holds it, ``limit`` its value
    and ``value`` what the request would have made it."""

    def __init__(self, message: str, *, code: str, key: str, limit: float, value: float) -> None:
        super().__init__(message)
        self.code = code
        self.key = key
        self.limit = limit
        self.value = value
