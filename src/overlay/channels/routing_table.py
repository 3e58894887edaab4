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

Versions (SPEC §16: "routing tables carry versions, and a node behind
fetches the current one"):

4. Every channel's state — an entry, or a *tombstone* once the channel is
   deleted (split, merged) — carries a version, one integer
   ``major << 32 | minor << 16 | writer`` (``version``), compared as an
   integer: by ``major``, then ``minor``, then the writing node's id.  Two
   nodes holding different states of one channel tell the newer one apart
   without knowing how either came about; the order is total, and the same
   on every node.
5. ``major`` is a Lamport clock over the table: ``clock`` is the highest
   major this table has seen (written or received), and an ordinary change
   (``set``, ``apply``, ``remove`` — the owner's split, merge, migration at
   <3>, a replica set it leaves or takes back) gets ``clock + 1``, one
   version for every channel the change names.  So a change made after
   another one was seen is newer than it, whoever made either.
6. A recovery coordinator's change of a dead node's channel (``recover``)
   keeps the entry's major and adds one to its minor: it is newer than the
   entry it replaces, and older than any change the dead owner made to the
   channel that the coordinator had not seen (that change's major is
   higher): the dead owner's last split, merge or move, still on its way to
   some nodes when it died, wins everywhere, and its new channels, owned by
   a dead node, are recovered in their turn — the spaces still partition
   (rule 1).  (A channel recovered 65,535 times without an ordinary change
   takes the next major instead.)  A restarted run that re-creates the
   channels its table still gives it (``node.recovery`` rule 5) changes no
   entry: it announces them at the versions of the table it adopted, so a
   newer change made meanwhile wins over its claim.
7. ``merge`` takes states from a peer one channel at a time: the one with
   the higher version wins (a tombstone wins a tie, then the larger
   ``item_hash`` — a tie between different contents is corruption, and
   every node must still pick the same one); an older or equal state changes
   nothing and is reported as such.  Merging is commutative, associative and
   idempotent: any set of changes, applied in any order, any number of
   times, leaves the same table.
8. Tombstones are bounded (``MAX_TOMBSTONES``, oldest out): a channel id is
   never used again (``LocalTable.observe_id`` sees the ids of tombstones
   too), so a forgotten tombstone can only let back an entry a peer has not
   updated for that many deletions.
9. ``digest`` sums, modulo 2**63, one 64-bit hash per entry of its id,
   version and content (``item_hash``), kept up to date at every change: two
   tables with the same entries at the same versions have the same digest,
   and a table that lost entries or had one changed in place has another.
   Tombstones are not in it (a node may have forgotten one its peer keeps).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from hashlib import blake2b
from typing import Annotated, Final, NamedTuple

import msgspec
from sortedcontainers import SortedList

from overlay.channels.channel import ChannelId
from overlay.channels.intervals import IntervalSet
from overlay.channels.predicates import Filter, conjunction
from overlay.channels.route_entry import RouteEntry
from overlay.channels.schema import Schema, Value
from overlay.channels.space import EventSpace, ExceptConstraint, RangeConstraint, SetConstraint
from overlay.errors import LocalProtocolError

__all__ = [
    "MAX_TOMBSTONES",
    "Change",
    "Merged",
    "RouteEntry",
    "RoutingTable",
    "Version",
    "item_hash",
    "version",
    "version_text",
]

# Rule 8: deleted channels remembered; far more than the splits and merges a
# peer can be behind while anti-entropy runs every few heartbeats.
# Not Final: tests lower it, and the compiled build would inline a Final.
MAX_TOMBSTONES = 10_000
_MASK16: Final = 0xFFFF
_DIGEST_MOD: Final = 1 << 63  # msgspec bounds integers to int64
# A version on the wire (rule 4): 31 bits of major, 16 of minor, 16 of writer.
Version = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]

# Sets sorted: a digest must not depend on a process's string hashing (rule 9).
_encode = msgspec.msgpack.Encoder(order="deterministic").encode


def version(major: int, minor: int, writer: int) -> int:
    """Rule 4."""
    return (major << 32) | (minor << 16) | writer


def version_text(v: int) -> str:
    """``major.minor@writer``, for logs."""
    return f"{v >> 32}.{(v >> 16) & _MASK16}@{v & _MASK16}"


def item_hash(chid: ChannelId, v: int, entry: RouteEntry | None) -> int:
    """Rule 9: one state of one channel as 64 bits (None: a tombstone)."""
    return int.from_bytes(blake2b(_encode((chid, v, entry)), digest_size=8).digest(), "big")


class Change(NamedTuple):
    """One channel whose state a merge changed: ``old`` and ``new`` entries
    (None: absent or deleted)."""

    chid: ChannelId
    old: RouteEntry | None
    new: RouteEntry | None


