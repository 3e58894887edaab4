"""Matching an event against a channel's subscriptions, and what it cost.

``SubscriptionIndex`` is a bucketed bitmap index, the counting algorithm done
with whole-word operations instead of per-predicate counters, plus
per-bucket dicts for the subscriptions that constrain a single attribute:

1. Each subscription holds a *slot*.  For each attribute the index keeps one
   bitmap of the slots that do not constrain it (*wildcards*) and, over the
   buckets of the attribute's domain, the bitmaps of a tree: each node of
   level ``l`` spans ``FANOUT ** (L - l)`` adjacent buckets, a leaf one.  A
   slot whose predicates on the attribute can be satisfied by some value of
   a run of buckets is in the nodes of the run's canonical cover (whole
   parents replace their children): ~10 nodes for half of 256 buckets,
   where one bitmap per bucket took 128 flips.  Ordered attributes cut
   ``[min, max]`` into equal-width buckets; strings hash into buckets, with
   patterns (prefix, suffix, contains, !=) counted as wildcards.
2. For an event, ``candidates = ⋀_attr (wildcards | ⋁ path(bucket(value)))``
   — the OR of the L nodes above the value's bucket (covers are disjoint, so
   a slot is in exactly one of them when its run holds the bucket, in none
   otherwise), a few whole-bitmap operations per attribute in C.  Attributes no bitmapped
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
6. The bitmaps are rows of one table per index (``overlay.channels._rows``):
   adding or removing a subscription flips its slot's bit in its rows in
   place, one numpy scatter; an event's rows are combined by numpy ufuncs,
   or as cached Python ints while the table is small.  Flips are exact
   because a slot's bit is only set when it is clear and cleared when it is
   set (the invariant below).
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

9. ``add_many`` (a bulk build: a split, a merge, a migration or a recovery
   indexing what it moved) files every subscription, then sets all their
   bits in a few numpy scatters (``overlay.channels._bulk``, whose rules
   say how): the same rows ``add`` gives one by one.  A plain
   subscription's rows are not stored: ``remove`` works them out again from
   its exact test (rule 4), as ``add`` did.
10. A single ``add`` of a conjunction of comparisons on two or more ordered
   attributes, one predicate each (most range subscriptions), is worked out
   in one pass (``_ranges``): its test (rule 4) and its rows *packed* —
   native ints in bytes (``Rows.flip_packed``), the cover of each run from a
   cache shared by every index of the layout, the wildcards of the
   attributes it leaves out looked up eight attributes at a time — then set
   in one scatter.  Its removal reads the same packed rows back from its
   test.  Python work per predicate is what an insert costs at 100k
   subscriptions (``bench/matching.py``, research workload), so nothing is
   built per row and nothing is called per predicate.

The order of the matched subscriptions is unspecified.  ``LinearMatcher``
tests every subscription; it is the reference the index is checked against
and the baseline of ``bench/matching.py``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from overlay.channels.predicates import Predicate, compile_filter
from overlay.channels.schema import Schema, Value
from overlay.channels.subscriptions import Subscription
from overlay.errors import LocalProtocolError

__all__ = ["BULK_MIN", "DEFAULT_BUCKETS", "LinearMatcher", "MatchResult", "SubscriptionIndex"]

from overlay.channels._buckets import _CODE_OFFSET, _CODE_TYPE, _WILD, DEFAULT_BUCKETS, _AttrIndex
from overlay.channels._bulk import BULK_MIN, add_many
from overlay.channels._candidates import candidate_bits
from overlay.channels._plain import (
    _ABSENT,
    _EQ,
    _GE,
    _GT,
    _HI_STRICT,
    _IN_RANGE,
    _LE,
    _LO_STRICT,
    _LT,
    _NEG_INF,
    _NEVER,
    _NUMBER_TYPES,
    _POS_INF,
    _Compiled,
    _Plain,
    _plain_bounds,
)
from overlay.channels._prepared import _ALIVE, _Bitmapped, _Single
from overlay.channels._rows import Rows
from overlay.channels._tree import _pack, wild_tables
from overlay.channels.linear import LinearMatcher, MatchResult

# Candidate extraction: bytes.translate maps every non-zero byte of the
# candidate bitmap to 1, then bytes.find (a memchr) jumps between them: far
# cheaper than a regex over mostly zero bytes when candidates are sparse.
_NONZERO_TO_ONE: Final = bytes([0]) + bytes([1]) * 255
_BITS: Final = tuple(tuple(b for b in range(8) if byte >> b & 1) for byte in range(256))
# ``_placed`` of a plain subscription (rule 4): its rows are read from its test.
_PLAIN: Final = b""
_ALIVE_PACKED: Final = _pack((_ALIVE,))


class SubscriptionIndex:
    """The indexed matcher of one channel.

    Invariant: ``_subs[slot]`` is set exactly for the slots in use.  A slot in
    use is either *bitmapped* — in row ``_ALIVE`` and in exactly the rows
    named by the runs ``_placed[slot]`` (their tree covers, rule 1) — or
    *single* (rule 5: ``_placed[slot]`` is None, its entry is in
    ``_order[pos]``'s dicts where ``pos`` is ``_tests[slot][0]``).
    ``_tests[slot]`` is its exact test (rule 4).  Free slots are in no row and
    no dict.
    """

    def __init__(self, schema: Schema, nbuckets: int = DEFAULT_BUCKETS) -> None:
        if nbuckets < 1:
            raise LocalProtocolError(f"an index needs at least one bucket, got {nbuckets}")
        self.schema = schema
        self._stride = nbuckets + _CODE_OFFSET
        per_attr = _AttrIndex.rows_needed(nbuckets)
        self._rows = Rows(1 + per_attr * len(schema.attributes))
        self._attrs = {
            name: _AttrIndex(attr, pos, nbuckets, self._rows, 1 + pos * per_attr)
            for pos, (name, attr) in enumerate(schema.attributes.items())
        }
        self._order = tuple(self._attrs.values())
        # The packed wildcard rows of the attributes a subscription leaves out.
        self._wild_tables = wild_tables(tuple(ai.wild for ai in self._order))
        # Rule 10: the ordered attributes' ``ranged``, by name and by position.
        self._ranged = {ai.name: ai.ranged for ai in self._order if ai.ranged is not None}
        self._ranged_at = tuple(ai.ranged for ai in self._order)
        self._bitmapped = 0
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
        slot = len(self._subs) - 1
        self._rows.ensure(slot)
        return slot

    def _plain_rows(self, test: _Plain, delta: int) -> bytes:
        """The rows of a plain subscription, packed, from its exact test (rule
        4): the same ``plain_packed`` worked out when it was added.  ``delta``
        (-1 removing) goes to the counts of the attributes it constrains."""
        order = self._order
        ranged_at = self._ranged_at
        parts = [_ALIVE_PACKED]
        mask = 0
        for j in range(0, len(test), 4):
            pos: int = test[j]  # type: ignore[assignment]  # (pos, lo, hi, strict)
            lo = test[j + 1]
            hi = test[j + 2]
            mask |= 1 << pos
            ranged = ranged_at[pos]
            if ranged is None:  # a string's =
                ai = order[pos]
                ai.constrained += delta
                parts.append(ai.plain_packed(lo, hi))  # type: ignore[arg-type]  # (pos, lo, hi, strict)
                continue
            _, _, _, dlo, dhi, span, width, n, covers, ai = ranged
            ai.constrained += delta
            # plain_packed inline, as in _ranges.
            if lo < dlo:  # type: ignore[operator]  # numbers: an ordered attribute's plain bound
                lo = dlo
            if hi > dhi:  # type: ignore[operator]  # numbers (see above)
                hi = dhi
            if lo > hi:  # type: ignore[operator]  # numbers (see above)
                continue
            if span:
                packed = covers.get((lo - dlo) * n // span * n + (hi - dlo) * n // span)  # type: ignore[operator, arg-type]  # ints (span)
            elif width:  # float_bucket inline
                first = int((lo - dlo) / width)  # type: ignore[operator]  # numbers
                last = int((hi - dlo) / width)  # type: ignore[operator]  # numbers
                packed = covers.get((first if first < n else n - 1) * n + (last if last < n else n - 1))
            else:
                packed = None
            parts.append(ai.plain_packed(lo, hi) if packed is None else packed)  # type: ignore[arg-type]  # numbers (see above)
        for table in self._wild_tables:
            parts.append(table[mask & 255])
            mask >>= 8
        return b"".join(parts)

    def _rows_of(self, placed: bytes, delta: int) -> list[int]:
        """The rows of the runs ``placed`` (their tree covers), ``_ALIVE`` first."""
        codes = array(_CODE_TYPE)
        codes.frombytes(placed)
        stride = self._stride
        order = self._order
        rows = [_ALIVE]
        for k in range(0, len(codes), 2):
            pos, first = divmod(codes[k], stride)
            rows += order[pos].run_rows(first - _CODE_OFFSET, codes[k + 1] - pos * stride - _CODE_OFFSET, delta)
        return rows

    def _flip_keys(self, slot: int, keys: tuple[tuple[int, str, str], ...], *, removing: bool = False) -> None:
        order = self._order
        for pos, kind, key in keys:
            order[pos].flip_key(kind, key, slot, removing=removing)

    def _prepare(self, sub: Subscription) -> _Single | _Bitmapped:
        """Everything ``add`` needs to file ``sub``, worked out before any change
        (so a raising add leaves the index as it was)."""
        f = sub.filter
        plain = _plain_bounds(f, self._attrs)
        if plain is not None and len(plain) == 1:
            ((name, bound),) = plain.items()
            ai = self._attrs[name]
            return _Single(ai, bound, ai.single_runs(bound))
        test: _Plain | _Compiled
        stride = self._stride
        codes: list[int] = []
        if plain is not None:
            # The common case, kept lean (every subscription of a range
            # workload comes here): the rows are worked out with the codes.
            flat: list[object] = []
            parts = [_ALIVE_PACKED]
            mask = 0
            attrs = self._attrs
            for name, bound in plain.items():
                ai = attrs[name]
                pos = ai.pos
                flat += (pos, *bound)
                mask |= 1 << pos
                parts.append(ai.plain_packed(bound[0], bound[1]))
            for table in self._wild_tables:
                parts.append(table[mask & 255])
                mask >>= 8
            return _Bitmapped(_PLAIN, tuple(flat), (), b"".join(parts), plain)
        keys: list[tuple[int, str, str]] = []
        names = f.attrs()
        for ai in self._order:
            if ai.name in names:
                runs, ai_keys = ai.bitmapped_placement(f.on(ai.name))
                keys += [(ai.pos, kind, key) for kind, key in ai_keys]
            else:
                runs = [(_WILD, _WILD)]
            for first, last in runs:
                codes += (ai.pos * stride + first + _CODE_OFFSET, ai.pos * stride + last + _CODE_OFFSET)
        test = compile_filter(f)
        return _Bitmapped(array(_CODE_TYPE, codes).tobytes(), test, tuple(keys), None, names)

    def _ranges(self, preds: tuple[Predicate, ...], *, pack: bool = True) -> tuple[_Plain, bytes, int] | None:
        """Rule 10: the exact test, the packed rows (with ``pack``; else
        ``b""``) and the mask of the attribute positions of a conjunction of
        comparisons (``= < <= > >= in[]``) on two or more ordered attributes,
        one each; None for anything else (``_prepare`` decides it then).  The
        same test ``_plain_bounds`` and the same rows ``plain_packed`` give,
        in one pass: most subscriptions of a range workload come here."""
        if len(preds) < 2:
            return None
        info = self._ranged
        flat: list[object] = []
        parts = [_ALIVE_PACKED]
        mask = 0
        for p in preds:
            ranged = info.get(p.attr)
            if ranged is None:
                return None
            pos, bit, discrete, dlo, dhi, span, width, n, covers, ai = ranged
            op = p.op
            args = p.args
            if op is _IN_RANGE:
                try:
                    lo, hi = args
                except ValueError:  # an unchecked filter's odd arity
                    return None
                t = type(hi)
                if t is not int and (t is not float or discrete or hi != hi):
                    return None
                s = 0
            elif len(args) != 1:
                return None
            elif op is _EQ:
                lo = hi = args[0]
                s = 0
            elif op is _GE or op is _GT:
                lo, hi, s = args[0], _POS_INF, (0 if op is _GE else _LO_STRICT)
            elif op is _LE or op is _LT:
                lo, hi, s = _NEG_INF, args[0], (0 if op is _LE else _HI_STRICT)
            else:
                return None
            # Numbers of the attribute's own kind only (as _plain_bounds):
            # a float on an int attribute, a bool or a NaN is not plain.
            x = args[0]
            t = type(x)
            if t is not int and (t is not float or discrete or x != x):
                return None
            if mask & bit:
                return None  # two on one attribute: _plain_bounds merges them
            mask |= bit
            flat += (pos, lo, hi, s)
            if not pack:
                continue
            # plain_packed inline (a call and its loads cost as much as the
            # rest): clipped to the domain, an integer run's cover looked up.
            if lo < dlo:  # type: ignore[operator]  # numbers (checked above)
                lo = dlo
            if hi > dhi:  # type: ignore[operator]  # numbers (checked above)
                hi = dhi
            if lo > hi:  # type: ignore[operator]  # numbers (checked above)
                continue  # no value of the domain: in no row of this attribute
            if span:
                packed = covers.get((lo - dlo) * n // span * n + (hi - dlo) * n // span)  # type: ignore[operator, arg-type]  # ints (span)
            elif width:  # float_bucket inline
                first = int((lo - dlo) / width)  # type: ignore[operator]  # numbers
                last = int((hi - dlo) / width)  # type: ignore[operator]  # numbers
                packed = covers.get((first if first < n else n - 1) * n + (last if last < n else n - 1))
            else:
                packed = None
            parts.append(ai.plain_packed(lo, hi) if packed is None else packed)
        if not pack:
            return tuple(flat), b"", mask
        constrained = mask
        for table in self._wild_tables:
            parts.append(table[mask & 255])
            mask >>= 8
        return tuple(flat), b"".join(parts), constrained

    def add(self, sub: Subscription) -> bool:
        """Index ``sub``; False (and no change) if its id is already here.

        Everything that can fail (placing an odd unchecked filter) is worked
        out before the first change, so a raising add leaves the index as it was.
        """
        if sub.id in self._slot_of:
            return False
        ranges = self._ranges(sub.filter.predicates)
        if ranges is not None:
            slot = self._new_slot()
            self._file_plain(slot, sub, ranges[0])
            self._rows.flip_packed(ranges[1], slot)
            return True
        prepared = self._prepare(sub)
        slot = self._new_slot()
        self._file(slot, sub, prepared)
        if type(prepared) is _Bitmapped:
            self._rows.flip_packed(self._placed_rows(prepared), slot)
        return True

    def _file_plain(self, slot: int, sub: Subscription, test: _Plain) -> None:
        """``_file`` of a plain subscription on two or more attributes (rule 10)."""
        order = self._order
        for j in range(0, len(test), 4):
            order[test[j]].constrained += 1  # type: ignore[call-overload]  # test[j]: a position
        self._placed[slot] = _PLAIN
        self._tests[slot] = test
        self._bitmapped += 1
        self._subs[slot] = sub
        self._slot_of[sub.id] = slot

    def _placed_rows(self, prepared: _Bitmapped) -> bytes:
        """The rows a prepared bitmapped subscription goes in, packed."""
        rows = prepared.rows
        return _pack(self._rows_of(prepared.placed, +1)) if rows is None else rows

    def _file(self, slot: int, sub: Subscription, prepared: _Single | _Bitmapped) -> None:
        """Record a prepared subscription in ``slot``, all but its bits."""
        if type(prepared) is _Single:
            ai, bound = prepared.ai, prepared.bound
            ai.add_single(slot, bound, prepared.runs, sub)
            self._tests[slot] = (ai.pos, *bound)
        else:
            assert type(prepared) is _Bitmapped
            keys = prepared.keys
            if keys:
                self._flip_keys(slot, keys)
                self._keys[slot] = keys
            for name in prepared.names:
                named = self._attrs.get(name)
                if named is not None:
                    named.constrained += 1
            self._placed[slot] = prepared.placed
            self._tests[slot] = prepared.test
            self._bitmapped += 1
        self._subs[slot] = sub
        self._slot_of[sub.id] = slot

    def add_many(self, subs: Iterable[Subscription]) -> int:
        """Index every new subscription of ``subs`` (rule 9, ``_bulk``); how
        many were new.  A subscription that cannot be placed raises, the ones
        before it indexed and the rest not."""
        return add_many(self, subs)

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
        elif placed is _PLAIN:
            test = self._tests[slot]
            assert type(test) is tuple
            self._rows.flip_packed(self._plain_rows(test, -1), slot)
            self._bitmapped -= 1
        else:
            self._rows.flip(self._rows_of(placed, -1), slot)
            keys = self._keys.pop(slot, None)
            if keys:
                self._flip_keys(slot, keys, removing=True)
            for name in sub.filter.attrs():
                ai = self._attrs.get(name)
                if ai is not None:
                    ai.constrained -= 1
            self._bitmapped -= 1
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
        get = values.get
        # The event's values by attribute position, for the plain tests.
        vals: list[object] = [_NEVER] * len(self._order)
        inline = True
        for ai in self._order:
            v = get(ai.name, _ABSENT)
            if v is _ABSENT:
                continue
            if (type(v) in _NUMBER_TYPES) if ai.ordered else (type(v) is str):
                vals[ai.pos] = v
            else:
                inline = False
            if ai.singles:
                tested += ai.match_singles(v, values, append)
        if not self._bitmapped:
            return matched, tested
        raw = candidate_bits(self._rows, self._order, get)
        # Every bitmapped candidate goes through exactly one exact test below.
        # A candidate's slot is in use (the class invariant): its subscription
        # is set and its test is a closure or a plain tuple (rule 4).  The
        # loops index by slot without re-checking that, for speed; the ignores
        # below say "in use" for it.
        subs = self._subs
        tests = self._tests
        find = raw.translate(_NONZERO_TO_ONE).find
        i = find(1)
        if not inline:
            while i >= 0:
                for bit in _BITS[raw[i]]:
                    tested += 1
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
                tested += 1
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
