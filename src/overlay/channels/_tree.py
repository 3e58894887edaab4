"""The buckets of an attribute's domain and the tree of bitmaps over them
(``overlay.channels.matcher`` rules 1 and 2; the rows are in
``overlay.channels._rows``, the attributes in ``overlay.channels._buckets``).

Rules this module keeps:

1. A value of an attribute's own kind falls in one of ``n`` buckets
   (``_bucket_function``): an ordered domain is cut into equal-width buckets
   over ``[min, max]`` (integers by integer arithmetic, exactly), a value
   past either end in the first or the last; a string by its crc32, stable
   across processes, so bucket statistics compare.
2. Over the buckets of an attribute sits a tree: a node of level ``l``
   covers ``FANOUT ** (L - l)`` adjacent buckets, a leaf one.  A run of
   buckets is the few nodes of its canonical cover (``_cover``: whole
   parents replace their children) and a bucket's path the ``L`` nodes
   above it (``_path``): a run holds a bucket exactly when one node of its
   cover is on the bucket's path.
3. Covers, paths and wildcard tables depend on the layout alone (levels,
   buckets, the tree's first row): they are cached and shared by every index
   of one layout, read only but for the packed covers an attribute fills
   (``_AttrIndex.plain_packed``, ``place_many``).  Every cache is bounded
   (``_COVER_CACHE``, ``_ROWS_CACHE``, ``_PACKED_MAX``, ``_STORE_MAX``).
4. Rows travel packed, native ints in bytes (``_pack``), as
   ``Rows.flip_packed`` reads them.
"""

from __future__ import annotations

import functools
import zlib
from array import array
from collections.abc import Callable, Iterable
from typing import Final

import numpy as np
import numpy.typing as npt

from overlay.channels._rows import PACKED
from overlay.channels.schema import Attribute, Kind, Value

__all__ = ["FANOUT", "tree_levels", "tree_rows", "wild_tables"]


# The bucket tree (rule 2): each node of level l covers FANOUT**(L-l)
# adjacent buckets, the leaves (level L) one each.  A range of buckets is
# the few nodes of its canonical cover — ~10 for half of 256 buckets where a
# flat layout took 128 — and an event ORs the L nodes on its bucket's path.
# 4 balances the two: 2 halves the ORs' share of a cover but doubles the path,
# 16 halves the path but doubles the cover (bench/matching.py, research).
FANOUT: Final = 4
# Distinct (levels, first, last) covers remembered: all of them for 256
# buckets (32,896), and a bound for odd bucket counts.
_COVER_CACHE: Final = 1 << 16
# Covers as absolute rows, (tree, levels, first, last): one look-up per
# placed range instead of a cover and a shift; ~300 bytes an entry at most.
_ROWS_CACHE: Final = 1 << 15


def tree_levels(nbuckets: int) -> int:
    """L: the levels below the root, FANOUT**L >= nbuckets (padded leaves hold no value)."""
    levels = 1
    while FANOUT**levels < nbuckets:
        levels += 1
    return levels


def _level_base(levels: int, level: int) -> int:
    """Row of the first node of ``level`` (1..L) within the tree's block."""
    return sum(FANOUT**k for k in range(1, level))


def tree_rows(levels: int) -> int:
    return _level_base(levels, levels + 1)


