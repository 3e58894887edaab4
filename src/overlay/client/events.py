"""What the client protocol (``overlay.client.protocol``) returns for its driver
to act on, and its re-subscribe list's entries.  Plain data: no behaviour."""

from __future__ import annotations

from dataclasses import dataclass

from overlay.client.deliveries import Notification
from overlay.errors import OverlayError
from overlay.messages import client as cm

__all__ = [
    "Connected",
    "Delivered",
    "Event",
    "Failed",
    "NodeError",
    "Replied",
    "SubscriptionLost",
    "SubscriptionSpec",
]


@dataclass(frozen=True, slots=True)
class Event:
    """Base of what ``receive``, ``tick`` and the other calls return."""


@dataclass(frozen=True, slots=True)
class Connected(Event):
    node_id: int
    cluster: str
    ready: bool
    conn: int  # connections opened so far, this one included


@dataclass(frozen=True, slots=True)
class Replied(Event):
    """Request ``request`` is done: ``reply`` is its final answer."""

    request: int
    reply: cm.ClientMessage


@dataclass(frozen=True, slots=True)
class Failed(Event):
    """Request ``request`` is done and failed (``RequestError``, ``NotReady``,
    ``ConnectionLost``, ``LocalProtocolError`` or ``TimeoutError``)."""

    request: int
    error: Exception


@dataclass(frozen=True, slots=True)
class Delivered(Event):
    """Hand ``note`` to each of ``sub_ids`` (protocol rule 5)."""

    note: Notification
    sub_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeError(Event):
    """An Error that answers nothing of ours: the node's news (protocol rule 7)."""

    error: OverlayError


@dataclass(frozen=True, slots=True)
class SubscriptionLost(Event):
    """The node did not take the subscription back after a reconnect (protocol rule 4): it ended."""

    sub_id: str
    error: OverlayError


@dataclass(slots=True)
class SubscriptionSpec:
    """One entry of the re-subscribe list (protocol rule 3)."""

    sub_id: str
    expression: str
    group: str = ""
    weight: float = 1.0
    request: int = 0  # the caller's Subscribe until it is acknowledged
    acked: bool = False
