"""overlay.channels._rows: bitmaps as rows of one growable table, and the bucket tree of _tree."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.channels import _rows
from overlay.channels._rows import PACKED, Rows
from overlay.channels._tree import FANOUT, _cover, _path, tree_levels, tree_rows

pytestmark = pytest.mark.timeout(60)


def members(table: Rows, r: int) -> set[int]:
    raw = table.row(r).tobytes()
    return {i * 8 + b for i, byte in enumerate(raw) for b in range(8) if byte >> b & 1}


@pytest.mark.parametrize("small", [True, False])
def test_flips_packed_or_not_set_bits_and_growth_keep_every_row_exact(
    monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    if not small:
        monkeypatch.setattr(_rows, "SMALL_WORDS", 0)  # rule 5 off: numpy reads only
    rng = random.Random(7)
    table = Rows(5)
    want: dict[int, set[int]] = {r: set() for r in range(5)}
    for slot in range(700):  # past 64 slots, and past the doubling
        table.ensure(slot)
        rows = rng.sample(range(5), rng.randint(1, 5))
        if slot % 2:
            table.flip(rows, slot)
        else:  # the same rows packed (matcher rule 10)
            table.flip_packed(array(PACKED, rows).tobytes(), slot)
        for r in rows:
            want[r].symmetric_difference_update({slot})
        if slot % 97 == 0:
            assert all(members(table, r) == want[r] for r in want)
            if small:
                assert all(table.int_of(r) == sum(1 << s for s in want[r]) for r in want)
    table.ensure(2000)
    new = list(range(700, 2001))
    pairs = [(r, s) for s in new for r in rng.sample(range(5), rng.randint(0, 5))]
    table.set_bits(np.array([r for r, _ in pairs], np.intp), np.array([s for _, s in pairs], np.intp))
    for r, s in pairs:
        want[r].add(s)
    assert all(members(table, r) == want[r] for r in want)
    assert table.capacity >= 2001


def test_alloc_reuses_released_rows_and_grows_the_table() -> None:
    table = Rows(2)
    extra = [table.alloc() for _ in range(9)]
    assert extra == list(range(2, 11))
    table.flip([extra[3]], 5)
    table.flip([extra[3]], 5)  # zero again
    table.release(extra[3])
    assert table.alloc() == extra[3]
    assert not members(table, extra[3])


@pytest.mark.parametrize("nbuckets", [1, 2, 3, 4, 5, 16, 17, 64, 100])
def test_the_cover_of_every_run_is_exactly_its_buckets(nbuckets: int) -> None:
    levels = tree_levels(nbuckets)
    assert FANOUT**levels >= nbuckets and (levels == 1 or FANOUT ** (levels - 1) < nbuckets)
    # Which leaves each node of the block holds: a node is on the path of its leaves.
    leaves_of: dict[int, set[int]] = {}
    for b in range(FANOUT**levels):
        for node in _path(levels, b):
            leaves_of.setdefault(node, set()).add(b)
    assert set(leaves_of) == set(range(tree_rows(levels)))
    for first in range(nbuckets):
        for last in range(first, nbuckets):
            nodes = _cover(levels, first, last)
            covered = [b for n in nodes for b in leaves_of[n]]
            assert sorted(covered) == list(range(first, last + 1))  # exact, and disjoint
            # Canonical: at most 2 (FANOUT - 1) nodes a level.
            assert len(nodes) <= 2 * (FANOUT - 1) * levels


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4096), st.data())
def test_a_bucket_is_in_a_run_iff_its_path_meets_the_runs_cover(nbuckets: int, data: st.DataObject) -> None:
    levels = tree_levels(nbuckets)
    first = data.draw(st.integers(0, nbuckets - 1))
    last = data.draw(st.integers(first, nbuckets - 1))
    b = data.draw(st.integers(0, nbuckets - 1))
    hits = set(_cover(levels, first, last)) & set(_path(levels, b))
    assert len(hits) == (1 if first <= b <= last else 0)
