"""Bitmaps of slots as the rows of one growable table (``overlay.channels.matcher`` rule 6).

1. A ``Rows`` table is ``rows × words`` little-endian 64-bit words in one
   numpy array: row ``r`` is a set of slots, slot ``s`` its bit ``s & 63`` of
   word ``s >> 6`` (byte ``s >> 3``, bit ``s & 7`` of the row's bytes, which
   is how the matcher reads candidates back).
2. Bits change in place: flipping one slot in every row a subscription is
   placed in is one numpy scatter over those rows' bytes, O(rows), whatever
   the number of slots.  (A Python integer per bitmap, the earlier design, is
   immutable: each change copied the whole ``N/8`` bytes of every bitmap it
   touched, ~1,300 of them per range subscription at 256 buckets.)
   ``flip_packed`` takes the rows as native ints packed in bytes, joined
   from cached pieces: numpy reads them without converting a list.
3. A bulk change sets the bits of many new slots at once (``set_bits``): one
   ``bitwise_or.at`` over every (row, slot) pair — what a migration, a split
   or a recovery does when it builds an index.
4. Capacity grows by doubling (by a quarter past ``GROW_SLOWER`` words a
   row), in slots (words per row) and in rows (the
   keyed rows of ``_buckets`` rule 3 come and go, ``alloc``/``release``):
   O(1) amortised per slot or row; a released row is all zero and reused.
5. Reading: numpy ufuncs on ``row(r)`` views for a large table.  A small one
   (at most ``SMALL_WORDS`` words a row) keeps a Python ``int`` per row,
   cached until a flip touches the row: a numpy call costs a microsecond
   even on one word, an ``&`` of two small ints a tenth of that, and most
   channels hold few subscriptions (the node's hot path matches there).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["PACKED", "SMALL_WORDS", "WORD", "Rows"]

# Little-endian whatever the machine, so a row's bytes (rule 1) read the same.
WORD: Final = np.dtype("<u8")
# Rule 5: up to 4,096 slots a row is read as Python ints (re-reading a row
# after a flip then costs under a microsecond: int.from_bytes of 512 bytes).
SMALL_WORDS: Final = 64

# Rule 4: words a row holds before growth slows from doubling to +25 %
# (65,536 slots: 8 KiB a row).
GROW_SLOWER: Final = 1024

Words = npt.NDArray[np.uint64]
# ``array``'s code of the packed row numbers ``flip_packed`` takes.
PACKED: Final = "q"
# A slot's bit within its byte, as numpy scalars made once (making one costs
# about as much as the scatter of a short flip).
_BIT: Final = tuple(np.uint8(1 << b) for b in range(8))


class Rows:
    """A table of bitmaps (rule 1).  Invariant: ``flat`` is the byte view of
    ``arr``; a row on the free list is all zero; with ``ints`` (rule 5), an
    entry that is not None equals its row."""

    __slots__ = ("_free", "_rowbytes", "arr", "flat", "ints", "nrows", "words")

    def __init__(self, nrows: int) -> None:
        self.nrows = nrows  # rows handed out: the first ``nrows`` at creation
        self.words = 1
        self._free: list[int] = []
        self.arr: Words = np.zeros((max(nrows, 1), 1), WORD)
        self.flat = self.arr.view(np.uint8).reshape(-1)
        self._rowbytes = 8
        self.ints: list[int | None] | None = [None] * self.arr.shape[0] if SMALL_WORDS >= 1 else None

    @property
    def capacity(self) -> int:
        """Slots a row holds now."""
        return self.words * 64

    def _resize(self, rows: int, words: int) -> None:
        arr: Words = np.zeros((rows, words), WORD)
        old = self.arr
        arr[: old.shape[0], : old.shape[1]] = old
        self.arr = arr
        self.flat = arr.view(np.uint8).reshape(-1)
        self.words = words
        self._rowbytes = words * 8
        if words > SMALL_WORDS:
            self.ints = None
        elif self.ints is not None:
            self.ints += [None] * (rows - len(self.ints))

    def ensure(self, slot: int) -> None:
        """Room for ``slot`` in every row (rule 4)."""
        if slot >= self.words * 64:
            words = self.words
            # Doubling while small; past GROW_SLOWER words a quarter more
            # (still O(1) amortised), so a big table wastes less.
            grown = words * 2 if words < GROW_SLOWER else words + words // 4
            self._resize(self.arr.shape[0], max(grown, (slot >> 6) + 1))

    def alloc(self) -> int:
        """A zero row of one's own (rule 4)."""
        if self._free:
            return self._free.pop()
        if self.nrows >= self.arr.shape[0]:
            self._resize(self.arr.shape[0] * 2, self.words)
        self.nrows += 1
        return self.nrows - 1

    def release(self, row: int) -> None:
        """Give back a row whose slots were all flipped out (it is zero)."""
        self._free.append(row)

    def flip(self, rows: list[int], slot: int) -> None:
        """Flip ``slot`` in each of ``rows`` (distinct rows; rule 2)."""
        byte = slot >> 3
        bit = _BIT[slot & 7]
        if len(rows) == 1:
            self.flat[rows[0] * self._rowbytes + byte] ^= bit
        else:
            at = np.array(rows, np.intp)
            at *= self._rowbytes
            at += byte
            self.flat[at] ^= bit
        ints = self.ints
        if ints is not None:
            for r in rows:
                ints[r] = None

    def flip_packed(self, rows: bytes, slot: int) -> None:
        """``flip`` of rows packed as native 64-bit ints (``PACKED``): one
        ``frombuffer`` where a list took a conversion per row (rule 2)."""
        at = np.frombuffer(rows, np.int64) * self._rowbytes
        at += slot >> 3
        self.flat[at] ^= _BIT[slot & 7]
        ints = self.ints
        if ints is not None:
            for r in memoryview(rows).cast(PACKED):
                ints[r] = None

    def set_bits(self, rows: npt.NDArray[np.intp], slots: npt.NDArray[np.intp]) -> None:
        """Set bit ``slots[k]`` in row ``rows[k]`` for every ``k`` (rule 3): the
        bits must be clear (new slots); pairs may share a byte."""
        if not len(rows):
            return
        at = rows * self._rowbytes + (slots >> 3)
        bit = slots & 7
        # One pass per bit position: slots sharing a byte differ there, and a
        # slot's rows are distinct, so within a pass no byte comes twice and
        # a plain scatter does (ufunc.at, for repeated bytes, is far slower).
        flat = self.flat
        for b in range(8):
            where = at[bit == b]
            flat[where] |= np.uint8(1 << b)
        if self.ints is not None:
            self.ints = [None] * len(self.ints)

    def row(self, r: int) -> Words:
        view: Words = self.arr[r]
        return view

    def int_of(self, r: int) -> int:
        """Row ``r`` as a Python int (a small table only, rule 5)."""
        ints = self.ints
        assert ints is not None
        v = ints[r]
        if v is None:
            v = ints[r] = int.from_bytes(self.arr[r].tobytes(), "little")
        return v
