"""The client half of the node core: sessions, publish, (un)subscribe, operator commands.

Rules (SPEC §3, §4; module rules of ``overlay.node_core``): a client must say
Hello first; publish and subscribe before the cluster is ready are answered
``not_ready``; an (un)subscription is acknowledged once every channel applied
it; bad expressions and events are answered with an error and the position,
and the session stays open.  One rule for admin rights, as on the admin HTTP
endpoint: when the cluster has an admin token, the commands that change the
cluster (``split``, ``place``, ``drain``) need a session whose Hello carried
it; reading (``status``, ``journal``) does not.
"""

from __future__ import annotations

import hmac
import itertools
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import msgspec

from overlay.actions import Action, CloseClient, ToClient
from overlay.balance.split import Cut
from overlay.channels.channel import ChannelId
from overlay.channels.expressions import parse_event, parse_subscription
from overlay.channels.predicates import MAX_SET_SIZE, Filter
from overlay.channels.routing_table import RouteEntry
from overlay.errors import ExpressionError, LocalProtocolError, OverlayError, SchemaError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import sub_prefix
from overlay.node.ordering import MAX_TIME, publish_time_of

if TYPE_CHECKING:
    from overlay.node_core import NodeCore

__all__ = ["MAX_TIME", "ClientsMixin", "publish_time_of", "sub_prefix"]

log = logging.getLogger("overlay.node")

# Journal entries per admin("journal") reply: a few hundred bytes each, so a
# page stays far below the 1 MiB default frame cap.
JOURNAL_PAGE: Final = 500


# Admin commands that change the cluster: they need the admin token, when one is set.
CHANGING_COMMANDS: Final = frozenset({"split", "place", "drain"})


class _Session:
    __slots__ = ("admin", "client_id", "greeted", "id", "n", "subs")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.client_id = ""
        self.greeted = False
        self.admin = False  # its Hello carried the admin token (or none is needed)
        self.subs: dict[str, tuple[str, Filter]] = {}  # local id -> (global id, filter)
        self.n = 0


class _Pending:
    """An (un)subscription waiting for its channels to apply it (rule 4)."""

    __slots__ = ("applied", "channels", "local_id", "seq", "session", "subscribe", "then", "waiting")

    def __init__(self, session: int, seq: int, local_id: str, subscribe: bool, chans: Iterable[ChannelId]) -> None:
        self.session = session
        self.seq = seq
        self.local_id = local_id
        self.subscribe = subscribe
        # Copies in flight per channel: each answers once, applied or rerouted.
        self.waiting: Counter[ChannelId] = Counter(chans)
        self.applied: set[ChannelId] = set()
        self.channels = len(self.waiting)
        # An unsubscribe that waits for this subscribe: the arguments of _send_unsubscribe.
        self.then: tuple[int, int, str, str, Filter] | None = None


