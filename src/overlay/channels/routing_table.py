"""``routingTable``: channel id → (space, owning node(s)) for every channel (SPEC §2.4).

Rules this module keeps:

1. The spaces of the entries partition the event space: a valid event lies in
   exactly one entry's space.  (Replicas of one channel are one entry with
   several owners.)
2. Lookups go through an index over the first distinguishing attribute in
   split priority, never a scan of all channels:
   * ordered attribute — the sorted boundary points of every entry's interval
     (``sortedcontainers``); for each boundary the entries whose interval
     contains it.  A point query bisects to the greatest boundary ≤ the value
     and checks only that boundary's entries;
   * string attribute — a hash map value → type-1 entries, plus the type-2
     entries.
   Candidates are then checked exactly, so the index may over-approximate
   but never miss.
3. The index is rebuilt lazily after a change; tables change rarely (splits,
   merges, migrations) and are read for every event.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import msgspec
from sortedcontainers import SortedList

from overlay.channels.channel import ChannelId
from overlay.channels.intervals import IntervalSet
from overlay.channels.predicates import Filter, conjunction
from overlay.channels.schema import Schema, Value
from overlay.channels.space import EventSpace, ExceptConstraint, RangeConstraint, SetConstraint
from overlay.errors import LocalProtocolError

__all__ = ["RouteEntry", "RoutingTable"]


class RouteEntry(msgspec.Struct, frozen=True, array_like=True):
    """Where a channel lives. Invariant: ``owners`` is non-empty; more than one
    owner means the channel is replicated (SPEC §8.3 degenerate case)."""

    space: EventSpace
    owners: tuple[int, ...]

    @property
    def owner(self) -> int:
        return self.owners[0]

    @property
    def replicated(self) -> bool:
        return len(self.owners) > 1


class RoutingTable:
    """The cluster-wide channel map; identical on every node once updates settle."""

    def __init__(self, schema: Schema, entries: Mapping[ChannelId, RouteEntry] | None = None) -> None:
        self.schema = schema
        self._entries: dict[ChannelId, RouteEntry] = dict(entries or {})
        self._key_attr = schema.da_priority()[0]
        self._index: _Index | None = None

    # -- content -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[ChannelId]:
        return iter(self._entries)

    def __contains__(self, chid: object) -> bool:
        return chid in self._entries

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoutingTable) and self._entries == other._entries

    def items(self) -> Iterable[tuple[ChannelId, RouteEntry]]:
        return self._entries.items()

    def get(self, chid: ChannelId) -> RouteEntry | None:
        return self._entries.get(chid)

    def __getitem__(self, chid: ChannelId) -> RouteEntry:
        try:
            return self._entries[chid]
        except KeyError:
            raise LocalProtocolError(f"channel {chid} is not in the routing table") from None

    def entries(self) -> dict[ChannelId, RouteEntry]:
        """A copy, e.g. to send in RoutingTableInit or keep for a rollback."""
        return dict(self._entries)

    def set(self, chid: ChannelId, entry: RouteEntry) -> None:
        if not entry.owners:
            raise LocalProtocolError(f"channel {chid} needs at least one owner")
        self._entries[chid] = entry
        self._index = None

    def remove(self, chid: ChannelId) -> RouteEntry | None:
        entry = self._entries.pop(chid, None)
        if entry is not None:
            self._index = None
        return entry

    def apply(
        self,
        delete: Iterable[ChannelId] = (),
        update: Mapping[ChannelId, RouteEntry] | Iterable[tuple[ChannelId, RouteEntry]] = (),
    ) -> None:
        """UpdateRoutingTable(deleteChs, updateChs): deletions first, then updates."""
        for chid in delete:
            self._entries.pop(chid, None)
        items = update.items() if isinstance(update, Mapping) else update
        for chid, entry in items:
            if not entry.owners:
                raise LocalProtocolError(f"channel {chid} needs at least one owner")
            self._entries[chid] = entry
        self._index = None

    def replace_all(self, entries: Mapping[ChannelId, RouteEntry]) -> None:
        self._entries = dict(entries)
        self._index = None

    def channels_of(self, node: int) -> list[ChannelId]:
        return [c for c, e in self._entries.items() if node in e.owners]

    # -- lookups (rule 2) -------------------------------------------------------------

    def _idx(self) -> _Index:
        if self._index is None:
            self._index = _Index(self.schema, self._key_attr, self._entries)
        return self._index

    def lookup_event(self, values: Mapping[str, Value]) -> ChannelId | None:
        """The one channel whose space holds the event (None: a gap in the table)."""
        entries = self._entries
        for chid in self._idx().point(values.get(self._key_attr)):
            if entries[chid].space.contains(values):
                return chid
        return None

    def lookup_subscription(self, f: Filter) -> list[ChannelId]:
        """Every channel the subscription belongs to (covers or overlaps), sorted."""
        entries = self._entries
        schema = self.schema
        cands = self._idx().overlapping(f)
        return sorted(c for c in cands if entries[c].space.overlaps(f, schema))


class _Index:
    """Rule 2 over one attribute, built from a snapshot of the entries."""

    def __init__(self, schema: Schema, attr_name: str, entries: Mapping[ChannelId, RouteEntry]) -> None:
        self.attr = schema.attributes[attr_name]
        self.all = tuple(entries)
        self.ordered = self.attr.kind.ordered
        if self.ordered:
            spans: list[tuple[Value, Value, ChannelId]] = []
            for chid, e in entries.items():
                c = e.space.constraint(attr_name)
                assert isinstance(c, RangeConstraint)
                spans.append((c.interval.lo, c.interval.hi, chid))
            self.points = SortedList({p for lo, hi, _ in spans for p in (lo, hi)})
            # Entries whose closed hull [lo, hi] contains each boundary point.
            self.stab: list[list[ChannelId]] = [[] for _ in range(len(self.points))]
            for lo, hi, chid in spans:
                for i in range(self.points.index(lo), self.points.index(hi) + 1):
                    self.stab[i].append(chid)
        else:
            self.by_value: dict[Value, list[ChannelId]] = {}
            self.rest: list[ChannelId] = []
            for chid, e in entries.items():
                c = e.space.constraint(attr_name)
                if isinstance(c, SetConstraint):
                    for v in c.values:
                        self.by_value.setdefault(v, []).append(chid)
                else:
                    assert isinstance(c, ExceptConstraint)
                    self.rest.append(chid)

    def point(self, v: Value | None) -> list[ChannelId]:
        if v is None:
            return []
        if self.ordered:
            i = self.points.bisect_right(v) - 1
            return self.stab[i] if i >= 0 else []
        hit = self.by_value.get(v)
        return hit + self.rest if hit else self.rest

    def overlapping(self, f: Filter) -> set[ChannelId] | tuple[ChannelId, ...]:
        preds = f.on(self.attr.name)
        if not preds:
            return self.all
        conj = conjunction(preds, self.attr)
        if isinstance(conj, IntervalSet):  # an ordered attribute (self.ordered)
            out: set[ChannelId] = set()
            for iv in conj.intervals:
                start = max(self.points.bisect_right(iv.lo) - 1, 0)
                stop = self.points.bisect_right(iv.hi)
                for i in range(start, stop):
                    out.update(self.stab[i])
            return out
        if conj.finite is None:
            return self.all
        out = set(self.rest)
        for v in conj.finite:
            out.update(self.by_value.get(v, ()))
        return out
