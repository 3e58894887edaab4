"""The textual syntax of subscriptions (``subExp``) and events (``eventExp``).

Grammar (keywords are case-insensitive)::

    subscription := predicate ("and" predicate)*
    predicate    := NAME cmp literal
                  | NAME "in" "[" literal "," literal "]"
                  | NAME "in" "{" literal ("," literal)* "}"
                  | NAME ("prefix" | "suffix" | "contains") STRING
    cmp          := "=" | "==" | "!=" | "<" | "<=" | ">" | ">="
    event        := "{" [item ("," item)*] [","] "}"
    item         := (NAME | STRING) ":" literal
    literal      := NUMBER | STRING | RFID
    RFID         := DIGITS "." DIGITS "." DIGITS "." DIGITS   (header.manager.class.serial)

Examples: ``price >= 10 and price < 20 and sym prefix "AB"`` and
``{sym: "ABC", price: 12.5}``.

Every error is an ``ExpressionError`` carrying the offending position; values
are checked against the schema (unknown attribute, wrong type, out of range,
missing distinguishing attribute) and nothing is coerced.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from typing import Final, NamedTuple

from overlay.channels.predicates import Filter, Op, Predicate, conjunction
from overlay.channels.schema import Kind, Schema, Value, as_number, parse_rfid
from overlay.errors import ExpressionError, SchemaError

__all__ = ["MAX_EXPRESSION_LENGTH", "parse_event", "parse_subscription"]

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
  | (?P<punct>==|!=|<=|>=|[=<>\[\]{},:])
    """,
    re.VERBOSE,
)
_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}
_CMP: Final = {"=": Op.EQ, "==": Op.EQ, "!=": Op.NE, "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE}
_PATTERN_OPS: Final = {"prefix": Op.PREFIX, "suffix": Op.SUFFIX, "contains": Op.CONTAINS}


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

    def subscription(self) -> Filter:
        starts = [self.peek()]
        preds = [self.predicate()]
        while self.is_keyword(self.peek(), "and"):
            self.take()
            starts.append(self.peek())
            preds.append(self.predicate())
        tok = self.peek()
        if tok.kind is not Tok.END:
            raise self.error(f"expected 'and' or end of input, found {_show(tok)}", tok)
        self.satisfiable(preds, starts)
        return Filter(tuple(preds))

    def satisfiable(self, preds: list[Predicate], starts: list[Token]) -> None:
        """A subscription no event can match is refused like ``price in [10, 5]``:
        at the predicate that leaves no value of its attribute
        (``price > 10 and price < 5``, ``qty > 100`` on ``[0, 100]``)."""
        by_attr: dict[str, list[Predicate]] = {}
        for p, tok in zip(preds, starts):
            on = by_attr.setdefault(p.attr, [])
            on.append(p)
            attr = self.schema.attributes[p.attr]
            if conjunction(on, attr).is_empty():
                if len(on) == 1:
                    reason = f"no value of {p.attr!r} can satisfy {p.text(self.schema)}"
                else:
                    reason = (
                        f"no value of {p.attr!r} satisfies both {p.text(self.schema)} and "
                        f"{' and '.join(q.text(self.schema) for q in on[:-1])}"
                    )
                raise self.error(f"{reason}: this subscription can never match", tok)

    def predicate(self) -> Predicate:
        name_tok = self.take()
        if name_tok.kind is not Tok.NAME:
            raise self.error(f"expected an attribute name, found {_show(name_tok)}", name_tok)
        name = name_tok.text
        try:
            self.schema.attribute(name)
        except SchemaError as exc:
            raise self.error(str(exc), name_tok) from None
        op_tok = self.take()
        op: Op
        args: tuple[Value, ...]
        if op_tok.kind is Tok.PUNCT and op_tok.text in _CMP:
            op = _CMP[op_tok.text]
            args = (self.literal(name),)
        elif self.is_keyword(op_tok, "in"):
            open_tok = self.expect_punct("[", "{")
            if open_tok.text == "[":
                if not self.schema.attributes[name].kind.ordered:
                    raise self.error(
                        f"operator 'in[]' does not apply to string attribute {name!r}; use in {{...}}", op_tok
                    )
                op = Op.IN_RANGE
                lo = self.literal(name)
                self.expect_punct(",")
                hi = self.literal(name)
                self.expect_punct("]")
                if as_number(lo) > as_number(hi):  # literals of an ordered attribute: numbers
                    raise self.error(f"range of {name!r} has its low end above its high end", open_tok)
                args = (lo, hi)
            else:
                op = Op.IN_SET
                items = [self.literal(name)]
                while self.peek().text == ",":
                    self.take()
                    items.append(self.literal(name))
                self.expect_punct("}")
                args = tuple(dict.fromkeys(items))  # drop repeats, keep order
        elif op_tok.kind is Tok.NAME and op_tok.text.lower() in _PATTERN_OPS:
            op = _PATTERN_OPS[op_tok.text.lower()]
            args = (self.pattern(name),)
        else:
            raise self.error(
                f"expected an operator (= != < <= > >= in prefix suffix contains) after "
                f"{name!r}, found {_show(op_tok)}",
                op_tok,
            )
        pred = Predicate(name, op, args)
        try:
            return pred.check(self.schema)
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


def parse_subscription(text: str, schema: Schema) -> Filter:
    """Parse and validate a ``subExp``; raises ``ExpressionError`` with a position."""
    return _Parser(text, schema).subscription()


def parse_event(text: str, schema: Schema) -> dict[str, Value]:
    """Parse and validate an ``eventExp`` into ``{attr: value}``."""
    return _Parser(text, schema).event()
