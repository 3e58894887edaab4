"""A subscription ready to file in the index: what
``SubscriptionIndex._prepare`` works out before it changes anything
(``overlay.channels.matcher``), so that a raising add leaves the index as
it was.

Rules this module keeps:

1. A subscription is prepared either as a ``_Single`` (matcher rule 5: a
   plain bound on one attribute, filed in that attribute's dicts) or as a
   ``_Bitmapped`` (every other: a slot in rows of the table).
2. A prepared subscription is only read: filing it (``_file``) copies what
   it holds into the index.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from overlay.channels._plain import _Bound, _Compiled, _Plain

if TYPE_CHECKING:
    from overlay.channels._buckets import _AttrIndex

__all__ = ["_ALIVE", "_Bitmapped", "_Single"]

# Row 0 of the index's table: the slots of bitmapped subscriptions (matcher rule 1).
_ALIVE: Final = 0


class _Single:
    """A single-attribute subscription ready to file (matcher rule 5)."""

    __slots__ = ("ai", "bound", "runs")

    def __init__(self, ai: _AttrIndex, bound: _Bound, runs: list[tuple[int, int]] | None) -> None:
        self.ai = ai
        self.bound = bound
        self.runs = runs


class _Bitmapped:
    """A bitmapped subscription ready to file: its runs (``_PLAIN``: read
    from its plain test), its exact test, its keyed-table entries, its rows
    packed (``Rows.flip_packed``; None: read them from ``placed``) and the
    attributes it constrains."""

    __slots__ = ("keys", "names", "placed", "rows", "test")

    def __init__(
        self,
        placed: bytes,
        test: _Plain | _Compiled,
        keys: tuple[tuple[int, str, str], ...],
        rows: bytes | None,
        names: Iterable[str],
    ) -> None:
        self.placed = placed
        self.test = test
        self.keys = keys
        self.rows = rows
        self.names = names
