"""The node's self-description for operators (SPEC §14).

Read by the client protocol's ``status`` admin command, the admin HTTP
``/status`` endpoint, ``overlay status`` and the live page.
"""

from __future__ import annotations

from typing import Any

from overlay.node.arrivals import Arrivals
from overlay.node.balancing import Balancing
from overlay.node.boot import Boot
from overlay.node.context import NodeContext
from overlay.node.liveness import Liveness
from overlay.node.membership import Membership
from overlay.node.migration import Migration
from overlay.node.outbox import Outbox
from overlay.node.sessions import Sessions
from overlay.node.table_sync import TableSync

__all__ = ["node_status", "state_summary"]


def node_status(
    ctx: NodeContext,
    boot: Boot,
    balancing: Balancing,
    membership: Membership,
    sessions: Sessions,
    liveness: Liveness | None = None,
    outbox: Outbox | None = None,
    tables: TableSync | None = None,
) -> dict[str, Any]:
    """A JSON-ready snapshot: readiness, load and state, peers, channels, routing table, counters."""
    mon = balancing.monitor
    report = balancing.last_report
    routing = ctx.routing
    return {
        "node": ctx.id,
        "ready": boot.ready,
        "initializer": boot.is_initializer,
        "load": ctx.local.load,
        "capacity": ctx.me.capacity,
        "state": mon.state.value,
        "draining": membership.draining,  # refuses channels, moving its own off
        "slice": mon.slice_no,
        "slice_seconds": mon.slice_seconds,
        "d": mon.d,
        "dc": mon.dc,
        "mean_dc": mon.mean,
        "spread": report.spread if report else None,
        "peers": {str(p.node): {"state": p.state.value, "dc": p.dc, "d": p.d} for p in mon.live()},
        "channels": [
            {**ch.summary(), "replicas": list(routing[ch.id].owners) if ch.id in routing else [ctx.id]}
            for ch in ctx.local
        ],
        "routing": [
            {"id": str(c), "space": e.space.text(ctx.schema), "owners": list(e.owners)}
            for c, e in sorted(routing.items())
        ],
        "sessions": len(sessions),
        "incarnation": ctx.incarnation,
        # Failures (SPEC §16): quorum, who is suspected or dead, how long each peer has been silent.
        **({"liveness": liveness.status(ctx.now)} if liveness is not None else {}),
        **({"outbox": outbox.status()} if outbox is not None else {}),
        # Anti-entropy (node.table_sync): the table's digest and clock, the peers it differs from.
        **({"table": tables.status()} if tables is not None else {}),
        "stats": dict(ctx.stats),
    }


def state_summary(ctx: NodeContext, boot: Boot, balancing: Balancing, migration: Migration, arrivals: Arrivals) -> str:
    """What an operator needs to read a failure in the log (``node.core`` rule 8)."""
    return (
        f"ready={boot.ready} state={balancing.monitor.state.value} channels={[str(c) for c in ctx.local.ids()]} "
        f"outgoing={[(m.session, m.receiver, m.state.value) for m in migration.outgoing.values()]} "
        f"incoming={[(k, m.state.value) for k, m in arrivals.incoming.items()]} "
        f"splitting={balancing.splitting()} unreachable={sorted(ctx.unreachable)}"
    )
