"""The client protocol at an access node: Hello, publish, (un)subscribe, acks (SPEC §4).

Rules: a client must say Hello first (a Hello carrying the cluster's admin
token gives the session admin rights, ``node.admin``, unless the cluster has
``[auth]``: then the auth rules below hold); publish and subscribe
before the cluster is ready are answered ``not_ready``; a node that drained
and left refuses a Hello (``draining``, ``node.membership`` rule 6); bad expressions and
events are answered with an error and the position, and the session stays
open; a message that is not a client request closes it.  An event gets its
id here and goes to its one channel (``node.router``), a keyed one through
its key's home (``node.ordering``); a subscription goes to every channel of
its filter and is acknowledged once all applied it (``node.sessions``).

An event's payload (``Publish.payload``) is never parsed or matched: one
over ``[cluster] max_payload`` is refused ``payload_too_large`` before the
event is parsed (the session stays open), and otherwise goes unchanged, the
same bytes object, into the ``pm.Event`` and so into every notification.

An unkeyed event is kept in the outbox and acknowledged once it reached
every matching subscription's access node (``node.outbox``); a full outbox
answers Choke.  Its id is the publisher's when the Publish names one —
``client_id/event_id``, refused ``bad_event`` unless both parts are plain
(``EVENT_ID``, ``CLIENT_ID``) — so a publish sent again after a lost
connection, while kept or later, is delivered once (``node.dedup``); one
sent again while its first copy is kept waits for that copy's PubAck.
Otherwise the node names it (``node.core`` rule 6).  Its publisher
``(session, seq)`` is remembered for a while (``Ordering.remember_publish``)
so that a group's ``undeliverable`` coming back after the PubAck still
reaches it (``node.notify`` rule 4) — unless the event was complete within
the publish's own call (a local owner, local subscribers) with no group
delivery tracked (``Groups.tracks``): then nothing can come back for it,
and the common event of a one-node cluster costs no entry.  A keyed event's id is
the publisher's on the same terms, and its home judges a re-send
(``node.keyhome`` rule 8).

Auth (SPEC §16, ``overlay.auth``), when the node has a ``Verifier``:

A1. The Hello's token is verified once, here, with the node's public keys
    and ``now`` — no round trip to anyone.  A missing token (where tokens
    are required), a bad one, or one for another client id than the Hello
    names is answered with a fatal ``unauthorized`` Error saying why, and
    the session is closed: nothing else it sends is read.  Where tokens are
    optional, a Hello without one gets ``Rights.anonymous``.
A2. Every publish and subscribe is checked against the session's rights:
    the role, then the content scope (the event inside the publish scope;
    the subscription included in the subscribe scope).  A refusal is a
    ``forbidden`` Error naming the role or the scope; the session stays
    open and nothing was done.  Unsubscribes and acks need no role: they
    only undo or finish what was allowed.
A3. A session whose token expires is closed with a fatal ``token_expired``
    Error: at its first message past ``exp`` (plus the leeway), or by the
    tick's sweep (``expire``) if it only listens — a subscriber's rights end
    with its token too.  The client reconnects with a fresh token.
A4. Every refusal is counted (``rejected_unauthorized``,
    ``rejected_forbidden``, ``rejected_token_expired``: the metrics'
    ``overlay_rejected{reason}``) and logged once per session; a refused
    Hello within the bound of ``security.refusals.RefusalLog``.

Limits (SPEC §16, ``overlay.limits.quotas``), per client id on this node:

L1. A Hello past the client id's ``max_connections`` is answered with a
    fatal ``too_many_connections`` Error and the session is closed; it
    never counted.
L2. A subscribe past ``max_subscriptions`` (or the node's
    ``max_node_subscriptions``, every client id together), or whose expression is over
    ``max_expression_bytes`` (checked before parsing) or ``max_predicates``
    (after), is refused — ``too_many_subscriptions``,
    ``expression_too_large`` — naming the limit and its config key; the
    session stays open and nothing was stored.
L3. A publish past the client id's token bucket (``publish_rate``,
    ``publish_burst``) is answered Choke with the delay until its turn,
    before the event is parsed: the client library waits and sends it
    again, so nothing is lost and a publisher over its rate is paced at it.
    (An error would make every application handle what the protocol
    already handles; a client that ignores Chokes gains nothing, as each
    publish it sends early is choked again.)
L4. Refusals are counted (``rejected_too_many_connections``,
    ``rejected_too_many_subscriptions``, ``rejected_expression_too_large``;
    Chokes as ``choked_rate_limited``) and logged once per session.
"""

