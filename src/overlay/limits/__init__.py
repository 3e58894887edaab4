"""Bounded resources for every connection (SPEC §16 "Absurd input"), sans-IO.

``settings`` is the ``[limits]`` table and the limits one client id lives
under; ``bucket`` the token bucket that paces a publisher; ``quotas`` what
each client id holds on a node (connections, subscriptions, expression
sizes, its publish rate), checked by ``overlay.node.clients``; ``budget``
the node-wide budget of bytes queued for clients and the slow-consumer
policy, carried out by ``overlay.net.clients``.
"""

from __future__ import annotations

from overlay.limits.bucket import MAX_DELAY, TokenBucket
from overlay.limits.budget import FRAME_OVERHEAD, Account, QueueBudget
from overlay.limits.quotas import Quotas
from overlay.limits.settings import CLIENT_KEYS, ClientLimits, LimitSettings, client_limits, parse_client_limits

__all__ = [
    "CLIENT_KEYS",
    "FRAME_OVERHEAD",
    "MAX_DELAY",
    "Account",
    "ClientLimits",
    "LimitSettings",
    "QueueBudget",
    "Quotas",
    "TokenBucket",
    "client_limits",
    "parse_client_limits",
]
