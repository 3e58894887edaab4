"""Each peer message to the component that handles it (``node.core``'s dispatch).

One ``match`` over the message types of SPEC §9 and what a deployment adds;
a ``NotificationAck`` goes on by the leg its ``code`` names.  A message whose
filters, events or spaces the schema refuses goes nowhere
(``node.peer_checks``).  No state of
its own: the components own theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from overlay.actions import Action, ToPeer
from overlay.errors import RemoteProtocolError
from overlay.messages import peer as pm
from overlay.node.arrivals import Arrivals
from overlay.node.balancing import Balancing
from overlay.node.boot import Boot
from overlay.node.context import NodeContext
from overlay.node.failures import Failures
from overlay.node.groups import Groups
from overlay.node.migration import Migration
from overlay.node.notify import UNDELIVERABLE, Notifier
from overlay.node.ordering import ACKED, COMPLETE, SEQUENCED, Ordering
from overlay.node.outbox import Outbox, Receipts
from overlay.node.peer_checks import check_peer_message
from overlay.node.recovery import Recovery
from overlay.node.router import Router
from overlay.node.sessions import Sessions
from overlay.node.table_sync import TableSync
from overlay.node.updates import TableUpdates

__all__ = ["PeerMessages"]

log = logging.getLogger("overlay.node")

PeerHello = Callable[[int, pm.PeerHello, float], list[Action]]


class PeerMessages:
    """The dispatch of peer messages; ``peer_hello`` is the node core's own handling of a hello."""

    def __init__(
        self,
        ctx: NodeContext,
        *,
        arrivals: Arrivals,
        balancing: Balancing,
        failures: Failures,
        migration: Migration,
        notifier: Notifier,
        outbox: Outbox,
        receipts: Receipts,
        recovery: Recovery,
        router: Router,
        sessions: Sessions,
        startup: Boot,
        updates: TableUpdates,
        ordering: Ordering,
        groups: Groups,
        tables: TableSync,
        peer_hello: PeerHello,
    ) -> None:
        self._ctx = ctx
        self._arrivals = arrivals
        self._balancing = balancing
        self._failures = failures
        self._migration = migration
        self._notifier = notifier
        self._outbox = outbox
        self._receipts = receipts
        self._recovery = recovery
        self._router = router
        self._sessions = sessions
        self._startup = startup
        self._updates = updates
        self._ordering = ordering
        self._groups = groups
        self._tables = tables
        self._peer_hello = peer_hello

    def events(self, src: int, msgs: list[pm.Event], out: list[Action]) -> None:
        """Events from ``src`` in a row (the shell's batch), each as ``handle``
        would take it.  One Event's failure is its own, as in the shell's
        dispatcher: what it had produced is dropped; a protocol error is
        answered with a ``PeerError``, anything else logged with its
        traceback; the next one is handled."""
        schema = self._ctx.schema
        on_event = self._router.on_event
        for msg in msgs:
            mark = len(out)
            try:
                check_peer_message(msg, schema)
                on_event(msg, out)
            except RemoteProtocolError as exc:
                del out[mark:]
                log.warning("node %d: protocol error from peer %d: %s", self._ctx.id, src, exc)
                out.append(ToPeer(src, pm.PeerError("protocol_error", str(exc))))
            except Exception:  # one message's failure is its own (net.dispatch rule 2)
                del out[mark:]
                log.exception("node %d: failed handling Event %s from peer %d", self._ctx.id, msg.event_id, src)

    def handle(self, src: int, msg: pm.PeerMessage, now: float, out: list[Action]) -> None:
        check_peer_message(msg, self._ctx.schema)  # what only the schema can judge (node.peer_checks)
        match msg:
            case pm.Event():
                self._router.on_event(msg, out)
            case pm.Notification():
                notifier = self._notifier
                if msg.key or notifier.has_groups:  # acks go back to the owner (node.notify)
                    notifier.notify(
                        msg.event_id,
                        msg.event_exp,
                        msg.sub_ids,
                        msg.publish_time,
                        src,
                        msg.key,
                        msg.rank,
                        out,
                        msg.ch_id,
                        msg.payload,
                    )
                else:
                    notifier.notify_clients(
                        msg.event_id, msg.event_exp, msg.sub_ids, msg.publish_time, out, msg.payload, src
                    )
                if msg.origin >= 0 and not msg.key:  # the publisher's access node waits for it (node.outbox)
                    if msg.confirm:  # the owner left its match report to us (node.outbox rule 2)
                        self._receipts.reported(msg.origin, msg.event_id, msg.confirm, out)
                    else:
                        self._receipts.delivered(msg.origin, msg.event_id, out)
            case pm.Subscription():
                self._router.on_subscription(msg, out)
            case pm.UnSubscription():
                self._router.on_unsubscription(msg, out)
            case pm.SubscriptionApplied():
                self._sessions.on_applied(msg, out)
            case pm.NotificationAck():
                self._ctx.stats["notification_acks"] += 1
                self._on_notification_ack(msg, out)
            case pm.RoutingTableInit():
                self._startup.on_table(src, msg, out)
            case pm.ReplyRoutingTableInit():
                self._startup.on_init_reply(src)
            case pm.UpdateRoutingTable():
                if msg.dead == src and self._startup.has_table:  # a new run's channels (node.recovery rule 5)
                    self._recovery.on_restart(src, msg, now, out)
                    return
                items = self._startup.on_update(src, msg, out)
                if msg.dead >= 0 and items is not None:  # a dead node's channels (node.recovery)
                    self._recovery.on_update(src, msg, items, now, out)
            case pm.ReplyUpdateGlobal():
                if not self._migration.on_update_reply(src, msg, now, out):
                    self._updates.on_reply(src, msg.session, out)
            case pm.RequestLoadBalance():
                self._arrivals.on_request(src, msg, now, out)
            case pm.ChannelTransfer():
                self._arrivals.on_channel_transfer(src, msg, now, out)
            case pm.SubscriptionMove():
                self._arrivals.on_subscription_move(src, msg, now, out)
            case pm.Reforward():
                self._arrivals.on_reforward(src, msg, now, out)
            case pm.CompleteLoadBalance():
                self._arrivals.on_complete(src, msg, now, out)
            case pm.DeliveryHandover():
                self._groups.adopt(src, msg, out)  # node.groups rule 10
            case pm.ReplyRequestLoadBalance() | pm.ReplyChannelTransfer() | pm.ReplySubscriptionMove():
                self._migration.on_reply(src, msg, now, out)
            case pm.EventsMatched():
                self._outbox.on_matched(src, msg, out)
            case pm.EventsDelivered():
                self._outbox.on_delivered(src, msg, out)
            case pm.LIEM():
                self._ctx.stats["liems_in"] += 1
                self._balancing.on_liem(src, msg)
            case pm.Heartbeat():
                self._failures.on_heartbeat(src, msg, now, out)
            case pm.KeySync():
                self._ordering.home.on_sync(src, msg, out)
            case pm.KeySynced():
                self._ordering.home.on_synced(src, msg, out)
            case pm.KeyAsk():
                self._ordering.home.on_ask(src, out)
            case pm.Rebuild():
                self._recovery.on_rebuild(src, msg, now, out)
            case pm.TableRequest():
                self._tables.on_request(src, msg, out)
            case pm.TableReply():
                self._tables.on_reply(src, msg, out)
            case pm.Batch():
                # The shell unpacks a Batch (net.peer_link rule 7); a driver that
                # hands one over whole gets the same: its messages in order,
                # after every one of them passed its checks (one refused, none applied).
                for inner in msg.messages:
                    check_peer_message(inner, self._ctx.schema)
                for inner in msg.messages:
                    self.handle(src, inner, now, out)
            case pm.PeerHello():
                out.extend(self._peer_hello(src, msg, now))
            case pm.PeerError():
                log.warning("node %d: peer %d refused a message: %s %s", self._ctx.id, src, msg.code, msg.message)
            case _:
                raise RemoteProtocolError(f"unexpected {type(msg).__name__} from node {src}")

    def _on_notification_ack(self, msg: pm.NotificationAck, out: list[Action]) -> None:
        """To the component of the leg ``msg.code`` names (see ``pm.NotificationAck``)."""
        code = msg.code
        if not msg.event_id and code in (COMPLETE, SEQUENCED, ACKED):
            self._ordering.on_batched(msg, out)
        elif code == pm.AckCode.DELIVERY:
            self._groups.on_delivery_ack(msg, out)
        elif code == COMPLETE:
            self._ordering.on_complete_ack(msg.event_id, out)
        elif code == UNDELIVERABLE:
            self._notifier.on_returned(msg, out)
        elif code == SEQUENCED or msg.failed:
            self._ordering.on_verdict(msg, out)
        else:
            self._ctx.stats["notification_acks_unknown"] += 1
