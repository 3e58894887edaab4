"""Fuzzing the expression parsers (issue 17 item 5, SPEC §2.2, §16).

``parse_subscription`` and ``parse_event`` take text from any client (and
from token scopes and the config): random text, random sequences of the
language's own tokens over the cluster's schema, deep nestings, inputs at
and past ``MAX_EXPRESSION_LENGTH``.  Each returns a value the schema
accepts or raises ``ExpressionError`` with a position inside the text —
never another exception.  Bounded: a few hundred examples per test.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import LOCAL
from overlay.channels import parse_event, parse_subscription
from overlay.channels.expressions import MAX_EXPRESSION_LENGTH
from overlay.errors import ExpressionError

pytestmark = pytest.mark.timeout(120)

SCHEMA = LOCAL.schema
SOME = settings(max_examples=300, deadline=None)

# The language's tokens over the cluster's schema, and what lies just past them.
TOKENS = [
    *SCHEMA.attributes,
    "nope",
    "and",
    "AND",
    "or",
    "not",
    "in",
    "prefix",
    "suffix",
    "contains",
    *["=", "==", "!=", "<", "<=", ">", ">=", "[", "]", "{", "}", "(", ")", ",", ":", "-", ".", "\\"],
    *["0", "1", "-1", "1000", "1001", "2.5", "-0.0", "1e3", "1e308", "1e999", "-1e999", ".5", "5.", "1e", "0x10"],
    *["9" * 120, "1" + "0" * 400 + ".0", "1.2.3.4", "256.0.0.0", "1.2.3", "99999999999.0.0.0"],
    *['"A"', "'IBM'", '""', '"ABCDEFGHIJ"', '"\\n"', '"\\q"', '"unterminated', "'", '"', '"\\', '"é"'],
    *[" ", "\t", "\n", "\x00", "\u2028", "é"],
]


def check(parse, text: str):
    """The parser's contract: a valid value, or ExpressionError pointing into ``text``."""
    try:
        out = parse(text, SCHEMA)
    except ExpressionError as exc:
        assert 0 <= exc.position <= len(text), (exc.position, len(text))
        assert exc.reason
        str(exc)  # renders with its caret
        return None
    return out


def both(text: str) -> None:
    f = check(parse_subscription, text)
    if f is not None:
        f.check(SCHEMA)
        assert f.predicates
    e = check(parse_event, text)
    if e is not None:
        assert SCHEMA.check_event_values(e) == e


@SOME
@given(st.text(max_size=200))
def test_random_text(text: str) -> None:
    both(text)


@SOME
@given(st.lists(st.sampled_from(TOKENS), max_size=24), st.sampled_from(["", " "]), st.booleans())
def test_random_token_sequences(parts: list[str], sep: str, braced: bool) -> None:
    text = sep.join(parts)
    both("{" + text + "}" if braced else text)


@SOME
@given(st.sampled_from(["[", "{", "(", '"', "price in [", "{price: {", "price < 1 and "]), st.integers(1, 5000))
def test_deep_nesting_and_long_repetition(unit: str, n: int) -> None:
    both(unit * n)


@pytest.mark.parametrize("extra", [-1, 0, 1, 1000])
def test_inputs_at_and_past_the_length_limit(extra: int) -> None:
    unit = "price < 1 and "
    text = (unit * (MAX_EXPRESSION_LENGTH // len(unit) + 1))[: MAX_EXPRESSION_LENGTH + extra - 9] + "price < 1"
    both(text)
    if len(text) > MAX_EXPRESSION_LENGTH:
        with pytest.raises(ExpressionError, match="over the limit"):
            parse_subscription(text, SCHEMA)


@pytest.mark.parametrize("value", [None, 1, 1.5, b"price < 1", ["price < 1"], {"price": 1}])
def test_a_value_that_is_not_text_is_an_expression_error(value: object) -> None:
    with pytest.raises(ExpressionError):
        parse_subscription(value, SCHEMA)  # type: ignore[arg-type]
    with pytest.raises(ExpressionError):
        parse_event(value, SCHEMA)  # type: ignore[arg-type]
