"""The operators of the filter language and their classes (SPEC §2.2, extended).

Rules this module keeps (``overlay.channels.predicates`` gives them meaning):

1. ``Op`` names every operator a predicate may carry; its value is the
   operator's text in the language.
2. ``ORDERED_OPS`` apply to ordered attributes (numbers), ``STRING_OPS`` to
   strings; ``PATTERN_OPS`` take one pattern argument of any length.
3. ``NEGATION`` pairs each operator with the one a present value satisfies
   iff it fails the original, both ways (``predicates`` rule 6).
4. ``MAX_SET_SIZE`` bounds an ``in{...}``/``not in{...}`` set.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["MAX_SET_SIZE", "NEGATION", "ORDERED_OPS", "PATTERN_OPS", "STRING_OPS", "Op"]

# An in{...} set larger than this is refused: the set lives in every channel
# the subscription belongs to and is scanned when coverage is decided.
MAX_SET_SIZE: Final = 1024


class Op(enum.StrEnum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    IN_RANGE = "in[]"
    PREFIX = "prefix"
    SUFFIX = "suffix"
    CONTAINS = "contains"
    IN_SET = "in{}"
    # The extended language (rule 6): anything-but, case-insensitive,
    # wildcard, presence, and the negation of every pattern.
    NOT_IN_RANGE = "not in[]"
    NOT_IN_SET = "not in{}"
    NOT_PREFIX = "not prefix"
    NOT_SUFFIX = "not suffix"
    NOT_CONTAINS = "not contains"
    IEQ = "ieq"
    NOT_IEQ = "not ieq"
    IPREFIX = "iprefix"
    NOT_IPREFIX = "not iprefix"
    ISUFFIX = "isuffix"
    NOT_ISUFFIX = "not isuffix"
    LIKE = "like"
    NOT_LIKE = "not like"
    EXISTS = "exists"
    NOT_EXISTS = "not exists"


ORDERED_OPS: Final = frozenset(
    {Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.IN_RANGE, Op.NOT_IN_RANGE, Op.EXISTS, Op.NOT_EXISTS}
)
# Operators whose one argument is a pattern: a fragment of a value, a string
# of any length (the schema's length bound is for values).
PATTERN_OPS: Final = frozenset(
    {
        Op.PREFIX,
        Op.SUFFIX,
        Op.CONTAINS,
        Op.NOT_PREFIX,
        Op.NOT_SUFFIX,
        Op.NOT_CONTAINS,
        Op.IEQ,
        Op.NOT_IEQ,
        Op.IPREFIX,
        Op.NOT_IPREFIX,
        Op.ISUFFIX,
        Op.NOT_ISUFFIX,
        Op.LIKE,
        Op.NOT_LIKE,
    }
)
# Operators on strings: the patterns, and equality, sets and presence.
STRING_OPS: Final = PATTERN_OPS | {Op.EQ, Op.NE, Op.IN_SET, Op.NOT_IN_SET, Op.EXISTS, Op.NOT_EXISTS}
# Rule 6: the negation of each operator among present values (Kleene's NOT:
# a predicate on an absent attribute is false, and so is its negation).
NEGATION: Final = {
    Op.EQ: Op.NE,
    Op.LT: Op.GE,
    Op.LE: Op.GT,
    Op.IN_RANGE: Op.NOT_IN_RANGE,
    Op.IN_SET: Op.NOT_IN_SET,
    Op.PREFIX: Op.NOT_PREFIX,
    Op.SUFFIX: Op.NOT_SUFFIX,
    Op.CONTAINS: Op.NOT_CONTAINS,
    Op.IEQ: Op.NOT_IEQ,
    Op.IPREFIX: Op.NOT_IPREFIX,
    Op.ISUFFIX: Op.NOT_ISUFFIX,
    Op.LIKE: Op.NOT_LIKE,
    Op.EXISTS: Op.NOT_EXISTS,
}
NEGATION.update({v: k for k, v in list(NEGATION.items())})
