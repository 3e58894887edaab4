"""The reference matcher: every subscription of a channel tested against
every event (``overlay.channels.matcher``).

Rules this module keeps:

1. ``LinearMatcher`` tests each subscription with its filter's exact test
   (``compile_filter``): what it matches is right by construction, and the
   indexed matcher is checked against it (``tests/test_matcher.py``).
2. Its cost is every subscription, every time: the baseline of
   ``bench/matching.py``.
3. Its interface is the indexed matcher's (``add``, ``remove``, ``match``,
   ``len``, iteration); ``add`` of an id it holds changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from overlay.channels.predicates import compile_filter
from overlay.channels.schema import Schema, Value
from overlay.channels.subscriptions import Subscription

__all__ = ["LinearMatcher", "MatchResult"]

# What a matcher's ``match`` returns: the subscriptions matched, and how many were tested.
MatchResult = tuple[list[Subscription], int]


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
