"""The client library: publishers and subscribers talking TCP to any node.

``Client`` uses one access node at a time; ``AgentClient`` holds several and
routes each publish to the one with the lowest predicted latency, and keeps
subscriptions alive across the loss of an access node (SPEC §12).

Layout: the protocol is sans-IO — ``protocol`` (the connection state machine
and what it composes: ``requests``, ``window``, ``deliveries``, the
re-subscribe list), ``reports`` (errors waiting for the error callback),
``agent`` (the routing agent's estimator), ``placement``, ``load_factor`` —
and the asyncio drivers are thin: ``connection`` (``Client``),
``subscription``, ``routing`` (``AgentClient``), ``failover``, ``callbacks``,
``tasks``.
"""

from overlay.client.callbacks import ErrorCallback
from overlay.client.connection import (
    Client,
    Notification,
    Publisher,
    Subscriber,
    Subscription,
)
from overlay.client.routing import (
    AgentClient,
    AgentSettings,
    FailoverSubscription,
    load_agent_settings,
)
from overlay.errors import SlowConsumerError

__all__ = [
    "AgentClient",
    "AgentSettings",
    "Client",
    "ErrorCallback",
    "FailoverSubscription",
    "Notification",
    "Publisher",
    "SlowConsumerError",
    "Subscriber",
    "Subscription",
    "load_agent_settings",
]
