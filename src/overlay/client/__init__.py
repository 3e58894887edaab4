"""The client library: publishers and subscribers talking TCP to any node."""

from overlay.client.connection import Client, Notification, Publisher, Subscriber, Subscription

__all__ = ["Client", "Notification", "Publisher", "Subscriber", "Subscription"]
