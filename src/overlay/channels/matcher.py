"""Matching an event against a channel's subscriptions, and what it cost.

``SubscriptionIndex`` is a bucketed bitmap index, the counting algorithm done
with whole-word operations instead of per-predicate counters, plus
per-bucket dicts for the subscriptions that constrain a single attribute:

1. Each subscription holds a *slot*.  For each attribute the index keeps one
   bitmap of the slots that do not constrain it (*wildcards*) and, for each
   bucket of the attribute's domain, a bitmap of the slots whose predicates on
   it can be satisfied by some value in that bucket.  Ordered attributes cut
   ``[min, max]`` into equal-width buckets; strings hash into buckets, with
   patterns (prefix, suffix, contains, !=) counted as wildcards.
2. For an event, ``candidates = ⋀_attr (wildcards | bucket(value))`` — a few
   big-integer ANDs, a C loop over machine words.  Attributes no bitmapped
   subscription constrains are skipped, and so is an attribute whose value has
   no bucket (wrong type, outside the domain, NaN): every slot stays a
   candidate there and the exact test decides.  A subscription whose
   predicates on one attribute cannot be satisfied at all is in no bucket and
   never a candidate.
3. Every candidate is then tested exactly, once.  The number of candidates is
   the event's **cost** (SPEC §5): each one counted is one filter evaluated by
   this matcher — real work, never an estimate.
4. The exact test of a *plain* subscription (only ``= < <= > >= in[]`` with
   numbers of the attribute's kind on ordered attributes, ``=`` on strings) is
   a bound ``(lo, hi, strict)`` per constrained attribute, evaluated inline by
   ``match``: a conjunction of comparisons on one attribute is one interval,
   exactly, because Python compares ints and floats exactly.  Other
   subscriptions keep the closure of ``compile_filter``.  A tuple is a few
   dozen bytes where the closures take about a kilobyte, and testing it reads
   two objects instead of ten scattered ones.  An attribute value the bounds
   cannot compare like the filter would (not a number on an ordered attribute,
   not a string on a string one) sends the tests that read it to
   ``compile_filter``, so results never differ from ``LinearMatcher``'s.
5. A plain subscription on a single attribute gains nothing from the AND of
   rule 2 (it is a wildcard everywhere else), so it is kept out of the bitmaps:
   its ``(lo, hi, strict, sub)`` entry sits in a dict per bucket it spans
   (an ``=`` in a dict per value instead: exact), and an event scans the dicts
   of its value's bucket directly — no bit to extract, no slot to look up.
   Each entry scanned is a candidate of rule 3, tested and counted.
6. A bitmap is a Python integer plus a ``bytearray`` of pending bit flips:
   adding or removing a subscription flips a few bits in O(1); the next match
   folds the flips in with one XOR and drops the buffer, so a bitmap costs
   ``N/8`` bytes at rest.  Flips are exact because a slot's bit is only set
   when it is clear and cleared when it is set (the invariant below).
7. Rules 7 and 8 place a conjunction on one attribute that uses an operator
   of the extended language (``not in``, ``ieq``, ``iprefix``, ``isuffix``,
   ``like``, ``exists``, ``not exists``, the negated patterns); one that uses
   only the older operators (``= != < <= > >= in[] in{} prefix suffix
   contains``) is placed exactly as it always was (a pattern or ``!=`` a
   wildcard), so an old subscription costs what it cost — costs drive
   balancing.  Two pseudo-buckets per attribute serve presence: slots that
   need the attribute present but no bucket narrows (``exists``, values
   spanning the domain) are in ``present`` — kept for any value, out when
   the attribute is absent — and slots that need it absent (``not exists``)
   in ``absent_ok``, kept only then.  An absent attribute keeps ``wild |
   absent_ok``; a present one ``wild | present | bucket(value)``.
8. A string conjunction (rule 7) that is not a finite set is filed under one
   *anchor* in a keyed table of its attribute: its ``ieq`` value (folded),
   else its longest literal prefix or suffix (``prefix``, ``suffix``, the
   folded ``iprefix``/``isuffix``, a ``like`` pattern's text before its
   first or after its last ``*``).  An event's value looks up each table
   once per key length the table holds (its prefixes, suffixes, or its
   folded self): a few dict look-ups, never a scan of the slots.  A
   conjunction with no anchor (``contains`` with ``not in {…}``, ``not
   prefix`` …) is ``present`` (rule 7).  Anything-but adds an *exclusion*:
   the slots whose ``!=``/``not in {…}`` names the value are dropped from
   the mask (their exact test would fail).  Every placement is a superset
   of the values the slot accepts, so the exact test of rule 3 still decides.

The order of the matched subscriptions is unspecified.  ``LinearMatcher``
tests every subscription; it is the reference the index is checked against
and the baseline of ``bench/matching.py``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping

from overlay.channels.predicates import compile_filter
from overlay.channels.schema import Schema, Value
from overlay.channels.subscriptions import Subscription
from overlay.errors import LocalProtocolError

__all__ = ["DEFAULT_BUCKETS", "LinearMatcher", "MatchResult", "SubscriptionIndex"]

from overlay.channels._buckets import (
    _ABSENT,
    _BITS,
    _CODE_OFFSET,
    _CODE_TYPE,
    _HI_STRICT,
    _LO_STRICT,
    _NEVER,
    _NONZERO_TO_ONE,
    _NUMBER_TYPES,
    _WILD,
    DEFAULT_BUCKETS,
    MatchResult,
    _AttrIndex,
    _Bitmap,
    _Compiled,
    _Plain,
    _plain_bounds,
)


class SubscriptionIndex:
    """The indexed matcher of one channel.

    Invariant: ``_subs[slot]`` is set exactly for the slots in use.  A slot in
    use is either *bitmapped* — in ``_alive`` and in exactly the bitmaps named
    by the runs ``_placed[slot]`` — or *single* (rule 5: ``_placed[slot]`` is
    None, its entry is in ``_order[pos]``'s dicts where ``pos`` is
    ``_tests[slot][0]``).  ``_tests[slot]`` is its exact test (rule 4).  Free
    slots are in no bitmap and no dict.
    """

    def __init__(self, schema: Schema, nbuckets: int = DEFAULT_BUCKETS) -> None:
        if nbuckets < 1:
            raise LocalProtocolError(f"an index needs at least one bucket, got {nbuckets}")
        self.schema = schema
        self._stride = nbuckets + _CODE_OFFSET
        self._attrs = {
            name: _AttrIndex(attr, pos, nbuckets) for pos, (name, attr) in enumerate(schema.attributes.items())
        }
        self._order = tuple(self._attrs.values())
        self._alive = _Bitmap()
        self._slot_of: dict[str, int] = {}
        self._subs: list[Subscription | None] = []
        self._tests: list[_Plain | _Compiled | None] = []
        self._placed: list[bytes | None] = []
        # Rule 8: the keyed-table entries of the slots that have some.
        self._keys: dict[int, tuple[tuple[int, str, str], ...]] = {}
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self._slot_of

    def __iter__(self) -> Iterator[Subscription]:
        for sub in self._subs:
            if sub is not None:
                yield sub

    def get(self, sub_id: str) -> Subscription | None:
        slot = self._slot_of.get(sub_id)
        return None if slot is None else self._subs[slot]

    def compiled(self, sub_id: str) -> Callable[[Mapping[str, Value]], bool] | None:
        """The exact test of a subscription held as a closure (rule 4), or None
        (not here, or tested inline by its bounds)."""
        slot = self._slot_of.get(sub_id)
        test = None if slot is None else self._tests[slot]
        return test if callable(test) else None

    def _new_slot(self) -> int:
        if self._free:
            return self._free.pop()
        self._subs.append(None)
        self._tests.append(None)
        self._placed.append(None)
        return len(self._subs) - 1

    def _flip(self, slot: int, placed: bytes) -> None:
        """Flip ``slot`` in every bitmap of the runs ``placed`` (rule 6)."""
        codes = array(_CODE_TYPE)
        codes.frombytes(placed)
        stride = self._stride
        order = self._order
        for k in range(0, len(codes), 2):
            pos, first = divmod(codes[k], stride)
            ai = order[pos]
            for b in range(first - _CODE_OFFSET, codes[k + 1] - pos * stride - _CODE_OFFSET + 1):
                ai.bitmap(b).flip(slot)

    def _flip_keys(self, slot: int, keys: tuple[tuple[int, str, str], ...], *, removing: bool = False) -> None:
        order = self._order
        for pos, kind, key in keys:
            order[pos].flip_key(kind, key, slot, removing=removing)

    def add(self, sub: Subscription) -> bool:
        """Index ``sub``; False (and no change) if its id is already here.

        Everything that can fail (placing an odd unchecked filter) is worked
        out before the first change, so a raising add leaves the index as it was.
        """
        if sub.id in self._slot_of:
            return False
        f = sub.filter
        plain = _plain_bounds(f, self._attrs)
        if plain is not None and len(plain) == 1:
            ((name, bound),) = plain.items()
            ai = self._attrs[name]
            runs = ai.single_runs(bound)
            slot = self._new_slot()
            ai.add_single(slot, bound, runs, sub)
            self._tests[slot] = (ai.pos, *bound)
        else:
            test: _Plain | _Compiled
            keys: list[tuple[int, str, str]] = []
            codes = array(_CODE_TYPE)
            stride = self._stride
            names = f.attrs()
            if plain is not None:
                flat: list[object] = []
                for ai in self._order:
                    on_ai = plain.get(ai.name)
                    if on_ai is None:
                        runs = [(_WILD, _WILD)]
                    else:
                        flat += (ai.pos, *on_ai)
                        runs = ai.plain_placement(on_ai[0], on_ai[1])
                    for first, last in runs:
                        codes.append(ai.pos * stride + first + _CODE_OFFSET)
                        codes.append(ai.pos * stride + last + _CODE_OFFSET)
                test = tuple(flat)
            else:
                for ai in self._order:
                    if ai.name in names:
                        runs, ai_keys = ai.bitmapped_placement(f.on(ai.name))
                        keys += [(ai.pos, kind, key) for kind, key in ai_keys]
                    else:
                        runs = [(_WILD, _WILD)]
                    for first, last in runs:
                        codes.append(ai.pos * stride + first + _CODE_OFFSET)
                        codes.append(ai.pos * stride + last + _CODE_OFFSET)
                test = compile_filter(f)
            placed = codes.tobytes()
            slot = self._new_slot()
            self._flip(slot, placed)
            if keys:
                self._flip_keys(slot, tuple(keys))
                self._keys[slot] = tuple(keys)
            for name in names:
                named = self._attrs.get(name)
                if named is not None:
                    named.constrained += 1
            self._placed[slot] = placed
            self._tests[slot] = test
            self._alive.flip(slot)
        self._subs[slot] = sub
        self._slot_of[sub.id] = slot
        return True

    def add_many(self, subs: Iterable[Subscription]) -> int:
        return sum(self.add(s) for s in subs)

    def remove(self, sub_id: str) -> Subscription | None:
        """Drop a subscription; returns it, or None if it was not here."""
        slot = self._slot_of.pop(sub_id, None)
        if slot is None:
            return None
        sub = self._subs[slot]
        assert sub is not None
        placed = self._placed[slot]
        if placed is None:
            # A single's filter constrains one attribute, whose index holds its entry.
            (name,) = sub.filter.attrs()
            self._attrs[name].remove_single(slot)
        else:
            self._flip(slot, placed)
            keys = self._keys.pop(slot, None)
            if keys:
                self._flip_keys(slot, keys, removing=True)
            for name in sub.filter.attrs():
                ai = self._attrs.get(name)
                if ai is not None:
                    ai.constrained -= 1
            self._alive.flip(slot)
        self._subs[slot] = None
        self._tests[slot] = None
        self._placed[slot] = None
        self._free.append(slot)
        return sub

    def match(self, values: Mapping[str, Value]) -> MatchResult:
        """The subscriptions ``values`` matches (in no particular order), and how
        many were tested (rule 3)."""
        matched: list[Subscription] = []
        append = matched.append
        tested = 0
        cand = self._alive.value()
        get = values.get
        # The event's values by attribute position, for the plain tests.
        vals: list[object] = [_NEVER] * len(self._order)
        inline = True
        for ai in self._order:
            v = get(ai.name, _ABSENT)
            if v is _ABSENT:
                # No predicate on a missing attribute holds: its singles are out.
                if cand and ai.constrained:
                    cand &= ai.absent_mask()
                continue
            if (type(v) in _NUMBER_TYPES) if ai.ordered else (type(v) is str):
                vals[ai.pos] = v
            else:
                inline = False
            if ai.singles:
                tested += ai.match_singles(v, values, append)
            if cand and ai.constrained and ai.bucketed(v):
                cand &= ai.mask(v)
        if not cand:
            return matched, tested
        # Every bitmapped candidate goes through exactly one exact test below.
        # A candidate's slot is in use (the class invariant): its subscription
        # is set and its test is a closure or a plain tuple (rule 4).  The
        # loops index by slot without re-checking that, for speed; the ignores
        # below say "in use" for it.
        tested += cand.bit_count()
        subs = self._subs
        tests = self._tests
        raw = cand.to_bytes((cand.bit_length() + 7) >> 3, "little")
        find = raw.translate(_NONZERO_TO_ONE).find
        i = find(1)
        if not inline:
            while i >= 0:
                for bit in _BITS[raw[i]]:
                    slot = i << 3 | bit
                    test = tests[slot]
                    if type(test) is tuple:
                        test = compile_filter(subs[slot].filter)  # type: ignore[union-attr]  # in use
                    if test(values):  # type: ignore[operator, misc]  # in use, and a tuple was replaced
                        append(subs[slot])  # type: ignore[arg-type]  # in use
                i = find(1, i + 1)
            return matched, tested
        while i >= 0:
            for bit in _BITS[raw[i]]:
                slot = i << 3 | bit
                test = tests[slot]
                if type(test) is not tuple:
                    if test(values):  # type: ignore[operator, misc]  # in use, and not a tuple: a closure
                        append(subs[slot])  # type: ignore[arg-type]  # in use
                    continue
                # Rule 4, inline: (pos, lo, hi, strict) per constrained attribute.
                j = 0
                n = len(test)
                while j < n:
                    v = vals[test[j]]  # type: ignore[call-overload]  # test[j] is a position, an int
                    lo = test[j + 1]
                    hi = test[j + 2]
                    s = test[j + 3]
                    if not lo <= v <= hi or (
                        s and ((s & _LO_STRICT and v == lo) or (s & _HI_STRICT and v == hi))  # type: ignore[operator]  # s: the flags, an int
                    ):
                        break
                    j += 4
                else:
                    append(subs[slot])  # type: ignore[arg-type]  # in use
            i = find(1, i + 1)
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
