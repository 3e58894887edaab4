"""Private parts of the subscription index: bitmaps, per-attribute buckets, and
the compact bounds of simple filters (see ``overlay.channels.matcher``)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeGuard

from overlay.channels.intervals import IntervalSet
from overlay.channels.predicates import Filter, Op, Predicate, StringConj, compile_filter, conjunction
from overlay.channels.schema import Attribute, Kind, Value, as_number, as_string
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
# Two more pseudo-buckets (rule 7 of overlay.channels.matcher): slots that
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
# The operators of the language before issue 18 (rule 8 of the matcher).
_CLASSIC_OPS: Final = frozenset(
    {Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.IN_RANGE, Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.IN_SET}
)
# Candidate extraction: bytes.translate maps every non-zero byte of the
# candidate bitmap to 1, then bytes.find (a memchr) jumps between them: far
# cheaper than a regex over mostly zero bytes when candidates are sparse.
_NONZERO_TO_ONE: Final = bytes([0]) + bytes([1]) * 255
_BITS: Final = tuple(tuple(b for b in range(8) if byte >> b & 1) for byte in range(256))
# A bitmapped slot's placement is kept as runs of codes
# ``pos * (nbuckets + 1) + bucket + 1`` packed in 4-byte unsigned ints, two
# per run, so a range costs 8 bytes however many buckets it spans.
_CODE_TYPE: Final = "I"
_NEG_INF: Final = -math.inf
_POS_INF: Final = math.inf
# Strictness flags of a plain bound (rule 4).
_LO_STRICT: Final = 1
_HI_STRICT: Final = 2
_LOWER_OPS: Final = {Op.GE: 0, Op.GT: _LO_STRICT}
_UPPER_OPS: Final = {Op.LE: 0, Op.LT: _HI_STRICT}
# Value types a plain bound compares exactly as the compiled predicate would.
_NUMBER_TYPES: Final = frozenset({int, float, bool})

MatchResult = tuple[list[Subscription], int]
_Compiled = Callable[[Mapping[str, Value]], bool]
# A plain subscription's exact test (rule 4): ``(pos, lo, hi, strict) * k``.
_Plain = tuple[object, ...]
# A single-attribute entry (rule 5): ``(lo, hi, strict, sub)``.
_Entry = tuple[Value, Value, int, Subscription]
_Bound = tuple[Value, Value, int]


class _Never:
    """The value of an attribute the event lacks: no comparison with it holds,
    as no predicate on a missing attribute does."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = object.__hash__


_NEVER: Final = _Never()
_ABSENT: Final = object()


class _Bitmap:
    """A set of slots as an integer plus pending flips (rule 6)."""

    __slots__ = ("_flips", "_int")

    def __init__(self) -> None:
        self._int = 0
        self._flips: bytearray | None = None

    def flip(self, slot: int) -> None:
        i = slot >> 3
        f = self._flips
        if f is None:
            f = self._flips = bytearray(i + 1)
        elif i >= len(f):
            f.extend(bytes(i + 1 - len(f)))
        f[i] ^= 1 << (slot & 7)

    def value(self) -> int:
        f = self._flips
        if f is not None:
            self._int ^= int.from_bytes(f, "little")
            self._flips = None
        return self._int


def _scan(entries: Iterable[_Entry], v: object, append: Callable[[Subscription], None]) -> None:
    """Rule 4 on single-attribute entries: append the subscriptions ``v`` satisfies."""
    for lo, hi, s, sub in entries:
        # v has the entries' kind (the callers check its type): strings with
        # strings, numbers with numbers — Python's comparison, inline, for speed.
        if lo <= v <= hi and not (  # type: ignore[operator]  # see the comment above
            s and ((s & _LO_STRICT and v == lo) or (s & _HI_STRICT and v == hi))
        ):
            append(sub)


