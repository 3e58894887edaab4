"""What each client id holds on one node, checked against its limits (sans-IO).

Theory of operation — the rules this module keeps (``overlay.node.clients``
calls it; ``now`` is given):

1. The unit is the *client id* (``overlay.limits.settings`` rule 3): a
   session counts for its client id from its Hello (``open``) to its end
   (``close``).  Sessions of one client id share its connection count, its
   subscription count and its publish bucket, so a client gains nothing by
   opening more connections than one.  Limits are per node: a client
   connected to n nodes may hold n times as much in the cluster.
2. ``open`` refuses a session past ``max_connections`` (``LimitExceeded``
   with ``too_many_connections``) and counts nothing for it.
3. ``check_subscribe`` refuses, before anything is parsed or stored, a
   subscription of a client id that holds ``max_subscriptions`` already
   (``too_many_subscriptions``; the count is the sessions' own, so what was
   unsubscribed or closed is free again at once) or whose text is over
   ``max_expression_bytes`` (``expression_too_large``); ``check_filter``
   refuses one whose parsed filter has more than ``max_predicates``.  And
   past ``max_node_subscriptions`` held on the node by every client id
   together (``too_many_subscriptions`` too, naming that key): a bound on
   the node's whole table, which per client id limits are not while client
   ids are free to choose (no ``[auth]``).
4. ``publish`` passes a publish (0.0) or returns the delay until its turn
   in the client id's token bucket (``overlay.limits.bucket``): the node
   answers Choke with it, and the client library sends it again then.
5. Every refusal's message names the limit, its value, where it comes from
   (``[limits] KEY`` in the cluster config, or the token's ``limits``
   claim) and what to do.
6. Bounded: one entry per client id with an open session; the bucket of a
   client id whose last session closed is kept until it is full again
   (``sweep``) — reconnecting never refills it sooner — and at most
   ``MAX_IDLE`` such buckets are kept (the oldest forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final

from overlay.channels.dnf import Expression
from overlay.channels.predicates import Filter
from overlay.errors import LimitExceeded
from overlay.limits.bucket import TokenBucket
from overlay.limits.settings import ClientLimits, LimitSettings, client_limits
from overlay.messages.client import ErrorCode

__all__ = ["MAX_IDLE", "Quotas"]

# Rule 6: buckets of client ids without a session, kept until full again;
# looked over at most once per SWEEP_SECONDS (the tick comes every 50 ms).
MAX_IDLE: Final = 10_000
SWEEP_SECONDS: Final = 1.0


class _Principal:
    """One client id with open sessions (rule 1)."""

    __slots__ = ("bucket", "sessions")

    def __init__(self, bucket: TokenBucket) -> None:
        self.sessions: set[int] = set()
        self.bucket = bucket


class _Session:
    __slots__ = ("claimed", "client_id", "limits", "logged")

    def __init__(self, client_id: str, limits: ClientLimits, claimed: frozenset[str]) -> None:
        self.client_id = client_id
        self.limits = limits
        self.claimed = claimed  # the keys its token's claim set (rule 5)
        self.logged: set[str] = set()  # the kinds of refusal logged for it (later ones are only counted)


class Quotas:
    """Rules 1–6 for one node.  ``subscriptions(sid)`` says how many
    subscriptions session ``sid`` holds, ``held()`` how many every session
    holds together (``node.sessions``).

    Invariant: ``_principals[c].sessions`` is exactly the open sessions of
    client id ``c``; ``_idle`` holds only client ids without one."""

    def __init__(
        self,
        node_id: int,
        settings: LimitSettings,
        subscriptions: Callable[[int], int],
        held: Callable[[], int] | None = None,
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self._subscriptions = subscriptions
        self._held = held  # rule 3: the node's whole count (None: not bounded, a core without sessions)
        self._principals: dict[str, _Principal] = {}
        self._sessions: dict[int, _Session] = {}
        self._bucket_of: dict[int, TokenBucket] = {}  # per session, its client id's (publish: one look-up)
        self._idle: OrderedDict[str, TokenBucket] = OrderedDict()
        self._swept = 0.0

    def __len__(self) -> int:
        return len(self._sessions)

    def limits(self, sid: int) -> ClientLimits | None:
        s = self._sessions.get(sid)
        return s.limits if s is not None else None

    def connections(self, client_id: str) -> int:
        p = self._principals.get(client_id)
        return len(p.sessions) if p is not None else 0

    def subscriptions_of(self, client_id: str) -> int:
        p = self._principals.get(client_id)
        return sum(map(self._subscriptions, p.sessions)) if p is not None else 0

    def first_refusal(self, sid: int, kind: str) -> bool:
        """True the first time session ``sid`` is refused for ``kind`` (a code):
        the node logs that one and only counts the others."""
        s = self._sessions.get(sid)
        if s is None:
            return True
        if kind in s.logged:
            return False
        s.logged.add(kind)
        return True

    # -- sessions (rules 1, 2, 6) ----------------------------------------------------------

    def open(self, sid: int, client_id: str, now: float, overrides: Mapping[str, float] | None = None) -> ClientLimits:
        """Rule 2: count session ``sid`` for ``client_id``, or ``LimitExceeded``."""
        limits = client_limits(self.settings, overrides)
        claimed = frozenset(overrides or ())
        p = self._principals.get(client_id)
        n = len(p.sessions) if p is not None else 0
        cap = limits.max_connections
        if cap and n >= cap:
            raise LimitExceeded(
                f"client {client_id!r} has {n} connections open on node {self.node_id}, its limit "
                f"({_source('max_connections', claimed)} = {cap}): close one, or share one connection "
                "between your publishers and subscribers",
                code=ErrorCode.TOO_MANY_CONNECTIONS,
                key="max_connections",
                limit=cap,
                value=n + 1,
            )
        if p is None:
            bucket = self._idle.pop(client_id, None) or TokenBucket(limits.publish_rate, limits.publish_burst, now)
            p = self._principals[client_id] = _Principal(bucket)
        # The client id's bucket follows its latest session's limits (a new token may change them).
        p.bucket.rate, p.bucket.burst = limits.publish_rate, max(1.0, float(limits.publish_burst))
        p.sessions.add(sid)
        self._sessions[sid] = _Session(client_id, limits, claimed)
        self._bucket_of[sid] = p.bucket
        return limits

    def close(self, sid: int, now: float) -> None:
        """Rule 1's end (idempotent): the session no longer counts."""
        s = self._sessions.pop(sid, None)
        if s is None:
            return
        del self._bucket_of[sid]
        p = self._principals[s.client_id]
        p.sessions.discard(sid)
        if p.sessions:
            return
        del self._principals[s.client_id]
        if not p.bucket.idle(now):  # rule 6: a reconnect must not refill it
            self._idle[s.client_id] = p.bucket
            while len(self._idle) > MAX_IDLE:
                self._idle.popitem(last=False)

    def sweep(self, now: float) -> None:
        """Rule 6: forget the buckets of client ids without a session once they are full."""
        if now - self._swept < SWEEP_SECONDS:
            return
        self._swept = now
        for cid in [c for c, b in self._idle.items() if b.idle(now)]:
            del self._idle[cid]

    @property
    def idle_buckets(self) -> int:
        return len(self._idle)

    # -- requests (rules 3, 4, 5) ------------------------------------------------------------

    def check_subscribe(self, sid: int, text: str) -> None:
        """Rule 3, before parsing: the client id's count, the text's size."""
        s = self._sessions.get(sid)
        if s is None:
            return
        lim = s.limits
        if lim.max_subscriptions:
            held = self.subscriptions_of(s.client_id)
            if held >= lim.max_subscriptions:
                raise LimitExceeded(
                    f"client {s.client_id!r} holds {held} subscriptions on node {self.node_id}, its limit "
                    f"({_source('max_subscriptions', s.claimed)} = {lim.max_subscriptions}): unsubscribe some first, "
                    "or merge filters into fewer, wider ones",
                    code=ErrorCode.TOO_MANY_SUBSCRIPTIONS,
                    key="max_subscriptions",
                    limit=lim.max_subscriptions,
                    value=held + 1,
                )
        cap = self.settings.max_node_subscriptions
        if cap and self._held is not None:
            total = self._held()
            if total >= cap:
                raise LimitExceeded(
                    f"node {self.node_id} holds {total} subscriptions of its clients, its limit "
                    f"([limits] max_node_subscriptions = {cap}): subscribe through another node, or unsubscribe some",
                    code=ErrorCode.TOO_MANY_SUBSCRIPTIONS,
                    key="max_node_subscriptions",
                    limit=cap,
                    value=total + 1,
                )
        size = len(text.encode()) if lim.max_expression_bytes else 0
        if lim.max_expression_bytes and size > lim.max_expression_bytes:
            raise LimitExceeded(
                f"the expression is {size} bytes, over the limit "
                f"({_source('max_expression_bytes', s.claimed)} = {lim.max_expression_bytes}): "
                "split it into several subscriptions",
                code=ErrorCode.EXPRESSION_TOO_LARGE,
                key="max_expression_bytes",
                limit=lim.max_expression_bytes,
                value=size,
            )

    def check_filter(self, sid: int, f: Filter | Expression) -> None:
        """Rule 3, after parsing: the filter's predicates — of its disjunctive
        normal form, every conjunct's, since each is stored and routed."""
        s = self._sessions.get(sid)
        if s is None:
            return
        cap = s.limits.max_predicates
        n = f.predicate_count() if isinstance(f, Expression) else len(f.predicates)
        if cap and n > cap:
            raise LimitExceeded(
                f"the expression has {n} predicates, over the limit "
                f"({_source('max_predicates', s.claimed)} = {cap}): split it into several subscriptions",
                code=ErrorCode.EXPRESSION_TOO_LARGE,
                key="max_predicates",
                limit=cap,
                value=n,
            )

    def publish_all(self, sid: int, n: int, now: float) -> bool:
        """Rule 4 for a run of ``n`` publishes at once: True when each passes
        (as ``publish`` one by one would say, tokens taken); False, with
        nothing taken, when it cannot tell: ask ``publish`` for each then."""
        bucket = self._bucket_of.get(sid)
        return bucket is None or bucket.take_all(n, now)

    def publish(self, sid: int, now: float) -> float:
        """Rule 4: 0.0 when the publish may go on, else the Choke's delay (on every publish: one look-up)."""
        bucket = self._bucket_of.get(sid)
        return bucket.take(now) if bucket is not None else 0.0

    def rate_hint(self, sid: int) -> str:
        """Rule 5 for a Choke of the bucket: what paces this client, for the log."""
        s = self._sessions.get(sid)
        if s is None:
            return ""
        lim = s.limits
        return (
            f"{_source('publish_rate', s.claimed)} = {lim.publish_rate:g}/s, "
            f"{_source('publish_burst', s.claimed)} = {lim.publish_burst}"
        )


def _source(key: str, claimed: frozenset[str]) -> str:
    """Rule 5: where a limit comes from."""
    return f"your token's limits claim {key}" if key in claimed else f"[limits] {key}"
