"""Prometheus metrics of one node, collected at scrape time (SPEC §14).

``NodeCollector`` reads the node's core (counters, monitor, histograms) and
shell (queue depths, links) whenever ``/metrics`` is scraped, into the
node's own ``CollectorRegistry`` (``overlay.net.admin``).  It sees the node
as a ``NodeView`` (``overlay.net.view``) and the core through its public
surface only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import utils as prometheus_utils
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from overlay.histograms import BucketCounts
from overlay.net.view import NodeView
from overlay.security import PEER_REFUSALS, TLS_REFUSALS, stats_key

__all__ = ["NodeCollector"]

# A bucket bound as Prometheus spells it ("+Inf", Go's exponents): the
# client library's own function, which it leaves unannotated.
_bound_label: Callable[[float], str] = prometheus_utils.floatToGoString

# Core counters exported under their own names: (family, help, stats key).
_COUNTERS: Final = (
    ("overlay_events_in", "Events accepted from publishers at this access node.", "events_in"),
    ("overlay_events_matched", "Events matched by a channel of this node.", "events_matched"),
    (
        "overlay_events_notified",
        "(event, subscription) matches sent towards subscribers' access nodes.",
        "notifications_out",
    ),
    ("overlay_notifies_sent", "Notify frames queued for this node's clients.", "notifies_out"),
    (
        "overlay_events_rerouted",
        "Dispatched events re-routed by the current routing table (SPEC §4).",
        "events_rerouted",
    ),
    ("overlay_subscriptions_in", "Subscriptions received from clients.", "subscriptions_in"),
    ("overlay_subscriptions_rerouted", "Dispatched (un)subscriptions re-routed (SPEC §4).", "subscriptions_rerouted"),
    ("overlay_client_acks", "Acks of tracked notifications (ordered, group copies) from clients.", "client_acks"),
    ("overlay_liems_in", "LIEMs received (SPEC §6).", "liems_in"),
    ("overlay_migrations", "Channel migrations this node completed as the sender (SPEC §8).", "migrations"),
    ("overlay_replications", "Channel replications this node completed as the sender (SPEC §8.3).", "replications"),
    ("overlay_migrations_aborted", "Migration sessions aborted or refused (SPEC §8.2).", "migrations_aborted"),
    ("overlay_splits", "Channel splits on this node (SPEC §8.3).", "splits"),
    ("overlay_merges", "Channel merges on this node (SPEC §8.4).", "merges"),
    ("overlay_migration_bytes", "Bytes of subscriptions moved by migrations and replications.", "migration_bytes"),
    ("overlay_subscriptions_moved", "Subscriptions moved by migrations and replications.", "subscriptions_moved"),
    ("overlay_chokes", "Publishes answered with Choke (SPEC §12).", "chokes"),
    (
        "overlay_peer_queue_overflow",
        "Peer frames queued past a full link queue (backpressure, not dropped).",
        "peer_queue_overflow",
    ),
    # Ordered delivery (SPEC §10, overlay.node.ordering) and groups (SPEC §11, overlay.node.groups).
    (
        "overlay_ordered_released",
        "Keyed events released by this node's sequencer (it is their key's home).",
        "ordered_released",
    ),
    ("overlay_ordered_completed", "Released keyed events delivered everywhere they matched.", "ordered_completed"),
    ("overlay_seq_gaps_skipped", "Missing ranks given up on by expiry (policy skip), per gap.", "seq_gaps_skipped"),
    ("overlay_seq_expired_dropped", "Held keyed events dropped by expiry (policy drop).", "seq_expired_dropped"),
    (
        "overlay_seq_processing_timeouts",
        "Released keyed events whose acks never all came (the key moved on).",
        "seq_processing_timeouts",
    ),
    ("overlay_group_dispatched", "Events dispatched to one instance of a subscriber group.", "group_dispatched"),
    (
        "overlay_group_redispatched",
        "Group events moved to another instance after a failed delivery.",
        "group_redispatched",
    ),
    (
        "overlay_group_throttled",
        "Low-priority group events dropped: every instance above the throttle LF.",
        "group_throttled",
    ),
    (
        "overlay_group_undeliverable",
        "Group events no instance could take (the publisher is told).",
        "group_undeliverable",
    ),
    (
        "overlay_delivery_ack_timeouts",
        "Tracked notifications whose client did not ack within ack_timeout.",
        "delivery_ack_timeouts",
    ),
    # Nothing acknowledged is lost (overlay.node.outbox, overlay.node.dedup).
    (
        "overlay_events_confirmed",
        "Unkeyed events PubAck'ed once every matching subscription's access node confirmed them.",
        "events_confirmed",
    ),
    ("overlay_events_resent", "Unconfirmed events sent again to their channel's current owner.", "events_resent"),
    (
        "overlay_events_expired",
        "Events given up unconfirmed after event_ttl (the publisher is told undeliverable).",
        "events_expired",
    ),
    (
        "overlay_duplicates_dropped",
        "Notifications of an event id this access node had delivered lately, dropped.",
        "duplicates_dropped",
    ),
    ("overlay_outbox_chokes", "Publishes answered Choke because the outbox was full.", "choked_outbox_full"),
    (
        "overlay_rate_limit_chokes",
        "Publishes answered Choke because their client id was over its publish rate ([limits]).",
        "choked_rate_limited",
    ),
)
_DROPS: Final = (
    ("slow_consumer", "slow_consumer_drops"),
    ("slow_consumer_disconnect", "slow_consumer_dropped"),
    ("orphaned_notification", "notifications_orphaned"),
    ("unroutable_event", "events_unroutable"),
    ("unroutable_subscription", "subscriptions_unroutable"),
)
_REJECTED_PREFIX: Final = "rejected_"
# Connections refused before they reached the core (SPEC §16, overlay.security.refusals).
_REFUSALS: Final = (
    ("overlay_tls_refused", "Connections refused by the TLS layer, by reason.", TLS_REFUSALS),
    ("overlay_peer_refused", "Peer links refused (strangers, forged ids, wrong cluster …), by reason.", PEER_REFUSALS),
)
# overlay.net.clients rule 7: why a slow consumer was disconnected.
_SLOW_REASONS: Final = ("stalled", "budget")


class NodeCollector:
    """Reads one node's core and shell at scrape time (module rule 6)."""

    def __init__(self, node: NodeView) -> None:
        self.node = node

    def describe(self) -> list[Metric]:
        return []  # families depend on the node's state; the registry is ours alone

    def collect(self) -> Iterator[Metric]:
        node, core = self.node, self.node.core
        stats = core.stats
        mon = core.monitor
        lab = ["node"]
        me = str(node.id)

        def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=lab)
            if value is not None:
                g.add_metric([me], value)
            return g

        yield gauge("overlay_ready", "1 when the node is ready (SPEC §3).", 1.0 if core.ready else 0.0)
        state = GaugeMetricFamily(
            "overlay_state", "The node's balancing state, 1 for the current one (SPEC §5).", labels=["node", "state"]
        )
        for s in type(mon.state):
            state.add_metric([me, s.value], 1.0 if s is mon.state else 0.0)
        yield state
        yield gauge("overlay_load_d", "Load d of the last slice: subscriptions tested (SPEC §5).", mon.d)
        yield gauge("overlay_load_dc", "Load level dc = d / c of the last slice (SPEC §5).", mon.dc)
        yield gauge("overlay_capacity", "Configured capacity c.", node.me.capacity)
        yield gauge("overlay_mean_dc", "Mean load level dc̄ as this node sees it (SPEC §5).", mon.mean)
        report = core.balancing.last_report
        spread = report.spread if report is not None else None
        yield gauge("overlay_spread", "Spread S of the load levels as this node sees it (SPEC §5).", spread)
        yield gauge(
            "overlay_spread_ratio",
            "S / dc̄ as this node sees it: what balancing lowers.",
            spread / mon.mean if spread is not None and mon.mean else None,
        )
        yield gauge("overlay_slice_seconds", "Current slice length T (anti-jitter may stretch it).", mon.slice_seconds)
        yield gauge("overlay_slice", "Slices this node has closed.", mon.slice_no)
        yield gauge("overlay_channels", "Channels in this node's localTable.", len(core.local))
        yield gauge("overlay_routing_channels", "Channels in this node's routingTable.", len(core.routing))
        yield gauge(
            "overlay_subscriptions_stored",
            "Subscriptions stored in this node's channels.",
            sum(len(ch) for ch in core.local),
        )
        yield gauge("overlay_client_sessions", "Client sessions open on this node.", len(core.sessions))
        yield gauge(
            "overlay_outbox_events", "Accepted events not confirmed yet (overlay.node.outbox).", len(core.outbox)
        )
        peer_dc = GaugeMetricFamily(
            "overlay_peer_dc", "Load level dc of a peer, from its last LIEM.", labels=["node", "peer"]
        )
        for p in mon.live():
            peer_dc.add_metric([me, str(p.node)], p.dc)
        yield peer_dc

        depth = GaugeMetricFamily(
            "overlay_link_queue_depth",
            "Frames waiting on the outbound link to a peer (SPEC §1.1).",
            labels=["node", "peer", "priority"],
        )
        up = GaugeMetricFamily(
            "overlay_link_connected", "1 while the outbound link to a peer is connected.", labels=["node", "peer"]
        )
        for pid, link in sorted(node.links.items()):
            depth.add_metric([me, str(pid), "high"], len(link.queue.high))
            depth.add_metric([me, str(pid), "normal"], len(link.queue.normal))
            up.add_metric([me, str(pid)], 1.0 if link.connected.is_set() else 0.0)
        yield depth
        yield up
        inbox = GaugeMetricFamily(
            "overlay_inbox_depth",
            "Inbound messages waiting for the dispatcher (SPEC §1.1).",
            labels=["node", "priority"],
        )
        inbox.add_metric([me, "high"], len(node.inbox.high))
        inbox.add_metric([me, "normal"], len(node.inbox.normal))
        yield inbox
        writers = list(node.clients.values())
        cq = GaugeMetricFamily(
            "overlay_client_queue_depth",
            "Frames waiting for this node's clients, summed over sessions.",
            labels=["node", "priority"],
        )
        cq.add_metric([me, "high"], sum(len(w.queue.high) for w in writers))
        cq.add_metric([me, "normal"], sum(len(w.queue.normal) for w in writers))
        yield cq
        yield gauge(
            "overlay_client_queue_max",
            "Frames waiting for the most backed-up client.",
            max((len(w.queue) for w in writers), default=0),
        )
        # The queue budget and the slow-consumer policy (overlay.net.clients rule 7).
        yield gauge(
            "overlay_client_queued_bytes",
            "Bytes queued for this node's clients, summed over sessions (counted against the queue budget).",
            sum(w.account.bytes for w in writers),
        )
        yield gauge(
            "overlay_client_queue_budget_bytes", "[limits] queue_budget of this node.", node.config.limits.queue_budget
        )

        known: set[str] = set()
        for name, doc, key in _COUNTERS:
            known.add(key)
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric([me], stats.get(key, 0))
            yield c
        refw = CounterMetricFamily(
            "overlay_reforwards",
            "Reforwarded messages (SPEC §8.2), out as the sender, in as the receiver.",
            labels=["node", "direction"],
        )
        refw.add_metric([me, "out"], stats.get("reforwards", 0))
        refw.add_metric([me, "in"], stats.get("reforwards_in", 0))
        known.update(("reforwards", "reforwards_in"))
        yield refw
        rejected = CounterMetricFamily("overlay_rejected", "Inputs refused, by reason.", labels=["node", "reason"])
        for key in sorted(k for k in stats if k.startswith(_REJECTED_PREFIX)):
            rejected.add_metric([me, key[len(_REJECTED_PREFIX) :]], stats[key])
            known.add(key)
        yield rejected
        drops = CounterMetricFamily(
            "overlay_dropped", "Messages dropped, by reason (always counted, never silent).", labels=["node", "reason"]
        )
        for reason, key in _DROPS:
            drops.add_metric([me, reason], stats.get(key, 0))
            known.add(key)
        yield drops
        for family, doc, reasons in _REFUSALS:
            refused = CounterMetricFamily(family, doc, labels=["node", "reason"])
            for reason in reasons:
                key = stats_key(reason)
                refused.add_metric([me, reason.value], stats.get(key, 0))
                known.add(key)
            yield refused
        slow = CounterMetricFamily(
            "overlay_slow_consumer_disconnects",
            "Client connections closed as slow consumers, by reason: stalled past the grace, or over the budget.",
            labels=["node", "reason"],
        )
        for reason in _SLOW_REASONS:
            key = f"slow_consumer_disconnects_{reason}"
            slow.add_metric([me, reason], stats.get(key, 0))
            known.add(key)
        known.add("slow_consumer_disconnects")
        yield slow
        # Every other counter of the core (sequencer, groups, journal records …)
        # under its own name, so a new counter is exported without a change here.
        other = CounterMetricFamily(
            "overlay_node_events", "Every other counter of the node core, by name.", labels=["node", "name"]
        )
        for key in sorted(k for k in stats if k not in known):
            other.add_metric([me, key], stats[key])
        yield other

        yield _histogram(
            "overlay_tested_subscriptions",
            "Subscriptions tested per matched event (SPEC §5 event cost).",
            core.ctx.tested_hist,
            me,
        )
        yield _histogram(
            "overlay_publish_notify_latency_seconds",
            "Seconds from publish to the access node's Notify.",
            core.ctx.latency_hist,
            me,
        )


def _histogram(name: str, doc: str, h: BucketCounts, node: str) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=["node"])
    fam.add_metric([node], [(_bound_label(le), n) for le, n in h.cumulative()], h.sum)
    return fam
