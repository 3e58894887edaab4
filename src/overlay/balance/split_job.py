"""A split worked out in steps while the channel keeps serving (SPEC §8.3, §8.1 step 5).

A split of a hot channel reads its slice records and every subscription; done
in one go it held the node's loop for 2–8 ms on the benchmark's hot channel
(measured), and every event reaching the node waited behind it.  ``SplitJob``
does the same work a bounded step at a time, between the node's message
batches, and ends with a commit whose cost does not grow with the channel.

Rules this module keeps:

1. The parent stays *the* channel until ``commit``: events are matched on it
   and (un)subscriptions change it; it logs its membership changes from the
   job's start (``Channel`` rule 7).
2. Each step is bounded: ``RECORDS_PER_STEP`` slice records or
   ``SUBS_PER_STEP`` subscriptions.  In order: the cut from the last slice's
   records (skipped when the cut is given); the parent's subscriptions sorted
   into the children (``split.sorter``); the smaller child's share stored
   deferred (``Channel`` rule 5); the last slice's records divided.
3. A last slice whose records all lie on one point cannot be cut: the job
   ends with ``replicate`` set and no children (§8.3 degenerate case).
4. ``commit`` replays the logged changes onto the children; the larger child
   adopts the parent's index, dropping only what went solely to the other;
   the slice in progress is divided.  Its cost is O(changes + dropped +
   records of the slice in progress), not O(subscriptions).  If the parent
   closed a slice meanwhile, the new last slice is divided then too.
5. ``cancel`` leaves the parent exactly as it was (only its log stops).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Final

from sortedcontainers import SortedDict

from overlay.balance.split import Cut, choose_points, sorter
from overlay.channels.channel import Channel, ChannelId, SliceStats
from overlay.channels.schema import Schema, Value, as_number
from overlay.channels.space import Constraint, RangeConstraint
from overlay.channels.subscriptions import Subscription
from overlay.errors import LocalProtocolError

__all__ = ["RECORDS_PER_STEP", "SUBS_PER_STEP", "SplitJob", "divide_records"]

# ≈ 0.1 ms of reading records, ≈ 0.2 ms of sorting subscriptions per step
# (a bound test each, ≈ 1.5 µs), on the benchmark machine.
RECORDS_PER_STEP: Final = 1000
SUBS_PER_STEP: Final = 128

_COST, _COUNT = itemgetter(0), itemgetter(1)  # of a record's [cost, count]


class SplitJob:
    """Split ``parent`` in two (children ``ids``) at ``cut``, or at the cut that
    takes ``delta_ld`` off its last slice.  ``step()`` until it returns True,
    then ``commit()`` (or ``cancel()`` at any time)."""

    def __init__(
        self,
        parent: Channel,
        ids: tuple[ChannelId, ChannelId],
        schema: Schema,
        *,
        delta_ld: float = 0.0,
        cut: Cut | None = None,
        records_per_step: int = RECORDS_PER_STEP,
        subs_per_step: int = SUBS_PER_STEP,
    ) -> None:
        self.parent = parent
        self.ids = ids
        self.schema = schema
        self.delta_ld = delta_ld
        self.cut = cut
        self._records_per_step = max(1, records_per_step)
        self._subs_per_step = max(1, subs_per_step)
        self.replicate = False
        self.done = False
        self.steps = 0
        self.replayed = 0  # membership changes the commit replayed (rule 4)
        self._last = parent.last
        self._keys = parent.last._records.keys()
        self._points: list[tuple[Value, ...]] = []
        self._costs: list[int] = []
        self._subs: list[Subscription] = []
        self._at = 0
        self._belongs: Callable[[Subscription], int] | None = None
        # Ids that go to one child alone; ordered sets (keys), so the adopting
        # child drops them in an order that does not follow string hashes.
        self._only: tuple[dict[str, None], dict[str, None]] = ({}, {})
        self._shares: tuple[list[Subscription], list[Subscription]] = ([], [])
        self.children: list[Channel] = []
        self._adopt = 0
        self._stage: Callable[[], None] = self._read_records if cut is None else self._start_sorting
        parent.watch()

    # -- steps (rule 2) --------------------------------------------------------------------

    def step(self) -> bool:
        """One bounded step; True when the job is ready to commit."""
        if not self.done:
            self.steps += 1
            self._stage()
        return self.done

    def run(self) -> None:
        """Every step at once (a split nobody waits on, e.g. an operator's)."""
        while not self.step():
            pass

    def _read_records(self) -> None:
        keys, recs = self._keys, self._last._records
        part = keys[len(self._points) : len(self._points) + self._records_per_step]
        self._points += part
        self._costs += [recs[p][0] for p in part]
        if len(self._points) >= len(keys):
            self._stage = self._choose

    def _choose(self) -> None:
        space, last = self.parent.space, self._last
        self.cut = choose_points(space, self._points, self._costs, last.priority, self.delta_ld, self.schema)
        self._points, self._costs = [], []
        if self.cut is None:  # rule 3
            self.replicate = True
            self.done = True
            self.parent.unwatch()
            return
        self._stage = self._start_sorting

    def _start_sorting(self) -> None:
        cut = self.cut
        assert cut is not None
        self.children = [Channel(chid, space, self.schema) for chid, space in zip(self.ids, (cut.low, cut.high))]
        self._belongs = sorter(self.parent, (cut.low, cut.high))
        self._subs = self.parent.members()
        self._at = 0
        self._stage = self._sort

    def _sort(self) -> None:
        belongs = self._belongs
        assert belongs is not None
        shares, only = self._shares, self._only
        end = min(self._at + self._subs_per_step, len(self._subs))
        for sub in self._subs[self._at : end]:
            mask = belongs(sub)
            if mask & 1:
                shares[0].append(sub)
            if mask & 2:
                shares[1].append(sub)
            if mask != 3:  # one child alone (or, never expected, neither: both drop it)
                if not mask & 1:
                    only[1][sub.id] = None
                if not mask & 2:
                    only[0][sub.id] = None
        self._at = end
        if end == len(self._subs):
            self._subs = []
            self._adopt = 0 if len(shares[0]) >= len(shares[1]) else 1
            self._at = 0
            self._stage = self._fill

    def _fill(self) -> None:
        """The smaller child's share, stored deferred with the parent's tests."""
        share = self._shares[1 - self._adopt]
        end = min(self._at + self._subs_per_step, len(share))
        self.children[1 - self._adopt].add_deferred(share[self._at : end], self.parent.tests_lookup())
        self._at = end
        if end == len(share):
            self._shares = ([], [])
            self._at = 0
            self._stage = self._divide_last

    def _divide_last(self) -> None:
        """The last slice's records, a child per step (rule 2)."""
        assert self.cut is not None
        k = self._at
        constraints = [c.space.constraint(self.cut.attr) for c in self.children]
        divide_records(self._last, [c.last for c in self.children], constraints, self.cut.attr, only=k)
        self._at += 1
        if self._at == len(self.children):
            self.done = True

    # -- the end (rules 4, 5) ----------------------------------------------------------------

    def cancel(self) -> None:
        if not self.replicate:  # a replicating job stopped watching already
            self.parent.unwatch()
        self.done = True
        self.children = []

    def commit(self) -> list[Channel]:
        """Rule 4: the two children, ready to replace the parent (which must be
        discarded after: the larger child took its index)."""
        if not self.done or self.replicate or not self.children:
            raise LocalProtocolError(f"split of {self.parent.id} is not ready to commit")
        parent, cut, children = self.parent, self.cut, self.children
        assert cut is not None and self._belongs is not None
        adopt, other = children[self._adopt], children[1 - self._adopt]
        drop = self._only[1 - self._adopt]  # ids in the parent's index the adopting child must drop
        tests = parent.tests_lookup()
        changes = parent.unwatch()
        self.replayed = len(changes)
        for _added, item in changes:
            if isinstance(item, Subscription):  # added; an id: removed
                sub = item
                mask = self._belongs(sub)
                if mask >> (1 - self._adopt) & 1:
                    other.add_deferred([sub], tests)
                if mask >> self._adopt & 1:
                    drop.pop(sub.id, None)
                else:
                    drop[sub.id] = None
            else:
                sid = item
                other.remove(sid)
                drop.pop(sid, None)
        for child in children:
            child.share_bounds(parent)
        adopt.adopt_index_dropping(parent, drop)
        constraints = [c.space.constraint(cut.attr) for c in children]
        if parent.last is not self._last:  # the parent closed a slice meanwhile
            for child in children:
                child.last = SliceStats(parent.last.priority)
            divide_records(parent.last, [c.last for c in children], constraints, cut.attr)
        for child in children:
            child.priority = parent.priority  # the order the slice in progress keys its records by
            child.current = SliceStats(parent.current.priority)
        divide_records(parent.current, [c.current for c in children], constraints, cut.attr)
        self.children = []
        return children


def divide_records(
    src: SliceStats,
    dsts: Sequence[SliceStats],
    constraints: Sequence[Constraint],
    attr: str,
    *,
    only: int | None = None,
) -> None:
    """Give each child's slice the records of ``src`` that fall in its space
    (``constraints``: each child's constraint on the cut attribute ``attr``,
    the only one on which they differ); with ``only``, to that child alone.
    The record lists move over as they are: the parent is discarded.  Access
    counts split in proportion to events (the records do not keep them)."""
    pos = src.priority.index(attr)
    recs = src._records
    low = constraints[0]
    keys = recs.keys()
    if pos == 0 and len(dsts) == 2 and isinstance(low, RangeConstraint):
        # Records sort by the cut attribute first: the low child's are a
        # prefix, found by bisection.
        hi, hi_open = low.interval.hi, low.interval.hi_open
        a, b = 0, len(keys)
        while a < b:
            mid = (a + b) // 2
            v = as_number(keys[mid][0])  # a range constraint's attribute: numbers
            if v < hi or (v == hi and not hi_open):
                a = mid + 1
            else:
                b = mid
        parts: list[list[tuple[Value, ...]]] = [keys[:a] if only != 1 else [], keys[a:] if only != 0 else []]
    else:
        parts = [[] for _ in dsts]
        for point in keys:
            v = point[pos]
            for k, constraint in enumerate(constraints):
                if constraint.contains_value(v):
                    parts[k].append(point)
                    break
    total = src.events or 1
    for k, (st, part) in enumerate(zip(dsts, parts)):
        if only is not None and k != only:
            continue
        st.priority = src.priority
        values = list(map(recs.__getitem__, part))
        st.load += sum(map(_COST, values))
        st.events += sum(map(_COUNT, values))
        if st._records:
            st._records.update(zip(part, values))
        else:
            st._records = SortedDict(zip(part, values))
        share = st.events / total
        st.access = {n: round(cnt * share) for n, cnt in src.access.items()}
