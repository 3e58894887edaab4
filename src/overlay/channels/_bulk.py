"""Building a channel's index in bulk: ``SubscriptionIndex.add_many``
(``overlay.channels.matcher`` rule 9) — a split, a merge, a migration or a
recovery indexing what it moved.

Rules this module keeps:

1. Fewer than ``BULK_MIN`` subscriptions are added one by one (``add``).
2. Every subscription is filed first, then the bits of all are set in a few
   numpy scatters, a chunk of ``BULK_CHUNK`` slots at a time; whatever was
   filed gets its bits even when a later subscription raises, so the
   index's invariant holds (the ones before it indexed, the rest not).
3. A plain subscription over attributes whose buckets numpy computes
   exactly (``_AttrIndex.vector``) is placed with its whole chunk
   (``_Vector``): its test (matcher rule 10's one pass when it has that
   form) is kept as it is, and the chunk's bounds become machine numbers in
   one conversion; buckets, covers (one look-up per distinct run, left in
   the layout's cache for rule 10) and wildcards are array operations, the
   same rows ``plain_packed`` gives one by one.  A bound past the float
   range keeps its side of every domain (``_clamped``).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from overlay.channels._buckets import _AttrIndex
from overlay.channels._plain import _Plain, _plain_bounds
from overlay.channels._prepared import _ALIVE, _Bitmapped, _Single
from overlay.channels._rows import Rows
from overlay.channels.predicates import Predicate
from overlay.channels.schema import Value, as_number
from overlay.channels.subscriptions import Subscription

__all__ = ["BULK_CHUNK", "BULK_MIN", "VECTOR_CHUNK", "add_many"]

# Rule 1: ``add_many`` of fewer subscriptions adds them one by one (the
# batch's numpy set-up costs about as much as a few single flips).
BULK_MIN: Final = 16
# Slots whose bits ``add_many`` sets at once: their bytes of every row
# (rows × BULK_CHUNK / 8) fit a core's cache, so the scatter hits it.
BULK_CHUNK: Final = 1024
# Plain subscriptions placed at once by ``_Vector.flush``: as BULK_CHUNK,
# their bits stay in cache (8,192 at once: 70 % slower bits, measured).
VECTOR_CHUNK: Final = 1024


class IndexLike(Protocol):
    """What the bulk build reads and calls of ``matcher.SubscriptionIndex``
    (named by its shape, so this module and the matcher do not import each
    other)."""

    _order: tuple[_AttrIndex, ...]
    _attrs: dict[str, _AttrIndex]
    _rows: Rows
    _subs: list[Subscription | None]
    _slot_of: dict[str, int]

    def add(self, sub: Subscription) -> bool: ...

    def _new_slot(self) -> int: ...

    def _ranges(self, preds: tuple[Predicate, ...], *, pack: bool = True) -> tuple[_Plain, bytes, int] | None: ...

    def _prepare(self, sub: Subscription) -> _Single | _Bitmapped: ...

    def _file(self, slot: int, sub: Subscription, prepared: _Single | _Bitmapped) -> None: ...

    def _file_plain(self, slot: int, sub: Subscription, test: _Plain) -> None: ...

    def _placed_rows(self, prepared: _Bitmapped) -> bytes: ...


class _Vector:
    """Rule 3's vectorised placement of plain subscriptions: each is filed at
    once (``add``), and ``flush`` sets the bits of all filed since in a few
    numpy operations per attribute — the buckets of their bounds, the
    canonical covers (one per distinct run), the wildcards of the attributes
    they leave out — exactly what ``plain_packed`` gives one by one."""

    def __init__(self, index: IndexLike) -> None:
        self._index = index
        # The positions of the attributes place_many takes (_AttrIndex.vector).
        self.mask = sum(1 << ai.pos for ai in index._order if ai.vector)
        self._slots = array("q")
        # The tests (matcher rule 4) of the subscriptions filed, one after the other,
        # and how many bounds each has: made machine numbers at once by flush.
        self._flat: list[object] = []
        self._counts = array("q")

    def __len__(self) -> int:
        return len(self._slots)

    def add(self, slot: int, sub: Subscription, test: _Plain) -> None:
        """File a plain subscription whose test names attributes of ``mask`` only."""
        self._index._file_plain(slot, sub, test)
        self._flat += test
        self._counts.append(len(test) >> 2)
        self._slots.append(slot)

    def flush(self) -> None:
        m = len(self._slots)
        if not m:
            return
        index = self._index
        slot_of = np.frombuffer(self._slots, np.int64).astype(np.intp)
        try:
            flat = np.array(self._flat, np.float64)
        except OverflowError:  # an int past 1e308 (an unchecked filter): only its side matters
            flat = np.array([_clamped(x) for x in self._flat], np.float64)  # type: ignore[arg-type]  # numbers
        flat = flat.reshape(-1, 4)
        pos = flat[:, 0].astype(np.intp)
        # Each bound's subscription (0..m-1), and the bounds grouped by attribute.
        owner = np.repeat(np.arange(m, dtype=np.intp), np.frombuffer(self._counts, np.int64))
        by_attr = np.argsort(pos, kind="stable")
        ends = np.cumsum(np.bincount(pos, minlength=len(index._order))).tolist()
        out_rows: list[npt.NDArray[np.intp]] = [np.full(m, _ALIVE, np.intp)]
        out_slots: list[npt.NDArray[np.intp]] = [slot_of]
        start = 0
        for ai, end in zip(index._order, ends, strict=True):
            free = np.ones(m, np.bool_)
            if end > start:
                at = by_attr[start:end]
                subs = owner[at]
                free[subs] = False
                rows, slots = ai.place_many(flat[at, 1], flat[at, 2], slot_of[subs])
                out_rows += rows
                out_slots += slots
            start = end
            # The subscriptions that leave this attribute out: its wildcards.
            out_rows.append(np.full(int(free.sum()), ai.wild, np.intp))
            out_slots.append(slot_of[free])
        index._rows.set_bits(np.concatenate(out_rows), np.concatenate(out_slots))
        self._slots = array("q")
        self._flat = []
        self._counts = array("q")


def _clamped(x: Value) -> float:
    """A number bound within float range, on the same side of every domain."""
    v = as_number(x)
    return max(-1e308, min(1e308, float(v) if abs(v) <= 1e308 else (1e308 if v > 0 else -1e308)))


def _set_bits(table: Rows, rows: array[int], slots: array[int], counts: array[int]) -> None:
    """``Rows.set_bits`` of each slot ``slots[k]`` in its ``counts[k]`` rows,
    listed one slot after the other in ``rows``."""
    if slots:
        table.set_bits(
            np.frombuffer(rows, np.int64).astype(np.intp),
            np.repeat(np.frombuffer(slots, np.int64), np.frombuffer(counts, np.int64)).astype(np.intp),
        )


def add_many(index: IndexLike, subs: Iterable[Subscription]) -> int:
    """``index.add_many``: index every new subscription of ``subs`` (rules
    1–3); how many were new.
    A subscription that cannot be placed raises, the ones before it
    indexed and the rest not."""
    batch = subs if isinstance(subs, list | tuple) else list(subs)
    if len(batch) < BULK_MIN:
        return sum(index.add(s) for s in batch)
    # Every (row, slot) pair to set, as machine ints (a list of millions
    # of Python ints takes longer to convert than to build), set a chunk
    # of slots at a time: the chunk's bytes of every row stay in cache.
    # A plain subscription over vectorisable attributes (_AttrIndex.vector)
    # leaves its bounds to ``_Vector``: its buckets, covers and wildcards
    # are worked out for the whole chunk in numpy.
    rows = array("q")
    slots = array("q")
    counts = array("q")
    vec = _Vector(index)
    table = index._rows
    # One growth, not one per doubling, with the headroom growth would
    # leave (Rows rule 4): the next single add must not copy every row.
    need = len(index._subs) + len(batch)
    table.ensure(need + need // 4)
    attrs = index._attrs
    vector = vec.mask
    added = 0
    try:
        for sub in batch:
            if sub.id in index._slot_of:
                continue
            ranges = index._ranges(sub.filter.predicates, pack=False)
            if ranges is None:
                # Not matcher rule 10's form, but perhaps plain (two bounds on one
                # attribute merged, a string's =): its test, by position.
                plain = _plain_bounds(sub.filter, attrs)
                if plain is not None and len(plain) > 1:
                    test: list[object] = []
                    for name, bound in plain.items():
                        test += (attrs[name].pos, *bound)
                    mask = sum(1 << attrs[name].pos for name in plain)
                    ranges = (tuple(test), b"", mask)
            if ranges is not None and not ranges[2] & ~vector:
                vec.add(index._new_slot(), sub, ranges[0])
            else:
                prepared = index._prepare(sub)
                slot = index._new_slot()
                index._file(slot, sub, prepared)
                if type(prepared) is _Bitmapped:
                    placed_rows = index._placed_rows(prepared)
                    rows.frombytes(placed_rows)
                    slots.append(slot)
                    counts.append(len(placed_rows) >> 3)
            added += 1
            if len(slots) >= BULK_CHUNK:
                _set_bits(table, rows, slots, counts)
                rows, slots, counts = array("q"), array("q"), array("q")
            if len(vec) >= VECTOR_CHUNK:
                vec.flush()
    finally:
        # Whatever was filed gets its bits, so the invariant holds even
        # when a later subscription raised.
        _set_bits(table, rows, slots, counts)
        vec.flush()
    return added