class ClientsMixin:
    """Mixed into ``NodeCore``."""

    # == clients =====================================================================

    def client_opened(self) -> int:
        self._session_seq += 1
        sid = self._session_seq
        self.sessions[sid] = _Session(sid)
        return sid

    def client_closed(self: NodeCore, sid: int) -> list[Action]:
        """Drop the session's subscriptions everywhere (subscriptions are owned by
        the client, which re-subscribes on reconnect)."""
        sess = self.sessions.pop(sid, None)
        out: list[Action] = []
        if sess is None:
            return out
        self.notifier.fail_session_acks(sid, out)  # its tracked deliveries failed (node.notify)
        for local_id, (gid, f) in sess.subs.items():
            self._sub_owner.pop(gid, None)
            if self.capture is not None:
                self.capture.unsubscribe(gid, "closed")
            self._send_unsubscribe(sid, 0, local_id, gid, f, out)
        return out

    def handle_client(self: NodeCore, sid: int, msg: cm.ClientMessage, now: float) -> list[Action]:
        out: list[Action] = []
        self.now = now
        if self.capture is not None:
            self.capture.now = now
        sess = self.sessions.get(sid)
        if sess is None:
            return out
        if not sess.greeted:
            if not isinstance(msg, cm.Hello):
                out.append(
                    ToClient(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, "the first message must be Hello", fatal=True))
                )
                out.append(CloseClient(sid, "no Hello"))
                return out
            sess.greeted = True
            sess.client_id = msg.client_id
            token = self.admin_token
            sess.admin = not token or hmac.compare_digest(msg.token.encode(), token.encode())
            out.append(
                ToClient(
                    sid, cm.Welcome(self.id, sid, self.ready, self.config.cluster.name, self.config.groups.ack_timeout)
                )
            )
            return out
        match msg:
            case cm.Publish():
                self._client_publish(sess, msg, now, out)
            case cm.Subscribe():
                self._client_subscribe(sess, msg, out)
            case cm.Unsubscribe():
                self._client_unsubscribe(sess, msg, out)
            case cm.Ack():
                self.stats["client_acks"] += 1
                self.notifier.client_acked(sid, msg, out)  # a tracked delivery (node.notify)
            case cm.Admin():
                self._client_admin(sess, msg, now, out)
            case cm.Hello():
                out.append(ToClient(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, "Hello sent twice")))
            case _:
                out.append(
                    ToClient(
                        sid,
                        cm.Error(
                            -1, cm.ErrorCode.PROTOCOL, f"{type(msg).__name__} is not a client request", fatal=True
                        ),
                    )
                )
                out.append(CloseClient(sid, f"sent {type(msg).__name__}"))
        return out

    def client_ack(self: NodeCore, sid: int, msg: cm.Ack) -> bool:
        """Count a client's Ack of a delivered notification, as ``handle_client``
        would.  False when the session cannot take one (unknown, or before its
        Hello): hand it to ``handle_client`` then, in order, for the answer.

        The shell calls this straight from the read loop: an Ack changes no
        state but a counter, so it need not wait its turn in the inbox.
        """
        sess = self.sessions.get(sid)
        if sess is None or not sess.greeted or self.notifier.tracks_ack(sid, msg):
            return False  # a tracked delivery's ack changes state: it waits its turn
        self.stats["client_acks"] += 1
        return True

    def _not_ready(self: NodeCore, sid: int, seq: int, out: list[Action]) -> bool:
        if self.ready:
            return False
        self.stats["rejected_not_ready"] += 1
        out.append(ToClient(sid, cm.Error(seq, cm.ErrorCode.NOT_READY, "the cluster is not ready yet; retry shortly")))
        return True

    def _client_publish(self: NodeCore, sess: _Session, msg: cm.Publish, now: float, out: list[Action]) -> None:
        if self._not_ready(sess.id, msg.seq, out):
            return
        try:
            if isinstance(msg.event, str):
                values = parse_event(msg.event, self.schema)
            else:
                values = self.schema.check_event_values(msg.event)
        except ExpressionError as exc:
            self.stats["rejected_bad_event"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EVENT, exc.reason, exc.position)))
            return
        except SchemaError as exc:
            self.stats["rejected_bad_event"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EVENT, str(exc))))
            return
        chid = self.routing.lookup_event(values)
        if chid is None:
            self.stats["rejected_no_route"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.NO_ROUTE, "no channel holds this event")))
            return
        if msg.key or msg.rank:  # ordered delivery: through the key's home (node.ordering)
            self.ordering.publish_keyed(sess.id, msg, values, now, out, chid)
            return
        event_id = self.ctx.next_event_id()
        self.ordering.remember_publish(event_id, sess.id, msg.seq)
        self.stats["events_in"] += 1
        if self.capture is not None:
            self.capture.publish(event_id, chid, values)
        ev = pm.Event(event_id, values, self.id, pm.DispatchSign.EVENT_DISPATCHED, chid, publish_time_of(msg, now))
        self._dispatch_event(ev, out)
        out.append(ToClient(sess.id, cm.PubAck(msg.seq, event_id)))

    def _client_subscribe(self: NodeCore, sess: _Session, msg: cm.Subscribe, out: list[Action]) -> None:
        if self._not_ready(sess.id, msg.seq, out):
            return
        if msg.sub_id in sess.subs:
            out.append(
                ToClient(
                    sess.id,
                    cm.Error(
                        msg.seq, cm.ErrorCode.DUPLICATE_SUBSCRIPTION, f"subscription {msg.sub_id!r} already exists"
                    ),
                )
            )
            return
        if not self.notifier.check_group(sess.id, msg, out):  # bad weight or group (node.notify)
            return
        try:
            f = parse_subscription(msg.expression, self.schema)
        except ExpressionError as exc:
            self.stats["rejected_bad_expression"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EXPRESSION, exc.reason, exc.position)))
            return
        sess.n += 1
        gid = f"{self.ctx.sub_prefix}{sess.id}:{msg.sub_id}:{sess.n}"
        sess.subs[msg.sub_id] = (gid, f)
        self._sub_owner[gid] = (sess.id, msg.sub_id)
        if self.capture is not None:
            self.capture.subscribe(gid, msg.sub_id, sess.id, sess.client_id, msg.expression)
        chans = self.routing.lookup_subscription(f)
        self._pending[gid] = _Pending(sess.id, msg.seq, msg.sub_id, True, chans)
        self.stats["subscriptions_in"] += 1
        if not chans:  # a filter no event can match: nothing to store
            self._pending.pop(gid)
            out.append(ToClient(sess.id, cm.SubAck(msg.seq, msg.sub_id, 0)))
            return
        if msg.group:
            self.notifier.note_group(gid, msg.group)
        sub = pm.Subscription(
            gid, f, sess.client_id, self.id, pm.DispatchSign.SUBSCRIBE_DISPATCHED, group=msg.group, weight=msg.weight
        )
        for chid in chans:
            self._dispatch_sub(msgspec.structs.replace(sub, ch_id=chid), out)

    def _client_unsubscribe(self: NodeCore, sess: _Session, msg: cm.Unsubscribe, out: list[Action]) -> None:
        entry = sess.subs.pop(msg.sub_id, None)
        if entry is None:
            out.append(
                ToClient(
                    sess.id, cm.Error(msg.seq, cm.ErrorCode.UNKNOWN_SUBSCRIPTION, f"no subscription {msg.sub_id!r}")
                )
            )
            return
        gid, f = entry
        self._sub_owner.pop(gid, None)
        if self.capture is not None:
            self.capture.unsubscribe(gid, "client")
        self._send_unsubscribe(sess.id, msg.seq, msg.sub_id, gid, f, out)

    def _send_unsubscribe(
        self: NodeCore, sid: int, seq: int, local_id: str, gid: str, f: Filter, out: list[Action]
    ) -> None:
        prior = self._pending.get(gid)
        if prior is not None and prior.subscribe:
            # The subscribe is still on its way, maybe by a stale route: an
            # unsubscribe sent now could overtake it and be undone by it.  It
            # goes once every channel has applied the subscribe (rule 4).
            prior.then = (sid, seq, local_id, gid, f)
            return
        chans = self.routing.lookup_subscription(f)
        self._pending[gid] = _Pending(sid, seq, local_id, False, chans or [ChannelId(-1, -1)])
        if not chans:
            self._on_applied(pm.SubscriptionApplied(gid, ChannelId(-1, -1), False), out)
            return
        unsub = pm.UnSubscription(gid, f, local_id, self.id, pm.DispatchSign.UNSUBSCRIBE_DISPATCHED)
        for chid in chans:
            self._dispatch_sub(msgspec.structs.replace(unsub, ch_id=chid), out)

    # -- operator commands -----------------------------------------------------------------

    def _client_admin(self: NodeCore, sess: _Session, msg: cm.Admin, now: float, out: list[Action]) -> None:
        if msg.command in CHANGING_COMMANDS and not sess.admin:
            self.stats["rejected_unauthorized"] += 1
            log.warning(
                "node %d: client %r (session %d) sent %r without the admin token; refused",
                self.id,
                sess.client_id,
                sess.id,
                msg.command,
            )
            out.append(
                ToClient(
                    sess.id,
                    cm.Error(
                        msg.seq,
                        cm.ErrorCode.UNAUTHORIZED,
                        (
                            f"{msg.command!r} changes the cluster and needs its admin token: connect with Client(token=...) "
                            "or `overlay … --token T` (or set OVERLAY_ADMIN_TOKEN)"
                        ),
                    ),
                )
            )
            return
        try:
            match msg.command:
                case "status":
                    out.append(ToClient(sess.id, cm.AdminReply(msg.seq, self.status())))
                case "split":
                    self._admin_split(sess.id, msg, now, out)
                case "place":
                    chid = _parse_chid(msg.args.get("channel"))
                    receiver = msg.args.get("node")
                    if isinstance(receiver, bool) or not isinstance(receiver, int):
                        raise LocalProtocolError("place needs an integer 'node'")
                    if chid not in self.local:
                        raise LocalProtocolError(self._not_owner(chid))
                    if receiver == self.id and not self.routing[chid].replicated:
                        out.append(
                            ToClient(
                                sess.id,
                                cm.AdminReply(
                                    msg.seq,
                                    {
                                        "channel": str(chid),
                                        "receiver": receiver,
                                        "moved": False,
                                        "note": f"channel {chid} is on node {receiver} already",
                                    },
                                ),
                            )
                        )
                        return
                    if receiver != self.id and receiver not in self.peers:
                        raise LocalProtocolError(
                            f"node {receiver} cannot receive channels: it is not a member of the cluster "
                            f"(members: {sorted({self.id, *self.peers})})"
                        )
                    self._own_alone(chid, out)  # a replicated channel: first back to one owner
                    if receiver == self.id:
                        out.append(
                            ToClient(
                                sess.id,
                                cm.AdminReply(
                                    msg.seq,
                                    {
                                        "channel": str(chid),
                                        "receiver": receiver,
                                        "moved": False,
                                        "note": f"channel {chid} is on node {receiver} alone now (its other replicas dropped it)",
                                    },
                                ),
                            )
                        )
                        return
                    _, acts = self.migration.start([chid], receiver, now, forced=True, admin=(sess.id, msg.seq))
                    out.extend(acts)
                case "drain":  # answered when the localTable is empty (node_membership)
                    out.extend(self.drain(now, admin=(sess.id, msg.seq)))
                case "journal":
                    # The balancing journal from entry `since` on, at most `limit` entries
                    # (a reply must fit in one frame; page with since += len(reply)).
                    since, limit = msg.args.get("since", 0), msg.args.get("limit", JOURNAL_PAGE)
                    if not (isinstance(since, int) and isinstance(limit, int) and since >= 0 and limit > 0):
                        raise LocalProtocolError("journal takes non-negative integers 'since' and 'limit'")
                    page = list(itertools.islice(self.journal, since, since + min(limit, JOURNAL_PAGE)))
                    out.append(ToClient(sess.id, cm.AdminReply(msg.seq, page)))
                case _:
                    raise LocalProtocolError(
                        f"unknown admin command {msg.command!r} (status, split, place, drain, journal)"
                    )
        except (OverlayError, KeyError, ValueError, TypeError) as exc:
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.ADMIN, str(exc))))

    def _not_owner(self: NodeCore, chid: ChannelId) -> str:
        entry = self.routing.get(chid)
        if entry is None:
            return f"channel {chid} does not exist"
        return f"channel {chid} is owned by node {entry.owner}, not node {self.id}"

    def _admin_split(self: NodeCore, sid: int, msg: cm.Admin, now: float, out: list[Action]) -> None:
        chid = _parse_chid(msg.args.get("channel"))
        ch = self.local.get(chid)
        if ch is None:
            raise LocalProtocolError(self._not_owner(chid))
        if self.migration.moving(chid):
            raise LocalProtocolError(f"channel {chid} is moving; split it later")
        if chid in self.migration.arriving():
            raise LocalProtocolError(f"channel {chid} is still arriving; split it later")
        if chid == self.balancing.splitting():
            raise LocalProtocolError(f"channel {chid} is being split already; try again later")
        attr_name = msg.args.get("attr")
        if not isinstance(attr_name, str) or not self.schema.is_da(attr_name):
            raise LocalProtocolError(
                f"split needs 'attr', one of the distinguishing attributes {list(self.schema.da)}, got {attr_name!r}"
            )
        attr = self.schema.attribute(attr_name)
        if "values" in msg.args:
            values = msg.args["values"]
            if not isinstance(values, list) or not 1 <= len(values) <= MAX_SET_SIZE:
                raise LocalProtocolError(f"split 'values' must be a list of 1 to {MAX_SET_SIZE} strings")
            low, high = ch.space.take_strings(attr.name, [str(attr.check(v)) for v in values])
        else:
            at = msg.args.get("at")
            if isinstance(at, bool) or not isinstance(at, (int, float)):
                raise LocalProtocolError("split needs a numeric 'at' or a list of 'values'")
            at = attr.check(at)  # finite, of the attribute's type, in its domain (SPEC §16): NaN split everything
            low, high = ch.space.cut(attr, at)
        self._own_alone(chid, out)  # a replicated channel: its other replicas would keep the parent
        self.splits.split_now(ch, Cut(attr.name, low, high, 0, 0), now, out, admin=(sid, msg.seq))

    def _own_alone(self: NodeCore, chid: ChannelId, out: list[Action]) -> None:
        """An operator splits or places a replicated channel: its first owner
        (this node, which holds every subscription, as each replica does)
        takes it back alone first; the other replicas drop their copies when
        the update reaches them (``node_core`` rule 9)."""
        entry = self.routing[chid]
        if not entry.replicated:
            return
        if entry.owner != self.id:
            raise LocalProtocolError(
                f"channel {chid} is replicated on nodes {list(entry.owners)}: ask node {entry.owner}, its first owner"
            )
        alone = RouteEntry(entry.space, (self.id,))
        self.routing.set(chid, alone)
        self.stats["replicas_collapsed"] += 1
        log.info(
            "node %d: channel %s back on this node alone (was on %s) for an operator's command",
            self.id,
            chid,
            list(entry.owners),
        )
        self.updates.broadcast((), [(chid, alone)], out)

    def _admin_done(self: NodeCore, admin: tuple[int, int], result: Any, out: list[Action]) -> None:
        sid, seq = admin
        if sid in self.sessions:
            out.append(ToClient(sid, cm.AdminReply(seq, result)))


def _parse_chid(raw: object) -> ChannelId:
    if isinstance(raw, str) and raw.count(".") == 1:
        node, seq = raw.split(".")
        if node.isdigit() and seq.isdigit():
            return ChannelId(int(node), int(seq))
    raise LocalProtocolError(f"channel ids look like 'node.seq' (e.g. '0.0'), got {raw!r}")
