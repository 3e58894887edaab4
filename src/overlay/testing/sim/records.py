"""What the simulator remembers of a run: subscriptions, events, clients, and
the result the invariants are checked against.

Steps (``SimNetwork.step_no``) order everything a run did: a record's ``*_at``
fields are steps, never times.  Under node faults (``sim.faults``) a client's
session can end without the client wanting it (``SubRec.lost_at``), an event
is known from its first Publish on (``EventRec.acked_at`` is None until its
PubAck), and the faults themselves are journalled (``SimResult.journal``).
"""

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
    # Its session ended under it: the access node crashed, closed it, or the
    # client left a node cut off in a minority.  The client re-subscribes
    # elsewhere with a new ``SubRec``.
    lost_at: int | None = None
    run: tuple[int, int] = (-1, 0)  # (access node, its incarnation) it was made on
    # That run ended (crash, or declared dead and rejoined), whenever the
    # client left it: the step its end began (the crash, or the pause or cut before it).
    died_at: int | None = None
    tries: int = 0  # Subscribes refused for now (not_ready, no_quorum) and sent again
    group: str = ""  # an instance of this subscriber group (SPEC §11): its filter is the group's

    @property
    def ended_at(self) -> int | None:
        """When the client stopped wanting notifications here (unsubscribe,
        close, or the session lost)."""
        ends = [t for t in (self.unsub_sent_at, self.client.closed_at, self.lost_at) if t is not None]
        return min(ends) if ends else None


@dataclass(eq=False)
class EventRec:
    """One published event.  Without node faults it is recorded at its PubAck
    (``event_id`` is the node's); with them at its first Publish, under the
    id the client chose (``Publish.event_id``), re-sent until PubAcked."""

    event_id: str
    values: dict[str, Any]
    pub_at: int  # the step its (first) Publish was sent
    publisher: str
    acked_at: int | None = None
    sends: int = 0  # Publishes sent for it: the first, re-sends after a lost session, retries
    gave_up: bool = False  # refused too often: never acknowledged, so nothing is promised
    aliases: list[str] = field(default_factory=list)  # other ids the nodes gave it (its PubAck's)
    key: str = ""  # its sequence key (SPEC §10); the home assigns its rank
    returned: bool = False  # its publisher heard no instance of a group could take it (SPEC §11)

    def ids(self) -> list[str]:
        return [self.event_id, *self.aliases]


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
    # Under node faults: False from a lost session to the reconnect; the
    # session's number (a retry armed in an earlier session is void); the
    # requests waiting to be sent again, by retry ticket.
    connected: bool = True
    session_no: int = 0
    waiting: dict[int, tuple[str, Any]] = field(default_factory=dict)
    carry: list[tuple[str, Any]] = field(
        default_factory=list
    )  # for the next session: ("event", EventRec) | ("sub", SubRec)


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
    exempt: int = 0  # promised pairs not delivered because the subscriber's session was lost
    journal: list[str] = field(default_factory=list)  # the node faults, as they happened (``sim.faults``)

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
            + (f"lost with their session {self.exempt}; " if self.exempt else "")
            + f"trace {self.trace_hash[:16]}"
        )
        if self.journal:
            head += "\n  " + "\n  ".join(self.journal)
        if self.failures:
            shown = self.failures[:25]
            more = len(self.failures) - len(shown)
            return head + "\n  " + "\n  ".join(shown) + (f"\n  … and {more} more" if more > 0 else "")
        return head
