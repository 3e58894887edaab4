"""What the simulator remembers of a run: subscriptions, events, clients, and
the result the invariants are checked against."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from overlay.channels.predicates import Filter
from overlay.messages import client as cm
from overlay.messages.codec import FrameReader

from .workload import SubSpec


@dataclass(eq=False)
class SubRec:
    client: SimClient
    local_id: str
    spec: SubSpec
    sent_at: int
    gid: str | None = None
    filter: Filter | None = None
    acked_at: int | None = None
    failed: bool = False
    unsub_sent_at: int | None = None
    unsub_acked_at: int | None = None

    @property
    def ended_at(self) -> int | None:
        """When the client stopped wanting notifications (unsubscribe or close)."""
        ends = [t for t in (self.unsub_sent_at, self.client.closed_at) if t is not None]
        return min(ends) if ends else None


@dataclass(eq=False)
class EventRec:
    event_id: str
    values: dict[str, Any]
    pub_at: int
    publisher: str


@dataclass(eq=False)
class SimClient:
    name: str
    node: int
    sid: int
    reader: FrameReader[cm.ClientMessage]
    seq: int = 0
    closed_at: int | None = None
    subs: dict[str, SubRec] = field(default_factory=dict)
    pending: dict[int, tuple[str, Any]] = field(default_factory=dict)
    admin: bool = False


@dataclass
class SimResult:
    seed: int
    nodes: int
    trace_hash: str
    failures: list[str]
    steps: int
    deliveries: int
    sim_seconds: float
    events: int
    notifies: int
    subscriptions: int
    stats: Counter[str]
    faults: Counter[str]
    admin: Counter[str]
    races: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    def describe(self) -> str:
        head = (
            f"seed {self.seed}: {self.nodes} nodes, {self.steps} steps, {self.deliveries} deliveries, "
            f"{self.sim_seconds:.1f} s simulated, {self.events} events, {self.notifies} notifies, "
            f"{self.subscriptions} subscriptions; "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.stats.items()))
            + f"; faults {dict(self.faults)}; admin {dict(self.admin)}; unsubscribe races {self.races}; "
            f"trace {self.trace_hash[:16]}"
        )
        if self.failures:
            shown = self.failures[:25]
            more = len(self.failures) - len(shown)
            return head + "\n  " + "\n  ".join(shown) + (f"\n  … and {more} more" if more > 0 else "")
        return head
