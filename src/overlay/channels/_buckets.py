"""The per-attribute part of the subscription index
(``overlay.channels.matcher``): one ``_AttrIndex`` per attribute of the
schema, owning its rows of the index's table (``overlay.channels._rows``),
its keyed tables and its single-attribute entries.  The buckets and their
tree are ``overlay.channels._tree``'s, a plain subscription's bounds
``overlay.channels._plain``'s.  In the comments below, "rule N" is the
matcher's.

Rules this module keeps:

1. An attribute owns four kinds of rows: ``wild`` (the slots that do not
   constrain it), the pseudo-buckets ``present`` and ``absent_ok`` (matcher
   rule 7), and the block of its bucket tree (``_tree`` rule 2).  A slot is
   placed in runs of buckets, coded ``pos * stride + bucket + _CODE_OFFSET``
   so that each pseudo-bucket (``_WILD``, ``_PRESENT``, ``_ABSENT_OK``) has
   a code of its own.
2. An event's value selects ``wild | path(bucket(value))``, with
   ``present`` and the keyed rows its value finds when there are any, less
   the row of the slots that exclude it (matcher rules 2, 7, 8); an absent
   attribute selects ``wild | absent_ok``.  Whether a value has a bucket is
   ``bucketed``'s to say; one without (the wrong type, outside the domain)
   narrows nothing: every slot stays a candidate there.
3. A keyed row exists while a slot is in it: it is allocated with its first
   slot and released, all zero, with its last (matcher rule 8).
4. A single-attribute entry (matcher rule 5) sits in ``singles`` and in one
   dict per bucket its bound spans — in the order entries came, which a
   node's notifications follow — or, for an ``=``, in the dict of its value;
   no such dict is kept empty.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeGuard

import numpy as np
import numpy.typing as npt

from overlay.channels._plain import _NUMBER_TYPES, _above, _Bound, _Entry, _scan
from overlay.channels._rows import Rows
from overlay.channels._tree import (
    _PACKED_MAX,
    _bucket_function,
    _cover_rows,
    _cover_store,
    _pack,
    _packed_covers,
    _paths,
    tree_levels,
    tree_rows,
)
from overlay.channels.intervals import IntervalSet
from overlay.channels.predicates import Op, Predicate, StringConj, compile_filter, conjunction
from overlay.channels.schema import Attribute, Kind, Value, as_number
from overlay.channels.strings import fold
from overlay.channels.subscriptions import Subscription

# Buckets per attribute.  More buckets prune better (a range over a few
# percent of a domain spills less into partly covered buckets, fewer values
# of an = share one) but cost up to one N/8-byte bitmap each, and a
# single-attribute range one dict entry per bucket it spans (rule 5).  At 256
# a 100k-subscription channel of four attributes takes under 500 bytes per
# subscription in all, and 512 buckets gain little more speed
# (bench/matching.py measures both).
DEFAULT_BUCKETS: Final = 256
_WILD: Final = -1
# Two more pseudo-buckets (rule 7): slots that
# need the attribute present but no bucket narrows (``exists``, anything-but,
# a pattern without an anchor), and slots that need it absent (``not exists``).
_PRESENT: Final = -2
_ABSENT_OK: Final = -3
# Placement codes are ``pos * stride + bucket + _CODE_OFFSET`` (stride:
# nbuckets + _CODE_OFFSET), so every pseudo-bucket has a code of its own.
_CODE_OFFSET: Final = 3
# Keyed tables of a string attribute (rule 8): the kinds looked up by the
# event value's prefixes, by its suffixes, by the value itself, and the
# anything-but exclusions.
_PREFIX_KINDS: Final = ("prefix", "iprefix")
_SUFFIX_KINDS: Final = ("suffix", "isuffix")
_EXCL: Final = "excl"
# The operators of the language before issue 18 (rule 7).
_CLASSIC_OPS: Final = frozenset(
    {Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.IN_RANGE, Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.IN_SET}
)
# A bitmapped slot's placement is kept as runs of codes
# ``pos * (nbuckets + 1) + bucket + 1`` packed in 4-byte unsigned ints, two
# per run, so a range costs 8 bytes however many buckets it spans.
_CODE_TYPE: Final = "I"
# ``_AttrIndex.ranged``: (pos, 1 << pos, discrete, min, max, span, width,
# nbuckets, packed covers, the index).
Ranged = tuple[int, int, bool, Value, Value, int, float, int, dict[int, bytes], "_AttrIndex"]


class _AttrIndex:
    """Rules 1 and 5 for one attribute, the ``pos``-th of the schema.

    Invariant: rows ``wild``, ``present``, ``absent_ok`` and the tree's block
    from ``tree`` (``tree_rows(levels)`` rows) of ``rows`` are this
    attribute's; ``n_present``/``n_absent_ok`` count the slots in the two
    pseudo-bucket rows.  Every single-attribute slot on this attribute is in
    ``singles`` and, unless its bound is unsatisfiable, either in
    ``single_eq`` under its value (a closed ``lo == hi``) or in the dicts of
    the buckets its bound spans (``single_wild`` when
    that is every bucket).  No ``single_eq`` or ``single_buckets`` dict is kept
    empty.
    """

    __slots__ = (
        "_bucket_of",
        "absent_ok",
        "attr",
        "constrained",
        "discrete",
        "hi",
        "key_lens",
        "keyed",
        "levels",
        "lo",
        "n_absent_ok",
        "n_present",
        "name",
        "nbuckets",
        "np_paths",
        "ordered",
        "packed",
        "paths",
        "pos",
        "present",
        "ranged",
        "rel_paths",
        "rows",
        "single_buckets",
        "single_eq",
        "single_wild",
        "singles",
        "span",
        "tree",
        "vector",
        "width",
        "wild",
    )

    def __init__(self, attr: Attribute, pos: int, nbuckets: int, rows: Rows, base: int) -> None:
        self.attr = attr
        self.name = attr.name
        self.pos = pos
        self.nbuckets = nbuckets
        self.rows = rows
        self.wild = base
        self.present = base + 1
        self.absent_ok = base + 2
        self.tree = base + 3
        self.n_present = 0
        self.n_absent_ok = 0
        self.levels = tree_levels(nbuckets)
        self.rel_paths, self.paths, self.np_paths = _paths(self.levels, nbuckets, self.tree)
        self.packed = _packed_covers(self.tree, self.levels, nbuckets)
        # Rule 8: kind -> key -> [row, slots in it], and kind -> key length -> keys of it.
        self.keyed: dict[str, dict[str, list[int]]] = {}
        self.key_lens: dict[str, dict[int, int]] = {}
        self.constrained = 0  # bitmapped slots whose filter names this attribute
        self.ordered = attr.kind.ordered
        self.discrete = attr.kind.discrete
        self.lo = attr.min
        self.hi = attr.max
        self.singles: dict[int, _Entry] = {}
        self.single_eq: dict[Value, dict[int, _Entry]] = {}
        self.single_wild: dict[int, _Entry] = {}
        self.single_buckets: list[dict[int, _Entry] | None] = [None] * nbuckets
        self._bucket_of = _bucket_function(attr, nbuckets)
        # An integer domain's width, for plain_packed's bucket arithmetic
        # (0: ask _bucket_of).
        self.span = (
            attr.max - attr.min + 1 if attr.kind.discrete and type(attr.min) is int and type(attr.max) is int else 0
        )
        # A float domain's bucket width, as float_bucket's (0.0: not a float).
        self.width = ((attr.max - attr.min) / nbuckets or 1.0) if attr.kind is Kind.FLOAT else 0.0
        # What the matcher's one-pass add (its rule 10) reads of an ordered
        # attribute, in one tuple: unpacking it costs less than the loads.
        self.ranged: Ranged | None = (
            (pos, 1 << pos, self.discrete, self.lo, self.hi, self.span, self.width, nbuckets, self.packed, self)
            if self.ordered
            else None
        )
        # Whether place_many computes this attribute's buckets exactly as
        # _bucket_of does (rule 9 of the matcher): an ordered domain of
        # float64-exact numbers, and for integers no overflow of int64 in
        # ``(v - lo) * nbuckets``.
        self.vector = self.ordered and (
            not self.discrete
            or (
                max(abs(int(attr.min)), abs(int(attr.max))) < 1 << 53
                and (int(attr.max) - int(attr.min) + 1) * nbuckets < 1 << 62
            )
        )

    @staticmethod
    def rows_needed(nbuckets: int) -> int:
        """Rows of the table one attribute takes: three pseudo-buckets and the tree."""
        return 3 + tree_rows(tree_levels(nbuckets))

    # -- bitmaps (rules 1, 2) ------------------------------------------------------

    def run_rows(self, first: int, last: int, delta: int) -> list[int]:
        """The rows of a run of buckets (a pseudo-bucket's own row); ``delta``
        (+1 placing, -1 removing) keeps the pseudo-bucket counts."""
        if first < 0:
            if first == _WILD:
                return [self.wild]
            if first == _PRESENT:
                self.n_present += delta
                return [self.present]
            self.n_absent_ok += delta
            return [self.absent_ok]
        return list(_cover_rows(self.tree, self.levels, first, last))

    def plain_packed(self, lo: Value, hi: Value) -> bytes:
        """The rows of ``plain_run`` of a plain bound (none when no value of
        the domain is in it), packed (``Rows.flip_packed``): the path of every
        range subscription, so it is ``plain_run`` inline and one look-up of
        the run's cover, shared by every index of this layout."""
        if self.ordered:
            # An ordered attribute's bounds are numbers (_plain_bounds made
            # them): compared and bucketed as they are.
            if lo < self.lo:  # type: ignore[operator]  # numbers (see above)
                lo = self.lo
            if hi > self.hi:  # type: ignore[operator]  # numbers (see above)
                hi = self.hi
            if lo > hi:  # type: ignore[operator]  # numbers (see above)
                return b""
        elif lo != hi:
            return b""
        n = self.nbuckets
        span = self.span
        if span:
            # discrete_bucket inline (lo and hi are in the domain now).
            base = self.lo
            key: int = (lo - base) * n // span * n + (hi - base) * n // span  # type: ignore[operator, assignment]  # ints (span)
        else:
            bucket_of = self._bucket_of
            key = bucket_of(lo) * n + bucket_of(hi)
        packed = self.packed.get(key)
        if packed is None:
            first, last = divmod(key, self.nbuckets)
            if first == 0 and last == self.nbuckets - 1:
                packed = _pack((self.wild,))
            else:
                packed = _pack(_cover_rows(self.tree, self.levels, first, last))
            if len(self.packed) >= _PACKED_MAX:
                self.packed.clear()
            self.packed[key] = packed
        return packed

    def place_many(
        self, lo: npt.NDArray[np.float64], hi: npt.NDArray[np.float64], slots: npt.NDArray[np.intp]
    ) -> tuple[list[npt.NDArray[np.intp]], list[npt.NDArray[np.intp]]]:
        """``plain_packed`` of many bounds at once (an attribute with
        ``vector``): the (rows, slots) pairs of all, as arrays."""
        n = self.nbuckets
        lo = np.maximum(lo, float(self.lo))
        hi = np.minimum(hi, float(self.hi))
        ok = lo <= hi
        # A bound wholly past the domain (not ok: dropped below) is brought
        # inside it, so its bucket arithmetic stays in machine range.
        lo = np.minimum(lo, float(self.hi))
        hi = np.maximum(hi, float(self.lo))
        if self.discrete:
            base, span = int(self.lo), int(self.hi) - int(self.lo) + 1
            first = (lo.astype(np.int64) - base) * n // span
            last = (hi.astype(np.int64) - base) * n // span
        else:
            width = (float(self.hi) - float(self.lo)) / n or 1.0
            first = ((lo - float(self.lo)) / width).astype(np.int64)
            last = ((hi - float(self.lo)) / width).astype(np.int64)
        first = np.clip(first, 0, n - 1)
        last = np.clip(last, 0, n - 1)
        whole = ok & (first == 0) & (last == n - 1)
        part = ok & ~whole
        rows = [np.full(int(whole.sum()), self.wild, np.intp)]
        out = [slots[whole]]
        keys = first[part] * n + last[part]
        if len(keys):
            distinct, which = np.unique(keys, return_inverse=True)
            store = _cover_store(self.levels, n)
            keys_list = distinct.tolist()
            starts, lens = store.spans(keys_list)
            each = lens[which]
            total = int(each.sum())
            # Entry j of the output: the row, within its cover, of the bound it expands.
            begin = np.cumsum(each) - each
            at = np.arange(total, dtype=np.intp) - np.repeat(begin, each) + np.repeat(starts[which], each)
            data = np.frombuffer(store.data, np.int64)
            # The runs met here, packed for single adds and removals too
            # (plain_packed): a bulk-built index's next add finds its covers.
            packed = self.packed
            if len(packed) + len(keys_list) <= _PACKED_MAX:
                tree = self.tree
                for k, start, length in zip(keys_list, starts.tolist(), lens.tolist(), strict=True):
                    if k not in packed:
                        packed[k] = (data[start : start + length] + tree).tobytes()
            rows.append(data[at] + self.tree)
            del data  # an array with a view on it cannot grow
            out.append(np.repeat(slots[part], each))
        return rows, out

    def mask_rows(self, value: Value) -> tuple[list[int], int]:
        """The rows whose union holds the slots ``value`` can satisfy here
        (rule 2, an event carrying it), and the row of the slots it excludes
        (rule 8; -1 for none)."""
        rows = [self.wild, *self.paths[self._bucket_of(value)]]
        if self.n_present:
            rows.append(self.present)
        if self.keyed:
            return self._keyed_rows(value, rows)
        return rows, -1

    def mask_index(self, value: Value) -> npt.NDArray[np.intp] | None:
        """``mask_rows`` as a numpy index when it is the bucket's path alone
        (nothing present-only or keyed here); None otherwise."""
        if self.n_present or self.keyed:
            return None
        return self.np_paths[self._bucket_of(value)]

    def absent_rows(self) -> list[int]:
        """The rows of the slots an event lacking this attribute can still match."""
        return [self.wild, self.absent_ok] if self.n_absent_ok else [self.wild]

    def placement(self, conj: IntervalSet | StringConj | None) -> list[tuple[int, int]]:
        """The runs of buckets a slot goes in (``[(_WILD, _WILD)]`` for a wildcard)."""
        if conj is None or conj.is_whole():
            return [(_WILD, _WILD)]
        if conj.is_empty():
            return []
        if isinstance(conj, StringConj):
            if conj.finite is None:
                return [(_WILD, _WILD)]
            # Only a str can equal an event's str value, the only kind bucketed.
            hit = {self._bucket_of(v) for v in conj.finite if type(v) is str}
            return [(b, b) for b in sorted(hit)]
        runs: list[tuple[int, int]] = []
        for iv in conj.intervals:
            first, last = self._bucket_of(iv.lo), self._bucket_of(iv.hi)
            if runs and first <= runs[-1][1] + 1:
                first = runs.pop()[0]
            runs.append((first, last))
        if runs == [(0, self.nbuckets - 1)]:
            return [(_WILD, _WILD)]
        return runs

    def plain_placement(self, lo: Value, hi: Value) -> list[tuple[int, int]]:
        """Buckets of a plain bound (rule 4) without building ``L``: every value
        of the domain in ``[lo, hi]`` falls in them (strictness is ignored: a
        superset is enough, the exact test decides)."""
        run = self.plain_run(lo, hi)
        return [] if run is None else [run]

    def plain_run(self, lo: Value, hi: Value) -> tuple[int, int] | None:
        """``plain_placement`` as its one run, or None when it has none."""
        if not self.ordered:
            if lo != hi:
                return None
            b = self._bucket_of(lo)
            return (b, b)
        # An ordered attribute's bounds are numbers (_plain_bounds made them).
        lo = as_number(lo)
        hi = as_number(hi)
        if lo < self.lo:
            lo = self.lo
        if hi > self.hi:
            hi = self.hi
        if lo > hi:
            return None
        first, last = self._bucket_of(lo), self._bucket_of(hi)
        if first == 0 and last == self.nbuckets - 1:
            return (_WILD, _WILD)
        return (first, last)

    def bucketed(self, value: object) -> TypeGuard[Value]:
        """Whether ``value`` has a bucket holding every slot it can satisfy
        (rule 2): the attribute's own type and, when ordered, in the domain."""
        if not self.ordered:
            return type(value) is str
        if type(value) is int or (type(value) is float and not self.discrete):
            return self.lo <= value <= self.hi
        return False

    # -- keyed tables of a string attribute (rule 8) -----------------------------

    def bitmapped_placement(self, preds: tuple[Predicate, ...]) -> tuple[list[tuple[int, int]], list[tuple[str, str]]]:
        """Where a bitmapped slot constraining this attribute by ``preds`` goes:
        bucket runs (pseudo-buckets included) and keyed-table entries.  A
        superset of the values satisfying ``preds``: the exact test decides."""
        conj = conjunction(preds, self.attr)
        if all(p.op in _CLASSIC_OPS for p in preds):
            # The language before issue 18, placed exactly as it always was:
            # an event's cost (what the index tests) drives balancing, and a
            # cluster's behaviour must not change under its old subscriptions.
            return self.placement(conj), []
        if all(p.op is Op.NOT_EXISTS for p in preds):
            return [(_ABSENT_OK, _ABSENT_OK)], []
        if conj.is_empty():
            return [], []
        if isinstance(conj, StringConj) and conj.finite is None:
            anchor = _anchor(preds)
            keys = [anchor] if anchor is not None else []
            # Anything-but: the slot is out for an event carrying an excluded value.
            for p in preds:
                if p.op is Op.NE or p.op is Op.NOT_IN_SET:
                    keys += [(_EXCL, x) for x in p.args if type(x) is str]
            return ([] if anchor is not None else [(_PRESENT, _PRESENT)]), keys
        runs = self.placement(conj)
        if runs == [(_WILD, _WILD)]:
            return [(_PRESENT, _PRESENT)], []  # constrained, so the attribute must be there
        return runs, []

    def flip_key(self, kind: str, key: str, slot: int, *, removing: bool) -> None:
        table = self.keyed.setdefault(kind, {})
        lens = self.key_lens.setdefault(kind, {})
        entry = table.get(key)
        if entry is None:
            entry = table[key] = [self.rows.alloc(), 0]
            lens[len(key)] = lens.get(len(key), 0) + 1
        self.rows.flip([entry[0]], slot)
        entry[1] += -1 if removing else 1
        if not entry[1]:
            # Every slot flipped out: the row is zero again, and goes back.
            self.rows.release(entry[0])
            del table[key]
            n = lens[len(key)] - 1
            if n:
                lens[len(key)] = n
            else:
                del lens[len(key)]
            if not table:
                del self.keyed[kind]
                del self.key_lens[kind]

    def _keyed_rows(self, value: Value, rows: list[int]) -> tuple[list[int], int]:
        """Rule 8: add the rows of the slots whose anchor the value has, and
        name the row of those that exclude it.  A value's type was checked by
        ``bucketed``: a str."""
        v: str = value  # type: ignore[assignment]  # a str (bucketed)
        folded: str | None = None
        excl = -1
        for kind, table in self.keyed.items():
            if kind == _EXCL:
                entry = table.get(v)
                if entry is not None:
                    excl = entry[0]
                continue
            if kind[0] == "i":
                if folded is None:
                    folded = fold(v)
                s = folded
            else:
                s = v
            if kind == "ieq":
                entry = table.get(s)
                if entry is not None:
                    rows.append(entry[0])
                continue
            n = len(s)
            prefix = kind in _PREFIX_KINDS
            for k in self.key_lens[kind]:
                if k <= n:
                    entry = table.get(s[:k] if prefix else s[n - k :])
                    if entry is not None:
                        rows.append(entry[0])
        return rows, excl

    # -- single-attribute entries (rule 5) ---------------------------------------

    def single_runs(self, bound: _Bound) -> list[tuple[int, int]] | None:
        """The bucket runs of a single-attribute entry; None for an ``=`` entry
        (it lives in ``single_eq``), ``[]`` when no value satisfies it."""
        lo, hi, strict = bound
        if lo == hi and not strict:
            return None
        if _above(lo, hi) or (lo == hi and strict):
            return []
        return self.plain_placement(lo, hi)

    def add_single(self, slot: int, bound: _Bound, runs: list[tuple[int, int]] | None, sub: Subscription) -> None:
        """File an entry where ``single_runs(bound)`` (that is ``runs``) says."""
        entry: _Entry = (*bound, sub)
        self.singles[slot] = entry
        if runs is None:
            self.single_eq.setdefault(bound[0], {})[slot] = entry
            return
        for first, last in runs:
            if first == _WILD:
                self.single_wild[slot] = entry
                continue
            # One dict per bucket, not per tree node: an event scans one dict,
            # in the order its entries came (what a node's notifications, and
            # so the simulation's golden traces, follow); a dict entry is cheap
            # to add, unlike the bit of a whole bitmap was.
            buckets = self.single_buckets
            for b in range(first, last + 1):
                d = buckets[b]
                if d is None:
                    d = buckets[b] = {}
                d[slot] = entry

    def remove_single(self, slot: int) -> None:
        lo, hi, strict, _ = self.singles.pop(slot)
        bound = (lo, hi, strict)
        runs = self.single_runs(bound)
        if runs is None:
            d = self.single_eq[bound[0]]
            del d[slot]
            if not d:
                del self.single_eq[bound[0]]
            return
        for first, last in runs:
            if first == _WILD:
                del self.single_wild[slot]
                continue
            buckets = self.single_buckets
            for b in range(first, last + 1):
                bucket = buckets[b]
                assert bucket is not None
                del bucket[slot]
                if not bucket:
                    # An emptied dict keeps its table; drop it.
                    buckets[b] = None

    def match_singles(self, v: object, values: Mapping[str, Value], append: Callable[[Subscription], None]) -> int:
        """Rule 5 for an event whose value here is ``v``; returns the number tested."""
        if self.bucketed(v):
            tested = 0
            eq = self.single_eq.get(v) if self.single_eq else None
            if eq:
                tested += len(eq)
                _scan(eq.values(), v, append)
            if not self.ordered:
                return tested  # a plain string bound is an = (or unsatisfiable)
            d = self.single_buckets[self._bucket_of(v)]
            if d:
                tested += len(d)
                _scan(d.values(), v, append)
            if self.single_wild:
                tested += len(self.single_wild)
                _scan(self.single_wild.values(), v, append)
            return tested
        # No bucket for v: every entry here is a candidate.
        if (type(v) in _NUMBER_TYPES) if self.ordered else (type(v) is str):
            _scan(self.singles.values(), v, append)
        else:
            for *_, sub in self.singles.values():
                if compile_filter(sub.filter)(values):
                    append(sub)
        return len(self.singles)


def _anchor(preds: tuple[Predicate, ...]) -> tuple[str, str] | None:
    """Rule 8: the keyed-table entry a string conjunction is filed under — its
    ``ieq`` value, else its longest literal prefix or suffix (``prefix``,
    ``suffix``, ``iprefix``, ``isuffix``, a ``like`` pattern's text before its
    first or after its last ``*``); None when it has none."""
    best: tuple[str, str] | None = None
    for p in preds:
        if not p.args or type(p.args[0]) is not str:
            continue
        x = p.args[0]
        cands: list[tuple[str, str]] = []
        match p.op:
            case Op.IEQ:
                return ("ieq", fold(x))
            case Op.PREFIX:
                cands.append(("prefix", x))
            case Op.SUFFIX:
                cands.append(("suffix", x))
            case Op.IPREFIX:
                cands.append(("iprefix", fold(x)))
            case Op.ISUFFIX:
                cands.append(("isuffix", fold(x)))
            case Op.LIKE:
                head, _, rest = x.partition("*")
                cands.append(("prefix", head))
                cands.append(("suffix", rest.rpartition("*")[2]))
        for c in cands:
            if c[1] and (best is None or len(c[1]) > len(best[1])):
                best = c
    return best