class _AttrIndex:
    """Rules 1 and 5 for one attribute, the ``pos``-th of the schema.

    Invariant: every single-attribute slot on this attribute is in ``singles``
    and, unless its bound is unsatisfiable, either in ``single_eq`` under its
    value (a closed ``lo == hi``) or in the dicts of the buckets its bound
    spans (``single_wild`` when that is every bucket).  No ``single_eq`` or
    ``single_buckets`` dict is kept empty.
    """

    __slots__ = (
        "_bucket_of",
        "absent_ok",
        "attr",
        "buckets",
        "constrained",
        "discrete",
        "hi",
        "key_lens",
        "keyed",
        "lo",
        "name",
        "nbuckets",
        "ordered",
        "pos",
        "present",
        "single_buckets",
        "single_eq",
        "single_wild",
        "singles",
        "wild",
    )

    def __init__(self, attr: Attribute, pos: int, nbuckets: int) -> None:
        self.attr = attr
        self.name = attr.name
        self.pos = pos
        self.nbuckets = nbuckets
        self.wild = _Bitmap()
        self.present = _Bitmap()
        self.absent_ok = _Bitmap()
        # Rule 8: kind -> key -> slots, and kind -> key length -> keys of it.
        self.keyed: dict[str, dict[str, _Bitmap]] = {}
        self.key_lens: dict[str, dict[int, int]] = {}
        self.buckets: list[_Bitmap | None] = [None] * nbuckets
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

    # -- bitmaps (rules 1, 2) ------------------------------------------------------

    def bitmap(self, b: int) -> _Bitmap:
        if b < 0:
            return self.wild if b == _WILD else self.present if b == _PRESENT else self.absent_ok
        bm = self.buckets[b]
        if bm is None:
            bm = self.buckets[b] = _Bitmap()
        return bm

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
        if not self.ordered:
            if lo != hi:
                return []
            b = self._bucket_of(lo)
            return [(b, b)]
        lo = max(as_number(lo), self.lo)  # an ordered attribute's bounds are numbers
        hi = min(as_number(hi), self.hi)
        if lo > hi:
            return []
        first, last = self._bucket_of(lo), self._bucket_of(hi)
        if first == 0 and last == self.nbuckets - 1:
            return [(_WILD, _WILD)]
        return [(first, last)]

    def bucketed(self, value: object) -> TypeGuard[Value]:
        """Whether ``value`` has a bucket holding every slot it can satisfy
        (rule 2): the attribute's own type and, when ordered, in the domain."""
        if not self.ordered:
            return type(value) is str
        if type(value) is int or (type(value) is float and not self.discrete):
            return self.lo <= value <= self.hi
        return False

    def mask(self, value: Value) -> int:
        b = self.buckets[self._bucket_of(value)]
        w = self.wild.value() | self.present.value()
        m = w if b is None else w | b.value()
        if self.keyed:
            m = self._keyed_mask(value, m)
        return m

    def absent_mask(self) -> int:
        """The slots an event lacking this attribute can still match."""
        return self.wild.value() | self.absent_ok.value()

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
        bm = table.get(key)
        if bm is None:
            bm = table[key] = _Bitmap()
            lens[len(key)] = lens.get(len(key), 0) + 1
        bm.flip(slot)
        # Only a removal can empty a table (folding the flips costs N/8 bytes: not on every add).
        if removing and not bm.value():
            del table[key]
            n = lens[len(key)] - 1
            if n:
                lens[len(key)] = n
            else:
                del lens[len(key)]
            if not table:
                del self.keyed[kind]
                del self.key_lens[kind]

    def _keyed_mask(self, value: Value, m: int) -> int:
        """Rule 8: add the slots whose anchor the value has, drop those that
        exclude it.  A value's type was checked by ``bucketed``: a str."""
        v: str = value  # type: ignore[assignment]  # a str (bucketed)
        folded: str | None = None
        excl = 0
        for kind, table in self.keyed.items():
            if kind == _EXCL:
                bm = table.get(v)
                if bm is not None:
                    excl = bm.value()
                continue
            if kind[0] == "i":
                if folded is None:
                    folded = fold(v)
                s = folded
            else:
                s = v
            if kind == "ieq":
                bm = table.get(s)
                if bm is not None:
                    m |= bm.value()
                continue
            n = len(s)
            prefix = kind in _PREFIX_KINDS
            for k in self.key_lens[kind]:
                if k <= n:
                    bm = table.get(s[:k] if prefix else s[n - k :])
                    if bm is not None:
                        m |= bm.value()
        return m & ~excl if excl else m

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
            for b in range(first, last + 1):
                d = self.single_buckets[b]
                if d is None:
                    d = self.single_buckets[b] = {}
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
            for b in range(first, last + 1):
                bucket = self.single_buckets[b]
                assert bucket is not None
                del bucket[slot]
                if not bucket:
                    # An emptied dict keeps its table; drop it.
                    self.single_buckets[b] = None

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


