"""Splitting a channel (SPEC §8.3): where to cut, and the cut itself.

Rules this module keeps:

1. Records ``<e_i, num_i>`` are sorted by the DA values in priority order
   (numeric, rfid, string; ties by popularity).  The cut-off part is a prefix
   of that order whose cost is closest to ``ΔLD``: the shortest prefix
   reaching ``ΔLD``, or the one before it when that is closer.
2. Attributes on which every record of the slice has the same value cannot
   separate anything; the cut is made on the first attribute (in priority
   order) on which the records differ, at a boundary between groups of equal
   values on it.  When the records differ already on the first DA this is
   exactly the spec's rule (``e_k`` and ``e_{k+1}`` differ on ``DA_1``): the
   worked example cuts ``a`` after 20.
3. Ordered attributes are cut after the last value of the prefix
   (``[lo, v]`` / ``[v+1, hi]`` for integers, ``(v, hi]`` for floats); string
   attributes move the prefix's values (``strSet``) into a type-1 child.
4. All records on one point: no cut is possible and the channel must be
   replicated instead (``choose_cut`` returns None).
5. ``divide`` builds the children and hands each subscription to every child
   it belongs to (covers or overlaps — some go to both).  The parent's
   subscriptions all belong to it, so only the attributes a child changed are
   tested, and plain numeric comparisons against an interval without building
   interval sets.  When the parent is consumed, the child keeping the most
   subscriptions adopts its index and the other indexes its share in the
   background (``Channel`` rule 5): the split itself costs O(subscriptions)
   comparisons, not O(subscriptions) index insertions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate

import msgspec

from overlay.channels.bounds import bound_of, bound_overlaps
from overlay.channels.channel import Channel, ChannelId, EventRecord, SliceStats
from overlay.channels.intervals import Interval
from overlay.channels.predicates import conjunction
from overlay.channels.schema import Kind, Schema, Value, as_number, as_string
from overlay.channels.space import Constraint, EventSpace, RangeConstraint
from overlay.channels.subscriptions import Subscription
from overlay.errors import LocalProtocolError

__all__ = ["Cut", "choose_cut", "choose_points", "cut_slice", "divide", "sorter"]


class Cut(msgspec.Struct, frozen=True):
    """A planned split: ``low`` carries ``low_load`` (≈ ΔLD), ``high`` the rest."""

    attr: str
    low: EventSpace
    high: EventSpace
    low_load: int
    high_load: int


def choose_cut(
    space: EventSpace,
    records: Sequence[EventRecord],
    priority: Sequence[str],
    delta_ld: float,
    schema: Schema,
) -> Cut | None:
    """Rules 1–4. ``records`` must be sorted by ``priority``."""
    return choose_points(space, [r.point for r in records], [r.cost for r in records], priority, delta_ld, schema)


def cut_slice(space: EventSpace, stats: SliceStats, delta_ld: float, schema: Schema) -> Cut | None:
    """``choose_cut`` on a slice's records as they are stored: no record
    objects built (the split of a hot channel runs while its node waits)."""
    points, costs = stats.points_costs()
    return choose_points(space, points, costs, stats.priority, delta_ld, schema)


def choose_points(
    space: EventSpace,
    points: Sequence[tuple[Value, ...]],
    costs: Sequence[int],
    priority: Sequence[str],
    delta_ld: float,
    schema: Schema,
) -> Cut | None:
    """Rules 1–4 on the records' points (sorted by ``priority``) and costs."""
    n = len(points)
    if n < 2:
        return None
    # Rule 2: the first attribute on which the records differ.  Sorted
    # lexicographically, they differ on the first one iff the ends do.
    first = points[0]
    if first[0] != points[-1][0]:
        pos: int | None = 0
    else:
        pos = next((i for i in range(1, len(priority)) if any(p[i] != first[i] for p in points)), None)
    if pos is None:
        return None
    name = priority[pos]
    # Records are lexicographic and constant before `pos`, so sorted by `pos`:
    # a cut goes after the last record of a group of equal values on it, at
    # the group end whose cumulative cost is closest to ΔLD — the first
    # reaching it, or the one before when that is closer; never after the
    # last group (that cuts nothing off).
    cum = list(accumulate(costs))
    total = cum[-1]

    def group_end(i: int) -> int:
        v = points[i][pos]
        while i + 1 < n and points[i + 1][pos] == v:
            i += 1
        return i

    def group_start(i: int) -> int:
        v = points[i][pos]
        while i > 0 and points[i - 1][pos] == v:
            i -= 1
        return i

    end = group_end(min(bisect_left(cum, delta_ld), n - 1))
    if end == n - 1:  # ΔLD falls in the last group: cut before it
        end = group_start(n - 1) - 1
    start = group_start(end)
    if start > 0 and abs(cum[start - 1] - delta_ld) < abs(cum[end] - delta_ld):
        end = start - 1
    value, low_load = points[end][pos], cum[end]
    attr = schema.attributes[name]
    # The points are checked events' values: strings of a string attribute,
    # numbers of an ordered one.
    if attr.kind is Kind.STRING:
        str_set = {as_string(p[pos]) for p in points[: end + 1]}
        low, high = space.take_strings(name, str_set)
    else:
        low, high = space.cut(attr, as_number(value))
    return Cut(name, low, high, low_load, total - low_load)


