"""overlay.channels.expressions: the subExp / eventExp syntax, its errors and their positions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.channels import Filter, Op, Predicate, parse_event, parse_rfid, parse_subscription
from overlay.channels.expressions import MAX_EXPRESSION_LENGTH
from overlay.channels.predicates import MAX_SET_SIZE
from overlay.errors import ExpressionError
from strategies import SMALL, brute_satisfies, domain_of, events, filters

PROPS = settings(max_examples=200, deadline=None)

EVENT_TAIL = 'qty: 1, sym: "A", tag: 1'


def P(attr, op, *args):
    return Predicate(attr, Op(op), args)


# -- subscriptions that parse --------------------------------------------------------------


@pytest.mark.parametrize(
    "text, preds",
    [
        ("price >= 10 and price < 20", [P("price", ">=", 10), P("price", "<", 20)]),
        ("qty = 3", [P("qty", "=", 3)]),
        ("qty == 3", [P("qty", "=", 3)]),
        ("qty != 3", [P("qty", "!=", 3)]),
        ("qty<3", [P("qty", "<", 3)]),
        ("qty<=3", [P("qty", "<=", 3)]),
        ("qty>3", [P("qty", ">", 3)]),
        ("qty>=3", [P("qty", ">=", 3)]),
        ("qty in [0, 100]", [P("qty", "in[]", 0, 100)]),
        ("qty in [7,7]", [P("qty", "in[]", 7, 7)]),
        ("price in [0.5, 1e3]", [P("price", "in[]", 0.5, 1000.0)]),
        ("price > .5", [P("price", ">", 0.5)]),
        ("price > 5.", [P("price", ">", 5.0)]),
        ("price >= -0", [P("price", ">=", 0)]),
        ("price < 2.5E+2", [P("price", "<", 250.0)]),
        ('sym = "AB"', [P("sym", "=", "AB")]),
        ("sym = 'AB'", [P("sym", "=", "AB")]),
        ('sym != "AB"', [P("sym", "!=", "AB")]),
        ('sym prefix "AB"', [P("sym", "prefix", "AB")]),
        ('sym suffix ""', [P("sym", "suffix", "")]),
        ('sym contains "B"', [P("sym", "contains", "B")]),
        ('sym in {"A", "B", "A"}', [P("sym", "in{}", "A", "B")]),  # repeats dropped
        ('sym in {"A"}', [P("sym", "in{}", "A")]),
        ("tag = 48.1.2.3", [P("tag", "=", parse_rfid("48.1.2.3"))]),
        ("tag = 5", [P("tag", "=", 5)]),
        ("tag in [0.0.0.0, 255.1048575.4095.16777215]", [P("tag", "in[]", 0, (1 << 64) - 1)]),
        # keywords are case-insensitive, attribute names are not
        (
            'qty IN [1, 2] AND sym PREFIX "A" And sym Contains "B"',
            [P("qty", "in[]", 1, 2), P("sym", "prefix", "A"), P("sym", "contains", "B")],
        ),
        ("\tqty\n>\r\n1  ", [P("qty", ">", 1)]),
        ('note = ""', [P("note", "=", "")]),
        (r'note = "a\"b\\c\n\t\r\'"', [P("note", "=", "a\"b\\c\n\t\r'")]),
        (r"note = 'it\'s \"q\"'", [P("note", "=", 'it\'s "q"')]),
        ('note = "é😀"', [P("note", "=", "é😀")]),
    ],
)
def test_parse_subscription(schema, text, preds):
    f = parse_subscription(text, schema)
    assert f == Filter(tuple(preds))
    # values keep the literal's type: 10 stays an int even for a float attribute
    for got, want in zip(f.predicates, preds):
        assert [type(a) for a in got.args] == [type(a) for a in want.args]


def test_parse_event(schema):
    e = parse_event('{sym: "ABC", price: 12.5, qty: 3, tag: 48.1.2.3}', schema)
    assert e == {"sym": "ABC", "price": 12.5, "qty": 3, "tag": parse_rfid("48.1.2.3")}
    e = parse_event('{"sym": "A", price: 12, qty: 0, tag: 0, note: "",}', schema)
    assert e == {"sym": "A", "price": 12, "qty": 0, "tag": 0, "note": ""}
    assert type(e["price"]) is int
    assert list(e) == ["sym", "price", "qty", "tag", "note"]


# -- errors point at the offending token --------------------------------------------------------


def at(text: str, needle: str, nth: int = 0) -> int:
    pos = -1
    for _ in range(nth + 1):
        pos = text.index(needle, pos + 1)
    return pos


BIG_SET = "sym in {" + ", ".join(f'"v{i}"' for i in range(MAX_SET_SIZE + 1)) + "}"

SUBSCRIPTION_ERRORS = [
    # malformed
    ("price >", 7, "expected a value, found end of input"),
    ("price 10", 6, "expected an operator"),
    ("= 5", 0, "expected an attribute name, found symbol '='"),
    ("", 0, "expected an attribute name, found end of input"),
    ("price >= 10 and", 15, "expected an attribute name, found end of input"),
    ("price >= 10 or", 14, "expected an attribute name, found end of input"),
    ("(price >= 10 or qty < 1", 23, "expected ')', found end of input"),
    ("price >= 10) or qty < 1", 11, "expected 'and', 'or' or end of input, found symbol ')'"),
    ("not", 3, "expected an attribute name, found end of input"),
    ("exists nope", 7, "unknown attribute 'nope'"),
    ("sym not prefix 'a'", 4, "expected an operator"),
    ("price not in {1, 'a'}", 17, "'a'"),
    ("price in (1, 2)", 9, "expected '[' or '{', found symbol '('"),
    ("price in [1 2]", 12, "expected ','"),
    ("price in [1, 2", 14, "expected ']'"),
    ('sym in {"a" "b"}', 12, "expected '}'"),
    ("sym in {}", 8, "expected a value, found symbol '}'"),
    ("price in 5", 9, "expected '[' or '{'"),
    ("price > 1 & qty < 2", 10, "unexpected character '&'"),
    ("qty = 12abc", 6, "unexpected character '1'"),
    ("qty = 1.2.3", 6, "unexpected character '1'"),
    ("qty = -", 6, "unexpected character '-'"),
    # unknown attribute
    ("pric > 1", 0, "unknown attribute 'pric'"),
    ("price > 1 and colour = 2", 14, "unknown attribute 'colour'"),
    ("and = 1", 0, "unknown attribute 'and'"),
    # wrong type
    ("qty = 1.5", 6, "'qty' is an integer, got float 1.5"),
    ('qty = "1"', 6, "'qty' is an integer, got str"),
    ("qty = true", 6, "expected a value, found name 'true'"),
    ("sym = 5", 6, "'sym' is a string, got int 5"),
    ('price = "x"', 8, "'price' is a number, got str"),
    ("tag = 1.5", 6, "'tag' is an rfid code, got float"),
    ("price = 1.2.3.4", 8, "1.2.3.4 is an rfid code but 'price' is float"),
    ("sym prefix 5", 11, "expected a quoted string, found number '5'"),
    ("qty in [1, 2.5]", 11, "got float 2.5"),
    # value out of [min, max]
    ("qty = 101", 6, "value 101 of 'qty' is outside [0, 100]"),
    ("qty >= -1", 7, "outside [0, 100]"),
    ("price < 1000.5", 8, "outside [0, 1000]"),
    ("price < 1e400", 8, "must be finite"),
    ("tag = 256.0.0.0", 6, "does not fit in 8 bits"),
    ('sym = ""', 6, "has length 0, outside [1, 8]"),
    ('sym in {"A", "ABCDEFGHI"}', 13, "has length 9"),
    ("qty in [0, 101]", 11, "outside [0, 100]"),
    # operator of the wrong kind, and set/range shape
    ('sym < "A"', 4, "operator '<' does not apply to string attribute 'sym'"),
    ('qty prefix "1"', 4, "operator 'prefix' does not apply to int"),
    ("qty in {1, 2}", 4, "operator 'in{}' does not apply to int"),
    ('sym in ["A", "B"]', 4, "operator 'in[]' does not apply to string"),
    ("qty in [5, 1]", 7, "range of 'qty' has its low end above its high end"),
    (BIG_SET, 4, f"needs 1 to {MAX_SET_SIZE} values, got {MAX_SET_SIZE + 1}"),
    # strings
    ('sym = "abc', 6, "unterminated string"),
    ("sym = 'abc", 6, "unterminated string"),
    ('sym = "abc\\"', 6, "unterminated string"),
    ('sym = "a\\qb"', 8, "unknown escape \\q in string"),
    ("sym = 'ab\\x41'", 9, "unknown escape \\x in string"),
    ('sym = "\\\n"', 7, "unknown escape"),
    # trailing garbage
    ("price > 1 qty", 10, "expected 'and', 'or' or end of input, found name 'qty'"),
    ("price > 1)", 9, "expected 'and', 'or' or end of input, found symbol ')'"),
    ("price > 1 2", 10, "expected 'and', 'or' or end of input, found number '2'"),
    # numbers too long for int()
    ("qty = " + "1" * 5000, 6, "too long"),
]


@pytest.mark.parametrize(
    "text, position, fragment", SUBSCRIPTION_ERRORS, ids=[t[:40] for t, _, _ in SUBSCRIPTION_ERRORS]
)
def test_subscription_errors(schema, text, position, fragment):
    with pytest.raises(ExpressionError) as info:
        parse_subscription(text, schema)
    exc = info.value
    assert exc.position == position
    assert fragment in exc.reason
    assert exc.text == text


EVENT_ERRORS = [
    ('{price: 1, qty: 1, sym: "A"}', 27, "event lacks distinguishing attribute(s) 'tag'"),
    ("{}", 1, "lacks distinguishing attribute(s) 'price', 'qty', 'sym', 'tag'"),
    ("{price: 1, price: 2, " + EVENT_TAIL + "}", 11, "attribute 'price' appears twice"),
    ('{price: 1, "price": 2, ' + EVENT_TAIL + "}", 11, "appears twice"),
    ("{colour: 1, price: 1, " + EVENT_TAIL + "}", 1, "unknown attribute 'colour'"),
    ('{"pr ice": 1}', 1, "unknown attribute 'pr ice'"),
    ("{price: 1.5.1, " + EVENT_TAIL + "}", 8, "unexpected character '1'"),
    ("{price: true, " + EVENT_TAIL + "}", 8, "expected a value, found name 'true'"),
    ('{price: 1, qty: 1.0, sym: "A", tag: 1}', 16, "'qty' is an integer, got float"),
    ("{price: 1, qty: 1, sym: 5, tag: 1}", 24, "'sym' is a string, got int"),
    ('{price: 1, qty: 1, sym: "A", tag: -1}', 34, "value -1 of 'tag' is outside"),
    ('{price: 1, qty: 1, sym: "A", tag: 0.0.4096.0}', 34, "does not fit in 12 bits"),
    ("{price: 1001, " + EVENT_TAIL + "}", 8, "outside [0, 1000]"),
    ("{price 1}", 7, "expected ':'"),
    ("{price: 1 qty: 2}", 10, "expected ',' or '}', found name 'qty'"),
    ("{price: 1,, qty: 2}", 10, "expected an attribute name, found symbol ','"),
    ("{1: 2}", 1, "expected an attribute name, found number '1'"),
    ("price: 1", 0, "expected '{'"),
    ("", 0, "expected '{', found end of input"),
    ("{price: 1", 9, "expected ',' or '}', found end of input"),
    ("{price: 1, " + EVENT_TAIL + "} x", 37, "unexpected name 'x' after the event"),
    ("{price: 1, " + EVENT_TAIL + "}}", 36, "unexpected symbol '}' after the event"),
    ('{sym: "A', 6, "unterminated string"),
    ('{"pri\\ce": 1}', 5, "unknown escape \\c"),
]


@pytest.mark.parametrize("text, position, fragment", EVENT_ERRORS, ids=[t[:40] for t, _, _ in EVENT_ERRORS])
def test_event_errors(schema, text, position, fragment):
    with pytest.raises(ExpressionError) as info:
        parse_event(text, schema)
    exc = info.value
    assert exc.position == position, (exc.position, exc.reason)
    assert fragment in exc.reason


def test_error_positions_match_their_tokens(schema):
    text = 'price >= 10 and sym prefix "AB" and qty = 1000'
    with pytest.raises(ExpressionError) as info:
        parse_subscription(text, schema)
    assert info.value.position == at(text, "1000")
    text = '{price: 1, qty: 1, sym: "A", tag: 1, qty: 2}'
    with pytest.raises(ExpressionError) as info:
        parse_event(text, schema)
    assert info.value.position == at(text, "qty", 1)


def test_error_message_shows_a_caret_under_the_position(schema):
    with pytest.raises(ExpressionError) as info:
        parse_subscription("qty = 101", schema)
    lines = str(info.value).splitlines()
    assert lines[0].endswith("at position 6")
    assert lines[1] == "  qty = 101"
    assert lines[2] == "  " + " " * 6 + "^"


@pytest.mark.parametrize("parse", [parse_subscription, parse_event])
def test_over_long_expressions_are_refused_before_parsing(schema, parse):
    text = "x" * (MAX_EXPRESSION_LENGTH + 1)
    with pytest.raises(ExpressionError) as info:
        parse(text, schema)
    assert info.value.position == 0
    assert "over the limit" in info.value.reason
    assert len(info.value.text) < 100  # the message does not echo 64 KiB back


def test_expressions_at_the_length_limit_still_parse(schema):
    body = "qty = 1"
    text = body + " " * (MAX_EXPRESSION_LENGTH - len(body))
    assert parse_subscription(text, schema) == Filter((P("qty", "=", 1),))


@pytest.mark.parametrize("parse", [parse_subscription, parse_event])
@pytest.mark.parametrize("value", [None, b"qty = 1", 5, ["qty = 1"]])
def test_non_text_is_an_expression_error(schema, parse, value):
    with pytest.raises(ExpressionError) as info:
        parse(value, schema)
    assert info.value.position == 0
    assert "must be text" in info.value.reason


# -- properties -------------------------------------------------------------------------------


@PROPS
@given(filters(SMALL))
def test_subscription_text_round_trips(f):
    """A filter some event matches round-trips; one refused as never matching
    has no witness in the brute-force domain of its attributes."""
    witnessed = all(
        any(all(brute_satisfies(p, v) for p in f.on(a)) for v in domain_of(SMALL.attributes[a])) for a in f.attrs()
    )
    try:
        parsed = parse_subscription(f.text(SMALL), SMALL)
    except ExpressionError as exc:
        assert not witnessed, f"refused a filter an event matches: {exc}"
        assert "can never match" in exc.reason
    else:
        assert parsed == f


@pytest.mark.parametrize(
    "text, at",
    [
        ("price > 10 and price < 5", "price < 5"),
        ("price < 0", "price < 0"),
        ("qty > 100", "qty > 100"),
        ('sym = "A" and sym = "B"', 'sym = "B"'),
        ('sym prefix "AB" and sym prefix "AC"', 'sym prefix "AC"'),
        ("qty >= 5 and price < 10 and qty != 5 and qty <= 5", "qty <= 5"),
    ],
)
def test_a_subscription_that_can_never_match_is_refused_at_its_culprit(text, at, schema):
    with pytest.raises(ExpressionError, match="can never match") as info:
        parse_subscription(text, schema)
    assert info.value.position == text.index(at)


@PROPS
@given(events(SMALL))
def test_event_text_round_trips(values):
    text = "{" + ", ".join(f"{n}: {SMALL.attributes[n].format(v)}" for n, v in values.items()) + "}"
    assert parse_event(text, SMALL) == values


def only_expression_errors(parse, text, schema):
    try:
        out = parse(text, schema)
    except ExpressionError as exc:
        assert 0 <= exc.position <= len(text)
        assert exc.reason and str(exc)
        return None
    return out


@PROPS
@given(st.text())
def test_fuzz_subscription_parser_with_any_text(text):
    schema = SMALL
    f = only_expression_errors(parse_subscription, text, schema)
    if f is not None:
        f.check(schema)


@PROPS
@given(st.text())
def test_fuzz_event_parser_with_any_text(text):
    e = only_expression_errors(parse_event, text, SMALL)
    if e is not None:
        SMALL.check_event_values(e)


FRAGMENTS = [
    "x",
    "y",
    "r",
    "s",
    "n",
    "t",
    "and",
    "AND",
    "in",
    "prefix",
    "suffix",
    "contains",
    "or",
    "=",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "(",
    "-",
    "0",
    "1",
    "12",
    "-3",
    "2.5",
    "1e3",
    ".5",
    "1e999",
    "0.0.0.1",
    "1.2.3",
    "256.0.0.0",
    '"a"',
    "'b'",
    '"ab',
    '"\\q"',
    '"\\n"',
    '""',
    "\\",
    '"',
    "'",
    " ",
    "\t",
    "\n",
    "é",
    "9" * 30,
]


@PROPS
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=16), st.booleans())
def test_fuzz_parsers_with_token_soup(parts, spaced):
    text = (" " if spaced else "").join(parts)
    f = only_expression_errors(parse_subscription, text, SMALL)
    if f is not None:
        f.check(SMALL)
    e = only_expression_errors(parse_event, "{" + text + "}", SMALL)
    if e is not None:
        SMALL.check_event_values(e)
