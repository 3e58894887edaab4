"""Languages of string predicates, decided exactly: emptiness of any conjunction
of string predicates and their negations (the string half of rule 2 of
``overlay.channels.predicates``).

Rules this module keeps:

1. Every string predicate is an automaton over characters.  A *glob* is a
   tuple of items, each a character or ``STAR`` (any run of characters, the
   empty one included), matched on characters as they are or on *folded*
   characters: ``= x`` is the glob ``x``; ``prefix x`` is ``x*``; ``suffix
   x`` is ``*x``; ``contains x`` is ``*x*``; ``ieq``/``iprefix``/``isuffix``
   are those globs folded; ``like P`` is ``P`` with each ``*`` a ``STAR``.
   ``in {…}`` is a trie of its values.  A negated predicate (``!=``,
   ``not in {…}``, ``not prefix`` …) accepts exactly the strings its
   positive form rejects.
2. ``fold`` is ``str.lower`` character by character: every character but
   one lowers to one character, and that one (``İ``, U+0130, which lowers to
   two) is kept as it is, so a folded comparison stays a comparison of
   characters and the automata stay exact.
3. The alphabet is infinite, but a character no literal names and that folds
   to no folded literal character behaves like any other such character in
   every automaton.  So the search runs over finitely many representatives:
   every literal character, every character that folds to a folded literal
   character (there are at most a handful for each), and one character that
   is none of those.  A conjunction is empty iff no word over those
   representatives is accepted by every automaton: a breadth-first search of
   the product automaton, exact.
4. The search is bounded by ``MAX_STEPS`` automaton steps (a product state
   expanded costs one step per automaton per representative character); a
   conjunction that needs more (only an adversarial pile of overlapping
   wildcards does) raises ``SchemaError`` — the parser reports it at the
   subscription, never a hang.  Inside ``search_budget(n)`` every search of
   the block draws on one budget of ``n`` steps: a parser checks a conjunct
   predicate by predicate and an expression conjunct by conjunct, so a bound
   per search alone let one subscription run hundreds of them.  Steps, not
   states: a bound of 20,000 states let twelve ``like "*a*b*"`` on one
   attribute hold a node's loop for 15 s (4.2 M steps) before refusing.
5. Results are cached by the predicates' automata: the same conjunction is
   decided once per process.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Final

from overlay.errors import SchemaError

__all__ = ["MAX_STEPS", "STAR", "Auto", "fold", "glob_auto", "is_empty", "search_budget", "set_auto"]

# Automaton steps one emptiness search — or one ``search_budget`` block — may
# take (rule 4): 0.05–0.15 s of one core; the richest filter of the tests takes 3,400.
MAX_STEPS: Final = 50_000
# The steps left in the enclosing ``search_budget`` block (a one-item list, so
# a search can draw on it), or None outside any (rule 4).
_budget: ContextVar[list[int] | None] = ContextVar("string_search_budget", default=None)
STAR: Final = None
_DOTTED_I: Final = "\u0130"


def fold(s: str) -> str:
    """Rule 2: the folded form of ``s``, character by character."""
    if _DOTTED_I not in s:
        return s.lower()
    return "".join(ch if ch == _DOTTED_I else ch.lower() for ch in s)


@functools.cache
def _preimages() -> dict[str, tuple[str, ...]]:
    """Every folded character -> the characters that fold to it (built once, ≈0.1 s)."""
    chars = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF and c != 0x130)
    lowered = chars.lower()
    assert len(lowered) == len(chars)  # rule 2: only U+0130 lowers to two characters
    out: dict[str, list[str]] = {}
    for a, b in zip(chars, lowered):
        if a != b:
            out.setdefault(b, []).append(a)
    return {k: (k, *v) if k.lower() == k else tuple(v) for k, v in out.items()}


def _folding_to(f: str) -> tuple[str, ...]:
    got = _preimages().get(f)
    if got is not None:
        return got
    return (f,) if fold(f) == f else ()


class Auto:
    """One predicate's automaton (rule 1); ``negated`` flips acceptance."""

    __slots__ = ("_key", "folded", "items", "kind", "negated", "prefixes", "words")

    def __init__(
        self,
        kind: str,
        negated: bool,
        *,
        items: tuple[str | None, ...] = (),
        folded: bool = False,
        words: frozenset[str] = frozenset(),
    ) -> None:
        self.kind = kind  # "glob" or "set"
        self.negated = negated
        self.items = items
        self.folded = folded
        self.words = words
        self.prefixes = frozenset(w[:i] for w in words for i in range(len(w) + 1)) if kind == "set" else frozenset()
        self._key = (kind, negated, items, folded, words)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Auto) and self._key == other._key

    def literal_chars(self) -> set[str]:
        if self.kind == "set":
            return {c for w in self.words for c in w}
        return {c for c in self.items if c is not None}

    # -- states: a frozenset of glob positions, or a trie prefix (None: dead) --

    def start(self) -> object:
        if self.kind == "set":
            return ""
        return self._closure((0,))

    def _closure(self, positions: Iterable[int]) -> frozenset[int]:
        items = self.items
        n = len(items)
        out = set(positions)
        stack = list(out)
        while stack:
            i = stack.pop()
            if i < n and items[i] is STAR and i + 1 not in out:
                out.add(i + 1)
                stack.append(i + 1)
        return frozenset(out)

    def step(self, state: object, ch: str, folded: str) -> object:
        if self.kind == "set":
            if state is None:
                return None
            nxt = state + ch  # type: ignore[operator]  # a trie state is a str prefix
            return nxt if nxt in self.prefixes else None
        c = folded if self.folded else ch
        items = self.items
        n = len(items)
        moved: set[int] = set()
        for i in state:  # type: ignore[attr-defined]  # a glob state is a frozenset of positions
            if i < n:
                it = items[i]
                if it is STAR:
                    moved.add(i)
                elif it == c:
                    moved.add(i + 1)
        return self._closure(moved) if moved else frozenset()

    def accepts(self, state: object) -> bool:
        if self.kind == "set":
            hit = state is not None and state in self.words
        else:
            hit = len(self.items) in state  # type: ignore[operator]  # a frozenset of positions
        return hit != self.negated

    def dead(self, state: object) -> bool:
        """No continuation can be accepted any more (only a positive automaton dies)."""
        if self.negated:
            return False
        return state is None if self.kind == "set" else not state


