"""The simulated clients under node faults (``sim.faults``; SPEC §16's promise
is about what they see).

Rules:

1. **Event ids.**  Every publish carries an id the client chose
   (``Publish.event_id``, ``<client>-e<n>``, unique in the run): the event is
   recorded when first sent, and a re-send with the same id — to the same
   node or, after its session was lost, to another — is the same event.  The
   cluster names it ``<client id>/<id>`` (``node.clients``): its PubAck and
   notifications carry that name, known from the first send
   (``SimClients.event_names``).
2. **Refusals are retried** later on the same session: ``not_ready`` (a
   node rejoining), ``overloaded`` (a full outbox) and ``Choke(delay)``;
   a request is sent at most ``MAX_TRIES`` times, then given up (an event
   never acknowledged, a subscription that failed: the promise does not
   cover them; counted).
3. **``no_quorum``** (the node is cut off in a minority) sends the client to
   another node, as the error says: it closes the session and reconnects
   elsewhere (rule 4), the refused request with it.
4. **A lost session** — its node crashed, stopped to rejoin, or closed it —
   ends every subscription of the session (``SubRec.lost_at``; when a
   node's run ends, every subscription ever made on that run notes since
   when it was dying, ``SubRec.died_at``); the client
   reconnects after a short delay to another node that serves clients (up,
   not paused; the one it lost only when no other does), says Hello,
   re-sends every publish not yet PubAcked with its id, and subscribes
   again to what it held or was subscribing to (new subscriptions, new
   SubAcks).  Requests waiting for a retry go with it; unsubscribes and
   operator commands of the lost session are done (the subscription went
   with the session) or dropped.
5. A retry or reconnect belongs to the session that armed it: one armed in
   an earlier session is void (rule 4 carried its request over).  Timers
   fire in (time, arming order) when the clock moves; a client that closed
   its session has none.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from typing import Any, Final, Protocol

from overlay.messages import client as cm
from overlay.messages.codec import client_reader

from .inbox import ClientLink
from .network import SimNetwork
from .records import EventRec, SimClient, SubRec
from .workload import SubSpec, payload_of


class SimUsers(Protocol):
    """What the client faults need of the simulated clients (``sim.clients``),
    named here so that module and this one do not import each other."""

    net: SimNetwork
    clients: list[SimClient]
    by_session: dict[tuple[int, int], SimClient]
    admins: dict[int, SimClient]
    events: dict[str, EventRec]
    event_names: dict[str, EventRec]
    subs: list[SubRec]
    admin_results: Counter[str]

    def open(self, node: int, *, admin: bool = False) -> SimClient: ...

    def subscribe(self, c: SimClient, spec: SubSpec, group: str = "") -> SubRec: ...

    def send(self, c: SimClient, msg: cm.ClientMessage) -> None: ...

    def next_seq(self, c: SimClient, kind: str, data: Any) -> int: ...

    def send_subscribe(self, c: SimClient, rec: SubRec) -> None: ...


__all__ = ["MAX_TRIES", "RETRIED", "ClientFaults"]

# Rule 2: sends of one request before it is given up (retries ~0.1–0.4 s apart:
# longer than a node takes to rejoin, fetch the table and be ready).
MAX_TRIES: Final = 40
# Rule 2: the refusals that mean "later".
RETRIED: Final = frozenset({cm.ErrorCode.NOT_READY, cm.ErrorCode.OVERLOADED})
RECONNECT = 0  # the ticket of a reconnect timer (retries have tickets from 1)


class ClientFaults:
    """Rules 1–5 for every client of ``users``."""

    def __init__(self, users: SimUsers, rng: random.Random) -> None:
        self.users = users
        self.rng = rng
        self.timers: list[tuple[float, int, int, int, SimClient]] = []  # (due, order, session_no, ticket, client)
        self._order = 0
        self._ticket = 0
        self._event_no = 0
        self.counts: Counter[str] = Counter()  # sessions lost, reconnects, re-sends, retries, given up

    # -- rule 1 ------------------------------------------------------------------------------

    def publish(self, c: SimClient, values: dict[str, Any], event: Any, key: str = "") -> None:
        users = self.users
        self._event_no += 1
        rec = EventRec(f"{c.name}-e{self._event_no}", values, users.net.step_no, c.name, key=key)
        users.events[rec.event_id] = rec
        name = f"{c.name}/{rec.event_id}"  # the cluster's name for it (rule 1)
        rec.aliases.append(name)
        users.event_names[name] = rec
        self._send_event(c, rec, event)

    def _send_event(self, c: SimClient, rec: EventRec, event: Any = None) -> None:
        users = self.users
        rec.sends += 1
        seq = users.next_seq(c, "event", rec)
        body = rec.values if event is None else event
        publish = cm.Publish(
            seq,
            body,
            publish_time=users.net.now,
            key=rec.key,
            event_id=rec.event_id,
            payload=payload_of(rec.values),
        )
        users.send(c, publish)

    def acked(self, c: SimClient, msg: cm.PubAck, rec: EventRec) -> None:
        users = self.users
        if rec.acked_at is not None:
            users.net.failures.append(f"{c.name}: second PubAck for event {rec.event_id} ({msg!r})")
            return
        rec.acked_at = users.net.step_no
        if msg.event_id not in rec.ids():  # the node named it otherwise: its notifications carry that name
            users.event_names.setdefault(msg.event_id, rec)
            rec.aliases.append(msg.event_id)

    def returned(self, msg: cm.Error) -> None:
        """An ``undeliverable`` Error about an event acknowledged before: no
        instance of a group could take it (SPEC §11) — named in its text."""
        users = self.users
        for name, rec in users.event_names.items():
            if f"event {name}:" in msg.message:
                rec.returned = True
                self.counts["returned_to_publisher"] += 1
                return
        users.net.failures.append(f"undeliverable Error about no known event: {msg!r}")

    # -- rules 2 and 3 -----------------------------------------------------------------------

    def refused(self, c: SimClient, kind: str, data: Any, msg: cm.Error | cm.Choke) -> None:
        """A request answered ``msg``: retried (rule 2), carried to another node
        (rule 3), or a finding."""
        users = self.users
        if isinstance(msg, cm.Choke):
            self._retry(c, kind, data, max(msg.delay, 0.01))
        elif msg.code == cm.ErrorCode.NO_QUORUM and kind in ("event", "sub", "unsub"):
            self.counts["no_quorum"] += 1
            if kind != "unsub" and self._count_try(kind, data):  # an unsubscribe is done by leaving
                c.waiting[self._next_ticket()] = (kind, data)
            self.leave(c, f"node {c.node} answered no_quorum")
        elif msg.code in RETRIED and kind in ("event", "sub", "unsub"):
            self._retry(c, kind, data, self.rng.uniform(0.1, 0.4))
        elif kind == "admin":
            users.admin_results[f"{data}:refused"] += 1
        else:
            what = data.event_id if kind == "event" else data.spec.text() if kind in ("sub", "unsub") else data
            users.net.failures.append(f"{c.name}: {kind} {what} refused: {msg.code} {msg.message}")
            if kind == "sub":
                data.failed = True

    def _count_try(self, kind: str, data: Any) -> bool:
        """One more send of the request; False when it is given up (rule 2)."""
        if kind == "event":
            gone = data.sends >= MAX_TRIES
            if gone:
                data.gave_up = True
        elif kind == "sub":
            data.tries += 1
            gone = data.tries >= MAX_TRIES
            if gone:
                data.failed = True
        else:
            gone = False
        if gone:
            self.counts[f"gave_up_{kind}"] += 1
        return not gone

    def _retry(self, c: SimClient, kind: str, data: Any, delay: float) -> None:
        if not self._count_try(kind, data):
            return
        self.counts["retries"] += 1
        ticket = self._next_ticket()
        c.waiting[ticket] = (kind, data)
        self._arm(c, ticket, delay)

    def _next_ticket(self) -> int:
        self._ticket += 1
        return self._ticket

    def _arm(self, c: SimClient, ticket: int, delay: float) -> None:
        self._order += 1
        heapq.heappush(self.timers, (self.users.net.now + delay, self._order, c.session_no, ticket, c))

    # -- rule 4 ------------------------------------------------------------------------------

    def node_down(self, node: int, incarnation: int, since: int) -> None:
        """That run of ``node`` is gone (dying since step ``since``): every
        session on it ends."""
        users = self.users
        for rec in users.subs:
            if rec.run == (node, incarnation) and rec.died_at is None:
                rec.died_at = since
        for c in [*users.clients, *users.admins.values()]:
            if c.node == node and c.connected and c.closed_at is None:
                self.lost(c, f"node {node} went down")

    def closed_by_node(self, node: int, sid: int, reason: str) -> None:
        """``CloseClient``: the shell closes the connection, then tells the core
        it closed (``client_closed``), as for any connection that ends."""
        net = self.users.net
        c = self.users.by_session.get((node, sid))
        if c is not None and c.connected and c.closed_at is None:
            self.lost(c, f"node {node} closed the session: {reason}")
        core = net.cores.get(node)
        if core is not None and sid in core.sessions:
            net.hash.update(b"X%d:%d" % (node, sid))
            net.execute(node, core.client_closed(sid))

    def node_up(self, node: int) -> None:
        """A new run of ``node``: its operator connects again."""
        users = self.users
        admin = users.admins.get(node)
        if admin is None or not admin.connected or admin.closed_at is not None:
            users.admins[node] = users.open(node, admin=True)

    def leave(self, c: SimClient, why: str) -> None:
        """Rule 3: the client closes its session on a node cut off, to go elsewhere."""
        net = self.users.net
        node, sid = c.node, c.sid
        self.lost(c, why)
        if node in net.cores:
            net.hash.update(b"X%d:%d" % (node, sid))
            net.left(node, sid)
            net.execute(node, net.cores[node].client_closed(sid))

    def lost(self, c: SimClient, why: str) -> None:
        """Rule 4: the session ended under the client."""
        users = self.users
        step = users.net.step_no
        self.counts["sessions_lost"] += 1
        users.by_session.pop((c.node, c.sid), None)
        # What its node had read and not dispatched goes with the session (sim.inbox rule 4).
        users.net.runs["client_messages_lost"] += users.net.inbox.drop(ClientLink(c.node, c.sid))
        c.connected = False
        c.session_no += 1
        if users.net.keep_trace:
            users.net.trace.append(f"{step} t={users.net.now:.3f} client {c.name}@{c.node}: session lost ({why})")
        if c.admin:
            c.pending.clear()
            c.closed_at = step  # an operator's session; a new one opens with the node's next run
            return
        carry: list[tuple[str, Any]] = []
        for rec in c.subs.values():
            if rec.ended_at is None:
                rec.lost_at = step
                if not rec.failed:
                    carry.append(("sub", rec))
        waiting = [item for _, item in sorted(c.waiting.items())]
        pending = [item for _, item in sorted(c.pending.items())]
        for kind, data in [*pending, *waiting]:
            if kind == "event" and data.acked_at is None and not data.gave_up:
                carry.append(("event", data))
        c.pending.clear()
        c.waiting.clear()
        c.carry = carry
        self._arm(c, RECONNECT, self.rng.uniform(0.05, 0.5))

    def _reconnect(self, c: SimClient) -> None:
        users, net = self.users, self.users.net
        nodes = net.serving()
        others = [i for i in nodes if i != c.node]
        if not nodes:
            self._arm(c, RECONNECT, 0.2)
            return
        node = self.rng.choice(others or nodes)
        self.counts["reconnects"] += 1
        c.node = node
        c.sid = net.cores[node].client_opened()
        c.reader = client_reader()
        c.connected = True
        users.by_session[(node, c.sid)] = c
        users.send(c, cm.Hello(c.name))
        carry, c.carry = c.carry, []
        for kind, data in carry:
            if not c.connected:  # the node sent it away at once: the rest goes with the next session
                c.carry.append((kind, data))
            elif kind == "event":
                self.counts["events_resent"] += 1
                self._send_event(c, data)
            else:
                self.counts["resubscribed"] += 1
                users.subscribe(c, data.spec, data.group)

    # -- rule 5 ------------------------------------------------------------------------------

    def run_due(self) -> None:
        """Fire the timers due by now."""
        net = self.users.net
        timers = self.timers
        while timers and timers[0][0] <= net.now:
            _, _, session_no, ticket, c = heapq.heappop(timers)
            if c.closed_at is not None or session_no != c.session_no:
                continue  # void (rule 5)
            if ticket == RECONNECT:
                if not c.connected:
                    self._reconnect(c)
                continue
            item = c.waiting.get(ticket)
            if item is None or not c.connected:
                continue
            if net.stall_until[c.node] > net.now:  # a paused node answers nothing yet
                self._arm(c, ticket, net.stall_until[c.node] - net.now + 0.01)
                continue
            del c.waiting[ticket]
            kind, data = item
            if kind == "event":
                self._send_event(c, data)
            elif kind == "sub":
                self.users.send_subscribe(c, data)
            elif kind == "unsub" and data.lost_at is None:
                seq = self.users.next_seq(c, "unsub", data)
                self.users.send(c, cm.Unsubscribe(seq, data.local_id))

    def unsettled(self) -> list[str]:
        """What the clients still wait for (the drain goes on while there is any)."""
        why = []
        for c in self.users.clients:
            if c.closed_at is not None:
                continue
            if not c.connected:
                why.append(f"{c.name} reconnecting")
                continue
            # A Subscribe its Unsubscribe overtook is answered by the UnsubAck (invariants rule 2).
            answers = Counter(k for k, d in c.pending.values() if not (k == "sub" and d.unsub_sent_at is not None))
            retries = Counter(kind for kind, _ in c.waiting.values())
            if answers or retries:
                why.append(
                    f"{c.name}@{c.node} waits for answers {dict(sorted(answers.items()))}, "
                    f"to send again {dict(sorted(retries.items()))}"
                )
        return why
