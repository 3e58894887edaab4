"""Client sessions at their access node, and (un)subscriptions waiting to be applied (SPEC §4).

Rules (``node.core`` rules 4 and 6):

1. A session holds its client's subscriptions by the client's local id; each
   subscribe call makes a new global id (``node.incarnation:session:local
   id:n``), so a re-subscribe never revives an old copy.  The access node
   maps every global id back to its session (``owners``), which is how a
   notification finds its client.
2. An (un)subscription is acknowledged to its client only when every copy of
   it has been applied (``SubscriptionApplied``; a reroute announces its new
   copies, counted per channel, below zero while an answer overtook its
   notice), so an event published after the SubAck is matched against it.
3. An unsubscribe waits until its subscribe is applied everywhere, so it
   cannot overtake it and be undone by it.
4. A closed session's subscriptions are dropped everywhere (the client
   re-subscribes on reconnect), and its tracked deliveries fail.  The
   first ``CLOSE_AT_ONCE`` are unsubscribed at once, the rest by the
   shell's background steps (``close_step``, a few per step): a client
   holding 40,000 subscriptions closed its connection and held its access
   node's loop 12.7 s (measured, ``bench/subscriptions.py``), past
   ``suspect_timeout``.  Meanwhile the session is gone: a notification for
   one of them finds no client and is dropped, counted, as one in flight at
   the close always was.
5. The access node is the source of truth of its clients' subscriptions:
   when a dead node's channel is rebuilt elsewhere (``node.recovery``) it
   sends the new owner every one it holds that overlaps the channel
   (``held``), and what waited on that channel is applied (``rebuilt``; the
   channel's own answer to the same try, should it come after, is not
   counted again — nor is any answer of a copy sent there before the
   rebuild, which would leave the wait below zero for ever, though the
   copies a reroute notice announces are waited for).
7. A subscription of the extended language is kept in disjunctive normal
   form (``overlay.channels.dnf``): each conjunct is a subscription of its
   own between nodes, under the global id ``<id>/<j>`` (one conjunct keeps
   the plain ``<id>``), routed to the channels it overlaps.  A session's
   ``subs`` holds ``(<id>, first conjunct)`` as it always held a
   subscription, and ``alts`` the conjuncts of one that has several.  ``owners``
   maps every conjunct's id, and the subscription's own id, to the session;
   ``base_of`` maps a conjunct's id to the subscription's.  The client hears
   one SubAck (UnsubAck) once every conjunct is applied everywhere, counting
   the channels of all of them (a ``_Joint``).  An event matching several
   conjuncts is matched in its one channel, which names them all in one
   Notification: the notifier names the subscription to its client once
   (``node.notify`` rule 6).
6. A node's death or restart may take (un)subscription copies with it (one
   it was forwarding, one it held unanswered): every (un)subscription still
   waiting is sent again, to every channel it belongs to now, as a new try;
   answers to earlier tries are ignored (``SubscriptionApplied.attempt``).
   Owners apply a copy twice harmlessly, and never store again an id they
   saw unsubscribed (``node.router`` rule 9).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping
from typing import Final

import msgspec

from overlay.actions import Action, ToClient
from overlay.auth.tokens import Rights
from overlay.channels.channel import ChannelId
from overlay.channels.predicates import Filter
from overlay.channels.space import EventSpace
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.context import NodeContext

__all__ = ["CLOSE_AT_ONCE", "Pending", "Session", "Sessions"]

# The channel an (un)subscription of no channel waits on: it is answered at once.
NO_CHANNEL: Final = ChannelId(-1, -1)
# Rule 4: a closed session's unsubscriptions sent at once; the rest wait for
# background steps.  Small sessions (every test's, the simulator's) close as
# they always did.
CLOSE_AT_ONCE: Final = 64

DispatchSub = Callable[[pm.Subscription | pm.UnSubscription, list[Action]], None]
FailAcks = Callable[[int, list[Action]], None]


class Session:
    __slots__ = ("admin", "alts", "auth_logged", "client_id", "greeted", "groups", "id", "n", "rights", "subs")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.client_id = ""
        self.greeted = False
        self.admin = False  # its Hello carried the admin token, or a token with the admin role (or none is needed)
        # What its token allows (``overlay.auth``); None when the cluster has no [auth].
        self.rights: Rights | None = None
        self.auth_logged = False  # a refusal was logged: later ones are only counted
        self.subs: dict[str, tuple[str, Filter]] = {}  # local id -> (global id, filter)
        # Rule 7: local id -> (global id, filter) of each conjunct, for subscriptions of several.
        self.alts: dict[str, tuple[tuple[str, Filter], ...]] = {}
        self.groups: dict[str, tuple[str, float]] = {}  # local id -> (group, weight), group members only
        self.n = 0

    def conjuncts(self, local_id: str) -> tuple[tuple[str, Filter], ...]:
        """Rule 7: ``(global id, filter)`` of each conjunct of a subscription held."""
        alts = self.alts.get(local_id)
        return alts if alts is not None else (self.subs[local_id],)


class _Joint:
    """Rule 7: the conjuncts of one (un)subscription still waiting, and the
    channels the finished ones were applied on."""

    __slots__ = ("applied", "base", "remaining")

    def __init__(self, base: str, gids: Iterable[str]) -> None:
        self.base = base
        self.remaining = set(gids)
        self.applied = 0


class Pending:
    """An (un)subscription waiting for its channels to apply it (rule 2)."""

    __slots__ = (
        "applied",
        "attempt",
        "channels",
        "joint",
        "local_id",
        "rebuilt",
        "seq",
        "session",
        "subscribe",
        "template",
        "then",
        "waiting",
    )

    def __init__(
        self,
        session: int,
        seq: int,
        local_id: str,
        subscribe: bool,
        chans: Iterable[ChannelId],
        template: pm.Subscription | pm.UnSubscription | None = None,
        joint: _Joint | None = None,
    ) -> None:
        self.session = session
        self.joint = joint
        self.seq = seq
        self.local_id = local_id
        self.subscribe = subscribe
        # Copies in flight per channel: each answers once, applied or rerouted.
        self.waiting: Counter[ChannelId] = Counter(chans)
        self.applied: set[ChannelId] = set()
        self.rebuilt: set[ChannelId] = set()  # rule 5: applied by a rebuild, whatever their copies answer
        self.channels = len(self.waiting)
        # An unsubscribe that waits for this subscribe (rule 3): the arguments of send_unsubscribe.
        self.then: tuple[int, int, str, str, Filter, _Joint | None] | None = None
        # Rule 6: the message its copies are made of, and which try this is.
        self.template = template
        self.attempt = 0


class Sessions(Mapping[int, Session]):
    """Rules 1–4.  ``dispatch_sub`` sends an (un)subscription copy to its
    channel (``node.router``); ``fail_acks`` fails a closed session's tracked
    deliveries (``node.notify``)."""

    def __init__(self, ctx: NodeContext, *, dispatch_sub: DispatchSub, fail_acks: FailAcks) -> None:
        self._ctx = ctx
        self._dispatch_sub = dispatch_sub
        self._fail_acks = fail_acks
        self._by_id: dict[int, Session] = {}
        # The open sessions' ids, live: ``in`` on it is C, where ``in`` on this
        # Mapping is a Python call (asked per PubAck and per Notify).
        self.open_ids: KeysView[int] = self._by_id.keys()
        self.owners: dict[str, tuple[int, str]] = {}  # global sub id -> (session, local id)
        self.base_of: dict[str, str] = {}  # a conjunct's global id -> its subscription's (rule 7)
        self._pending: dict[str, Pending] = {}
        self._seq = 0
        # Rule 4: (session, local id, global id, filter) of closed sessions'
        # conjuncts not unsubscribed yet, in order.
        self._closing: deque[tuple[int, str, str, Filter]] = deque()

    def __getitem__(self, sid: int) -> Session:
        return self._by_id[sid]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, sid: object) -> bool:
        return sid in self._by_id  # Mapping's would go through __getitem__ and a KeyError: hot (PubAcks)

    def pending(self) -> int:
        """(Un)subscriptions still waiting for their channels."""
        return len(self._pending)

    def pending_ids(self) -> list[str]:
        return sorted(self._pending)

    def pending_for(self, gid: str) -> Pending | None:
        return self._pending.get(gid)

    def subscription_count(self) -> int:
        """Subscriptions the open sessions hold, every one together (``limits.quotas`` rule 3):
        ``owners`` names each once by its base id, and an expression's conjuncts once more each."""
        return len(self.owners) - len(self.base_of)

    def open(self) -> int:
        self._seq += 1
        sid = self._seq
        self._by_id[sid] = Session(sid)
        return sid

    def close(self, sid: int) -> list[Action]:
        """Rule 4."""
        sess = self._by_id.pop(sid, None)
        out: list[Action] = []
        if sess is None:
            return out
        capture = self._ctx.capture
        closing = self._closing
        for local_id, (base, _) in sess.subs.items():
            conjuncts = self._forget(sess, local_id, base)
            if capture is not None:
                capture.unsubscribe(base, "closed")
            closing.extend((sid, local_id, gid, f) for gid, f in conjuncts)
        # Its tracked deliveries fail only now that its subscriptions have no
        # session: a group copy failed to a channel this node owns is offered
        # again at once, and found this session's instance still listed
        # (fault seed 821: a Notify to the session being closed).
        self._fail_acks(sid, out)
        self.close_step(CLOSE_AT_ONCE, out)
        return out

    @property
    def closing(self) -> int:
        """Rule 4: closed sessions' conjuncts not unsubscribed yet."""
        return len(self._closing)

    def close_step(self, limit: int, out: list[Action]) -> int:
        """Rule 4: unsubscribe up to ``limit`` of closed sessions' conjuncts; how many are left."""
        closing = self._closing
        for _ in range(min(limit, len(closing))):
            sid, local_id, gid, f = closing.popleft()
            self.send_unsubscribe(sid, 0, local_id, gid, f, out)
        return len(closing)

    def _forget(self, sess: Session, local_id: str, base: str) -> tuple[tuple[str, Filter], ...]:
        """Drop a subscription's owners entries (rule 7); its conjuncts."""
        alts = sess.alts.pop(local_id, None)
        self.owners.pop(base, None)
        if alts is None:
            return (sess.subs[local_id],) if local_id in sess.subs else ()
        for gid, _ in alts:
            self.owners.pop(gid, None)
            self.base_of.pop(gid, None)
        return alts

    def subscribed(
        self,
        sess: Session,
        seq: int,
        local_id: str,
        conjuncts: list[tuple[Filter, list[ChannelId]]],
        expression: str,
        *,
        group: str = "",
        weight: float = 1.0,
    ) -> list[str]:
        """A new subscription of ``sess`` (rules 1, 7), each conjunct waiting for
        its channels (rule 2; none: ``NO_CHANNEL``, for the caller to apply):
        the conjuncts' global ids."""
        ctx = self._ctx
        sess.n += 1
        base = f"{ctx.sub_prefix}{sess.id}:{local_id}:{sess.n}"
        gids = [base] if len(conjuncts) == 1 else [f"{base}/{j}" for j in range(len(conjuncts))]
        sess.subs[local_id] = (base, conjuncts[0][0])
        if len(conjuncts) > 1:
            sess.alts[local_id] = tuple((gid, f) for gid, (f, _) in zip(gids, conjuncts))
        else:
            sess.alts.pop(local_id, None)
        if group:
            sess.groups[local_id] = (group, weight)
        else:
            sess.groups.pop(local_id, None)
        self.owners[base] = (sess.id, local_id)
        joint = None
        if len(gids) > 1:
            joint = _Joint(base, gids)
            for gid in gids:
                self.owners[gid] = (sess.id, local_id)
                self.base_of[gid] = base
        if ctx.capture is not None:
            ctx.capture.subscribe(base, local_id, sess.id, sess.client_id, expression)
        for gid, (f, chans) in zip(gids, conjuncts):
            template = pm.Subscription(
                gid, f, sess.client_id, ctx.id, pm.DispatchSign.SUBSCRIBE_DISPATCHED, group=group, weight=weight
            )
            self._pending[gid] = Pending(sess.id, seq, local_id, True, chans or [NO_CHANNEL], template, joint)
        return gids

    def forget_pending(self, gid: str) -> None:
        del self._pending[gid]

    def apply_unrouted(self, gid: str, out: list[Action]) -> None:
        """A conjunct no channel holds (rule 7): applied at once, on no channel."""
        self.on_applied(pm.SubscriptionApplied(gid, NO_CHANNEL, True), out)

    def unsubscribed(self, sess: Session, seq: int, local_id: str, out: list[Action]) -> bool:
        """The client unsubscribes ``local_id``; False when it has no such subscription."""
        entry = sess.subs.get(local_id)
        if entry is None:
            return False
        sess.groups.pop(local_id, None)
        base = entry[0]
        conjuncts = self._forget(sess, local_id, base)
        del sess.subs[local_id]
        if self._ctx.capture is not None:
            self._ctx.capture.unsubscribe(base, "client")
        if len(conjuncts) == 1:
            gid, f = conjuncts[0]
            self.send_unsubscribe(sess.id, seq, local_id, gid, f, out)
            return True
        joint = _Joint(base, [gid for gid, _ in conjuncts])
        for gid, f in conjuncts:
            self.send_unsubscribe(sess.id, seq, local_id, gid, f, out, joint=joint)
        return True

    def send_unsubscribe(
        self, sid: int, seq: int, local_id: str, gid: str, f: Filter, out: list[Action], *, joint: _Joint | None = None
    ) -> None:
        """``f`` is a conjunct of a session's subscription, which the parser
        let in satisfiable (``channels.dnf`` rule 1): routing need not decide
        that again (half of an unsubscription's cost, measured)."""
        ctx = self._ctx
        prior = self._pending.get(gid)
        if prior is not None and prior.subscribe:
            # The subscribe is still on its way, maybe by a stale route: an
            # unsubscribe sent now could overtake it and be undone by it.  It
            # goes once every channel has applied the subscribe (rule 3).
            prior.then = (sid, seq, local_id, gid, f, joint)
            return
        chans = ctx.routing.lookup_subscription(f, satisfiable=True)
        unsub = pm.UnSubscription(gid, f, local_id, ctx.id, pm.DispatchSign.UNSUBSCRIBE_DISPATCHED)
        self._pending[gid] = Pending(sid, seq, local_id, False, chans or [NO_CHANNEL], unsub if chans else None, joint)
        if not chans:
            self.on_applied(pm.SubscriptionApplied(gid, NO_CHANNEL, False), out)
            return
        for chid in chans:
            self._dispatch_sub(msgspec.structs.replace(unsub, ch_id=chid), out)

    def held(self, space: EventSpace) -> Iterator[StoredSubscription]:
        """Rule 5: every subscription this node's clients hold that overlaps ``space``."""
        ctx = self._ctx
        schema = ctx.schema
        for sess in self._by_id.values():
            for local_id in sess.subs:
                for gid, f in sess.conjuncts(local_id):
                    if space.overlaps(f, schema):
                        group, weight = sess.groups.get(local_id, ("", 1.0))
                        yield StoredSubscription(gid, f, sess.client_id, ctx.id, group, weight)

    def rebuilt(self, chid: ChannelId, out: list[Action]) -> None:
        """Rule 5: ``chid`` was rebuilt from this node's own copies: every
        (un)subscription waiting on it is applied there (what it waited for
        may have died with the channel's old owner)."""
        for gid, p in list(self._pending.items()):
            n = p.waiting.get(chid, 0)
            if n > 0:
                for _ in range(n):
                    self.on_applied(pm.SubscriptionApplied(gid, chid, p.subscribe, (), p.attempt), out)
                p.rebuilt.add(chid)

    def retry_all(self, out: list[Action]) -> None:
        """Rule 6: every (un)subscription still waiting is sent again, as a new try."""
        routing = self._ctx.routing
        for p in list(self._pending.values()):
            t = p.template
            if t is None:
                continue
            chans = routing.lookup_subscription(t.sub_exp if isinstance(t, pm.Subscription) else t.unsub_exp)
            if not chans:
                continue  # nothing to apply it to any more: its channels' answers will come or were had
            p.attempt += 1
            p.waiting = Counter(chans)
            p.rebuilt.clear()
            p.applied = set()
            p.channels = len(chans)
            self._ctx.stats["subscriptions_retried"] += 1
            for chid in chans:
                self._dispatch_sub(msgspec.structs.replace(t, ch_id=chid, attempt=p.attempt), out)

    def on_applied(self, msg: pm.SubscriptionApplied, out: list[Action]) -> None:
        """Rule 2: a copy was applied, or rerouted to the channels it names."""
        p = self._pending.get(msg.sub_id)
        if p is None or p.subscribe != msg.subscribe or msg.attempt != p.attempt:
            return  # done, or an answer to an earlier try (rule 6)
        if not msg.rerouted_to and msg.ch_id in p.applied and p.waiting[msg.ch_id] <= 0:
            return  # that channel's copy counted already: ``rebuilt`` applied it first (rule 5)
        # Signed count of copies per channel: below zero while an answer has
        # overtaken the reroute notice that announces its copy (a Reforward
        # travels on the high queue, the notice on the normal one).
        if msg.ch_id not in p.rebuilt:  # rule 5: a rebuild applied it already
            p.waiting[msg.ch_id] -= 1
        if msg.rerouted_to:
            # One copy went on to each of these; wait for every one, so none is
            # still on its way when the client hears back (and unsubscribes).
            p.waiting.update(msg.rerouted_to)
            p.channels += len(msg.rerouted_to) - 1
        else:
            p.applied.add(msg.ch_id)
        if any(p.waiting.values()):
            return
        del self._pending[msg.sub_id]
        applied = len(p.applied)
        base = msg.sub_id
        j = p.joint
        if j is not None:  # rule 7: the last conjunct answers for all
            j.remaining.discard(msg.sub_id)
            j.applied += len(p.applied - {NO_CHANNEL})
            applied, base = j.applied, j.base
        done = j is None or not j.remaining
        if done and self._ctx.capture is not None:
            self._ctx.capture.applied(base, p.subscribe)
        if p.then is not None:  # an unsubscribe waited for this subscribe: no SubAck, send it now
            sid, seq, local_id, gid, f, joint = p.then
            if joint is None:
                self.send_unsubscribe(sid, seq, local_id, gid, f, out)
            else:
                self.send_unsubscribe(sid, seq, local_id, gid, f, out, joint=joint)
            return
        if not done:
            return
        if p.session not in self._by_id:
            return
        if p.subscribe:
            out.append(ToClient(p.session, cm.SubAck(p.seq, p.local_id, applied)))
        else:
            out.append(ToClient(p.session, cm.UnsubAck(p.seq, p.local_id)))
