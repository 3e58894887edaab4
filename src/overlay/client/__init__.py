"""The client library: publishers and subscribers talking TCP to any node.

``Client`` uses one access node at a time; ``AgentClient`` holds several and
routes each publish to the one with the lowest predicted latency, and keeps
subscriptions alive across the loss of an access node (SPEC §12).
"""

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

__all__ = [
    "AgentClient",
    "AgentSettings",
    "Client",
    "FailoverSubscription",
    "Notification",
    "Publisher",
    "Subscriber",
    "Subscription",
    "load_agent_settings",
]