class Merged(NamedTuple):
    """What ``merge`` did: the states it took, and the ones it refused as not
    newer than this table's (``stale``: channel, their version, ours)."""

    changed: list[Change]
    stale: list[tuple[ChannelId, int, int]]


class RoutingTable:
    """The cluster-wide channel map; identical on every node once updates
    settle (rules 1–9).  ``writer``: this node's id, the writer of its own
    changes' versions."""

    def __init__(
        self, schema: Schema, entries: Mapping[ChannelId, RouteEntry] | None = None, *, writer: int = 0
    ) -> None:
        self.schema = schema
        self.writer = writer
        self._entries: dict[ChannelId, RouteEntry] = dict(entries or {})
        self._versions: dict[ChannelId, int] = dict.fromkeys(self._entries, 0)
        self._hashes: dict[ChannelId, int] = {c: item_hash(c, 0, e) for c, e in self._entries.items()}
        self._digest = sum(self._hashes.values()) % _DIGEST_MOD
        self._deleted: dict[ChannelId, int] = {}  # tombstones (rule 8), oldest first
        self.clock = 0  # rule 5
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
        """The same entries at the same versions (tombstones aside, rule 9)."""
        return isinstance(other, RoutingTable) and self._entries == other._entries and self._versions == other._versions

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

    def channels_of(self, node: int) -> list[ChannelId]:
        return [c for c, e in self._entries.items() if node in e.owners]

    # -- versions (rules 4-9) -----------------------------------------------------------

    @property
    def digest(self) -> int:
        """Rule 9."""
        return self._digest

    def version(self, chid: ChannelId) -> int:
        """The version of ``chid``'s entry or tombstone; 0: never heard of."""
        v = self._versions.get(chid)
        return v if v is not None else self._deleted.get(chid, 0)

    def versioned(self) -> Iterator[tuple[ChannelId, RouteEntry, int]]:
        """Every entry with its version."""
        versions = self._versions
        for chid, entry in self._entries.items():
            yield chid, entry, versions[chid]

    def versions(self) -> dict[ChannelId, int]:
        """A copy: channel id -> its entry's version."""
        return dict(self._versions)

    def tombstones(self) -> dict[ChannelId, int]:
        """A copy: deleted channel id -> the version of its deletion, oldest first."""
        return dict(self._deleted)

    def deleted(self, chid: ChannelId) -> bool:
        return chid in self._deleted

    def _stamp(self) -> int:
        """Rule 5: the version of a change made here."""
        self.clock += 1
        return version(self.clock, 0, self.writer)

    def _observe(self, v: int) -> None:
        major = v >> 32
        if major > self.clock:
            self.clock = major

    def _put(self, chid: ChannelId, entry: RouteEntry, v: int) -> None:
        if not entry.owners:
            raise LocalProtocolError(f"channel {chid} needs at least one owner")
        self._drop_hash(chid)
        self._deleted.pop(chid, None)
        self._entries[chid] = entry
        self._versions[chid] = v
        h = item_hash(chid, v, entry)
        self._hashes[chid] = h
        self._digest = (self._digest + h) % _DIGEST_MOD
        self._observe(v)
        self._index = None

    def _bury(self, chid: ChannelId, v: int) -> RouteEntry | None:
        self._drop_hash(chid)
        entry = self._entries.pop(chid, None)
        self._versions.pop(chid, None)
        deleted = self._deleted
        deleted.pop(chid, None)
        deleted[chid] = v
        while len(deleted) > MAX_TOMBSTONES:
            del deleted[next(iter(deleted))]
        self._observe(v)
        if entry is not None:
            self._index = None
        return entry

    def _drop_hash(self, chid: ChannelId) -> None:
        h = self._hashes.pop(chid, None)
        if h is not None:
            self._digest = (self._digest - h) % _DIGEST_MOD

    # -- changes made here (rules 5, 6) ------------------------------------------------------

    def set(self, chid: ChannelId, entry: RouteEntry) -> int:
        """An ordinary change of one entry; returns its version."""
        return self.apply((), ((chid, entry),))

    def remove(self, chid: ChannelId) -> RouteEntry | None:
        """An ordinary deletion (a tombstone); returns the entry it held."""
        entry = self._entries.get(chid)
        self.apply((chid,), ())
        return entry

    def apply(
        self,
        delete: Iterable[ChannelId] = (),
        update: Mapping[ChannelId, RouteEntry] | Iterable[tuple[ChannelId, RouteEntry]] = (),
    ) -> int:
        """An ordinary change (UpdateRoutingTable's deleteChs, updateChs made
        here): deletions first, then updates, all at one new version (rule 5),
        which it returns."""
        items = list(update.items() if isinstance(update, Mapping) else update)
        for chid, entry in items:
            if not entry.owners:
                raise LocalProtocolError(f"channel {chid} needs at least one owner")
        v = self._stamp()
        for chid in delete:
            self._bury(chid, v)
        for chid, entry in items:
            self._put(chid, entry, v)
        return v

    def recover(self, chid: ChannelId, entry: RouteEntry) -> int:
        """Rule 6: a recovery coordinator's change of a dead node's channel;
        returns its version."""
        cur = self.version(chid)
        major, minor = cur >> 32, (cur >> 16) & _MASK16
        if minor >= _MASK16 or not cur:
            return self.set(chid, entry)
        v = version(major, minor + 1, self.writer)
        self._put(chid, entry, v)
        return v

    # -- states from peers (rule 7) ---------------------------------------------------------

    def merge(
        self,
        entries: Iterable[tuple[ChannelId, RouteEntry, int]] = (),
        deleted: Iterable[tuple[ChannelId, int]] = (),
    ) -> Merged:
        """Rule 7: take each state that is newer than this table's."""
        changed: list[Change] = []
        stale: list[tuple[ChannelId, int, int]] = []
        for chid, v in deleted:
            mine = self.version(chid)
            if v > mine or (v == mine and chid in self._entries):  # a tombstone wins a tie
                old = self._bury(chid, v)
                if old is not None:
                    changed.append(Change(chid, old, None))
            else:
                self._observe(v)
                if v < mine or chid not in self._deleted:
                    stale.append((chid, v, mine))
        for chid, entry, v in entries:
            mine = self.version(chid)
            old = self._entries.get(chid)
            if v > mine or (
                v == mine and old is not None and old != entry and item_hash(chid, v, entry) > self._hashes[chid]
            ):
                self._put(chid, entry, v)
                changed.append(Change(chid, old, entry))
            else:
                self._observe(v)
                if v < mine or (v == mine and old != entry):
                    stale.append((chid, v, mine))
        return Merged(changed, stale)

    def replace_all(
        self,
        entries: Mapping[ChannelId, RouteEntry] | Iterable[tuple[ChannelId, RouteEntry, int]],
        deleted: Iterable[tuple[ChannelId, int]] = (),
    ) -> None:
        """Take another table whole (a node adopting its peers' table, node.boot
        rule 4): its entries at their versions (a plain mapping: version 0).
        The clock never goes back (rule 5)."""
        items = [(c, e, 0) for c, e in entries.items()] if isinstance(entries, Mapping) else list(entries)
        self._entries, self._versions, self._hashes, self._deleted = {}, {}, {}, {}
        self._digest = 0
        self._index = None
        for chid, v in deleted:
            self._bury(chid, v)
        for chid, entry, v in items:
            self._put(chid, entry, v)

    # -- lookups (rule 2) -------------------------------------------------------------

    def _idx(self) -> _Index:
        if self._index is None:
            self._index = _Index(self.schema, self._key_attr, self._entries)
        return self._index

    def lookup_event(self, values: Mapping[str, Value]) -> ChannelId | None:
        """The one channel whose space holds the event (None: a gap in the table)."""
        entries = self._entries
        for chid in self._idx().point(values.get(self._key_attr)):
            if space_contains(entries[chid].space, values):
                return chid
        return None

    def lookup_subscription(self, f: Filter, *, satisfiable: bool = False) -> list[ChannelId]:
        """Every channel the subscription belongs to (covers or overlaps),
        sorted.  ``satisfiable``: the caller knows some event matches ``f``
        (a conjunct the parser let in), so it is not decided again."""
        entries = self._entries
        schema = self.schema
        if not satisfiable and not f.satisfiable(schema):  # no event matches it: it belongs nowhere
            return []
        cands = self._idx().overlapping(f)
        # Satisfiable: each candidate compares only the attributes it constrains.
        return sorted(c for c in cands if entries[c].space.meets(f, schema))


# Read from C statics when compiled (globals are looked up by name each time).
_EXCEPT: Final = ExceptConstraint
_SET: Final = SetConstraint


def space_contains(space: EventSpace, values: Mapping[str, Value]) -> bool:
    """``space.contains(values)``, compiled: a string attribute's constraint
    is tested here, where ``EventSpace.contains`` (a Struct's method: pure
    Python, overlay.build rule 4) made two interpreted calls per constraint
    on every event; a range's goes through its own ``contains_value``."""
    for c in space.constraints:
        v = values.get(c.attr)
        if v is None:
            return False
        if type(c) is _EXCEPT:
            if v in c.excluded:
                return False
        elif type(c) is _SET:
            if v not in c.values:
                return False
        elif not c.contains_value(v):
            return False
    return True


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
