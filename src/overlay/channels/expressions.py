"""The textual syntax of subscriptions (``subExp``, extended) and events (``eventExp``).

Grammar (keywords are case-insensitive)::

    expression   := conjunction ("or" conjunction)*
    conjunction  := unary ("and" unary)*
    unary        := "not" unary | "(" expression ")" | "exists" NAME | predicate
    predicate    := NAME cmp literal
                  | NAME ["not"] "in" "[" literal "," literal "]"
                  | NAME ["not"] "in" "{" literal ("," literal)* "}"
                  | NAME ("prefix" | "suffix" | "contains" | "ieq" | "iprefix"
                          | "isuffix" | "like") STRING
    cmp          := "=" | "==" | "!=" | "<" | "<=" | ">" | ">="
    event        := "{" [item ("," item)*] [","] "}"
    item         := (NAME | STRING) ":" literal
    literal      := NUMBER | STRING | RFID
    RFID         := DIGITS "." DIGITS "." DIGITS "." DIGITS   (header.manager.class.serial)

Examples: ``price >= 10 and price < 20 and sym prefix "AB"``,
``(price < 100 or sym ieq "ibm") and not exists venue`` and
``{sym: "ABC", price: 12.5}``.

``not`` binds tighter than ``and``, ``and`` than ``or``.  ``not`` is pushed
down to the predicates and the expression expanded to disjunctive normal
form (``overlay.channels.dnf``): at most ``MAX_CONJUNCTS`` alternatives,
nesting at most ``MAX_NESTING`` deep.  ``not in {…}`` on a number is one
``!=`` per value.  An alternative no event can match is dropped; an
expression with none left is refused at the predicate that empties its
first alternative.

Every error is an ``ExpressionError`` carrying the offending position; values
are checked against the schema (unknown attribute, wrong type, out of range,
missing distinguishing attribute) and nothing is coerced.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from typing import Final, NamedTuple

from overlay.channels.dnf import MAX_CONJUNCTS, Expression
from overlay.channels.predicates import MAX_SET_SIZE, Filter, Op, Predicate, conjunction
from overlay.channels.schema import Kind, Schema, Value, as_number, parse_rfid
from overlay.channels.strings import search_budget
from overlay.errors import ExpressionError, SchemaError

__all__ = ["MAX_EXPRESSION_LENGTH", "MAX_NESTING", "parse_event", "parse_expression", "parse_subscription"]

# Expressions arrive from the network; a bound keeps parsing cost predictable.
MAX_EXPRESSION_LENGTH: Final = 64 * 1024
# Longest integer literal: far past any 64-bit value, well below int()'s limit.
_MAX_INT_DIGITS: Final = 100


class Tok(enum.Enum):
    NAME = "name"
    NUMBER = "number"
    RFID = "rfid code"
    STRING = "string"
    PUNCT = "symbol"
    END = "end of input"


class Token(NamedTuple):
    kind: Tok
    text: str
    value: Value | None
    pos: int


_TOKEN_RE: Final = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<rfid>[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(?![\w.]))
  | (?P<number>-?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?(?![\w.]))
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\]|\\[\s\S])*"|'(?:[^'\\]|\\[\s\S])*')
  | (?P<punct>==|!=|<=|>=|[=<>\[\]{},:()])
    """,
    re.VERBOSE,
)
_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}
_CMP: Final = {"=": Op.EQ, "==": Op.EQ, "!=": Op.NE, "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE}
_PATTERN_OPS: Final = {
    "prefix": Op.PREFIX,
    "suffix": Op.SUFFIX,
    "contains": Op.CONTAINS,
    "ieq": Op.IEQ,
    "iprefix": Op.IPREFIX,
    "isuffix": Op.ISUFFIX,
    "like": Op.LIKE,
}
# Parentheses and `not`s nest at most this deep: the parser recurses.
MAX_NESTING: Final = 64
# A parsed expression before expansion: ("pred", Predicate, Token),
# ("and" | "or", [children], Token) or ("not", child, Token).
_Node = tuple[object, ...]


def _unescape(body: str, text: str, pos: int) -> str:
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1]
            if nxt not in _ESCAPES:
                raise ExpressionError(f"unknown escape \\{nxt} in string", text=text, position=pos + 1 + i)
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _tokens(text: str) -> Iterator[Token]:
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(
            f"expression is {len(text)} characters long, over the limit of {MAX_EXPRESSION_LENGTH}",
            text=text[:80] + "…",
            position=0,
        )
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            ch = text[pos]
            reason = "unterminated string" if ch in "\"'" else f"unexpected character {ch!r}"
            raise ExpressionError(reason, text=text, position=pos)
        kind = m.lastgroup
        raw = m.group()
        if kind == "rfid":
            yield Token(Tok.RFID, raw, None, pos)
        elif kind == "number":
            is_float = any(c in raw for c in ".eE")
            if not is_float and len(raw) > _MAX_INT_DIGITS:
                # int() refuses more than 4300 digits with a ValueError; no schema
                # domain needs a literal anywhere near this long.
                raise ExpressionError(f"number is too long ({len(raw)} characters)", text=text, position=pos)
            yield Token(Tok.NUMBER, raw, float(raw) if is_float else int(raw), pos)
        elif kind == "name":
            yield Token(Tok.NAME, raw, None, pos)
        elif kind == "string":
            yield Token(Tok.STRING, raw, _unescape(raw[1:-1], text, pos), pos)
        elif kind == "punct":
            yield Token(Tok.PUNCT, raw, None, pos)
        pos = m.end()
    yield Token(Tok.END, "", None, n)


