"""Subscriptions of the extended filter language, kept in disjunctive normal form.

A subscription is ``F1 or F2 or …``, each ``Fi`` a conjunction of predicates
(``overlay.channels.predicates.Filter``).  The parser
(``overlay.channels.expressions``) builds it from any mix of ``and``, ``or``,
``not`` and parentheses.

Rules this module keeps:

1. An ``Expression`` holds 1 to ``MAX_CONJUNCTS`` conjuncts, each
   satisfiable, no two equal, in the order the expansion produced them; an
   event matches it iff it matches some conjunct.
2. Logic is three-valued, as SQL's with NULL (Kleene's): a predicate on an
   attribute the event lacks is *unknown*, ``not`` of unknown is unknown, and
   an event matches only what is *true*.  So ``not price < 10`` is ``price >=
   10``: it holds only when ``price`` is present — SNS's and EventBridge's
   anything-but.  ``exists a`` and ``not exists a`` are never unknown.  De
   Morgan's laws and double negation hold in this logic, so pushing every
   ``not`` down to a predicate (``Predicate.negated``) and distributing
   ``and`` over ``or`` change nothing an event matches.
3. ``includes(a, b)`` — every event matching ``b`` matches ``a`` — is exact:
   for each conjunct ``B`` of ``b``, no event satisfies ``B`` while ``a`` is
   not true.  A predicate ``p`` is not true iff its attribute is absent (when
   it is not distinguishing) or ``p``'s negation holds (``exists`` and ``not
   exists`` negate each other); ``a`` is not true iff one predicate of each of
   its conjuncts is.  A backtracking search over those choices, pruned by
   satisfiability (``predicates.satisfiable``), decides it; past
   ``MAX_INCLUDE_STEPS`` steps, or past one budget of string steps
   (``strings`` rule 4) for them all, it answers False (a scope then
   refuses: the safe side).
4. ``overlaps(a, b)``: some conjunct of ``a`` and some conjunct of ``b`` are
   jointly satisfiable.
5. On the wire a subscription travels as its text (``Subscribe.expression``,
   and in captures); between nodes each conjunct travels as its own
   ``Filter`` under a subscription id of its own (``node.sessions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from overlay.channels.predicates import Filter, Op, Predicate, satisfiable
from overlay.channels.schema import Schema, Value
from overlay.channels.strings import search_budget
from overlay.errors import SchemaError

__all__ = ["MAX_CONJUNCTS", "MAX_INCLUDE_STEPS", "Expression"]

# Conjuncts after expansion: each is stored and routed as a subscription of
# its own, so ``(a or b) and (c or d) and …`` must not grow without bound.
MAX_CONJUNCTS: Final = 64
# Rule 3's search budget.
MAX_INCLUDE_STEPS: Final = 100_000


class Expression(msgspec.Struct, frozen=True, array_like=True):
    """``F1 ∨ … ∨ Fn`` (rule 1)."""

    conjuncts: tuple[Filter, ...]

    def matches(self, values: Mapping[str, Value]) -> bool:
        return any(f.matches(values) for f in self.conjuncts)

    def text(self, schema: Schema | None = None) -> str:
        if len(self.conjuncts) == 1:
            return self.conjuncts[0].text(schema)
        return " or ".join(f"({f.text(schema)})" for f in self.conjuncts)

    def predicate_count(self) -> int:
        return sum(len(f.predicates) for f in self.conjuncts)

    def overlaps(self, other: Expression, schema: Schema) -> bool:
        """Rule 4."""
        return any(satisfiable((*a.predicates, *b.predicates), schema) for a in self.conjuncts for b in other.conjuncts)

    def includes(self, other: Expression, schema: Schema) -> bool:
        """Rule 3: every event matching ``other`` matches ``self``."""
        budget = [MAX_INCLUDE_STEPS]
        # One string budget for the whole search (strings rule 4): up to
        # MAX_INCLUDE_STEPS satisfiability checks, each a search of its own,
        # held a node's loop; past it, or a search too intricate, False.
        with search_budget():
            for b in other.conjuncts:
                try:
                    if _escapes(list(b.predicates), self.conjuncts, 0, schema, budget):
                        return False
                except (_OverBudget, SchemaError):
                    return False
        return True


class _OverBudget(Exception):
    pass


def _not_true(p: Predicate, schema: Schema) -> list[Predicate]:
    """Rule 3: the ways ``p`` can fail to be true on an event."""
    if p.op is Op.EXISTS or p.op is Op.NOT_EXISTS:
        return [p.negated()]
    out = [p.negated()]
    if not schema.is_da(p.attr):
        out.append(Predicate(p.attr, Op.NOT_EXISTS, ()))
    return out


def _escapes(preds: list[Predicate], conjuncts: tuple[Filter, ...], i: int, schema: Schema, budget: list[int]) -> bool:
    """Some event satisfies ``preds`` and none of ``conjuncts[i:]``."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _OverBudget
    if not satisfiable(preds, schema):
        return False
    if i == len(conjuncts):
        return True
    for p in conjuncts[i].predicates:
        for alt in _not_true(p, schema):
            preds.append(alt)
            try:
                if _escapes(preds, conjuncts, i + 1, schema, budget):
                    return True
            finally:
                preds.pop()
    return False
