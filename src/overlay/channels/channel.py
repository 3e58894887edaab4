"""A channel ``ch = <Es, S>``: its space, its subscriptions, and per-slice load records.

Rules this module keeps (SPEC §2.3, §5, §8.3):

1. A channel id ``(node, seq)`` is unique in the cluster: the creating node
   numbers its channels.
2. ``match`` is the only way an event is matched on a channel; it records the
   event's cost (subscriptions tested by the real matcher) in the current
   slice, with the event's access node (for f4).
3. Slice records are aggregated per distinct point of the distinguishing
   attributes and kept sorted by the DA priority of §8.3 (numeric, rfid,
   string; ties by popularity).  At most ``MAX_RECORDS`` points are kept: past
   that, a new point's cost is added to the kept point just above it (or the
   last one), a neighbour in priority order, so the
   slice load stays exact and memory stays bounded.
4. For each string DA whose constraint is type 2, the channel remembers values
   seen (the spec's ``valSet2``), bounded by ``MAX_SEEN``.
5. Bulk changes are indexed in the background.  Indexing a subscription costs
   tens of microseconds, so a split or an arriving SubscriptionMove of
   thousands would stall the node's loop for as long, and every event behind
   it with it.  ``add_deferred`` stores subscriptions at once as *pending*:
   they are members (counted, iterated, moved, matched) and every event tests
   each of them exactly, linearly (counted in the cost like any candidate)
   until ``index_step`` has moved them into the index a batch at a time
   (a bulk build: ``SubscriptionIndex.add_many``).  A
   child that adopts its parent's index marks the subscriptions it does not
   keep *stale*: no longer members, dropped from the index by ``index_step``;
   until then they may be candidates (and counted) but are never returned — a
   stale subscription does not overlap the channel, so no event of the
   channel matches it anyway.
6. When a subscription is indexed, its plain bound on each numeric DA
   attribute (``channels.bounds``) is kept by id, in a map a split's children
   share with their parent: a split reads the cut attribute's bounds instead
   of working them out while its node waits.  A bound is a pure function of
   the filter, and an id names one filter, so an entry is never wrong, only
   possibly unused; the map is cleared when unused entries pile up.
7. ``watch`` starts a log of membership changes (a subscription added, an id
   removed), in order, until ``unwatch`` returns it: a split worked out in
   steps while the channel keeps serving (``balance.split_job``) replays
   what changed meanwhile.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Final

from sortedcontainers import SortedDict

from overlay.channels.bounds import Bound, bound_of
from overlay.channels.matcher import DEFAULT_BUCKETS, MatchResult, SubscriptionIndex
from overlay.channels.records import ChannelId, EventRecord
from overlay.channels.schema import Kind, Schema, Value
from overlay.channels.space import EventSpace, ExceptConstraint
from overlay.channels.subscriptions import Subscription

# An exact test of one subscription: ``test(values)`` is whether the event matches.
Test = Callable[[Mapping[str, Value]], bool]

__all__ = ["MAX_RECORDS", "MAX_SEEN", "Channel", "ChannelId", "EventRecord", "SliceStats"]

# Distinct DA points recorded per slice; enough to cut a channel finely while
# bounding the memory a flood of unique values can take.
# Not Final: tests lower it, and the compiled build would inline a Final.
MAX_RECORDS = 4096
# Distinct values remembered per type-2 string attribute.
# Not Final: tests lower it, and the compiled build would inline a Final.
MAX_SEEN = 4096


class _Unknown(enum.Enum):
    """A bound not worked out yet (None is a known answer: no plain bound)."""

    UNKNOWN = enum.auto()


_UNKNOWN: Final = _Unknown.UNKNOWN


class SliceStats:
    """What one time slice of a channel recorded. Invariant: ``load`` is the sum of
    the records' costs and ``events`` the sum of their counts."""

    __slots__ = ("_records", "access", "events", "load", "priority")

    def __init__(self, priority: tuple[str, ...]) -> None:
        self.priority = priority
        self.load = 0
        self.events = 0
        self._records: SortedDict = SortedDict()
        self.access: dict[int, int] = {}

    def add(self, point: tuple[Value, ...], cost: int, access_node: int) -> None:
        self.load += cost
        self.events += 1
        self.access[access_node] = self.access.get(access_node, 0) + 1
        recs = self._records
        rec = recs.get(point)
        if rec is None:
            if len(recs) >= MAX_RECORDS:
                point = _nearest(recs, point)
                rec = recs[point]
            else:
                recs[point] = [cost, 1]
                return
        rec[0] += cost
        rec[1] += 1

    def records(self) -> list[EventRecord]:
        """The records in DA-priority order (rule 3)."""
        recs = self._records
        # Iterating keys and indexing is C-level; SortedDict.items() is not.
        return [EventRecord(p, *recs[p]) for p in recs]

    def points_costs(self) -> tuple[list[tuple[Value, ...]], list[int]]:
        """The records' points and costs, in DA-priority order (rule 3)."""
        recs = self._records
        points = list(recs.keys())
        return points, [recs[p][0] for p in points]

    def reordered(self, priority: tuple[str, ...], old: tuple[str, ...]) -> None:
        """Re-key the records for a new DA priority order."""
        if priority == old:
            return
        perm = [old.index(n) for n in priority]
        items = list(self._records.items())
        self._records = SortedDict()
        for p, r in items:
            key = tuple(p[i] for i in perm)
            rec = self._records.setdefault(key, [0, 0])
            rec[0] += r[0]
            rec[1] += r[1]
        self.priority = priority

    def access_rate(self, node: int) -> float:
        """``acc_rate = n_ikj / n_ik`` (SPEC §7, f4)."""
        return self.access.get(node, 0) / self.events if self.events else 0.0


