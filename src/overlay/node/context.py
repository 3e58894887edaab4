"""What every component of a node core shares, and nothing else.

The context holds the node's identity and configuration, who its peers are
and which of them are unreachable, the two tables (the cluster's routing
table and this node's local channels, SPEC §3), the counters and histograms
the admin endpoint exposes, the decision journal, the capture buffer when the
shell captures (SPEC §13), the clock of the message being handled, and the
ids this run of the node names events with.  Everything else is some component's own
state, reached through that component's methods.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from overlay.channels.local_table import LocalTable
from overlay.channels.routing_table import RoutingTable
from overlay.histograms import LATENCY_BOUNDS, TESTED_BOUNDS, BucketCounts
from overlay.node.journal import Journal
from overlay.node.stats import Stats

if TYPE_CHECKING:
    from overlay.capture import CaptureBuffer
    from overlay.config import ClusterConfig

__all__ = ["NodeContext", "base36", "event_prefix", "sub_prefix"]


class NodeContext:
    """One node's shared state (see the module docstring)."""

    __slots__ = (
        "_event_seq",
        "capture",
        "config",
        "event_prefix",
        "id",
        "incarnation",
        "journal",
        "latency_hist",
        "local",
        "me",
        "now",
        "peers",
        "routing",
        "schema",
        "stats",
        "sub_prefix",
        "tested_hist",
        "unreachable",
    )

    def __init__(self, config: ClusterConfig, node_id: int, incarnation: int) -> None:
        self.config = config
        self.id = node_id
        # The process's start time (ms), given by the shell: ids of this run
        # never repeat those of an earlier one (node.core rule 6).
        self.incarnation = incarnation
        self.me = config.node(node_id)
        self.schema = config.schema
        # The other members; membership (drain, join) changes this list in place.
        self.peers: list[int] = [n for n in config.node_ids if n != node_id]
        # Peers the shell reports down past the peer timeout: nothing waits for them.
        self.unreachable: set[int] = set()
        self.routing = RoutingTable(self.schema, writer=node_id)  # its changes are versioned as this node's
        self.local = LocalTable(node_id)
        self.stats: Counter[str] = Stats()
        # Histograms the admin endpoint exposes (SPEC §14), filled on the hot path.
        self.tested_hist = BucketCounts(TESTED_BOUNDS)
        self.latency_hist = BucketCounts(LATENCY_BOUNDS)
        self.journal = Journal(node_id, self.stats)
        # The capture buffer when the shell captures (SPEC §13; ``set_capture``).
        self.capture: CaptureBuffer | None = None
        self.now = 0.0  # the `now` of the message being handled
        self.event_prefix = event_prefix(node_id, incarnation)
        self.sub_prefix = sub_prefix(node_id, incarnation)
        self._event_seq = 0

    def set_capture(self, capture: CaptureBuffer | None) -> None:
        """The shell captures to ``capture`` (SPEC §13), None: no longer.
        ``capture`` itself is a plain attribute, read on every event (a
        property would cost a Python call each time)."""
        self.capture = capture
        self.journal.capture = capture

    def next_event_id(self) -> str:
        """A new event id of this run: ``node-incarnation-n``."""
        self._event_seq += 1
        return f"{self.event_prefix}{self._event_seq}"


def sub_prefix(node: int, incarnation: int) -> str:
    """How every subscription id made by this run of ``node`` starts
    (``node.core`` rule 6): ``node.incarnation:``, or ``node:`` for
    incarnation 0 (tests and the simulator, which never restart)."""
    return f"{node}.{base36(incarnation)}:" if incarnation else f"{node}:"


def event_prefix(node: int, incarnation: int) -> str:
    """How every event id named by this run of ``node`` starts: ``node-incarnation-``."""
    return f"{node}-{base36(incarnation)}-" if incarnation else f"{node}-"


def base36(n: int) -> str:
    """A short spelling of a non-negative integer (an incarnation: ms since the epoch)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out