def divide(parent: Channel, parts: Sequence[tuple[ChannelId, EventSpace]], *, consume: bool = False) -> list[Channel]:
    """Rule 5.

    With ``consume`` the parent is being discarded: the child that keeps the
    most subscriptions adopts the parent's index (an index does not depend on
    the space) and only drops what left, so a split of a hot channel rebuilds
    the smaller side only — the node stalls for less while traffic flows.
    """
    if len(parts) < 2:
        raise LocalProtocolError("a split needs at least two children")
    schema = parent.schema
    children = [Channel(chid, space, schema) for chid, space in parts]
    belongs = sorter(parent, [space for _chid, space in parts])
    members: list[list[Subscription]] = [[] for _ in children]
    for sub in parent:
        mask = belongs(sub)
        for k in range(len(children)):
            if mask >> k & 1:
                members[k].append(sub)
    adopt = max(range(len(children)), key=lambda k: len(members[k])) if consume else -1
    tests = parent.tests_lookup()  # the parent's built tests serve the deferred side
    for k, child in enumerate(children):
        child.share_bounds(parent)
        if k == adopt:
            child.adopt_index(parent, {s.id for s in members[k]})
        elif consume:
            child.add_deferred(members[k], tests)  # indexed in the background (Channel rule 5)
        else:
            for sub in members[k]:
                child.add(sub)
    return children


def sorter(parent: Channel, spaces: Sequence[EventSpace]) -> Callable[[Subscription], int]:
    """A test giving, for a subscription of ``parent``, the bit mask of the
    children (by position in ``spaces``) it belongs to (rule 5)."""
    schema = parent.schema
    # A stored subscription belongs to the parent, so it overlaps it on every
    # attribute; a child differs from the parent on the cut attribute(s) only,
    # and only those are tested — the full test costs a conjunction per
    # attribute per child, and a split stalls the node for as long as it takes.
    changed = [[c for c, p in zip(space.constraints, parent.space.constraints) if c != p] for space in spaces]
    ranges = _one_range_each(changed)
    if ranges is not None:
        # The usual split (a numeric or rfid cut): one attribute, an interval
        # per child.  A subscription's bound on it is read once, not per child.
        name, intervals = ranges
        discrete = schema.attributes[name].kind.discrete
        bound_in = parent.bound
        numbered = list(enumerate(intervals))

        def by_range(sub: Subscription) -> int:
            bound = bound_in(name, sub)
            mask = 0
            for k, iv in numbered:
                if bound_overlaps(bound, iv, discrete) if bound is not None else _overlaps(changed[k][0], sub, schema):
                    mask |= 1 << k
            return mask

        return by_range

    def by_constraints(sub: Subscription) -> int:
        mask = 0
        for k, constraints in enumerate(changed):
            if all(_overlaps(c, sub, schema) for c in constraints):
                mask |= 1 << k
        return mask

    return by_constraints


def _one_range_each(changed: list[list[Constraint]]) -> tuple[str, list[Interval]] | None:
    """``(attribute, each child's interval)`` when every child differs from
    the parent by one range on the same attribute; None otherwise."""
    names = set()
    intervals = []
    for constraints in changed:
        if len(constraints) != 1 or not isinstance(constraints[0], RangeConstraint):
            return None
        names.add(constraints[0].attr)
        intervals.append(constraints[0].interval)
    return (names.pop(), intervals) if len(names) == 1 else None


def _overlaps(c: Constraint, sub: Subscription, schema: Schema) -> bool:
    attr = schema.attributes[c.attr]
    if isinstance(c, RangeConstraint):
        bound = bound_of(sub.filter.predicates, c.attr, attr)
        if bound is not None:
            return bound_overlaps(bound, c.interval, attr.kind.discrete)
    return c.overlaps_conj(conjunction(sub.filter.on(c.attr), attr), attr)
