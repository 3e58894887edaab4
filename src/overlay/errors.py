"""The one exception hierarchy of overlay.

Every error a user can cause or see is an ``OverlayError``; nothing else is
meant to escape a parser, a codec or a core.  Exceptions carry fields, not only
text, so callers (and the wire protocol) can act on them.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConnectionLost",
    "ExpressionError",
    "LocalProtocolError",
    "NotReady",
    "OverlayError",
    "RemoteProtocolError",
    "RequestError",
    "SchemaError",
    "SlowConsumerError",
]


class OverlayError(Exception):
    """Base class of every error raised by overlay."""


class RemoteProtocolError(OverlayError):
    """The peer misbehaved: answer with an error message and close cleanly."""


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
    """A subscriber's bounded queue is full and the policy is to refuse."""

    def __init__(self, subscriber: str, queued: int, limit: int) -> None:
        super().__init__(f"subscriber {subscriber!r} is too slow: {queued} notifications queued (limit {limit})")
        self.subscriber = subscriber
        self.queued = queued
        self.limit = limit


class RequestError(OverlayError):
    """A node refused a client request; ``code`` is one of
    ``overlay.messages.client.ErrorCode`` and ``position`` points into the
    expression when the expression was at fault (-1 otherwise)."""

    def __init__(self, code: str, message: str, position: int = -1) -> None:
        super().__init__(f"{code}: {message}" + (f" (at position {position})" if position >= 0 else ""))
        self.code = code
        self.reason = message
        self.position = position


class ConnectionLost(OverlayError):
    """The connection to the access node is gone and could not be re-established."""
