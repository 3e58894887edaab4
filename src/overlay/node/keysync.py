"""What a key's home sends its backups and the new homes it hands keys to (SPEC §10; ``node.keyhome``).

``Syncs`` is the bookkeeping of ``node.keyhome`` rules 2 and 4 on one node,
per destination node (a *link*): the ops of the current batch, the outputs
(verdicts, releases) that wait for the destination to hold them, and the
syncs already sent whose answer (``KeySynced``) they wait for; and, on the
receiving side, the last sync of each sender to answer.

Rules:

1. Syncs are numbered by the sender, one sequence for all its links; an
   answer ``KeySynced(no)`` covers every sync of that link up to ``no``
   (links are FIFO: the receiver applied them in order).
2. A link's ops go in ``KeySync``s cut below half the frame limit (an
   event is reckoned at its values' and payload's length plus ``OP_BYTES``); what is
   staged waits for the last one's answer.  A key's whole state is one
   ``KeyCopy`` with the events that fit, then one op per further event.
3. ``take(key)`` removes every output of ``key`` waiting on any link, in
   order (a key handed over, a backup changed); ``drop(node)`` ends a link
   (its node died): what waited on it is the caller's to stage again.
4. The state is bounded by what the node sequences: at most one output per
   accepted arrival or completion, each until its answer or its link's end.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Final

import msgspec

from overlay.actions import Action, ToPeer
from overlay.messages import peer as pm
from overlay.seq import KeyState, Release

__all__ = ["OP_BYTES", "Out", "Syncs", "op_size", "ranked_events"]

# Bytes an op is reckoned beyond its event's values (ids, key, ranks, framing).
OP_BYTES: Final = 96

_replace: Final = msgspec.structs.replace

# What waits for a sync: (key, the arrival whose verdict it is, the release).
Out = tuple[str, pm.Event | None, Release | None]


class Link:
    """What goes to one node: this batch's ops and the outputs waiting for
    them, and those waiting for syncs already sent."""

    __slots__ = ("keys", "ops", "staged", "waiting")

    def __init__(self) -> None:
        self.ops: list[pm.KeyOp] = []
        self.staged: list[Out] = []
        self.waiting: deque[tuple[int, list[Out]]] = deque()
        self.keys: Counter[str] = Counter()  # outputs of each key staged or waiting

    def stage(self, item: Out) -> None:
        self.staged.append(item)
        self.keys[item[0]] += 1


def op_size(ev: pm.Event) -> int:
    """About how many bytes ``ev`` takes on the wire (rule 2's cut)."""
    return (
        OP_BYTES
        + len(ev.event_id)
        + len(ev.key)
        + len(ev.payload)
        + sum(len(k) + len(str(v)) + 8 for k, v in ev.event_exp.items())
    )


def ranked_events(st: KeyState) -> list[pm.Event]:
    """``st``'s events by rank, each carrying its rank."""
    return [e if e.rank == r else _replace(e, rank=r) for r, e in sorted(st.events.items())]


class Syncs:
    """Rules 1–4; ``frame`` is the cluster's frame limit."""

    def __init__(self, frame: int) -> None:
        self._cut = frame // 2
        self.links: dict[int, Link] = {}
        self._no = 0
        self._acks: dict[int, int] = {}  # sender -> the last of its syncs applied here

    def link(self, node: int) -> Link:
        link = self.links.get(node)
        if link is None:
            link = self.links[node] = Link()
        return link

    def add_state(self, link: Link, key: str, st: KeyState | None) -> None:
        """Rule 2: ``key``'s whole state as ops on ``link`` (None: the key is forgotten)."""
        if st is None:
            link.ops.append(pm.KeyOp(key, forget=True))
            return
        events = ranked_events(st)
        first: list[pm.Event] = []
        size = OP_BYTES
        for e in events:
            size += op_size(e)
            if size > self._cut and first:
                break
            first.append(e)
        link.ops.append(pm.KeyOp(key, copy=pm.KeyCopy(key, st.seq, st.last_assigned, tuple(first), st.released)))
        link.ops.extend(pm.KeyOp(key, e) for e in events[len(first) :])

    def flush(self, node: int, link: Link, out: list[Action], *, handover: bool = False, last: bool = False) -> None:
        """Rule 2: the link's ops in KeySyncs (at least one); what is staged waits for the last."""
        ops, link.ops = link.ops, []
        chunks: list[list[pm.KeyOp]] = [[]]
        size = 0
        for op in ops:
            if op.copy is not None:
                s = OP_BYTES + sum(op_size(e) for e in op.copy.events)
            else:
                s = op_size(op.event) if op.event is not None else OP_BYTES
            if size + s > self._cut and chunks[-1]:
                chunks.append([])
                size = 0
            chunks[-1].append(op)
            size += s
        for i, chunk in enumerate(chunks):
            self._no += 1
            final = i == len(chunks) - 1
            out.append(ToPeer(node, pm.KeySync(self._no, tuple(chunk), handover, last and final)))
        if link.staged:
            link.waiting.append((self._no, link.staged))
            link.staged = []

    def answered(self, src: int, no: int) -> list[Out]:
        """Rule 1: ``src`` holds every sync up to ``no``: what waited for it."""
        link = self.links.get(src)
        if link is None:
            return []
        done: list[Out] = []
        waiting = link.waiting
        while waiting and waiting[0][0] <= no:
            done.extend(waiting.popleft()[1])
        for item in done:
            link.keys[item[0]] -= 1
        for key in [k for k, n in link.keys.items() if n <= 0]:
            del link.keys[key]
        return done

    def take(self, key: str) -> list[Out]:
        """Rule 3: every output of ``key`` waiting on any link, in order."""
        taken: list[Out] = []
        for link in self.links.values():
            if not link.keys.get(key):
                continue
            for _, outs in link.waiting:
                taken.extend(o for o in outs if o[0] == key)
                outs[:] = [o for o in outs if o[0] != key]
            taken.extend(o for o in link.staged if o[0] == key)
            link.staged = [o for o in link.staged if o[0] != key]
            del link.keys[key]
        return taken

    def drop(self, node: int) -> list[Out]:
        """Rule 3: ``node``'s link ends; what waited on it, in order."""
        link = self.links.pop(node, None)
        if link is None:
            return []
        return [o for _, w in link.waiting for o in w] + link.staged

    def applied(self, src: int, no: int) -> None:
        """The receiving side: sync ``no`` of ``src`` is applied (answered by ``end_batch``)."""
        self._acks[src] = max(no, self._acks.get(src, 0))

    def end_batch(self, out: list[Action]) -> None:
        for node, link in self.links.items():
            if link.ops or link.staged:
                self.flush(node, link, out)
        if self._acks:
            out.extend(ToPeer(node, pm.KeySynced(no)) for node, no in self._acks.items())
            self._acks.clear()

    def waiting(self) -> int:
        return sum(sum(link.keys.values()) for link in self.links.values())
