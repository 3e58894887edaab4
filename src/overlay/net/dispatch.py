"""The dispatcher, the indexer and the slow log of a node (``overlay.net.node`` rules 3, 7, 8).

Rules:

1. One dispatcher task takes the inbox's items in batches of at most
   ``DISPATCH_BATCH``, high first, and hands each to the core method for its
   type (``net.inbox``); what the core returns goes to ``execute``.  A
   session's Publishes in a row in a batch (a pipelining publisher's read)
   go to the core in one call, ``NodeCore.handle_publishes``: the checks of
   the session made once, one list of actions; so do a peer's Events in a
   row (``NodeCore.handle_peer_events``).  It gives
   the loop a turn at least every ``DISPATCH_SLICE`` while busy, so the
   writers send replies and notifications during a burst.  After each batch,
   the core's batched notes (``NodeCore.end_batch``) go out — its receipts
   once due (``node.outbox`` rule 5: the dispatcher, waiting on an empty
   inbox, wakes when they are) —, and the indexer is woken when the core
   has background work.
2. A message that breaks the protocol is logged (a peer is answered with
   ``PeerError``); any other error of one message's handling is logged with
   its traceback, and a client's request (Subscribe, Unsubscribe, Admin) is
   answered ``internal_error`` — unanswered, its client waited out its
   timeout ("request timed out") for an answer that never came —; so is
   each Publish of a run whose handling fails as a whole (one Publish's
   failure within it the core answers itself).  Either way
   the next message is handled: one message's failure is its own.
3. The indexer runs ``NodeCore.background_step`` a bounded step at a time
   (``INDEX_STEP``), pausing ``INDEX_PAUSE`` between steps, until the core
   has nothing left; an error is logged, counted (``shell_errors``), and the
   indexer waits for the next wake-up.
4. ``SlowLog``: whatever held the loop past ``slow_ms`` is journalled as
   ``slow`` with what it was, where it came from and for how long.
5. A test may see, drop or answer in the core's place what reaches the core
   (``intercept``): each batch's items are shown to its tap first, in the
   order they are taken; an item the tap answers with a list of actions
   (maybe empty) is not handed to the core, and those actions are executed
   at once.  A test may also hold or slow the dispatcher (``pace``): its
   hook is awaited before each batch is taken.  Without them (always
   outside tests) each costs one test per batch.  (Tests used to replace
   the core's and the inbox's methods: compiled classes' cannot be,
   ``overlay.build``.)
6. **Publishes at once.**  A client's read loop that reads Publishes while
   the inbox is empty hands them to ``publishes_now`` instead of queueing
   them: the dispatcher is idle then (it awaits only on an empty inbox, or
   for its slice's loop turn with items left), so nothing is queued ahead
   of them and handling them now is the order rule 1 would give — without
   an inbox item per message and the hand-over to this task.  They are one
   run, as in rule 1 (``NodeCore.handle_publishes``, in runs of at most
   ``DISPATCH_BATCH``), with rule 2's errors and rule 4's slow log, and
   ``end_batch`` after them; at most one slice's worth (``DISPATCH_SLICE``)
   per call: the read loop gives the loop a turn before the rest (queued
   if the inbox is no longer empty by then).  Receipts left waiting go out
   once due (``node.outbox`` rule 5) from a timer, as the idle dispatcher
   would send them.  While a test taps or paces the dispatcher (rule 5)
   nothing is handled so: every message goes through the inbox, to be seen
   or held.
7. **A peer's Batch at once.**  Likewise a peer's inbound link that reads a
   ``Batch`` while the inbox is empty hands its messages to ``peers_now``
   (``net.inbound`` rule 4): handled now, in order, as rule 1 would handle
   them queued — a peer's Events in a row in one call
   (``NodeCore.handle_peer_events``, in runs of at most ``DISPATCH_BATCH``),
   any other message alone (``NodeCore.handle_peer``) — with rule 2's
   errors (a protocol error answered ``PeerError``), rule 4's slow log,
   ``end_batch`` after them, rule 6's slice and receipts timer, and none
   while a test taps or paces the dispatcher.  No inbox item, no hand-over
   to the dispatcher's task: an event crossing nodes meets this twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from overlay.actions import Action, ToClient, ToPeer
from overlay.errors import RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.net.inbox import ClientClosed, FromClient, FromPeer, Inbox, InboxItem, PeerHelloIn
from overlay.node import NodeCore

__all__ = ["DISPATCH_BATCH", "DISPATCH_SLICE", "INDEX_PAUSE", "INDEX_STEP", "Dispatcher", "Pace", "SlowLog", "Tap"]

log = logging.getLogger("overlay.net")

# Inbound messages the dispatcher takes per wake-up: the loop gets back to the
# sockets at least this often under a flood.
DISPATCH_BATCH: Final = 64
# Longest run of dispatching before a loop turn lets the writers send (rule 1).
DISPATCH_SLICE: Final = 0.001
# Subscriptions indexed per background step (Channel rule 5): ≈ 50 µs each for
# a range over many buckets (measured), so a step holds the loop for about
# 0.2 ms — an event arriving meanwhile waits no longer than that — and the
# pause keeps indexing to a sixth of the loop's time.
INDEX_STEP: Final = 4
# Rule 5: None hands the item to the core as usual; a list answers it instead.
Tap = Callable[[InboxItem], list[Action] | None]
Pace = Callable[[], Awaitable[None]]
INDEX_PAUSE: Final = 0.001


class SlowLog:
    """Rule 4.  ``threshold`` is in seconds (``inf``: off)."""

    def __init__(self, core: NodeCore, slow_ms: float) -> None:
        self._core = core
        self.threshold = slow_ms / 1000 or float("inf")

    def check(self, what: str, source: str, now: float, t0: float) -> None:
        """Journal ``what`` if it held the loop past the threshold since ``t0`` (``perf_counter``)."""
        if time.perf_counter() - t0 > self.threshold:
            self.note(what, source, now, t0)

    def note(self, what: str, source: str, now: float, t0: float) -> None:
        """Journal ``what``, which held the loop since ``t0`` (``perf_counter``)."""
        ms = (time.perf_counter() - t0) * 1000
        log.info("node %d: %s from %s held the loop %.1f ms", self._core.id, what, source, ms)
        self._core.ctx.journal.record("slow", now, what=what, source=source, ms=round(ms, 3))


class Dispatcher:
    """Rules 1–3 for one node: ``run`` and ``index`` are two tasks of its TaskGroup."""

    def __init__(
        self,
        core: NodeCore,
        inbox: Inbox,
        slow: SlowLog,
        *,
        execute: Callable[[list[Action]], None],
        peer_run: Callable[[int, int], None],
    ) -> None:
        self._core = core
        self._inbox = inbox
        self._slow = slow
        self._execute = execute
        self._peer_run = peer_run
        self._wake = asyncio.Event()
        self._tap: Tap | None = None  # rule 5
        self._pace: Pace | None = None
        self._receipts_timer: asyncio.TimerHandle | None = None  # rule 6
        self.publishes_inline = 0  # rule 6: Publishes handled at once (status, tests)
        self.peer_inline = 0  # rule 7: peer messages handled at once (tests)
        self.slice = DISPATCH_SLICE  # rule 1's slice, and rule 6's (seconds)

    def intercept(self, tap: Tap | None) -> None:
        """Rule 5: show every item to ``tap`` before the core (None: no more)."""
        self._tap = tap

    def pace(self, hook: Pace | None) -> None:
        """Rule 5: await ``hook()`` before taking each batch (None: no more)."""
        self._pace = hook

    def _tapped(self, tap: Tap, items: list[InboxItem]) -> list[InboxItem]:
        """Rule 5: the items ``tap`` leaves to the core, in order."""
        kept: list[InboxItem] = []
        for item in items:
            acts = tap(item)
            if acts is None:
                kept.append(item)
            elif acts:
                self._execute(acts)
        return kept

    async def run(self) -> None:
        """Rule 1 until cancelled (the node's TaskGroup stops it); rule 6's
        receipts timer goes with it, so nothing runs on a stopped core."""
        try:
            await self._run()
        finally:
            if self._receipts_timer is not None:
                self._receipts_timer.cancel()
                self._receipts_timer = None

    async def _run(self) -> None:
        core = self._core
        inbox = self._inbox
        execute = self._execute
        slow = self._slow
        stats = core.ctx.stats
        slice_end = time.perf_counter() + self.slice
        while True:
            if not len(inbox):
                due = core.receipts_due_in(time.time())
                if due is None:
                    await inbox.wait()
                else:  # node.outbox rule 5: receipts wait a moment for more to share their frame
                    try:
                        async with asyncio.timeout(due):
                            await inbox.wait()
                    except TimeoutError:
                        acts = core.end_batch()
                        if acts:
                            execute(acts)
                        continue
                slice_end = time.perf_counter() + self.slice
            elif time.perf_counter() > slice_end:
                # Still busy after a slice: one loop turn, so the writer tasks
                # send what this one produced.  Waiting for an empty inbox
                # instead held every reply and notification of a burst (a
                # split's backlog, a move's Reforwards) until its end.
                await asyncio.sleep(0)
                slice_end = time.perf_counter() + self.slice
            # Take a batch, high first (queues rule 1).  Nothing below awaits, so
            # nothing is queued meanwhile: the order is exactly the one a get()
            # per message would give, without its per-message cost.
            if self._pace is not None:
                await self._pace()
            items = inbox.drain(DISPATCH_BATCH)
            if self._tap is not None:
                items = self._tapped(self._tap, items)
            n = len(items)
            i = 0
            while i < n:
                item = items[i]
                i += 1
                now = time.time()
                t0 = time.perf_counter()
                try:
                    if type(item) is FromPeer:
                        pmsg = item.msg
                        if type(pmsg) is pm.Event and i < n and _event_of(items[i], item.src) is not None:
                            # Rule 1: a peer's Events in a row, in one call.
                            events, i = _run(items, i, pmsg, _event_of, item.src)
                            acts = core.handle_peer_events(item.src, events, now)
                        else:
                            acts = core.handle_peer(item.src, pmsg, now)
                    elif type(item) is FromClient:
                        msg = item.msg
                        if type(msg) is cm.Publish and i < n and _publish_of(items[i], item.sid) is not None:
                            # Rule 1: a session's Publishes in a row, in one call.
                            run, i = _run(items, i, msg, _publish_of, item.sid)
                            acts = core.handle_publishes(item.sid, run, now)
                        else:
                            acts = core.handle_client(item.sid, msg, now)
                    elif type(item) is ClientClosed:
                        acts = core.client_closed(item.sid)
                    elif type(item) is PeerHelloIn:  # a restarted peer's old frames go first (node rule 9)
                        self._peer_run(item.src, item.msg.incarnation)
                        acts = core.peer_hello(item.src, item.msg, now)
                    else:
                        stats["shell_unknown_inbox_items"] += 1
                        log.error("node %d: the inbox holds an item the dispatcher does not know: %r", core.id, item)
                        continue
                except RemoteProtocolError as exc:
                    log.warning("node %d: protocol error from %s: %s", core.id, described(item)[1], exc)
                    if type(item) is FromPeer:
                        execute([ToPeer(item.src, pm.PeerError("protocol_error", str(exc)))])
                    continue
                except Exception as exc:  # rule 2: one message's failure is its own
                    what, source = described(item)
                    log.exception("node %d: failed handling %s from %s", core.id, what, source)
                    if type(item) is FromClient and isinstance(item.msg, _REQUESTS):
                        execute([ToClient(item.sid, _internal_error(item.msg, exc))])
                    elif type(item) is FromClient and type(item.msg) is cm.Publish:
                        execute(_publishes_failed(item.sid, _failed_run(items, i, item), exc))
                    continue
                if acts:
                    execute(acts)
                if time.perf_counter() - t0 > slow.threshold:
                    slow.note(*described(item), now, t0)
            # Notes collected over the batch (node.ordering rule 8); receipts once
            # due (node.outbox rule 5: above, when the inbox stays empty).
            acts = core.end_batch(idle=False)
            if acts:
                execute(acts)
            if core.index_wanted:
                self._wake.set()

    def publishes_now(self, sid: int, msgs: list[cm.Publish]) -> int:
        """Rule 6: Publishes of session ``sid`` read while the inbox is empty,
        handled now, in order; how many (the first ones: a slice's worth) —
        the caller queues the rest.  None while a test taps or paces the
        dispatcher (rule 5): those must reach the inbox."""
        if self._tap is not None or self._pace is not None:
            return 0
        core = self._core
        execute = self._execute
        slow = self._slow
        n = len(msgs)
        done = 0
        slice_end = time.perf_counter() + self.slice
        while done < n:
            run = msgs if not done and n <= DISPATCH_BATCH else msgs[done : done + DISPATCH_BATCH]
            done += len(run)
            now = time.time()
            t0 = time.perf_counter()
            try:
                acts = core.handle_publishes(sid, run, now)
            except RemoteProtocolError as exc:  # rule 2, as for a queued run
                log.warning("node %d: protocol error from client %d: %s", core.id, sid, exc)
                continue
            except Exception as exc:  # rule 2: the whole run failed, each of it answered
                log.exception("node %d: failed handling Publish from client %d", core.id, sid)
                execute(_publishes_failed(sid, run, exc))
                continue
            if acts:
                execute(acts)
            t1 = time.perf_counter()
            if t1 - t0 > slow.threshold:
                slow.note("Publish", f"client {sid}", now, t0)
            if t1 >= slice_end:
                break
        self.publishes_inline += done
        self._after_now()
        return done

    def peers_now(self, src: int, msgs: list[pm.PeerMessage]) -> int:
        """Rule 7: the messages of a Batch from peer ``src`` read while the
        inbox is empty, handled now, in order; how many (the first ones: a
        slice's worth) — the caller queues the rest.  None while a test taps
        or paces the dispatcher (rule 5)."""
        if self._tap is not None or self._pace is not None:
            return 0
        core = self._core
        execute = self._execute
        slow = self._slow
        n = len(msgs)
        i = 0
        slice_end = time.perf_counter() + self.slice
        while i < n:
            msg = msgs[i]
            j = i + 1
            now = time.time()
            t0 = time.perf_counter()
            try:
                if type(msg) is _EVENT and j < n and type(msgs[j]) is _EVENT:
                    # Rule 1's run: the Events in a row, at most a batch's worth.
                    stop = min(n, i + DISPATCH_BATCH)
                    while j < stop and type(msgs[j]) is _EVENT:
                        j += 1
                    events: list[pm.Event] = msgs[i:j]  # type: ignore[assignment]  # Events
                    i = j
                    acts = core.handle_peer_events(src, events, now)
                else:
                    i = j
                    acts = core.handle_peer(src, msg, now)
            except RemoteProtocolError as exc:  # rule 2, as for a queued one
                log.warning("node %d: protocol error from peer %d: %s", core.id, src, exc)
                execute([ToPeer(src, pm.PeerError("protocol_error", str(exc)))])
                continue
            except Exception:
                log.exception("node %d: failed handling %s from peer %d", core.id, type(msg).__name__, src)
                continue
            if acts:
                execute(acts)
            t1 = time.perf_counter()
            if t1 - t0 > slow.threshold:
                slow.note(type(msg).__name__, f"peer {src}", now, t0)
            if t1 >= slice_end:
                break
        self.peer_inline += i
        self._after_now()
        return i

    def _after_now(self) -> None:
        """Rules 6 and 7: after messages handled at once, the core's batched
        notes, the indexer, and the receipts timer, as after a batch (rule 1)."""
        core = self._core
        acts = core.end_batch(idle=False)
        if acts:
            self._execute(acts)
        if core.index_wanted:
            self._wake.set()
        if self._receipts_timer is None:
            due = core.receipts_due_in(time.time())
            if due is not None:  # the dispatcher may be waiting on the inbox alone: a timer sends them
                self._receipts_timer = asyncio.get_running_loop().call_later(due, self._receipts_due)

    def _receipts_due(self) -> None:
        """Rule 6: receipts left by Publishes handled at once, now due."""
        self._receipts_timer = None
        if len(self._inbox):  # the dispatcher is busy: it sends them once due (rule 1)
            return
        acts = self._core.end_batch()
        if acts:
            self._execute(acts)

    async def index(self) -> None:
        """Rule 3: the split a session waits on (``node.balancing`` rule 3),
        then what splits, merges and SubscriptionMoves left to index
        (``Channel`` rule 5)."""
        core = self._core
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                t0 = time.perf_counter()
                try:
                    more, acts = core.background_step(INDEX_STEP, time.time())
                except Exception:  # rule 3: the node keeps serving
                    core.ctx.stats["shell_errors"] += 1
                    log.exception(
                        "node %d: background step (%s) failed; the node keeps serving", core.id, core.background_last
                    )
                    break
                if acts:
                    self._execute(acts)
                self._slow.check(core.background_last, f"node {core.id}", time.time(), t0)
                if not more:
                    break
                # A pause, not just a loop turn: a split or a move leaves tens of
                # ms of work, and done at once it takes a core the node's
                # peers need just then (they balance too); events meanwhile are
                # matched exactly, a little slower.
                await asyncio.sleep(INDEX_PAUSE)


M = TypeVar("M")  # a run's message type (rule 1)

# Rule 7's check, as this module's own constant (compiled: a C static, not
# the lookups of ``pm.Event`` on every message).
_EVENT: Final = pm.Event


# Rule 2: the requests answered internal_error when their handling fails (a
# Publish of a run whose handling fails is the core's: handle_publishes
# answers it internal_error on its own; a run that fails whole, here).
_REQUESTS: Final = (cm.Subscribe, cm.Unsubscribe, cm.Admin)


def _internal_error(msg: cm.Subscribe | cm.Unsubscribe | cm.Admin, exc: Exception) -> cm.Error:
    return cm.internal_error(msg.seq, type(msg).__name__, exc)


def _publishes_failed(sid: int, run: list[cm.Publish], exc: Exception) -> list[Action]:
    """Rule 2 for a run of Publishes whose handling failed as a whole (in what
    the core checks once for the run): nothing of it went out, each is answered."""
    return [ToClient(sid, cm.internal_error(m.seq, "Publish", exc)) for m in run]


def _failed_run(items: list[InboxItem], i: int, item: FromClient) -> list[cm.Publish]:
    """The Publishes of the run ``item`` began, the last one ``items[i - 1]``
    (rule 1; ``item`` alone when it was one)."""
    k = i - 1
    while items[k] is not item:
        k -= 1
    return [it.msg for it in items[k:i] if type(it) is FromClient and type(it.msg) is cm.Publish]


def _publish_of(item: InboxItem, sid: int) -> cm.Publish | None:
    """``item``'s Publish if it is one from session ``sid`` (rule 1's runs)."""
    if type(item) is FromClient and item.sid == sid and type(item.msg) is cm.Publish:
        return item.msg
    return None


def _event_of(item: InboxItem, src: int) -> pm.Event | None:
    """``item``'s Event if it is one from peer ``src`` (rule 1's runs)."""
    if type(item) is FromPeer and item.src == src and type(item.msg) is pm.Event:
        return item.msg
    return None


def _run(
    items: list[InboxItem], i: int, first: M, next_of: Callable[[InboxItem, int], M | None], origin: int
) -> tuple[list[M], int]:
    """Rule 1's run: ``first`` and the messages from ``origin`` that follow it
    from ``items[i]`` on, as ``next_of`` tells them; and the index after it."""
    run = [first]
    n = len(items)
    while i < n:
        m = next_of(items[i], origin)
        if m is None:
            break
        run.append(m)
        i += 1
    return run, i


def described(item: InboxItem) -> tuple[str, str]:
    """What an inbox item is and where it came from, for the logs (rule 4)."""
    match item:
        case FromClient(sid=sid, msg=msg):
            return type(msg).__name__, f"client {sid}"
        case FromPeer(src=src, msg=pmsg):
            return type(pmsg).__name__, f"peer {src}"
        case PeerHelloIn(src=src):
            return "PeerHello", f"hello {src}"
        case ClientClosed(sid=sid):
            return "close", f"closed {sid}"