class _Parser:
    def __init__(self, text: str, schema: Schema) -> None:
        if not isinstance(text, str):
            raise ExpressionError(f"expression must be text, got {type(text).__name__}", text=repr(text), position=0)
        self.text = text
        self.schema = schema
        self.toks = list(_tokens(text))
        self.i = 0

    # -- token helpers ---------------------------------------------------------

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        tok = self.toks[self.i]
        if tok.kind is not Tok.END:
            self.i += 1
        return tok

    def error(self, reason: str, tok: Token) -> ExpressionError:
        return ExpressionError(reason, text=self.text, position=tok.pos)

    def expect_punct(self, *symbols: str) -> Token:
        tok = self.take()
        if tok.kind is not Tok.PUNCT or tok.text not in symbols:
            raise self.error(f"expected {' or '.join(repr(s) for s in symbols)}, found {_show(tok)}", tok)
        return tok

    def is_keyword(self, tok: Token, word: str) -> bool:
        return tok.kind is Tok.NAME and tok.text.lower() == word

    # -- values ------------------------------------------------------------------

    def literal(self, attr_name: str) -> Value:
        """One literal, checked against ``attr_name``'s kind and domain."""
        tok = self.take()
        if tok.kind not in (Tok.NUMBER, Tok.STRING, Tok.RFID):
            raise self.error(f"expected a value, found {_show(tok)}", tok)
        attr = self.schema.attributes.get(attr_name)
        if attr is None:  # reported at the name by the caller; keep a sane value
            return tok.value if tok.value is not None else tok.text
        value: Value
        if tok.kind is Tok.RFID:
            if attr.kind is not Kind.RFID:
                raise self.error(f"{tok.text} is an rfid code but {attr_name!r} is {attr.kind.value}", tok)
            try:
                value = parse_rfid(tok.text)
            except SchemaError as exc:
                raise self.error(str(exc), tok) from None
        else:
            assert tok.value is not None  # a NUMBER or STRING token carries its value
            value = tok.value
        try:
            return attr.check(value)
        except SchemaError as exc:
            raise self.error(str(exc), tok) from None

    def pattern(self, attr_name: str) -> str:
        tok = self.take()
        # A STRING token's value is its unescaped text, a str.
        if tok.kind is not Tok.STRING or not isinstance(tok.value, str):
            raise self.error(f"expected a quoted string, found {_show(tok)}", tok)
        return tok.value

    # -- subscriptions -------------------------------------------------------------

    def expression(self) -> Expression:
        node = self.disjunction(0)
        tok = self.peek()
        if tok.kind is not Tok.END:
            raise self.error(f"expected 'and', 'or' or end of input, found {_show(tok)}", tok)
        first_error: ExpressionError | None = None
        kept: dict[Filter, None] = {}
        with search_budget():  # one budget for every string search of the expression (strings rule 4)
            for conj in self.dnf(node, False):
                # A predicate repeated in one conjunct is one predicate.
                unique = dict.fromkeys(conj)
                preds = [p for p, _ in unique]
                try:
                    self.satisfiable(preds, [t for _, t in unique])
                except ExpressionError as exc:
                    first_error = first_error or exc
                    continue
                kept.setdefault(Filter(tuple(preds)))
        if not kept:
            assert first_error is not None  # the expansion has at least one conjunct
            raise first_error
        return Expression(tuple(kept))

    def disjunction(self, depth: int) -> _Node:
        start = self.peek()
        parts = [self.conjunction(depth)]
        while self.is_keyword(self.peek(), "or"):
            self.take()
            parts.append(self.conjunction(depth))
        return parts[0] if len(parts) == 1 else ("or", parts, start)

    def conjunction(self, depth: int) -> _Node:
        start = self.peek()
        parts = [self.unary(depth)]
        while self.is_keyword(self.peek(), "and"):
            self.take()
            parts.append(self.unary(depth))
        return parts[0] if len(parts) == 1 else ("and", parts, start)

    def unary(self, depth: int) -> _Node:
        tok = self.peek()
        if depth >= MAX_NESTING:
            raise self.error(f"parentheses and 'not' nest more than {MAX_NESTING} deep", tok)
        nxt = self.toks[self.i + 1] if tok.kind is not Tok.END else tok
        # A keyword unless an operator follows: an attribute may be named `not`.
        if self.is_keyword(tok, "not") and not (nxt.kind is Tok.PUNCT and nxt.text in _CMP):
            self.take()
            return ("not", self.unary(depth + 1), tok)
        if tok.kind is Tok.PUNCT and tok.text == "(":
            self.take()
            node = self.disjunction(depth + 1)
            self.expect_punct(")")
            return node
        if self.is_keyword(tok, "exists") and nxt.kind is Tok.NAME:
            self.take()
            name_tok = self.take()
            try:
                self.schema.attribute(name_tok.text)
            except SchemaError as exc:
                raise self.error(str(exc), name_tok) from None
            return ("pred", Predicate(name_tok.text, Op.EXISTS, ()), tok)
        return self.predicate()

    def dnf(self, node: _Node, neg: bool) -> list[list[tuple[Predicate, Token]]]:
        """Rule 2 of ``overlay.channels.dnf``: ``not`` pushed down to the
        predicates, ``and`` distributed over ``or``; at most ``MAX_CONJUNCTS``."""
        kind = node[0]
        if kind == "pred":
            p = node[1]
            assert isinstance(p, Predicate)
            tok = node[2]
            assert isinstance(tok, Token)
            return [[(p.negated() if neg else p, tok)]]
        if kind == "not":
            child = node[1]
            assert isinstance(child, tuple)
            return self.dnf(child, not neg)
        children = node[1]
        tok = node[2]
        assert isinstance(children, list) and isinstance(tok, Token)
        parts = [self.dnf(c, neg) for c in children]
        too_many = self.error(
            f"this expression expands to more than {MAX_CONJUNCTS} alternatives (its disjunctive "
            "normal form): factor it, or split it into several subscriptions",
            tok,
        )
        if (kind == "or") != neg:  # an or, or a negated and: alternatives side by side
            out = [c for part in parts for c in part]
        else:
            out = [[]]
            for part in parts:
                if len(out) * len(part) > MAX_CONJUNCTS:
                    raise too_many
                out = [a + b for a in out for b in part]
        if len(out) > MAX_CONJUNCTS:
            raise too_many
        return out

    def satisfiable(self, preds: list[Predicate], starts: list[Token]) -> None:
        """A subscription no event can match is refused like ``price in [10, 5]``:
        at the predicate that leaves no value of its attribute
        (``price > 10 and price < 5``, ``qty > 100`` on ``[0, 100]``)."""
        by_attr: dict[str, list[Predicate]] = {}
        for p, tok in zip(preds, starts):
            on = by_attr.setdefault(p.attr, [])
            on.append(p)
            attr = self.schema.attributes[p.attr]
            if all(q.op is Op.NOT_EXISTS for q in on):
                if self.schema.is_da(p.attr):
                    raise self.error(
                        f"{p.attr!r} is distinguishing: every event carries it, so {p.text(self.schema)} "
                        "can never match",
                        tok,
                    )
                continue
            try:
                empty = conjunction(on, attr).is_empty()
            except SchemaError as exc:
                raise self.error(str(exc), tok) from None
            if empty:
                if len(on) == 1:
                    reason = f"no value of {p.attr!r} can satisfy {p.text(self.schema)}"
                else:
                    reason = (
                        f"no value of {p.attr!r} satisfies both {p.text(self.schema)} and "
                        f"{' and '.join(q.text(self.schema) for q in on[:-1])}"
                    )
                raise self.error(f"{reason}: this subscription can never match", tok)

    def predicate(self) -> _Node:
        name_tok = self.take()
        if name_tok.kind is not Tok.NAME:
            raise self.error(f"expected an attribute name, found {_show(name_tok)}", name_tok)
        name = name_tok.text
        try:
            self.schema.attribute(name)
        except SchemaError as exc:
            raise self.error(str(exc), name_tok) from None
        op_tok = self.take()
        negated = False
        if self.is_keyword(op_tok, "not") and self.is_keyword(self.peek(), "in"):
            negated = True  # `not in`: anything-but
            self.take()
        op: Op
        args: tuple[Value, ...]
        if op_tok.kind is Tok.PUNCT and op_tok.text in _CMP:
            op = _CMP[op_tok.text]
            args = (self.literal(name),)
        elif negated or self.is_keyword(op_tok, "in"):
            open_tok = self.expect_punct("[", "{")
            if open_tok.text == "[":
                if not self.schema.attributes[name].kind.ordered:
                    raise self.error(
                        f"operator 'in[]' does not apply to string attribute {name!r}; use in {{...}}", op_tok
                    )
                op = Op.NOT_IN_RANGE if negated else Op.IN_RANGE
                lo = self.literal(name)
                self.expect_punct(",")
                hi = self.literal(name)
                self.expect_punct("]")
                if as_number(lo) > as_number(hi):  # literals of an ordered attribute: numbers
                    raise self.error(f"range of {name!r} has its low end above its high end", open_tok)
                args = (lo, hi)
            else:
                op = Op.NOT_IN_SET if negated else Op.IN_SET
                items = [self.literal(name)]
                while self.peek().text == ",":
                    self.take()
                    items.append(self.literal(name))
                self.expect_punct("}")
                args = tuple(dict.fromkeys(items))  # drop repeats, keep order
                if negated and self.schema.attributes[name].kind.ordered:
                    if len(args) > MAX_SET_SIZE:
                        raise self.error(f"not in{{...}} on {name!r} takes at most {MAX_SET_SIZE} values", open_tok)
                    # Anything-but on numbers: one != per value.
                    nes = [("pred", Predicate(name, Op.NE, (a,)).check(self.schema), op_tok) for a in args]
                    return nes[0] if len(nes) == 1 else ("and", nes, op_tok)
        elif op_tok.kind is Tok.NAME and op_tok.text.lower() in _PATTERN_OPS:
            op = _PATTERN_OPS[op_tok.text.lower()]
            args = (self.pattern(name),)
        else:
            raise self.error(
                f"expected an operator (= != < <= > >= in, not in, prefix suffix contains ieq iprefix "
                f"isuffix like) after {name!r}, found {_show(op_tok)}",
                op_tok,
            )
        pred = Predicate(name, op, args)
        try:
            return ("pred", pred.check(self.schema), name_tok)
        except SchemaError as exc:
            raise self.error(str(exc), op_tok) from None

    # -- events ----------------------------------------------------------------------

    def event(self) -> dict[str, Value]:
        self.expect_punct("{")
        values: dict[str, Value] = {}
        while True:
            tok = self.peek()
            if tok.kind is Tok.PUNCT and tok.text == "}":
                break
            key_tok = self.take()
            if key_tok.kind is Tok.NAME:
                key = key_tok.text
            elif key_tok.kind is Tok.STRING and isinstance(key_tok.value, str):  # always a str
                key = key_tok.value
            else:
                raise self.error(f"expected an attribute name, found {_show(key_tok)}", key_tok)
            if key not in self.schema.attributes:
                raise self.error(str(SchemaError(f"unknown attribute {key!r}")), key_tok)
            if key in values:
                raise self.error(f"attribute {key!r} appears twice", key_tok)
            self.expect_punct(":")
            values[key] = self.literal(key)
            if self.peek().text == ",":
                self.take()
            elif not (self.peek().kind is Tok.PUNCT and self.peek().text == "}"):
                raise self.error(f"expected ',' or '}}', found {_show(self.peek())}", self.peek())
        close = self.take()
        end = self.peek()
        if end.kind is not Tok.END:
            raise self.error(f"unexpected {_show(end)} after the event", end)
        missing = [n for n in self.schema.da if n not in values]
        if missing:
            raise self.error(f"event lacks distinguishing attribute(s) {', '.join(map(repr, missing))}", close)
        return values


def _show(tok: Token) -> str:
    if tok.kind is Tok.END:
        return "end of input"
    return f"{tok.kind.value} {tok.text!r}"


def parse_expression(text: str, schema: Schema) -> Expression:
    """Parse and validate a subscription of the extended language into its
    disjunctive normal form; raises ``ExpressionError`` with a position."""
    return _Parser(text, schema).expression()


def parse_subscription(text: str, schema: Schema) -> Filter:
    """Parse and validate a ``subExp`` that is one conjunction (``or`` and a
    ``not`` of a group that expand to more are refused here: the places that
    take one — a group's low-priority filter — say so); raises
    ``ExpressionError`` with a position."""
    expr = parse_expression(text, schema)
    if len(expr.conjuncts) != 1:
        raise ExpressionError(
            f"one conjunction is needed here: this expression expands to {len(expr.conjuncts)} alternatives ('or')",
            text=text,
            position=0,
        )
    return expr.conjuncts[0]


def parse_event(text: str, schema: Schema) -> dict[str, Value]:
    """Parse and validate an ``eventExp`` into ``{attr: value}``."""
    return _Parser(text, schema).event()
