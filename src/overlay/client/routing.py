"""A client over several access nodes: latency routing for publishes (SPEC §12)
and subscriptions that survive the loss of an access node.

``AgentClient`` holds one ``Client`` connection per known access node and
keeps these rules:

1. **Routing.**  Each publish goes to the connected node with the lowest
   predicted ack latency (``overlay.client.agent.RoutingAgent``: sliding-window
   RLS over the last ``window`` PubAck latencies of each node); between equal
   costs, the one with fewer publishes waiting (agent rule 2b).  Every PubAck
   feeds its latency in.  Latencies are read on ``time.perf_counter`` (the
   loop's clock may tick in milliseconds, e.g. uvloop's: too coarse for
   loopback latencies).
2. **Choke.**  A node answering Choke(delay) has ``(now, delay)`` fed into its
   estimator; the agent re-chooses, and if the same node is still the best it
   waits the delay first.  The publish is sent again either way: nothing is
   dropped.  For this publish a choking node counts as tried, like one that
   timed out (rule 3): once every node was tried, all are tried again.
3. **Timeout.**  No PubAck within ``mean + 3σ`` of the node's recent latencies
   (bounded by ``min_timeout``/``max_timeout``) is a failure: a large latency
   is fed in (the node is avoided until its estimate recovers) and the publish
   is sent again to another node.  The first node may have accepted it all
   the same; every attempt carries the same event id (the agent names each
   event, and every connection says Hello with the agent's ``client_id``, so
   the cluster's id ``client_id/event_id`` is the same through any node), and
   the subscribers' access nodes drop the second copy: **a publish that timed
   out is delivered once** to plain subscriptions (a group instance may get
   both copies: group copies are not de-duplicated).  ``resent`` counts these.
   A ``no_quorum`` answer (the node is cut off from the cluster's majority,
   and did nothing) is treated the same way, without waiting: the publish
   goes to another node under the same id (``quorum_refusals``); when every
   node refuses, it waits and tries again until its timeout.
4. **Probing.**  An avoided node gets no publishes, hence no new samples, so
   a connected node without a sample for ``probe_interval`` s is pinged
   (``Client.ping``: an Unsubscribe of an id no subscription has, which waits
   in the node's inbox and dispatcher like a publish and costs as little) and
   the latency fed in.  This is how a node that recovered — or
   one that only looked slow because of one spike (a pause hits every
   request in flight, so one spike is often several samples) — wins traffic
   back.
5. **Failover of subscriptions — redundant homes, de-duplicated at the
   client.**  A subscription is held on ``redundancy`` access nodes at once
   (default 2), under the same ``sub_id``; each matching event is matched
   once on its channel's owner and sent to both homes; the client hands each
   event id to the application once (a bounded LRU of the last ``dedup`` ids)
   and acks the second copy at once.  ``subscribe`` returns when every home
   acknowledged, so every event published after it returns is on its way
   through each home.  When a home's connection is lost the subscription is
   taken off that node's client (no re-subscribe there) and placed on
   another connected node, and events keep flowing through the surviving
   home meanwhile: **exactly once across the loss of one access node**, with
   no window — the notifications the dead node held in its queues are also
   on their way through the other home.

   What this does not cover, honestly: both homes lost before a new one is
   placed (events matched in between are lost, as with ``redundancy = 1``,
   where the window runs from the node's death until the re-subscription is
   applied); the loss of a *channel owner* (channels are not replicated
   against crashes — SPEC has no channel failover); a copy arriving after its
   id left the LRU (the two homes more than ``dedup`` events apart) would be
   delivered twice.  The cost is one extra notification per event per extra
   home.  A **group** subscription is held on one home only: two homes would
   be two instances of the group; on the loss of its home it re-subscribes
   elsewhere, and the events in the window are the node side's to re-route
   (SPEC §11 fault surveillance).

6. **Placing never spins.**  A node that does not take a subscription (no
   answer in time, not ready, refused — e.g. ``duplicate_subscription`` from
   an earlier attempt that timed out there, which is cleaned up with an
   unsubscribe, or ``no_quorum``) is tried again after a growing pause, at most
   ``MAX_PLACE_ATTEMPTS`` times per connection to it (``overlay.client.placement``);
   one placement of a subscription runs at a time (``FailoverSubscription.placing``:
   the supervisor's, running while the caller's first one waited for a
   node, met the caller's copy as a client-side ``duplicate_subscription``
   and cleaned it up with an unsubscribe — a SubAck'd subscription on no
   node, seen by ``bench/soak.py`` as every event of a churned subscription lost);
   a subscription left with no home while every connected node gave up on
   it ends: its iteration raises ``ConnectionLost`` naming the last refusal.
   Failures are logged once each, without a traceback.  ``subscribe`` raises
   a node's refusal of the subscription itself (``bad_expression`` …) at
   once; a ``no_quorum`` refuses only that node, as for a publish (rule 3):
   the next node is tried, and while none took it the caller's subscribe
   waits and tries again, raising ``no_quorum`` if its timeout comes first.

7. **Owned tasks, one error callback.**  The connecting, placing and probing
   tasks and the error reporter are kept (``overlay.client.tasks``) and
   ``close()`` cancels and awaits them, then closes every connection.
   ``error_cb`` gets what the connections report (the nodes' errors) and
   each subscription's drops (``SlowConsumerError``), as for ``Client``.

   Why not keep unacknowledged notifications at the sender and resume: the
   sender of a notification is the channel's owner, so that design needs
   per-subscription retention on every owner, an end-to-end ack path and a
   resume request that finds the retained notifications again after
   migrations and splits moved the channel — all node-side state, on the
   paths the ordering and group work is changing.  Redundant homes need no
   node-side change at all and have no loss window for a single failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from ssl import SSLContext
from typing import Any, Final

from overlay.auth.tokens import unverified_subject
from overlay.channels.schema import Value
from overlay.client.agent import RoutingAgent
from overlay.client.callbacks import ErrorCallback, ErrorReporter
from overlay.client.connection import Client
from overlay.client.failover import FailoverSubscription
from overlay.client.limits import DEFAULT_QUEUE, NOT_READY_RETRY, REQUEST_TIMEOUT, check_payload, check_timeout
from overlay.client.load_factor import LoadFactorConfig
from overlay.client.placement import MAX_PLACE_ATTEMPTS, Placements
from overlay.client.tasks import OwnedTasks
from overlay.client.transport import TokenSource
from overlay.config import AgentSettings, load_agent_settings
from overlay.errors import ConnectionLost, NotReady, RequestError, TlsError
from overlay.messages import client as cm
from overlay.messages.codec import DEFAULT_MAX_FRAME_SIZE

__all__ = ["AgentClient", "AgentSettings", "FailoverSubscription", "load_agent_settings"]

log = logging.getLogger("overlay.client")

# How often a sleeping supervisor re-checks for subscriptions short of homes
# (a node coming back is noticed by polling its client's state).
REPLACE_POLL: Final = 0.2
# The timeout of the clean-up unsubscribe of a subscription left behind on a node.
CLEANUP_TIMEOUT: Final = 2.0
# Refusals of a node, not of the subscription (rule 6): placing goes on with
# another node — duplicate_subscription (an earlier attempt that timed out
# there was applied) and no_quorum (the node is cut off and did nothing).
NODE_REFUSALS: Final = frozenset({cm.ErrorCode.DUPLICATE_SUBSCRIPTION, cm.ErrorCode.NO_QUORUM})


class AgentClient:
    """Connections to several access nodes, used by the routing agent (rules 1–7).

    Invariant: a ``FailoverSubscription`` is in ``clients[i].subscriptions``
    exactly for the node indices ``i`` in its ``homes``.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        client_id: str | None = None,
        settings: AgentSettings | None = None,
        max_frame: int = DEFAULT_MAX_FRAME_SIZE,
        token: TokenSource = "",
        error_cb: ErrorCallback | None = None,
        ssl: SSLContext | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("an agent client needs at least one access node address")
        self.settings = settings or AgentSettings()
        # A token names its client (``overlay.client.connection`` rule 6).
        subject = unverified_subject(token() if callable(token) else token)
        self.client_id = client_id or subject or f"agent-{uuid.uuid4().hex[:16]}"
        # Rule 3: this agent's event ids, the same through every node (a random
        # prefix per instance, as ``ClientProtocol`` rule 8, then a counter).
        self._event_prefix = f"{uuid.uuid4().hex[:8]}."
        self._event_no = itertools.count(1)
        self.addresses = list(addresses)
        self._errors = ErrorReporter(error_cb, self.client_id)
        # One single-address Client per node: each reconnects to its own node
        # only, and reports its errors through this agent's callback.  All say
        # Hello with the agent's id: an event's id is the same through any of them.
        self.clients = [
            Client([a], client_id=self.client_id, max_frame=max_frame, token=token, error_cb=self._errors.add, ssl=ssl)
            for a in self.addresses
        ]
        s = self.settings
        self.agent: RoutingAgent[int] = RoutingAgent(
            range(len(self.clients)), window=s.window, min_timeout=s.min_timeout, max_timeout=s.max_timeout
        )
        self.chokes = 0
        self.timeouts = 0
        self.resent = 0
        self.quorum_refusals = 0  # publishes a node refused with no_quorum (rule 3)
        self.probes = 0
        self.published: list[int] = [0] * len(self.clients)  # PubAcks per node
        self._pending: dict[int, int] = dict.fromkeys(range(len(self.clients)), 0)  # publishes awaiting an answer
        self._subs: dict[str, FailoverSubscription] = {}
        self._sub_seq = 0
        self._sampled: list[float] = [0.0] * len(self.clients)  # perf_counter of each node's last sample
        self._replace = asyncio.Event()
        self._placements = Placements()  # rule 6
        self._tasks = OwnedTasks(self.client_id)
        self._closing = False
        for i, c in enumerate(self.clients):
            c.on_lost.append(functools.partial(self._lost, i))

    # -- lifecycle ---------------------------------------------------------------------

    async def connect(self, timeout: float = 10.0) -> AgentClient:
        """Connect to every node; returns once at least one is up (the others keep
        trying).  If none is up within ``timeout``: ``TimeoutError``, and nothing
        is left running; if every node refused the session (a bad token): the
        first refusal, a ``RequestError``, at once; if TLS failed with every
        node, the first ``TlsError`` (a missing CA is no reason to wait either)."""
        up = asyncio.Event()
        refusals: list[RequestError] = []
        tls_failed: list[TlsError] = []

        async def connect_one(i: int) -> None:
            while not self._closing:
                try:
                    await self.clients[i].connect(timeout)
                except (TimeoutError, OSError) as exc:
                    log.info("%s: node %s not reachable yet: %s", self.client_id, self.addresses[i], exc)
                    continue
                except RequestError as exc:  # logged below unless every node refused (then it is raised)
                    log.debug("%s: node %s refused the session: %s", self.client_id, self.addresses[i], exc)
                    refusals.append(exc)
                    if len(refusals) == len(self.clients):
                        up.set()  # nobody will take it: say why now, not after the timeout
                    return
                except TlsError as exc:
                    log.warning("%s: %s", self.client_id, exc)
                    tls_failed.append(exc)
                    if len(tls_failed) == len(self.clients):
                        up.set()
                    return
                up.set()
                return

        self._tasks.spawn(self._errors.run(), "error reporter")
        for i, address in enumerate(self.addresses):
            self._tasks.spawn(connect_one(i), f"connect to {address}")
        try:
            await asyncio.wait_for(up.wait(), timeout)
            if len(refusals) == len(self.clients):
                raise refusals[0]
            for exc in refusals:
                log.warning("%s: a node refused the session: %s", self.client_id, exc)
            if len(tls_failed) == len(self.clients):
                raise tls_failed[0]
        except BaseException:
            await self.close()
            raise
        self._tasks.spawn(self._supervise(), "placing")
        if self.settings.probe_interval > 0:
            self._tasks.spawn(self._probe(), "probing")
        return self

    async def __aenter__(self) -> AgentClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every task of the agent, end every subscription's iteration and
        close every connection; returns when all of it has ended."""
        self._closing = True
        self._errors.stop()
        await self._tasks.close()
        for sub in list(self._subs.values()):
            sub._end()
        for c in self.clients:
            await c.close()

    @property
    def connected(self) -> list[int]:
        return [i for i, c in enumerate(self.clients) if c.connected]

    def _slow_consumer(self, sub_id: str, queued: int, limit: int, event_id: str) -> None:
        self._errors.slow_consumer(sub_id, queued, limit, event_id)

    # -- publishing (rules 1–3) --------------------------------------------------------

    async def publish(
        self,
        event: str | dict[str, Value],
        *,
        payload: bytes | str = b"",
        key: str = "",
        rank: int = 0,
        timeout: float = REQUEST_TIMEOUT,
    ) -> str:
        """Publish through the node with the lowest predicted latency; returns the event id.

        ``payload`` as for ``Client.publish``: opaque bytes (a ``str`` as its
        UTF-8) delivered unchanged with every notification.  Raises
        ``RequestError`` if the event is rejected, ``TimeoutError`` if no
        node acknowledged it within ``timeout``.
        """
        data = check_payload(payload)  # the same bytes on every attempt; each node checks its limit
        clock = time.perf_counter
        deadline = clock() + check_timeout(timeout)
        agent = self.agent
        pending = self._pending
        failed: set[int] = set()  # nodes that timed out on, refused or choked this publish
        event_id = f"{self._event_prefix}{next(self._event_no)}"  # rule 3: one id, every attempt
        while True:
            now = clock()
            if now >= deadline:
                raise TimeoutError("no access node acknowledged the publish in time")
            up = self.connected
            if not up:
                await asyncio.sleep(NOT_READY_RETRY)
                continue
            skip = failed.union(i for i in range(len(self.clients)) if i not in up)
            if len(skip) >= len(self.clients):
                failed.clear()  # every live node failed once: try them again
                skip = {i for i in range(len(self.clients)) if i not in up}
            node = agent.choose(now, exclude=skip, pending=pending)
            wait = min(agent.timeout(node), deadline - now)
            pending[node] += 1
            try:
                reply = await self.clients[node].publish_once(
                    event, key=key, rank=rank, timeout=wait, event_id=event_id, payload=data
                )
            except (TimeoutError, ConnectionLost):
                self.timeouts += 1
                self.resent += 1
                agent.on_timeout(node, clock())
                failed.add(node)
                continue
            except NotReady:
                await asyncio.sleep(NOT_READY_RETRY)
                continue
            except RequestError as exc:
                if exc.code != cm.ErrorCode.NO_QUORUM:
                    raise
                # That node is cut off from the majority: it did nothing with
                # the event; another node takes it, under the same id.
                self.quorum_refusals += 1
                agent.on_timeout(node, clock())
                failed.add(node)
                if len(failed | {i for i in range(len(self.clients)) if i not in up}) >= len(self.clients):
                    await asyncio.sleep(NOT_READY_RETRY)  # every node refuses: wait for a majority
                continue
            finally:
                pending[node] -= 1
            t1 = clock()
            self._sampled[node] = t1
            if isinstance(reply, cm.Choke):
                self.chokes += 1
                agent.on_choke(node, reply.delay, t1)
                if agent.choose(t1, exclude=skip) == node:
                    await asyncio.sleep(reply.delay)
                # It did not take the event either: once every node timed out or
                # choked, all are tried again.  (Left out, a node that timed out
                # once — a slow reply on a busy machine — stayed out while the
                # only other one choked: the publish waited chokes out until its
                # deadline with a healthy node at hand.)
                failed.add(node)
                continue
            agent.on_ack(node, t1 - now, t1)
            self.published[node] += 1
            return reply.event_id

    async def _probe(self) -> None:
        """Rule 4."""
        clock = time.perf_counter
        interval = self.settings.probe_interval

        async def probe(i: int) -> None:
            t0 = clock()
            try:
                await self.clients[i].ping(timeout=self.agent.timeout(i))
            except (TimeoutError, ConnectionLost):
                self.agent.on_timeout(i, clock())
                self._sampled[i] = clock()
                return
            t1 = clock()
            self._sampled[i] = t1
            self.probes += 1
            self.agent.on_ack(i, t1 - t0, t1)

        while True:
            await asyncio.sleep(interval / 2)
            now = clock()
            idle = [i for i in self.connected if now - self._sampled[i] >= interval]
            # At once: one node that does not answer must not hold back the others' probes.
            await asyncio.gather(*(probe(i) for i in idle))

    # -- subscriptions (rule 5) --------------------------------------------------------

    async def subscribe(
        self,
        expression: str,
        *,
        sub_id: str | None = None,
        group: str = "",
        weight: float = 1.0,
        queue_size: int = DEFAULT_QUEUE,
        redundancy: int | None = None,
        load: LoadFactorConfig | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> FailoverSubscription:
        """Subscribe on ``redundancy`` access nodes (1 for a group); returns once each applied it."""
        if sub_id is None:
            self._sub_seq += 1
            sub_id = f"f{self._sub_seq}"
        if sub_id in self._subs:
            raise RequestError(cm.ErrorCode.DUPLICATE_SUBSCRIPTION, f"subscription {sub_id!r} is already open")
        fs = FailoverSubscription(
            self,
            sub_id,
            expression,
            group=group,
            weight=weight,
            queue_size=queue_size,
            redundancy=redundancy or self.settings.redundancy,
            dedup=self.settings.dedup,
            load=load,
        )
        self._subs[sub_id] = fs
        try:
            await asyncio.wait_for(self._place_first(fs), check_timeout(timeout))
            if not fs.homes:
                raise ConnectionLost("no access node could take the subscription")
        except TimeoutError:
            await fs.close()
            if fs.quorum_refused:  # rule 6: what the nodes said, rather than only that time ran out
                raise RequestError(
                    cm.ErrorCode.NO_QUORUM, f"no access node took the subscription in time ({fs.last_refusal})"
                ) from None
            raise
        except BaseException:
            await fs.close()
            raise
        return fs

    async def _place_first(self, fs: FailoverSubscription) -> None:
        """The caller's subscribe (rule 6): placed where it can be; while no
        node took it and a node refused it with ``no_quorum`` (it did nothing:
        cut off, or its lease lapsed for a moment), it waits and tries again,
        as a publish does (rule 3) — until the caller's timeout."""
        while True:
            await self._place(fs, initial=True)
            if fs.homes or fs.closed or not fs.quorum_refused:
                return
            await asyncio.sleep(NOT_READY_RETRY)

    async def _place(self, fs: FailoverSubscription, *, initial: bool = False) -> None:
        """Give ``fs`` homes on connected nodes up to its redundancy, cheapest
        first (rule 6: a node that failed waits out its pause).  ``initial``:
        the caller's subscribe — a refusal of the subscription itself
        (``bad_expression`` …) is raised to it."""
        async with fs.placing:  # rule 6: one placement of a subscription at a time
            await self._place_locked(fs, initial=initial)

    async def _place_locked(self, fs: FailoverSubscription, *, initial: bool) -> None:
        now = time.perf_counter()
        tried: set[int] = set()
        while len(fs.homes) < fs.redundancy and not fs.closed and not self._closing:
            free = [i for i in self.connected if i not in fs.homes and i not in tried and self._may_try(fs, i)]
            if not free:
                self._check_homeless(fs)
                return
            i = min(free, key=lambda n: self.agent.cost(n, now))
            tried.add(i)
            try:
                part = await self.clients[i].subscribe(
                    fs.expression,
                    sub_id=fs.sub_id,
                    group=fs.group,
                    weight=fs.weight,
                    queue_size=1,  # unused: the sink takes every notification
                    sink=fs._sink,
                    timeout=self.settings.max_timeout,
                )
            except (ConnectionLost, TimeoutError, NotReady, RequestError) as exc:
                code = exc.code if isinstance(exc, RequestError) else None
                # no_quorum refuses the node, not the subscription: the next node is tried (rule 6).
                fs.quorum_refused |= code == cm.ErrorCode.NO_QUORUM
                refused = code is not None and code not in NODE_REFUSALS
                if initial and refused and not fs.homes:  # the first node refused the subscription itself
                    raise
                self._failed_to_place(fs, i, exc)
                if (
                    isinstance(exc, RequestError)
                    and exc.code == cm.ErrorCode.DUPLICATE_SUBSCRIPTION
                    and i not in fs.homes
                ):
                    # An earlier attempt there timed out here but was applied there.
                    with contextlib.suppress(ConnectionLost, RequestError, TimeoutError):
                        await self.clients[i].request_unsubscribe(fs.sub_id, timeout=CLEANUP_TIMEOUT)
                continue
            self._placements.succeeded(fs.sub_id, i)
            if fs.closed:
                with contextlib.suppress(ConnectionLost, RequestError, TimeoutError):
                    await self.clients[i].unsubscribe(fs.sub_id, timeout=CLEANUP_TIMEOUT)
                return
            if not self.clients[i].connected:
                # Lost while we waited: _lost did not see it as a home, so take
                # it off that client here (it must not re-subscribe it).
                self.clients[i]._forget(fs.sub_id)
                continue
            fs.homes[i] = part

    def _may_try(self, fs: FailoverSubscription, i: int) -> bool:
        """Rule 6: not during a node's pause, nor past its attempts on this connection."""
        return self._placements.may_try(fs.sub_id, i, self.clients[i].connections, time.monotonic())

    def _failed_to_place(self, fs: FailoverSubscription, i: int, exc: Exception) -> None:
        count = self._placements.failed(fs.sub_id, i, self.clients[i].connections, time.monotonic())
        why = str(exc) or type(exc).__name__
        fs.last_refusal = f"node {self.addresses[i]}: {why}"
        log.info(
            "%s: cannot place %s on node %s (attempt %d of %d): %s",
            self.client_id,
            fs.sub_id,
            self.addresses[i],
            count,
            MAX_PLACE_ATTEMPTS,
            why,
        )

    def _check_homeless(self, fs: FailoverSubscription) -> None:
        """Rule 6: no home, and every connected node gave up on it."""
        if not fs.homes and self._placements.gave_up(fs.sub_id, self.connected):
            error = ConnectionLost(f"no access node takes subscription {fs.sub_id!r} any more ({fs.last_refusal})")
            self._ended(fs.sub_id)
            fs._end(error)
            log.warning("%s: %s", self.client_id, error)

    def _ended(self, sub_id: str) -> None:
        """``sub_id`` is no subscription of the agent's any more."""
        self._subs.pop(sub_id, None)
        self._placements.forget(sub_id)

    def _lost(self, i: int, client: Client) -> None:
        """Client ``i`` lost its node: take subscriptions off it (before it can
        re-subscribe them on reconnect) and have them placed elsewhere."""
        for fs in self._subs.values():
            if fs.homes.pop(i, None) is not None:
                fs.failovers += 1
                client._forget(fs.sub_id)
                log.info("%s: subscription %s lost its home %s", self.client_id, fs.sub_id, self.addresses[i])
        self._replace.set()

    async def _supervise(self) -> None:
        """Place subscriptions short of homes, when a home is lost or a node comes back."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._replace.wait(), REPLACE_POLL)
            self._replace.clear()
            for fs in list(self._subs.values()):
                if len(fs.homes) < fs.redundancy and not fs.closed:
                    try:
                        await self._place(fs)
                    except Exception as exc:  # noqa: BLE001 — a bug: serve the others (rule 6: no spin, no trace per turn)
                        fs.last_refusal = repr(exc)
                        log.warning("%s: re-placing subscription %s failed: %r", self.client_id, fs.sub_id, exc)

    def stats(self) -> dict[str, Any]:
        now = time.perf_counter()
        return {
            "published": list(self.published),
            "chokes": self.chokes,
            "timeouts": self.timeouts,
            "resent": self.resent,
            "probes": self.probes,
            "cost": [self.agent.cost(i, now) for i in range(len(self.clients))],
            "connected": self.connected,
        }
