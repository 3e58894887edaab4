"""What the admin endpoint, its metrics and the drain routes see of a running node.

``NodeView`` is the one seam between ``overlay.net.node.Node`` and the
modules that serve it over HTTP (``net.admin``, ``net.metrics``,
``net.membership``): they depend on this protocol, never on ``Node``, so
no import runs back from them to the node.  Rules:

1. Everything here is read-only to them but ``execute`` (carry out the
   core's actions, e.g. a drain's first messages) and ``wait_stop``.
2. The core is read through its public surface only (``NodeCore``'s
   methods and properties); the shell's state through the links, client
   writers and inbox listed here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from overlay.actions import Action
from overlay.config import ClusterConfig, NodeConfig
from overlay.net.inbox import Inbox
from overlay.net.peer_link import PeerLink
from overlay.net.writer import ConnectionWriter
from overlay.node import NodeCore
from overlay.security import NodeSecurity

__all__ = ["NodeView"]


class NodeView(Protocol):
    """A running node as its HTTP side reads it (see the module docstring)."""

    @property
    def id(self) -> int: ...

    @property
    def me(self) -> NodeConfig: ...

    @property
    def config(self) -> ClusterConfig:
        """The cluster as this node knows it (grown by joins)."""
        ...

    @property
    def core(self) -> NodeCore: ...

    @property
    def port(self) -> int:
        """The peer/client port the node listens on."""
        ...

    @property
    def security(self) -> NodeSecurity:
        """TLS or not, the contexts of its ports (``overlay.security.tls``)."""
        ...

    @property
    def started(self) -> asyncio.Event: ...

    @property
    def stopping(self) -> bool:
        """True from ``stop()`` on."""
        ...

    @property
    def links(self) -> Mapping[int, PeerLink]: ...

    @property
    def clients(self) -> Mapping[int, ConnectionWriter]: ...

    @property
    def inbox(self) -> Inbox: ...

    def execute(self, actions: list[Action]) -> None: ...

    async def wait_stop(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the node to be told to stop; whether it was."""
        ...
