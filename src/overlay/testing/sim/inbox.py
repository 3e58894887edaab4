"""What a simulated node has read and not dispatched yet: the runs the real
dispatcher hands its core in one call (``overlay.net.dispatch`` rule 1).

Rules:

1. A run is what the real dispatcher batches: a session's Publishes in a
   row (``NodeCore.handle_publishes``), or a peer's Events in a row
   (``NodeCore.handle_peer_events``).  Anything else breaks a run and goes
   alone (``handle_client``, ``handle_peer``); so does a run of one.  A run
   holds at most ``DISPATCH_BATCH`` messages, the dispatcher's batch.
2. How many of the messages waiting in a row arrive together is the
   scheduler's draw (``run_length``, from the run's own batch stream): one,
   all of them, or some in between — both single and batched deliveries,
   deterministically per seed.
3. A client's messages reach its node at once, unless the node has not
   read them yet: a Publish may wait in the node's inbox (``ClientInbox``;
   ``P_HOLD`` of lone ones, every one of a pipelining publisher's burst),
   and once one waits, the session's later Publishes and Acks queue behind
   it (a session is FIFO).  Any other request of the client is preceded
   by what waits (``SimClients.send`` flushes it: what the node read first
   is dispatched first).  The scheduler delivers a waiting session like a
   ready peer link (``ClientLink`` among ``SimNetwork.ready_links``).
4. What waits dies with the session: a crash, a session the node or the
   client ended (the client re-sends what was not PubAcked, SPEC §16).
5. ``SimParams.batching`` off: no Publish waits, no run forms, and no
   number is drawn for either — the schedule of the one-message-per-step
   simulator, trace for trace.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from overlay.messages import client as cm
from overlay.net.dispatch import DISPATCH_BATCH

__all__ = ["MAX_BURST", "P_BURST", "P_HOLD", "ClientInbox", "ClientLink", "run_length"]

# Rule 3: the share of lone Publishes the node has not read yet when the
# client sent them — enough that a session's Publishes often wait together.
P_HOLD: Final = 0.5
# A publish action of a pipelining publisher: a burst of 2..MAX_BURST Publishes
# written at once, all waiting in the node's inbox (``SimClients.act``).
P_BURST: Final = 0.1
MAX_BURST: Final = 6


@dataclass(frozen=True)
class ClientLink:
    """The connection of session ``sid`` to ``node``: a source the scheduler
    delivers from, beside the peer links ``(src, dst)`` (rule 3)."""

    node: int
    sid: int


def run_length(rng: random.Random, n: int) -> int:
    """Rule 2: how many of ``n`` messages waiting in a row arrive together."""
    n = min(n, DISPATCH_BATCH)
    if n <= 1:
        return n
    r = rng.random()
    if r < 0.4:
        return 1
    if r < 0.7:
        return n
    return rng.randint(2, n)


class ClientInbox:
    """Rules 3 and 4: per session, the client messages its node read and has
    not dispatched, each with the time it was read.  Invariant: no session
    has an empty queue here."""

    def __init__(self) -> None:
        self._held: dict[ClientLink, deque[tuple[float, cm.ClientMessage]]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._held.values())

    def __contains__(self, link: ClientLink) -> bool:
        return link in self._held

    def links(self) -> Iterator[tuple[ClientLink, float]]:
        """Each session that has messages waiting, with when its first was read (in arrival order)."""
        for link, q in self._held.items():
            yield link, q[0][0]

    def hold(self, link: ClientLink, now: float, msg: cm.ClientMessage) -> None:
        q = self._held.get(link)
        if q is None:
            q = self._held[link] = deque()
        q.append((now, msg))

    def take_run(self, link: ClientLink, rng: random.Random) -> list[cm.ClientMessage]:
        """Rule 1: the next run of ``link`` (its length drawn, rule 2)."""
        q = self._held[link]
        first = q.popleft()[1]
        run = [first]
        if type(first) is cm.Publish:
            n = 1
            for _, msg in q:
                if type(msg) is not cm.Publish or n == DISPATCH_BATCH:
                    break
                n += 1
            for _ in range(run_length(rng, n) - 1):
                run.append(q.popleft()[1])
        if not q:
            del self._held[link]
        return run

    def drop(self, link: ClientLink) -> int:
        """Rule 4: the session ended; how many messages died with it."""
        q = self._held.pop(link, None)
        return 0 if q is None else len(q)

    def drop_node(self, node: int) -> int:
        """Rule 4: ``node`` crashed; how many messages died with it."""
        gone = [link for link in self._held if link.node == node]
        return sum(self.drop(link) for link in gone)
