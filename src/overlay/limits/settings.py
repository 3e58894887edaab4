"""The ``[limits]`` table, and the limits one client lives under (SPEC §16 "Absurd input").

Rules:

1. Every setting has a default a legitimate heavy user (the benchmarks, the
   test suite, ``make run``) never reaches, and an upper bound that catches
   a typo (``MAX_*`` below), checked when the config is loaded.
2. A count or a rate of ``0`` means *no limit* (an operator's explicit
   choice); durations, byte sizes and the burst are always positive.
3. The client limits (``CLIENT_KEYS``) apply per client id, per node: the
   token's subject when the client presented a token (the node checks that
   it is the Hello's client id), the Hello's client id otherwise.  A token
   may carry a ``limits`` claim overriding any of them for its holder
   (``overlay token create --limit KEY=VALUE``); the claim is signed, so
   only the issuer of tokens can raise a client's limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final

import msgspec

__all__ = ["CLIENT_KEYS", "ClientLimits", "LimitSettings", "client_limits", "parse_client_limits"]

# Upper bounds (rule 1): far past any sensible value.
MAX_COUNT: Final = 100_000_000
MAX_RATE: Final = 1e9
MAX_BYTES: Final = 1 << 40  # a TiB of queued notifications is a typo
MAX_SECONDS: Final = 24 * 3600.0

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Rate = Annotated[float, msgspec.Meta(ge=0, le=MAX_RATE)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]


class ClientLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one client id may hold or do on one node (rule 3); ``0``: no limit."""

    # Client connections of this client id open on the node at once.
    max_connections: Count = 64
    # Subscriptions of this client id on the node, over all its connections
    # (the 20,000-subscription client is refused past this).
    max_subscriptions: Count = 10_000
    # A subscription expression's size: bytes of its text, and predicates
    # once parsed (each costs matching time on every event of its channels).
    max_expression_bytes: Count = 8192
    max_predicates: Count = 64
    # Publishes per second (a token bucket of ``publish_burst``); past it a
    # publish is answered Choke with the delay until its turn.
    publish_rate: Rate = 50_000.0
    publish_burst: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)] = 100_000


# The keys a token's ``limits`` claim may override (rule 3).
CLIENT_KEYS: Final = tuple(f.name for f in msgspec.structs.fields(ClientLimits))


class LimitSettings(ClientLimits, frozen=True, forbid_unknown_fields=True):
    """``[limits]``: the client limits (``ClientLimits``, rule 3) and the node-wide bounds below."""

    # Client connections open on the node, every client together.
    max_clients: Count = 10_000
    # Subscriptions the node's clients hold on it, every client together
    # (about 1.3 kB each): without it, client ids made up by the thousand
    # (no [auth]) each held max_subscriptions, and the node's memory had no bound.
    max_node_subscriptions: Count = 1_000_000
    # Bytes queued for clients (notifications and replies), every session
    # together; when exceeded, the sessions holding more than their share
    # are disconnected (slow_consumer).
    queue_budget: Annotated[int, msgspec.Meta(ge=64 * 1024, le=MAX_BYTES)] = 128 << 20
    # Seconds a connection with data waiting for it may accept none before
    # it is disconnected (slow_consumer).
    slow_consumer_grace: Seconds = 10.0
    # Seconds a new client connection has to send its first whole frame (its
    # Hello), and a session to finish a frame it began after its last whole one;
    # also the admin endpoint's TLS handshake (net.admin rule 9e).
    hello_timeout: Seconds = 10.0
    # The admin HTTP endpoint: seconds a connection may sit without a
    # request being handled (idle keep-alive, or a request's head still
    # arriving); seconds a request's body may take; its largest body; the
    # connections it keeps open at once.
    http_idle_timeout: Seconds = 30.0
    http_body_timeout: Seconds = 10.0
    http_max_body: Annotated[int, msgspec.Meta(ge=1024, le=64 << 20)] = 64 * 1024
    http_max_connections: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)] = 256

    def client(self) -> ClientLimits:
        """The client limits of this table (rule 3, without a token's claim)."""
        return ClientLimits(**{k: getattr(self, k) for k in CLIENT_KEYS})


def parse_client_limits(claim: Mapping[str, object]) -> dict[str, float]:
    """A token's ``limits`` claim, checked (rule 3): known keys, values within
    the bounds of ``ClientLimits``.  ``ValueError`` names the first bad one."""
    for key in claim:
        if key not in CLIENT_KEYS:
            raise ValueError(f"unknown limit {key!r}: limits a token may set are {', '.join(CLIENT_KEYS)}")
    try:
        checked = msgspec.convert(dict(claim), ClientLimits)
    except msgspec.ValidationError as exc:
        raise ValueError(f"bad limit: {exc}") from None
    return {k: getattr(checked, k) for k in claim}


def client_limits(settings: LimitSettings, overrides: Mapping[str, float] | None = None) -> ClientLimits:
    """Rule 3: the config's client limits, with a token's ``overrides``."""
    base = settings.client()
    return msgspec.structs.replace(base, **overrides) if overrides else base