@functools.lru_cache(maxsize=_COVER_CACHE)
def _cover(levels: int, first: int, last: int) -> tuple[int, ...]:
    """The canonical cover of leaves ``first..last``: the fewest tree nodes
    (rows within the block) whose leaves are exactly those — whole parents
    replace their children, level by level from the leaves up."""
    out: list[int] = []
    lo, hi = first, last + 1  # half-open, at the current level
    for level in range(levels, 0, -1):
        base = _level_base(levels, level)
        up_lo, up_hi = -(-lo // FANOUT), hi // FANOUT
        if level == 1 or up_lo >= up_hi:
            out += range(base + lo, base + hi)
            break
        out += range(base + lo, base + up_lo * FANOUT)
        out += range(base + up_hi * FANOUT, base + hi)
        lo, hi = up_lo, up_hi
    return tuple(out)


@functools.lru_cache(maxsize=_ROWS_CACHE)
def _cover_rows(tree: int, levels: int, first: int, last: int) -> tuple[int, ...]:
    """``_cover`` shifted to a tree's block of rows starting at ``tree``."""
    return tuple(tree + r for r in _cover(levels, first, last))


# Packed covers (``Rows.flip_packed``) one tree layout keeps before it
# starts again: ~100 bytes each, a few MiB at most.
_PACKED_MAX: Final = 1 << 15


@functools.lru_cache(maxsize=64)
def _packed_covers(tree: int, levels: int, nbuckets: int) -> dict[int, bytes]:
    """Run ``first * nbuckets + last`` -> its cover's rows, packed: filled by
    ``_AttrIndex.plain_packed`` and shared by every index of one layout, so a
    new channel starts with the covers its predecessors worked out."""
    return {}


def _pack(rows: Iterable[int]) -> bytes:
    return array(PACKED, rows).tobytes()


@functools.lru_cache(maxsize=16)
def wild_tables(wilds: tuple[int, ...]) -> tuple[tuple[bytes, ...], ...]:
    """The wildcard rows of the attributes a plain subscription leaves out,
    packed, looked up 8 attributes at a time: entry ``m`` of table ``c`` holds
    the rows ``wilds[8c + i]`` of every bit ``i`` *clear* in ``m`` (``m``: the
    constrained attributes among the chunk's eight).  One look-up per 8
    attributes, where a test per attribute took a microsecond at 20."""
    tables = []
    for c in range(0, len(wilds), 8):
        chunk = wilds[c : c + 8]
        tables.append(tuple(_pack(w for i, w in enumerate(chunk) if not m >> i & 1) for m in range(256)))
    return tuple(tables)


# Rows a _CoverStore keeps before it starts again (8 MiB of int64).
_STORE_MAX: Final = 1 << 20


class _CoverStore:
    """The covers of one tree layout (levels, buckets) as spans of one array,
    for ``place_many``: a run's cover is looked up once per bulk, not
    expanded in Python per subscription.  Bounded by ``_STORE_MAX`` rows."""

    def __init__(self, levels: int, nbuckets: int) -> None:
        self.levels = levels
        self.nbuckets = nbuckets
        self.where: dict[int, tuple[int, int]] = {}
        self.data = array("q")

    def spans(self, keys: list[int]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """(starts, lengths) in ``data`` of the covers of runs ``first * nbuckets + last``."""
        if len(self.data) + len(keys) * 2 * FANOUT * self.levels > _STORE_MAX:
            self.where, self.data = {}, array("q")
        where, data, n, levels = self.where, self.data, self.nbuckets, self.levels
        starts: list[int] = []
        lens: list[int] = []
        for k in keys:
            w = where.get(k)
            if w is None:
                c = _cover(levels, k // n, k % n)
                w = where[k] = (len(data), len(c))
                data.extend(c)
            starts.append(w[0])
            lens.append(w[1])
        return np.array(starts, np.intp), np.array(lens, np.intp)


@functools.lru_cache(maxsize=16)
def _cover_store(levels: int, nbuckets: int) -> _CoverStore:
    return _CoverStore(levels, nbuckets)


def _path(levels: int, leaf: int) -> tuple[int, ...]:
    """The nodes (rows within the block) above and at ``leaf``, root excluded."""
    return tuple(_level_base(levels, lv) + leaf // FANOUT ** (levels - lv) for lv in range(1, levels + 1))


_Paths = tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[npt.NDArray[np.intp]]]


@functools.lru_cache(maxsize=64)
def _paths(levels: int, nbuckets: int, tree: int) -> _Paths:
    """Every bucket's path: as nodes of the block, as rows, and as a numpy
    index of those rows led by the wildcards' (``tree - 3``) — one
    gather-and-OR per attribute and event in a large table.  Shared by every
    index of one layout (read only), so a new channel does not build them."""
    rel = [_path(levels, b) for b in range(nbuckets)]
    absolute = [tuple(tree + r for r in p) for p in rel]
    wild = tree - 3
    return rel, absolute, [np.array((wild, *p), np.intp) for p in absolute]


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
            # int(): a plain bound of a subscription may be a float (x > 2.5 on
            # an int attribute), and a float bucket breaks the compiled build,
            # which checks this function's ``-> int`` where it is called.
            i = int((v - lo) * n // span)  # type: ignore[operator]  # numbers here (see above)
            return last if i > last else (0 if i < 0 else i)

        return discrete_bucket
    width = (hi - lo) / n or 1.0

    def float_bucket(v: Value) -> int:
        i = int((v - lo) / width)  # type: ignore[operator]  # a number (see above)
        return last if i > last else (0 if i < 0 else i)

    return float_bucket