def _nearest(recs: SortedDict, point: tuple[Value, ...]) -> tuple[Value, ...]:
    i = recs.bisect_left(point)
    keys = recs.keys()
    key: tuple[Value, ...] = keys[i] if i < len(keys) else keys[i - 1]
    return key


def _test_of(
    index: SubscriptionIndex, pending: dict[str, tuple[Subscription, Test | None]], sub_id: str
) -> Test | None:
    """``Channel.tests_lookup``'s answer for one subscription."""
    entry = pending.get(sub_id)
    return entry[1] if entry is not None else index.compiled(sub_id)


class Channel:
    """``ch = <Es, S>`` with its matcher and slice statistics.

    Invariant: every stored subscription belongs to ``space`` (covers or
    overlaps it) — callers route by the routing table, which guarantees it.
    """

    def __init__(
        self,
        id: ChannelId,
        space: EventSpace,
        schema: Schema,
        *,
        nbuckets: int = DEFAULT_BUCKETS,
    ) -> None:
        self.id = id
        self.space = space
        self.schema = schema
        self.index = SubscriptionIndex(schema, nbuckets)
        # Rule 5: members not indexed yet (with their exact test once compiled),
        # and indexed non-members waiting to be dropped.
        self._pending: dict[str, tuple[Subscription, Test | None]] = {}
        # An ordered set (keys): the order stale ids leave the index decides which
        # slots later subscriptions take, so it must not follow string hashes.
        self._stale: dict[str, None] = {}
        self._da_count: dict[str, int] = dict.fromkeys(schema.da, 0)
        # Each subscription's plain bound on the numeric DA attributes, by id
        # (rule 6): shared with the channel's split children (an id names one
        # filter everywhere), so a split reads what indexing already computed.
        self._numeric_da = tuple(n for n in schema.da if schema.attributes[n].kind is not Kind.STRING)
        self._bounds: dict[str, dict[str, Bound | None]] = {n: {} for n in self._numeric_da}
        self._changes: list[tuple[bool, Subscription | str]] | None = None  # rule 7
        self.priority = schema.da_priority()
        self.current = SliceStats(self.priority)
        self.last: SliceStats = SliceStats(self.priority)
        # Strings once the events are checked (Schema.check_event_values);
        # match records whatever value an event brings.
        self.seen: dict[str, set[Value]] = {}
        self._type2 = tuple(
            c.attr
            for c in space.constraints
            if isinstance(c, ExceptConstraint) and schema.attributes[c.attr].kind is Kind.STRING
        )

    def __repr__(self) -> str:
        return f"Channel({self.id}, {self.space.text(self.schema)}, {len(self)} subs)"

    # -- subscriptions --------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.index) - len(self._stale) + len(self._pending)

    def __contains__(self, sub_id: str) -> bool:
        if sub_id in self._pending:
            return True
        return sub_id in self.index and sub_id not in self._stale

    def __iter__(self) -> Iterator[Subscription]:
        stale = self._stale
        for sub in self.index:
            if sub.id not in stale:
                yield sub
        for sub, _test in list(self._pending.values()):
            yield sub

    def get(self, sub_id: str) -> Subscription | None:
        entry = self._pending.get(sub_id)
        if entry is not None:
            return entry[0]
        return None if sub_id in self._stale else self.index.get(sub_id)

    def _count(self, sub: Subscription, delta: int) -> None:
        for name in sub.filter.attrs():
            if name in self._da_count:
                self._da_count[name] += delta

    def add(self, sub: Subscription) -> bool:
        """Store and index ``sub``; False when it was already here (idempotent)."""
        if sub.id in self._stale:  # back before its drop: still indexed
            del self._stale[sub.id]
        elif sub.id in self._pending or not self.index.add(sub):
            return False
        self._count(sub, +1)
        self._remember_bounds(sub)
        if self._changes is not None:
            self._changes.append((True, sub))
        return True

    def _remember_bounds(self, sub: Subscription) -> None:
        attrs = self.schema.attributes
        for name in self._numeric_da:
            known = self._bounds[name]
            if len(known) > 4 * len(self) + 1024:  # ids gone elsewhere pile up in a shared map
                known.clear()
            known[sub.id] = bound_of(sub.filter.predicates, name, attrs[name])

    def bound(self, name: str, sub: Subscription) -> Bound | None:
        """``sub``'s plain bound on the attribute ``name`` (rule 6), from
        memory when indexing already worked it out (numeric DA attributes)."""
        known = self._bounds.get(name)
        b = known.get(sub.id, _UNKNOWN) if known is not None else _UNKNOWN
        if b is _UNKNOWN:
            b = bound_of(sub.filter.predicates, name, self.schema.attributes[name])
            if known is not None:
                known[sub.id] = b
        return b

    def share_bounds(self, parent: Channel) -> None:
        """Use ``parent``'s bounds (a split child: the same subscriptions)."""
        self._bounds = parent._bounds

    def add_deferred(self, subs: Iterable[Subscription], tests: Callable[[str], Test | None] | None = None) -> int:
        """Store ``subs`` now and index them later (rule 5); how many were new.
        ``tests`` gives an exact test already built for a subscription, if any
        (``tests_lookup`` of the channel it comes from)."""
        added = 0
        pending = self._pending
        for sub in subs:
            if sub.id in pending or (sub.id in self.index and sub.id not in self._stale):
                continue
            if sub.id in self._stale:
                del self._stale[sub.id]
            else:
                pending[sub.id] = (sub, tests(sub.id) if tests is not None else None)
            self._count(sub, +1)
            if self._changes is not None:
                self._changes.append((True, sub))
            added += 1
        return added

    def tests_lookup(self) -> Callable[[str], Test | None]:
        """The exact tests this channel holds now, by subscription id: for
        ``add_deferred`` elsewhere (they stay valid after an ``adopt_index``)."""
        # A partial, not a closure: mypyc 2.4.1 cannot compile a closure in a
        # method of a plain class (overlay.build rule 5).
        return functools.partial(_test_of, self.index, self._pending)

    def adopt_index(self, parent: Channel, keep: set[str]) -> None:
        """Take over ``parent``'s index (the parent must be discarded after);
        the subscriptions not in ``keep`` turn stale (rule 5): O(dropped) set
        inserts now, their removal from the index later."""
        drop = dict.fromkeys(sub.id for sub in parent.index if sub.id not in keep)  # ordered: see _stale
        drop.update(dict.fromkeys(sid for sid in parent._pending if sid not in keep))
        self.adopt_index_dropping(parent, drop)

    def adopt_index_dropping(self, parent: Channel, drop: Collection[str]) -> None:
        """``adopt_index`` told what leaves instead of what stays: no pass
        over the whole index (a split prepared in steps knows it already)."""
        self.index = parent.index
        self._stale = dict(parent._stale)
        self._pending = {}
        self._da_count = dict(parent._da_count)
        for sid, entry in parent._pending.items():
            if sid not in drop:
                self._pending[sid] = entry
            else:
                self._count(entry[0], -1)
        parent.index = SubscriptionIndex(parent.schema)  # the parent no longer shares it
        parent._pending, parent._stale = {}, {}
        parent._da_count = dict.fromkeys(parent._da_count, 0)
        stale, index = self._stale, self.index
        for sid in drop:
            if sid not in stale:
                sub = index.get(sid)
                if sub is not None:
                    stale[sid] = None
                    self._count(sub, -1)

    def remove(self, sub_id: str) -> Subscription | None:
        entry = self._pending.pop(sub_id, None)
        if entry is not None:
            sub = entry[0]
        elif sub_id in self._stale:
            del self._stale[sub_id]
            self.index.remove(sub_id)
            return None
        else:
            indexed = self.index.remove(sub_id)
            if indexed is None:
                return None
            sub = indexed
        self._count(sub, -1)
        if self._changes is not None:
            self._changes.append((False, sub_id))
        return sub

    def members(self) -> list[Subscription]:
        """The subscriptions now, as a list (``iter`` is lazy and must not
        outlive a change)."""
        stale = self._stale
        subs = (
            [s for s in self.index._subs if s is not None and s.id not in stale]
            if stale
            else [s for s in self.index._subs if s is not None]
        )
        subs += [entry[0] for entry in self._pending.values()]
        return subs

    def watch(self) -> None:
        """Rule 7: log membership changes from now on."""
        self._changes = []

    def unwatch(self) -> list[tuple[bool, Subscription | str]]:
        """Rule 7: stop logging; the changes since ``watch``, in order:
        ``(True, subscription)`` added, ``(False, id)`` removed."""
        changes, self._changes = self._changes or [], None
        return changes

    @property
    def unindexed(self) -> int:
        """Background work left (rule 5): pending plus stale subscriptions."""
        return len(self._pending) + len(self._stale)

    @property
    def pending(self) -> int:
        """Members not indexed yet (rule 5)."""
        return len(self._pending)

    @property
    def stale(self) -> int:
        """Non-members still in the index (rule 5)."""
        return len(self._stale)

    def index_step(self, limit: int, *, drop_stale: bool = True) -> int:
        """Index up to ``limit`` pending subscriptions, then (with
        ``drop_stale``) drop stale ones from the index, ``limit`` in all
        (rule 5); the work left after."""
        index = self.index
        stale = self._stale
        pending = self._pending
        # Pending first: each one indexed makes every later event cheaper; a
        # stale one is rarely even a candidate (it lies outside the space).
        # The pending ones in one bulk build (SubscriptionIndex rule 9).
        batch = [pending.popitem()[1][0] for _ in range(min(limit, len(pending)))]  # LIFO: O(1)
        try:
            index.add_many(batch)
        except BaseException:
            # Whatever the index did not take stays pending: still a member.
            for sub in batch:
                if sub.id not in index:
                    pending[sub.id] = (sub, None)
            raise
        for sub in batch:
            self._remember_bounds(sub)
        for _ in range(limit - len(batch)):
            if stale and drop_stale:
                index.remove(stale.popitem()[0])
            else:
                break
        return len(stale) + len(pending)

    def popularity(self) -> dict[str, float]:
        """``pop(attr) = |subs constraining attr| / |subs|`` over the DA (SPEC §8.3)."""
        n = len(self)
        return {a: (c / n if n else 0.0) for a, c in self._da_count.items()}

    # -- matching and load ---------------------------------------------------------

    def match(self, values: Mapping[str, Value], access_node: int) -> MatchResult:
        """Rule 2."""
        result = self.index.match(values)
        if self._pending or self._stale:
            result = self._match_unindexed(values, result)
        priority = self.priority
        # The event's DA point; one attribute's without a generator (per event).
        point = (values[priority[0]],) if len(priority) == 1 else tuple([values[n] for n in priority])
        self.current.add(point, result[1], access_node)
        for name in self._type2:
            seen = self.seen.get(name)
            if seen is None:
                seen = self.seen[name] = set()
            if len(seen) < MAX_SEEN:
                seen.add(values[name])
        return result

    def match_isolating(self, values: Mapping[str, Value], access_node: int) -> tuple[MatchResult, list[Subscription]]:
        """Rule 2, one member at a time, each test on its own: the matches and
        cost ``match`` would give, and the members whose test raised.  The
        fallback when ``match`` raised: one subscription that cannot be tested
        must not cost every other member its notification (SPEC §16)."""
        matched: list[Subscription] = []
        failed: list[Subscription] = []
        members = list(self)
        for sub in members:
            try:
                if sub.filter.matches(values):
                    matched.append(sub)
            except Exception:  # noqa: BLE001 — whatever one filter raises is that filter's fault
                failed.append(sub)
        try:
            point = tuple(values[n] for n in self.priority)
            self.current.add(point, len(members), access_node)
        except Exception:  # noqa: BLE001 — the load record is best effort here
            pass
        return (matched, len(members)), failed

    def _match_unindexed(self, values: Mapping[str, Value], result: MatchResult) -> MatchResult:
        matched, tested = result
        if self._stale:
            stale = self._stale
            matched = [s for s in matched if s.id not in stale]
        pending = self._pending
        for sid, (sub, test) in pending.items():
            if test is None:
                # Interpreted, not compiled: compiling every pending filter at
                # the first event after a split or a move held that event up
                # (≈ 10 µs each); these are indexed within milliseconds anyway.
                test = sub.filter.matches
                pending[sid] = (sub, test)  # replacing a value keeps the dict's size: iteration is safe
            if test(values):
                matched.append(sub)
        return matched, tested + len(pending)

    @property
    def load(self) -> int:
        """``LD(ch)`` of the slice in progress."""
        return self.current.load

    def roll_slice(self) -> SliceStats:
        """Close the slice: it becomes ``last``; a new one starts with the DA
        priority recomputed from the current popularity."""
        done = self.current
        self.last = done
        self.priority = self.schema.da_priority(self.popularity())
        self.current = SliceStats(self.priority)
        return done

    def summary(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "space": self.space.text(self.schema),
            "subscriptions": len(self),
            "load": self.current.load,
            "last_load": self.last.load,
        }
