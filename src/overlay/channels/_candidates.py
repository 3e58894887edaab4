"""An event's candidates in the subscription index: the bitmapped slots
whose rows its values select (``overlay.channels.matcher`` rules 2 and 7).

Rules this module keeps:

1. ``candidates = ALIVE ⋀_attr mask(attr)``, where an attribute's mask is
   the OR of the rows its value selects (``_buckets`` rule 2), less the row
   of the slots that exclude the value.  An attribute no bitmapped slot
   constrains is skipped, and so is one whose value has no bucket: every
   slot stays a candidate there and the exact test decides.
2. A small table is combined as cached Python ints, stopping at the first
   empty AND; a large one by numpy ufuncs into two scratch rows, a
   bucket's path gathered and ORed in one call when it is the whole mask.
3. The answer is the candidates' row as little-endian bytes (byte ``s >> 3``,
   bit ``s & 7`` is slot ``s``), which the matcher scans for set bits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from overlay.channels._buckets import _AttrIndex
from overlay.channels._plain import _ABSENT
from overlay.channels._prepared import _ALIVE
from overlay.channels._rows import WORD, Rows

__all__ = ["candidate_bits"]


def candidate_bits(table: Rows, order: tuple[_AttrIndex, ...], get: Callable[[str, object], object]) -> bytes:
    """Rules 1–3: the bitmapped candidates' bits of an event whose values
    ``get`` reads, as the bytes of a row of ``table``."""
    if table.ints is not None:
        int_of = table.int_of
        cand = int_of(_ALIVE)
        for ai in order:
            if not cand:
                break
            if not ai.constrained:
                continue
            v = get(ai.name, _ABSENT)
            if v is _ABSENT:
                rows = ai.absent_rows()
                excl = -1
            elif ai.bucketed(v):
                rows, excl = ai.mask_rows(v)
            else:
                continue
            m = 0
            for r in rows:
                m |= int_of(r)
            if excl >= 0:
                m &= ~int_of(excl)
            cand &= m
        return cand.to_bytes((cand.bit_length() + 7) >> 3, "little")
    arr = table.arr
    cand_row = arr[_ALIVE].copy()
    acc = np.empty(table.words, WORD)
    or_, and_ = np.bitwise_or, np.bitwise_and
    for ai in order:
        if not ai.constrained:
            continue
        v = get(ai.name, _ABSENT)
        if v is _ABSENT:
            rows = ai.absent_rows()
            excl = -1
        elif ai.bucketed(v):
            index = ai.mask_index(v)
            if index is not None:
                or_.reduce(arr[index], axis=0, out=acc)
                and_(cand_row, acc, out=cand_row)
                continue
            rows, excl = ai.mask_rows(v)
        else:
            continue
        if len(rows) == 1 and excl < 0:
            and_(cand_row, arr[rows[0]], out=cand_row)
            continue
        or_(arr[rows[0]], arr[rows[1]], out=acc) if len(rows) > 1 else np.copyto(acc, arr[rows[0]])
        for r in rows[2:]:
            or_(acc, arr[r], out=acc)
        if excl >= 0:
            and_(acc, np.invert(arr[excl]), out=acc)
        and_(cand_row, acc, out=cand_row)
    raw: bytes = cand_row.tobytes()
    return raw
