"""Matching an event against a channel's subscriptions, and what it cost.

``SubscriptionIndex`` is a bucketed bitmap index, the counting algorithm done
with whole-word operations instead of per-predicate counters:

1. Each subscription holds a *slot*.  For each attribute the index keeps one
   bitmap of the slots that do not constrain it (*wildcards*) and, for each
   bucket of the attribute's domain, a bitmap of the slots whose predicates on
   it can be satisfied by some value in that bucket.  Ordered attributes cut
   ``[min, max]`` into equal-width buckets; strings hash into buckets, with
   patterns (prefix, suffix, contains, !=) counted as wildcards.
2. For an event, ``candidates = ⋀_attr (wildcards | bucket(value))`` — a few
   big-integer ANDs, a C loop over machine words.  Attributes no subscription
   constrains are skipped.  A subscription whose predicates on one attribute
   cannot be satisfied at all is in no bucket and never a candidate.
3. Every candidate is then tested exactly with its compiled filter.  The
   number of candidates tested is the event's **cost** (SPEC §5): it counts
   real work done by this matcher, never an estimate.
4. Bitmaps are mutable ``bytearray``s (adding or removing a subscription flips
   a few bits in O(1)); each caches its integer form until the next change.

``LinearMatcher`` tests every subscription; it is the reference the index is
checked against and the baseline of ``bench/matching.py``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from overlay.channels.intervals import IntervalSet
from overlay.channels.predicates import StringConj, compile_filter, conjunction
from overlay.channels.schema import Attribute, Kind, Schema, Value
from overlay.channels.subscriptions import Subscription

__all__ = ["MatchResult", "SubscriptionIndex", "LinearMatcher", "DEFAULT_BUCKETS"]

# Buckets per attribute.  More buckets prune better for narrow ranges but cost
# one bitmap each; 128 keeps a 100k-subscription channel's index near 10 MB.
DEFAULT_BUCKETS: Final = 128
_WILD: Final = -1
_NONZERO: Final = re.compile(rb"[^\x00]")
_BITS: Final = tuple(tuple(b for b in range(8) if byte >> b & 1) for byte in range(256))

MatchResult = tuple[list[Subscription], int]


class _Bitmap:
    """A growable bit set over slots with a cached integer view (rule 4)."""

    __slots__ = ("bits", "_int")

    def __init__(self, nbytes: int) -> None:
        self.bits = bytearray(nbytes)
        self._int: int | None = 0

    def set(self, slot: int) -> None:
        self.bits[slot >> 3] |= 1 << (slot & 7)
        self._int = None

    def clear(self, slot: int) -> None:
        self.bits[slot >> 3] &= ~(1 << (slot & 7)) & 0xFF
        self._int = None

    def grow(self, nbytes: int) -> None:
        self.bits.extend(bytes(nbytes - len(self.bits)))

    def value(self) -> int:
        v = self._int
        if v is None:
            v = self._int = int.from_bytes(self.bits, "little")
        return v


class _AttrIndex:
    """Rule 1 for one attribute."""

    __slots__ = ("attr", "nbuckets", "wild", "buckets", "constrained", "_bucket_of", "_nbytes")

    def __init__(self, attr: Attribute, nbuckets: int, nbytes: int) -> None:
        self.attr = attr
        self.nbuckets = nbuckets
        self._nbytes = nbytes
        self.wild = _Bitmap(nbytes)
        self.buckets: list[_Bitmap | None] = [None] * nbuckets
        self.constrained = 0  # slots that are not wildcards here
        self._bucket_of = _bucket_function(attr, nbuckets)

    def grow(self, nbytes: int) -> None:
        self._nbytes = nbytes
        self.wild.grow(nbytes)
        for b in self.buckets:
            if b is not None:
                b.grow(nbytes)

    def bucket(self, i: int) -> _Bitmap:
        b = self.buckets[i]
        if b is None:
            b = self.buckets[i] = _Bitmap(self._nbytes)
        return b

    def placement(self, conj: IntervalSet | StringConj | None) -> tuple[int, ...]:
        """The buckets a slot goes in (``(_WILD,)`` for a wildcard)."""
        if conj is None or conj.is_whole():
            return (_WILD,)
        if conj.is_empty():
            return ()
        if isinstance(conj, StringConj):
            if conj.finite is None:
                return (_WILD,)
            return tuple(sorted({self._bucket_of(v) for v in conj.finite}))
        out: set[int] = set()
        for iv in conj.intervals:
            out.update(range(self._bucket_of(iv.lo), self._bucket_of(iv.hi) + 1))
        if len(out) == self.nbuckets:
            return (_WILD,)
        return tuple(sorted(out))

    def mask(self, value: Value | None) -> int:
        if value is None:
            return self.wild.value()
        b = self.buckets[self._bucket_of(value)]
        w = self.wild.value()
        return w if b is None else w | b.value()


def _bucket_function(attr: Attribute, n: int) -> Callable[[Value], int]:
    if attr.kind is Kind.STRING:
        # crc32, not hash(): stable across processes, so bucket stats are comparable.
        return lambda v: zlib.crc32(v.encode()) % n  # type: ignore[union-attr]
    lo, hi = attr.min, attr.max
    last = n - 1
    if attr.kind.discrete:
        span = int(hi) - int(lo) + 1

        def discrete_bucket(v: Value) -> int:
            i = (v - lo) * n // span  # type: ignore[operator]
            return last if i > last else (0 if i < 0 else i)

        return discrete_bucket
    width = (hi - lo) / n or 1.0

    def float_bucket(v: Value) -> int:
        i = int((v - lo) / width)  # type: ignore[operator]
        return last if i > last else (0 if i < 0 else i)

    return float_bucket


class SubscriptionIndex:
    """The indexed matcher of one channel.

    Invariant: ``_subs[slot]`` is set exactly for the slots whose bit is set
    in ``_alive``, and each such slot's bits are set in exactly the bitmaps
    named by ``_placed[slot]``.
    """

    def __init__(self, schema: Schema, nbuckets: int = DEFAULT_BUCKETS) -> None:
        self.schema = schema
        self._nbytes = 8
        self._attrs = {
            name: _AttrIndex(attr, nbuckets, self._nbytes)
            for name, attr in schema.attributes.items()
        }
        self._alive = _Bitmap(self._nbytes)
        self._slot_of: dict[str, int] = {}
        self._subs: list[tuple[Subscription, Callable[[Mapping[str, Value]], bool]] | None] = []
        self._placed: list[tuple[tuple[str, int], ...]] = []
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self._slot_of

    def __iter__(self) -> Iterator[Subscription]:
        for entry in self._subs:
            if entry is not None:
                yield entry[0]

    def get(self, sub_id: str) -> Subscription | None:
        slot = self._slot_of.get(sub_id)
        if slot is None:
            return None
        entry = self._subs[slot]
        return None if entry is None else entry[0]

    def _new_slot(self) -> int:
        if self._free:
            return self._free.pop()
        slot = len(self._subs)
        self._subs.append(None)
        self._placed.append(())
        if slot >> 3 >= self._nbytes:
            self._nbytes *= 2
            self._alive.grow(self._nbytes)
            for ai in self._attrs.values():
                ai.grow(self._nbytes)
        return slot

    def add(self, sub: Subscription) -> bool:
        """Index ``sub``; False (and no change) if its id is already here."""
        if sub.id in self._slot_of:
            return False
        slot = self._new_slot()
        placed: list[tuple[str, int]] = []
        f = sub.filter
        constrained = f.attrs()
        for name, ai in self._attrs.items():
            conj = conjunction(f.on(name), ai.attr) if name in constrained else None
            for b in ai.placement(conj):
                placed.append((name, b))
                if b == _WILD:
                    ai.wild.set(slot)
                else:
                    ai.bucket(b).set(slot)
            if name in constrained:
                ai.constrained += 1
        self._placed[slot] = tuple(placed)
        self._subs[slot] = (sub, compile_filter(f))
        self._slot_of[sub.id] = slot
        self._alive.set(slot)
        return True

    def add_many(self, subs: Iterable[Subscription]) -> int:
        return sum(self.add(s) for s in subs)

    def remove(self, sub_id: str) -> Subscription | None:
        """Drop a subscription; returns it, or None if it was not here."""
        slot = self._slot_of.pop(sub_id, None)
        if slot is None:
            return None
        entry = self._subs[slot]
        assert entry is not None
        for name, b in self._placed[slot]:
            ai = self._attrs[name]
            if b == _WILD:
                ai.wild.clear(slot)
            else:
                ai.bucket(b).clear(slot)
        for name in entry[0].filter.attrs():
            self._attrs[name].constrained -= 1
        self._alive.clear(slot)
        self._subs[slot] = None
        self._placed[slot] = ()
        self._free.append(slot)
        return entry[0]

    def match(self, values: Mapping[str, Value]) -> MatchResult:
        """The subscriptions ``values`` matches, and how many were tested (rule 3)."""
        cand = self._alive.value()
        if not cand:
            return [], 0
        get = values.get
        for name, ai in self._attrs.items():
            if ai.constrained:
                cand &= ai.mask(get(name))
                if not cand:
                    return [], 0
        subs = self._subs
        matched: list[Subscription] = []
        tested = 0
        raw = cand.to_bytes((cand.bit_length() + 7) >> 3, "little")
        for m in _NONZERO.finditer(raw):
            base = m.start() << 3
            for bit in _BITS[raw[base >> 3]]:
                entry = subs[base | bit]
                tested += 1
                if entry[1](values):  # type: ignore[index]
                    matched.append(entry[0])  # type: ignore[index]
        return matched, tested


class LinearMatcher:
    """Tests every subscription: the reference and the benchmark's baseline."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._subs: dict[str, tuple[Subscription, Callable[[Mapping[str, Value]], bool]]] = {}

    def __len__(self) -> int:
        return len(self._subs)

    def __iter__(self) -> Iterator[Subscription]:
        return (s for s, _ in self._subs.values())

    def add(self, sub: Subscription) -> bool:
        if sub.id in self._subs:
            return False
        self._subs[sub.id] = (sub, compile_filter(sub.filter))
        return True

    def remove(self, sub_id: str) -> Subscription | None:
        entry = self._subs.pop(sub_id, None)
        return None if entry is None else entry[0]

    def match(self, values: Mapping[str, Value]) -> MatchResult:
        matched = [s for s, fn in self._subs.values() if fn(values)]
        return matched, len(self._subs)