def glob_auto(items: Sequence[str | None], *, folded: bool = False, negated: bool = False) -> Auto:
    # Consecutive stars are one star: fewer states, the same language.
    out: list[str | None] = []
    for it in items:
        if it is STAR and out and out[-1] is STAR:
            continue
        out.append(fold(it) if folded and it is not None else it)
    return Auto("glob", negated, items=tuple(out), folded=folded)


def set_auto(words: Iterable[str], *, negated: bool = False) -> Auto:
    return Auto("set", negated, words=frozenset(words))


def _alphabet(autos: Sequence[Auto]) -> list[tuple[str, str]]:
    """Rule 3: the representative characters, each with its folded form."""
    chars: set[str] = set()
    folded_lits: set[str] = set()
    for a in autos:
        lits = a.literal_chars()
        if a.folded:
            folded_lits |= lits
        else:
            chars |= lits
    for f in folded_lits:
        chars.update(_folding_to(f))
        chars.add(f)
    # A character neither named nor folding to a folded literal: the
    # private-use plane has a free one (a literal can take only so many).
    named = chars | folded_lits
    other = next(chr(c) for c in range(0xF0000, 0xF0000 + len(named) + 2) if chr(c) not in named)
    chars.add(other)
    return [(c, fold(c)) for c in sorted(chars)]


@contextlib.contextmanager
def search_budget(steps: int = MAX_STEPS) -> Iterator[None]:
    """Rule 4: every search in the block draws on one budget of ``steps``."""
    token = _budget.set([steps])
    try:
        yield
    finally:
        _budget.reset(token)


def is_empty(autos: Iterable[Auto]) -> bool:
    """Rule 3: whether no string is accepted by every automaton."""
    return _is_empty(frozenset(autos))


@functools.lru_cache(maxsize=8192)
def _is_empty(autos_set: frozenset[Auto]) -> bool:
    autos = tuple(autos_set)
    if not autos:
        return False
    shared = _budget.get()
    limit = MAX_STEPS if shared is None else min(MAX_STEPS, shared[0])
    empty, steps = _search(autos, limit)
    if shared is not None:
        shared[0] -= steps
    if empty is None:
        raise SchemaError(
            f"these string patterns are too intricate to decide (over {MAX_STEPS:,} automaton steps): "
            "use fewer wildcards on one attribute"
        )
    return empty


def _search(autos: tuple[Auto, ...], limit: int) -> tuple[bool | None, int]:
    """Rule 3's search within ``limit`` steps: (empty, steps taken), or
    (None, steps taken) when the limit came first."""
    alphabet = _alphabet(autos)
    start = tuple(a.start() for a in autos)
    if any(a.dead(s) for a, s in zip(autos, start)):
        return True, 0
    if all(a.accepts(s) for a, s in zip(autos, start)):
        return False, 0
    cost = len(autos) * len(alphabet)  # the steps of expanding one product state
    steps = 0
    seen = {start}
    frontier = [start]
    while frontier:
        nxt: list[tuple[object, ...]] = []
        for st in frontier:
            steps += cost
            if steps > limit:
                return None, steps
            for ch, fc in alphabet:
                new = tuple(a.step(s, ch, fc) for a, s in zip(autos, st))
                if new in seen or any(a.dead(s) for a, s in zip(autos, new)):
                    continue
                if all(a.accepts(s) for a, s in zip(autos, new)):
                    return False, steps
                seen.add(new)
                nxt.append(new)
        frontier = nxt
    return True, steps