from __future__ import annotations

import heapq
import hmac
import logging
from collections.abc import Callable
from typing import Final

import msgspec

from overlay.actions import Action, CloseClient, ToClient
from overlay.auth.tokens import Rights, Role, Verifier
from overlay.channels.event_check import EventCheck
from overlay.channels.expressions import parse_event, parse_expression
from overlay.errors import ExpressionError, Forbidden, LimitExceeded, SchemaError, TokenError
from overlay.limits.quotas import Quotas
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.ids import CLIENT_ID, EVENT_ID, EVENT_ID_TABLE, client_id_ok, plain_event_id
from overlay.node.notify import Notifier
from overlay.node.ordering import Ordering, publish_time_of
from overlay.node.outbox import FULL_DELAY, Outbox
from overlay.node.router import Router
from overlay.node.sessions import Session, Sessions
from overlay.security.refusals import RefusalLog

__all__ = ["CLIENT_ID", "EVENT_ID", "Clients", "plain_event_id"]

log = logging.getLogger("overlay.node")

_EVENT_DISPATCHED: Final = pm.DispatchSign.EVENT_DISPATCHED
_REFUSED: Final = "node %d: client %r (session %d) refused: %s"
_Event: Final = pm.Event  # a C static when compiled, not a global's and an attribute's lookup per event

AdminCommand = Callable[[Session, cm.Admin, float, list[Action]], None]


# Functions, not lambdas, as defaults below: mypyc 2.4.1 cannot compile a
# lambda in a method of a plain class (overlay.build rule 5).
def _no() -> bool:
    return False


def _yes() -> bool:
    return True


