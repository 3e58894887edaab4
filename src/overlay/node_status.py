"""The node's self-description for operators: ``NodeCore.status()`` (SPEC §14).

Read by the client protocol's ``status`` admin command, the admin HTTP
``/status`` endpoint, ``overlay status`` and the live page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from overlay.node_core import NodeCore

__all__ = ["StatusMixin"]


class StatusMixin:
    """Mixed into ``NodeCore``."""

    def status(self: NodeCore) -> dict[str, Any]:
        return {
            "node": self.id,
            "ready": self.ready,
            "initializer": self.is_initializer,
            "load": self.local.load,
            "capacity": self.me.capacity,
            "state": self.monitor.state.value,
            "draining": self.draining,  # node_membership: refuses channels, moving its own off
            "slice": self.monitor.slice_no,
            "slice_seconds": self.monitor.slice_seconds,
            "d": self.monitor.d,
            "dc": self.monitor.dc,
            "mean_dc": self.monitor.mean,
            "spread": self.balancing.last_report.spread if self.balancing.last_report else None,
            "peers": {str(p.node): {"state": p.state.value, "dc": p.dc, "d": p.d} for p in self.monitor.live()},
            "channels": [
                {**ch.summary(), "replicas": list(self.routing[ch.id].owners) if ch.id in self.routing else [self.id]}
                for ch in self.local
            ],
            "routing": [
                {"id": str(c), "space": e.space.text(self.schema), "owners": list(e.owners)}
                for c, e in sorted(self.routing.items())
            ],
            "sessions": len(self.sessions),
            "stats": dict(self.stats),
        }