def _above(a: Value, b: Value) -> bool:
    """``a > b`` for two values of one kind: two strings or two numbers."""
    if isinstance(a, str) or isinstance(b, str):
        return as_string(a) > as_string(b)
    return a > b


def _bucket_function(attr: Attribute, n: int) -> Callable[[Value], int]:
    """The bucket of a value of ``attr``'s own kind: ``bucketed``, the
    placements and ``_plain_bounds`` check the type before they ask, so the
    functions below take the value as it is (one call per event and attribute)."""
    if attr.kind is Kind.STRING:
        # crc32, not hash(): stable across processes, so bucket stats are
        # comparable; surrogatepass, so every str has bytes.
        return lambda v: zlib.crc32(v.encode("utf-8", "surrogatepass")) % n  # type: ignore[union-attr]  # a str (see above)
    lo, hi = attr.min, attr.max
    last = n - 1
    if attr.kind.discrete:
        span = int(hi) - int(lo) + 1

        def discrete_bucket(v: Value) -> int:
            i: int = (v - lo) * n // span  # type: ignore[operator, assignment]  # ints here (see above)
            return last if i > last else (0 if i < 0 else i)

        return discrete_bucket
    width = (hi - lo) / n or 1.0

    def float_bucket(v: Value) -> int:
        i = int((v - lo) / width)  # type: ignore[operator]  # a number (see above)
        return last if i > last else (0 if i < 0 else i)

    return float_bucket


def _plain_bounds(f: Filter, attrs: Mapping[str, _AttrIndex]) -> dict[str, _Bound] | None:
    """Rule 4: ``{attr: (lo, hi, strict)}`` equivalent to ``f`` for every value
    of a type in ``_NUMBER_TYPES`` (ordered) or str (strings), or None when
    some predicate has no such form."""
    bounds: dict[str, _Bound] = {}
    for p in f.predicates:
        ai = attrs.get(p.attr)
        if ai is None:
            return None
        args = p.args
        if not ai.ordered:
            if not (p.op is Op.EQ or (p.op is Op.IN_SET and len(args) == 1)):
                return None
            x = args[0]
            if type(x) is not str:
                return None
            prev = bounds.get(p.attr)
            # x <= v <= x is v == x for strings; two different = leave lo > hi,
            # which no string satisfies, as none satisfies the filter.
            bounds[p.attr] = (x, x, 0) if prev is None else (max(prev[0], x), min(prev[1], x), 0)
            continue
        # Numbers of the attribute's own kind only: a float bound on an int
        # attribute, a bool or a NaN is left to compile_filter.
        if not all(type(a) is int or (type(a) is float and not ai.discrete) for a in args):
            return None
        if any(a != a for a in args):
            return None
        lowers: tuple[tuple[int | float, int], ...]
        uppers: tuple[tuple[int | float, int], ...]
        if p.op is Op.EQ or p.op is Op.IN_RANGE:
            lowers, uppers = ((as_number(args[0]), 0),), ((as_number(args[-1]), 0),)
        elif p.op in _LOWER_OPS:
            lowers, uppers = ((as_number(args[0]), _LOWER_OPS[p.op]),), ()
        elif p.op in _UPPER_OPS:
            lowers, uppers = (), ((as_number(args[0]), _UPPER_OPS[p.op]),)
        else:
            return None
        lo, hi, strict = bounds.get(p.attr, (_NEG_INF, _POS_INF, 0))
        lo, hi = as_number(lo), as_number(hi)  # this attribute's bounds so far: numbers
        for x, s in lowers:  # the tightest lower bound; strict wins a tie
            if x > lo:
                lo, strict = x, (strict & _HI_STRICT) | s
            elif x == lo:
                strict |= s
        for x, s in uppers:
            if x < hi:
                hi, strict = x, (strict & _LO_STRICT) | s
            elif x == hi:
                strict |= s
        bounds[p.attr] = (lo, hi, strict)
    return bounds