class Clients:
    """What a client's messages do.  ``ready`` says whether the cluster is
    ready (``node.boot``); ``admin`` runs an operator command (``node.admin``);
    ``admin_token`` is the token a Hello needs for admin rights ("" = none)
    without ``[auth]``; ``verifier`` checks tokens with it (rules A1–A4), and
    ``auth_required`` says whether a Hello needs one."""

    def __init__(
        self,
        ctx: NodeContext,
        sessions: Sessions,
        router: Router,
        ordering: Ordering,
        notifier: Notifier,
        outbox: Outbox,
        *,
        tracks: Callable[[str], bool] = lambda event_id: False,
        ready: Callable[[], bool],
        left: Callable[[], bool] = _no,
        quorum: Callable[[], bool] = _yes,
        admin: AdminCommand,
        admin_token: str,
        verifier: Verifier | None = None,
        auth_required: bool = True,
    ) -> None:
        self._ctx = ctx
        self._sessions = sessions
        self._router = router
        self._ordering = ordering
        self._notifier = notifier
        self._outbox = outbox
        self._tracks = tracks
        self._ready = ready
        self._left = left
        self._quorum = quorum
        self._admin = admin
        self._admin_token = admin_token
        self._verifier = verifier
        self._auth_required = auth_required
        self._max_payload = ctx.config.cluster.max_payload
        self._event_check = EventCheck(ctx.schema)  # Schema.valid_event's pass, compiled
        self._client_ok = ""  # the last client id client_id_ok passed: compared by identity per publish
        self._expiries: list[tuple[float, int]] = []  # (rights.expires, session): rule A3's sweep
        self._refusals = RefusalLog()  # rules A4, L4: a refused Hello is a stranger's as often as not
        # Rules L1–L4: what each client id holds here.
        self.quotas = Quotas(ctx.id, ctx.config.limits, self._subscriptions_of, sessions.subscription_count)

    def _subscriptions_of(self, sid: int) -> int:
        sess = self._sessions.get(sid)
        return len(sess.subs) if sess is not None else 0

    def handle(self, sid: int, msg: cm.ClientMessage, now: float) -> list[Action]:
        ctx = self._ctx
        out: list[Action] = []
        sess = self._sessions.get(sid)
        if sess is None:
            return out
        if not sess.greeted:
            if not isinstance(msg, cm.Hello):
                out.append(
                    ToClient(sid, cm.Error(-1, cm.ErrorCode.PROTOCOL, "the first message must be Hello", fatal=True))
                )
                out.append(CloseClient(sid, "no Hello"))
                return out
            if self._left():  # node.membership rule 6: nothing new lands on a node that left
                ctx.stats["rejected_left"] += 1
                why = f"node {ctx.id} drained and left: connect to another node"
                out.append(ToClient(sid, cm.Error(-1, cm.ErrorCode.DRAINING, why, fatal=True)))
                out.append(CloseClient(sid, "node drained"))
                return out
            if self._verifier is not None:
                if not self._authenticate(sess, msg, now, out):
                    return out
            else:
                token = self._admin_token
                sess.admin = not token or hmac.compare_digest(msg.token.encode(), token.encode())
            if not self._count_session(sess, msg, now, out):  # rule L1
                return out
            sess.greeted = True
            sess.client_id = msg.client_id
            cfg = ctx.config
            out.append(
                ToClient(
                    sid,
                    cm.Welcome(
                        ctx.id, sid, self._ready(), cfg.cluster.name, cfg.groups.ack_timeout, cfg.cluster.max_payload
                    ),
                )
            )
            return out
        rights = sess.rights
        if rights is not None and rights.expired(now):  # rule A3
            if rights.expires >= 0:  # not told yet (< 0: closing, the rest is ignored)
                self._expire(sess, rights, out)
            return out
        match msg:
            case cm.Publish():
                self._publish(sess, msg, now, out)
            case cm.Subscribe():
                self._subscribe(sess, msg, out)
            case cm.Unsubscribe():
                self._unsubscribe(sess, msg, out)
            case cm.Ack():
                ctx.stats["client_acks"] += 1
                self._notifier.client_acked(sid, msg, out)  # a tracked delivery (node.notify)
            case cm.Admin():
                self._admin(sess, msg, now, out)
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

    # -- auth (rules A1–A4) --------------------------------------------------------------

    def _authenticate(self, sess: Session, msg: cm.Hello, now: float, out: list[Action]) -> bool:
        """Rule A1: the session's rights from its Hello, or a refusal (False)."""
        assert self._verifier is not None
        if not msg.token and not self._auth_required:
            sess.rights = Rights.anonymous(self._ctx.schema)
            return True
        try:
            rights = self._verifier.verify(msg.token, now)
            if rights.subject != msg.client_id:
                raise TokenError(
                    f"this token is for client {rights.subject!r}, and the Hello names {msg.client_id!r}: "
                    "connect with the token's client id (the client library takes it when given no client_id)"
                )
        except TokenError as exc:
            self._ctx.stats["rejected_unauthorized"] += 1
            self._refusals.warn(log, "unauthorized", now, _REFUSED, self._ctx.id, msg.client_id, sess.id, exc)
            out.append(ToClient(sess.id, cm.Error(-1, cm.ErrorCode.UNAUTHORIZED, str(exc), fatal=True)))
            out.append(CloseClient(sess.id, "unauthorized"))
            return False
        sess.rights = rights
        sess.admin = Role.ADMIN in rights.roles
        heapq.heappush(self._expiries, (rights.expires, sess.id))
        log.debug("node %d: session %d is %s, token %s", self._ctx.id, sess.id, rights.describe(), rights.token_id)
        return True

    # -- limits (rules L1–L4) ---------------------------------------------------------------

    def _count_session(self, sess: Session, msg: cm.Hello, now: float, out: list[Action]) -> bool:
        """Rule L1: the session counts for its client id, or it is refused (False)."""
        overrides = sess.rights.limits if sess.rights is not None else None
        try:
            self.quotas.open(sess.id, msg.client_id, now, overrides)
        except LimitExceeded as exc:
            self._ctx.stats[f"rejected_{exc.code}"] += 1
            self._refusals.warn(log, exc.code, now, _REFUSED, self._ctx.id, msg.client_id, sess.id, exc)
            out.append(ToClient(sess.id, cm.Error(-1, exc.code, str(exc), fatal=True)))
            out.append(CloseClient(sess.id, exc.code))
            return False
        return True

    def _limit(self, sess: Session, seq: int, exc: LimitExceeded, out: list[Action]) -> None:
        """Rule L2's refusal; rule L4's count and log."""
        self._ctx.stats[f"rejected_{exc.code}"] += 1
        if self.quotas.first_refusal(sess.id, exc.code):
            log.warning(
                "node %d: client %r (session %d) refused: %s (further refusals of this session are only counted)",
                self._ctx.id,
                sess.client_id,
                sess.id,
                exc,
            )
        out.append(ToClient(sess.id, cm.Error(seq, exc.code, str(exc))))

    def closed(self, sid: int) -> None:
        """The session ended: it no longer counts for its client id (rule L1)."""
        self.quotas.close(sid, self._ctx.now)

    def sweep(self, now: float) -> None:
        """From the tick: forget the publish buckets of client ids gone and full again."""
        self.quotas.sweep(now)

    def _forbid(self, sess: Session, seq: int, exc: Forbidden, out: list[Action]) -> None:
        """Rule A2's refusal; rule A4's count and log."""
        self._ctx.stats["rejected_forbidden"] += 1
        if not sess.auth_logged:
            sess.auth_logged = True
            log.warning(
                "node %d: client %r (session %d) refused: %s (further refusals of this session are only counted)",
                self._ctx.id,
                sess.client_id,
                sess.id,
                exc,
            )
        out.append(ToClient(sess.id, cm.Error(seq, cm.ErrorCode.FORBIDDEN, str(exc))))

    def _expire(self, sess: Session, rights: Rights, out: list[Action]) -> None:
        """Rule A3: the session's token ran out; it ends."""
        self._ctx.stats["rejected_token_expired"] += 1
        log.info("node %d: client %r (session %d): its token expired; closing", self._ctx.id, sess.client_id, sess.id)
        why = "your token expired; the session is closed: reconnect with a new token (`overlay token create`)"
        out.append(ToClient(sess.id, cm.Error(-1, cm.ErrorCode.TOKEN_EXPIRED, why, fatal=True)))
        out.append(CloseClient(sess.id, "token expired"))
        sess.rights = Rights("", frozenset(), {}, self._ctx.schema, expires=-1.0)  # nothing more until it is gone

    def expire(self, now: float, out: list[Action]) -> None:
        """Rule A3's sweep (from the tick): close the sessions whose token ran
        out, listeners included.  O(log n) per session, once."""
        heap = self._expiries
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            sess = self._sessions.get(sid)
            rights = sess.rights if sess is not None else None
            if sess is not None and rights is not None and rights.expires >= 0 and rights.expired(now):
                self._expire(sess, rights, out)

    def ack(self, sid: int, msg: cm.Ack) -> bool:
        """Count a client's Ack of a delivered notification, as ``handle``
        would.  False when the session cannot take one (unknown, or before its
        Hello): hand it to ``handle`` then, in order, for the answer.

        The shell calls this straight from the read loop: an Ack changes no
        state but a counter, so it need not wait its turn in the inbox.
        """
        sess = self._sessions.get(sid)
        if sess is None or not sess.greeted or self._notifier.tracks_ack(sid, msg):
            return False  # a tracked delivery's ack changes state: it waits its turn
        self._ctx.stats["client_acks"] += 1
        return True

    def _not_ready(self, sid: int, seq: int, out: list[Action]) -> bool:
        if not self._ready():
            self._ctx.stats["rejected_not_ready"] += 1
            out.append(
                ToClient(sid, cm.Error(seq, cm.ErrorCode.NOT_READY, "the cluster is not ready yet; retry shortly"))
            )
            return True
        if not self._quorum():  # cut off in a minority: no split brain (node.liveness rule 4)
            self._ctx.stats["rejected_no_quorum"] += 1
            out.append(
                ToClient(
                    sid,
                    cm.Error(
                        seq,
                        cm.ErrorCode.NO_QUORUM,
                        f"node {self._ctx.id} cannot reach a majority of the cluster; retry on another node",
                    ),
                )
            )
            return True
        return False

    def _role(self, sess: Session, seq: int, role: Role, what: str, out: list[Action]) -> bool:
        """Rule A2's first half, before any parsing: False (refused) without ``role``."""
        if sess.rights is None:
            return True
        try:
            sess.rights.need(role, what)
        except Forbidden as exc:
            self._forbid(sess, seq, exc, out)
            return False
        return True

    def publish_many(self, sid: int, msgs: list[cm.Publish], now: float) -> list[Action]:
        """A run of Publishes from session ``sid``, in order (the shell's batch
        of one read): what ``handle`` does with each, in one call, the checks
        that hold for the whole run — the session greeted and its token
        valid, the cluster ready and in quorum, the publish role — made once.
        One message's failure is its own, as in the shell's dispatcher: it is
        logged with its traceback, what it had produced is dropped, and the
        next one is handled."""
        out: list[Action] = []
        sess = self._sessions.get(sid)
        rights = sess.rights if sess is not None else None
        if (
            sess is None
            or not sess.greeted
            or (rights is not None and (rights.expired(now) or Role.PUBLISH not in rights.roles))
            or not self._ready()
            or not self._quorum()
        ):  # each answered as if alone (refusals, rule A3, not_ready ...)
            for msg in msgs:
                out.extend(self.handle(sid, msg, now))
            return out
        admitted = self._admitted
        paced = not self.quotas.publish_all(sid, len(msgs), now)  # rule L3 for the run at once, when it all passes
        for msg in msgs:
            mark = len(out)
            try:
                admitted(sess, msg, now, out, paced)
            except Exception as exc:  # one message's failure is its own (net.dispatch rule 2)
                del out[mark:]
                self._ctx.stats["publish_errors"] += 1
                log.exception("node %d: failed handling Publish %d from client %d", self._ctx.id, msg.seq, sid)
                # Answered, as a failed request is: unanswered, the publisher
                # waited out its timeout for a PubAck that never came.
                out.append(ToClient(sid, cm.internal_error(msg.seq, "Publish", exc)))
        return out

    def _publish(self, sess: Session, msg: cm.Publish, now: float, out: list[Action]) -> None:
        if self._not_ready(sess.id, msg.seq, out) or not self._role(sess, msg.seq, Role.PUBLISH, "publishing", out):
            return
        self._admitted(sess, msg, now, out)

    def _admitted(self, sess: Session, msg: cm.Publish, now: float, out: list[Action], paced: bool = True) -> None:
        """A Publish past the checks that hold for its session: ready, quorum,
        role; ``paced``: False when rule L3 passed it already (with its run)."""
        ctx = self._ctx
        delay = self.quotas.publish(sess.id, now) if paced else 0.0
        if delay:  # rule L3: paced, before any parsing
            ctx.stats["choked_rate_limited"] += 1
            if self.quotas.first_refusal(sess.id, "rate"):
                log.info(
                    "node %d: client %r (session %d) publishes faster than its limit (%s): paced with Choke",
                    ctx.id,
                    sess.client_id,
                    sess.id,
                    self.quotas.rate_hint(sess.id),
                )
            out.append(ToClient(sess.id, cm.Choke(msg.seq, delay)))
            return
        if len(msg.payload) > self._max_payload:  # before parsing: the attributes are not looked at
            ctx.stats["rejected_payload_too_large"] += 1
            why = (
                f"the payload is {len(msg.payload)} bytes; this cluster takes at most "
                f"{self._max_payload} ([cluster] max_payload)"
            )
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.PAYLOAD_TOO_LARGE, why)))
            return
        try:
            if isinstance(msg.event, str):
                values = parse_event(msg.event, ctx.schema)
            else:  # checked once, here (schema rule 6), natively (channels.event_check)
                values = msg.event if self._event_check.valid(msg.event) else ctx.schema.check_event_values(msg.event)
        except ExpressionError as exc:
            ctx.stats["rejected_bad_event"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EVENT, exc.reason, exc.position)))
            return
        except SchemaError as exc:
            ctx.stats["rejected_bad_event"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EVENT, str(exc))))
            return
        if sess.rights is not None:  # rule A2
            try:
                sess.rights.check_publish(values)
            except Forbidden as exc:
                self._forbid(sess, msg.seq, exc, out)
                return
        chid = ctx.routing.lookup_event(values)
        if chid is None:
            ctx.stats["rejected_no_route"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.NO_ROUTE, "no channel holds this event")))
            return
        outbox = self._outbox
        if msg.event_id:
            event_id = f"{sess.client_id}/{msg.event_id}"
            chosen = msg.event_id
            if not (  # plain_event_id, inline (per publish)
                len(chosen) <= 128
                and chosen.isascii()
                and 1 not in chosen.encode().translate(EVENT_ID_TABLE)
                and (sess.client_id is self._client_ok or client_id_ok(sess.client_id))
            ):
                ctx.stats["rejected_bad_event"] += 1
                why = (
                    f"event id {msg.event_id!r} must be 1-128 letters, digits or ._:-"
                    if not plain_event_id(msg.event_id)
                    else f"a chosen event id needs a client id of 1-128 printable characters without spaces, "
                    f"not {sess.client_id!r}"
                )
                out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EVENT, why)))
                return
            self._client_ok = sess.client_id
        else:
            event_id = ""
        if msg.key or msg.rank:  # ordered delivery: through the key's home (node.ordering)
            self._ordering.publish_keyed(sess.id, msg, values, now, out, chid, event_id)
            return
        if event_id and outbox.attach(event_id, sess.id, msg.seq):  # sent again while kept: one delivery, two PubAcks
            ctx.stats["publishes_rejoined"] += 1
            return
        if outbox.full:  # backpressure (node.outbox rule 1): the client sends it again after the delay
            ctx.stats["choked_outbox_full"] += 1
            out.append(ToClient(sess.id, cm.Choke(msg.seq, FULL_DELAY)))
            return
        if not event_id:
            event_id = ctx.next_event_id()
        ctx.stats["events_in"] += 1
        if ctx.capture is not None:
            ctx.capture.publish(event_id, chid, values, payload=msg.payload)
        ev = _Event(event_id, values, ctx.id, _EVENT_DISPATCHED, chid, publish_time_of(msg, now), payload=msg.payload)
        if outbox.send(ev, sess.id, msg.seq, out) and not self._tracks(event_id):
            return  # complete already, no group delivery tracked: nothing comes back (above)
        self._ordering.remember_publish(event_id, sess.id, msg.seq, now)  # dispatched; the PubAck once confirmed

    def _subscribe(self, sess: Session, msg: cm.Subscribe, out: list[Action]) -> None:
        ctx = self._ctx
        if self._not_ready(sess.id, msg.seq, out) or not self._role(sess, msg.seq, Role.SUBSCRIBE, "subscribing", out):
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
        if not self._notifier.check_group(sess.id, msg, out):  # bad weight or group (node.notify)
            return
        try:
            self.quotas.check_subscribe(sess.id, msg.expression)  # rule L2: before parsing
            expr = parse_expression(msg.expression, ctx.schema)
            self.quotas.check_filter(sess.id, expr)
            if msg.group and len(expr.conjuncts) > 1:
                # A group's dispatcher picks one instance per event among the
                # subscriptions it matched; conjuncts of one instance would
                # count as several (overlay.channels.groups).
                raise ExpressionError(
                    f"a group subscription takes one conjunction: this expression expands to "
                    f"{len(expr.conjuncts)} alternatives ('or'); subscribe to each in the group instead",
                    text=msg.expression,
                    position=0,
                )
        except LimitExceeded as exc:
            self._limit(sess, msg.seq, exc, out)
            return
        except ExpressionError as exc:
            ctx.stats["rejected_bad_expression"] += 1
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.BAD_EXPRESSION, exc.reason, exc.position)))
            return
        if sess.rights is not None:  # rule A2
            try:
                sess.rights.check_subscribe(expr)
            except Forbidden as exc:
                self._forbid(sess, msg.seq, exc, out)
                return
        # Rule 7 of node.sessions: each conjunct to the channels it overlaps.
        routed = [(f, ctx.routing.lookup_subscription(f)) for f in expr.conjuncts]
        gids = self._sessions.subscribed(
            sess, msg.seq, msg.sub_id, routed, msg.expression, group=msg.group, weight=msg.weight
        )
        ctx.stats["subscriptions_in"] += 1
        if all(not chans for _, chans in routed):  # a filter no event can match: nothing to store
            for gid in gids:
                self._sessions.forget_pending(gid)
            out.append(ToClient(sess.id, cm.SubAck(msg.seq, msg.sub_id, 0)))
            return
        if msg.group:
            self._notifier.note_group(gids[0], msg.group)
        for gid, (f, chans) in zip(gids, routed):
            if not chans:
                self._sessions.apply_unrouted(gid, out)
                continue
            sub = pm.Subscription(
                gid, f, sess.client_id, ctx.id, pm.DispatchSign.SUBSCRIBE_DISPATCHED, group=msg.group, weight=msg.weight
            )
            for chid in chans:
                self._router.dispatch_sub(msgspec.structs.replace(sub, ch_id=chid), out)

    def _unsubscribe(self, sess: Session, msg: cm.Unsubscribe, out: list[Action]) -> None:
        if not self._sessions.unsubscribed(sess, msg.seq, msg.sub_id, out):
            out.append(
                ToClient(
                    sess.id, cm.Error(msg.seq, cm.ErrorCode.UNKNOWN_SUBSCRIPTION, f"no subscription {msg.sub_id!r}")
                )
            )
