"""overlay.channels.schema: kinds, rfid codes, attribute checks, the schema, TOML loading."""

from __future__ import annotations

import math
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_schema
from overlay.channels import Attribute, Kind, Schema, format_rfid, parse_rfid
from overlay.channels.schema import DEFAULT_STRING_MAX_LEN, RFID_MAX, as_number, as_string
from overlay.errors import ConfigError, OverlayError, SchemaError

PROPS = settings(max_examples=200, deadline=None)


# -- kinds ------------------------------------------------------------------------


def test_kind_properties():
    assert [k.ordered for k in Kind] == [True, True, True, False]
    assert Kind.INT.discrete and Kind.RFID.discrete
    assert not Kind.FLOAT.discrete and not Kind.STRING.discrete
    # SPEC §8.3: numeric first, then rfid, then string.
    assert Kind.INT.split_priority == Kind.FLOAT.split_priority
    assert Kind.FLOAT.split_priority < Kind.RFID.split_priority < Kind.STRING.split_priority


# -- rfid codes -----------------------------------------------------------------------


def test_parse_rfid_packs_fields_8_20_12_24():
    assert parse_rfid("48.1.2.3") == 48 << 56 | 1 << 36 | 2 << 24 | 3
    assert parse_rfid("0.0.0.0") == 0
    assert parse_rfid("0.0.0.1") == 1
    assert parse_rfid("255.1048575.4095.16777215") == RFID_MAX
    assert parse_rfid("1.0.0.0") == 1 << 56
    # Order of codes is the order of (header, manager, class, serial).
    assert parse_rfid("0.0.1.0") > parse_rfid("0.0.0.16777215")
    assert parse_rfid("007.0.0.0") == 7 << 56
    assert parse_rfid("0.0.0." + "0" * 5000 + "1") == 1  # leading zeros, past int()'s limit


def test_format_rfid():
    assert format_rfid(0) == "0.0.0.0"
    assert format_rfid(RFID_MAX) == "255.1048575.4095.16777215"
    assert format_rfid(48 << 56 | 1 << 36 | 2 << 24 | 3) == "48.1.2.3"


@pytest.mark.parametrize("value", [-1, RFID_MAX + 1, 1 << 96])
def test_format_rfid_refuses_values_that_are_not_codes(value):
    # Masking to 64 bits would print another code: -1 as the maximum code.
    with pytest.raises(SchemaError, match="is not an rfid code"):
        format_rfid(value)


@PROPS
@given(st.integers(0, RFID_MAX))
def test_rfid_format_parse_round_trip(value):
    assert parse_rfid(format_rfid(value)) == value


@PROPS
@given(
    st.integers(0, 255),
    st.integers(0, (1 << 20) - 1),
    st.integers(0, 4095),
    st.integers(0, (1 << 24) - 1),
)
def test_rfid_parse_format_round_trip(h, m, c, s):
    text = f"{h}.{m}.{c}.{s}"
    value = parse_rfid(text)
    assert 0 <= value <= RFID_MAX
    assert format_rfid(value) == text


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("1.2.3", "4 dotted fields"),
        ("1.2.3.4.5", "4 dotted fields"),
        ("", "4 dotted fields"),
        ("1234", "4 dotted fields"),
        ("a.b.c.d", "not a decimal number"),
        ("1..2.3", "not a decimal number"),
        ("-1.0.0.0", "not a decimal number"),
        ("+1.0.0.0", "not a decimal number"),
        (" 1.2.3.4", "not a decimal number"),
        ("1.2.3.4 ", "not a decimal number"),
        ("1.2.3.0x4", "not a decimal number"),
        ("1.2.3.²", "not a decimal number"),  # isdigit() but not a decimal digit
        ("256.0.0.0", "does not fit in 8 bits"),
        ("0.1048576.0.0", "does not fit in 20 bits"),
        ("0.0.4096.0", "does not fit in 12 bits"),
        ("0.0.0.16777216", "does not fit in 24 bits"),
        ("0.0.0." + "9" * 5000, "does not fit in 24 bits"),  # past int()'s digit limit
    ],
)
def test_parse_rfid_rejects_bad_text(text, fragment):
    with pytest.raises(SchemaError) as info:
        parse_rfid(text)
    assert fragment in str(info.value)


@PROPS
@given(st.text(max_size=40))
def test_parse_rfid_raises_only_schema_error(text):
    try:
        value = parse_rfid(text)
    except SchemaError:
        return
    assert 0 <= value <= RFID_MAX


# -- attribute checks ----------------------------------------------------------------------


@pytest.fixture
def attrs(schema):
    return schema.attributes


@pytest.mark.parametrize(
    "name, value",
    [
        ("price", 0),
        ("price", 1000),
        ("price", 0.0),
        ("price", 1000.0),
        ("price", 12.5),
        ("price", 5e-324),
        ("qty", 0),
        ("qty", 100),
        ("qty", 42),
        ("sym", "A"),
        ("sym", "ABCDEFGH"),
        ("tag", 0),
        ("tag", RFID_MAX),
        ("note", ""),
        ("note", "x" * 32),
    ],
)
def test_check_accepts_values_in_the_domain(attrs, name, value):
    out = attrs[name].check(value)
    assert out == value and type(out) is type(value)  # never coerced


@pytest.mark.parametrize(
    "name, value, fragment",
    [
        # bool is not a number, a float is not an int, nothing is coerced
        ("price", True, "is a number, got bool"),
        ("qty", False, "is an integer, got bool"),
        ("tag", True, "is an rfid code, got bool"),
        ("qty", 1.0, "is an integer, got float"),
        ("tag", 1.0, "is an rfid code, got float"),
        ("price", "1", "is a number, got str"),
        ("qty", "1", "is an integer, got str"),
        ("sym", 1, "is a string, got int"),
        ("sym", b"AB", "is a string, got bytes"),
        ("price", None, "is a number, got NoneType"),
        ("price", math.nan, "must be finite"),
        ("price", math.inf, "must be finite"),
        ("price", -math.inf, "must be finite"),
        # domain bounds, both ends
        ("price", -0.001, "outside [0, 1000]"),
        ("price", 1000.0001, "outside [0, 1000]"),
        ("price", 1001, "outside [0, 1000]"),
        ("qty", -1, "outside [0, 100]"),
        ("qty", 101, "outside [0, 100]"),
        ("tag", -1, "value -1 of 'tag' is outside [0.0.0.0, 255.1048575.4095.16777215]"),
        ("tag", RFID_MAX + 1, f"value {RFID_MAX + 1} of 'tag' is outside [0.0.0.0, "),
        ("sym", "", "has length 0, outside [1, 8]"),
        ("sym", "ABCDEFGHI", "has length 9, outside [1, 8]"),
        ("note", "x" * 33, "has length 33, outside [0, 32]"),
    ],
)
def test_check_rejects_with_a_schema_error_naming_the_attribute(attrs, name, value, fragment):
    with pytest.raises(SchemaError) as info:
        attrs[name].check(value)
    assert info.value.attr == name
    assert repr(name) in str(info.value)
    assert fragment in str(info.value)


def test_format_values_as_written_in_expressions(attrs):
    assert attrs["tag"].format(parse_rfid("1.2.3.4")) == "1.2.3.4"
    assert attrs["sym"].format('a"b\\c') == '"a\\"b\\\\c"'
    assert attrs["price"].format(12.5) == "12.5"
    assert attrs["qty"].format(7) == "7"
    # Out-of-range rfid values (in error messages) print as plain integers.
    assert attrs["tag"].format(-1) == "-1"
    assert attrs["tag"].format(RFID_MAX + 1) == str(RFID_MAX + 1)


@pytest.mark.parametrize("value", [0, -3, 2.5, math.inf, RFID_MAX, True])
def test_as_number_returns_a_number_as_it_is(value):
    assert as_number(value) is value


@pytest.mark.parametrize("value", ["", "12"])
def test_as_number_refuses_a_string_as_python_would(value):
    with pytest.raises(TypeError, match="expected a number"):
        as_number(value)


def test_as_string_returns_a_string_and_refuses_a_number():
    text = "AB"
    assert as_string(text) is text
    for value in (0, 1.5, True):
        with pytest.raises(TypeError, match="expected a string"):
            as_string(value)


# -- the schema ------------------------------------------------------------------------------


def test_schema_holds_attributes_and_da(schema):
    assert list(schema.attributes) == ["price", "qty", "sym", "tag", "note"]
    assert schema.da == ("price", "qty", "sym", "tag")
    assert schema.is_da("sym") and not schema.is_da("note") and not schema.is_da("nope")
    assert schema.attribute("qty") == Attribute("qty", Kind.INT, 0, 100)
    assert schema == make_schema() and hash(schema) == hash(make_schema())
    assert schema != Schema(schema.attributes.values(), ["price"])
    assert "price" in repr(schema)


def test_unknown_attribute_is_a_schema_error(schema):
    with pytest.raises(SchemaError) as info:
        schema.attribute("pric")
    assert info.value.attr == "pric"
    assert "unknown attribute 'pric'" in str(info.value)


@pytest.mark.parametrize(
    "attributes, da, fragment",
    [
        ([Attribute("a", Kind.INT, 0, 1), Attribute("a", Kind.INT, 0, 1)], ["a"], "declared twice"),
        ([Attribute("a", Kind.INT, 0, 1)], [], "at least one distinguishing"),
        ([Attribute("a", Kind.INT, 0, 1)], ["b"], "'b' is not declared"),
        ([Attribute("a", Kind.INT, 0, 1)], ["a", "a"], "listed twice"),
    ],
)
def test_schema_constructor_errors(attributes, da, fragment):
    with pytest.raises(ConfigError, match=fragment):
        Schema(attributes, da)


def test_da_priority_numeric_then_rfid_then_string_ties_by_popularity():
    s = Schema(
        [
            Attribute("name", Kind.STRING, 0, 8),
            Attribute("code", Kind.RFID, 0, RFID_MAX),
            Attribute("a", Kind.INT, 0, 9),
            Attribute("b", Kind.FLOAT, 0, 9),
        ],
        ["name", "code", "a", "b"],
    )
    assert s.da_priority() == ("a", "b", "code", "name")  # ties: declaration order
    assert s.da_priority({"b": 0.5, "a": 0.25}) == ("b", "a", "code", "name")
    # Popularity never lifts a string above a number.
    assert s.da_priority({"name": 1.0}) == ("a", "b", "code", "name")


def test_check_event_values(schema):
    ok = {"price": 1.5, "qty": 3, "sym": "AB", "tag": 7}
    assert schema.check_event_values(ok) == ok
    assert schema.check_event_values({**ok, "note": ""}) == {**ok, "note": ""}
    with pytest.raises(SchemaError) as info:
        schema.check_event_values({"price": 1.5, "sym": "AB"})
    assert info.value.attr == "qty"
    assert "lacks distinguishing attribute(s) 'qty', 'tag'" in str(info.value)
    with pytest.raises(SchemaError, match="unknown attribute 'colour'"):
        schema.check_event_values({**ok, "colour": "red"})
    with pytest.raises(SchemaError, match="is an integer, got float"):
        schema.check_event_values({**ok, "qty": 3.0})
    with pytest.raises(SchemaError, match="outside"):
        schema.check_event_values({**ok, "price": 2000})


_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=40),
    st.none(),
)


@PROPS
@given(st.dictionaries(st.sampled_from(["price", "qty", "sym", "tag", "note", "colour"]), _VALUES, max_size=6))
def test_valid_event_accepts_and_refuses_what_check_event_values_does(values):
    """Rule 6: the one-pass check is the copying check without the copy."""
    schema = make_schema()
    try:
        expected = schema.check_event_values(values)
    except SchemaError as exc:
        with pytest.raises(SchemaError) as info:
            schema.valid_event(values)
        assert str(info.value) == str(exc)
    else:
        got = schema.valid_event(values)
        assert got is values and got == expected


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"price": math.nan}, "finite"),
        ({"price": math.inf}, "finite"),
        ({"price": 1e308}, "outside"),
        ({"qty": True}, "is an integer, got bool"),
        ({"qty": 10**400}, "outside"),
        ({"sym": "x" * 100_000}, "length 100000"),
        ({"colour": "red"}, "unknown attribute 'colour'"),
    ],
)
def test_valid_event_refuses_the_absurd_naming_the_attribute(schema, change, why):
    ok = {"price": 1.5, "qty": 3, "sym": "AB", "tag": 7}
    assert schema.valid_event(ok) is ok
    with pytest.raises(SchemaError, match=why):
        schema.valid_event({**ok, **change})


# -- loading the [schema] table of a cluster TOML -----------------------------------------------

FULL_TOML = """
[schema]
distinguishing = ["price", "qty", "sym", "tag"]
attributes = [
  { name = "price", type = "float",  min = 0, max = 1000 },
  { name = "qty",   type = "int",    min = 0, max = 100 },
  { name = "sym",   type = "string", min = 1, max = 8 },
  { name = "tag",   type = "rfid",   min = "0.0.0.0", max = "255.1048575.4095.16777215" },
  { name = "note",  type = "string", max = 32 },
]
"""


def write(tmp_path, text, name="cluster.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_from_toml_builds_the_conftest_schema(tmp_path):
    assert Schema.from_toml(write(tmp_path, FULL_TOML)) == make_schema()
    assert Schema.from_toml(str(write(tmp_path, FULL_TOML))) == make_schema()


def test_from_toml_defaults_and_aliases(tmp_path):
    s = Schema.from_toml(
        write(
            tmp_path,
            """
            [schema]
            distinguishing = ["v"]
            [[schema.attributes]]
            name = "v"
            type = "numeric"
            min = -1.5
            max = 2
            [[schema.attributes]]
            name = "code"
            type = "rfid"
            [[schema.attributes]]
            name = "text"
            type = "string"
            [[schema.attributes]]
            name = "low"
            type = "rfid"
            min = 5
            max = "0.0.0.9"
            """,
        )
    )
    assert s.attributes["v"] == Attribute("v", Kind.FLOAT, -1.5, 2)  # numeric means float
    assert s.attributes["code"] == Attribute("code", Kind.RFID, 0, RFID_MAX)
    assert s.attributes["text"] == Attribute("text", Kind.STRING, 0, DEFAULT_STRING_MAX_LEN)
    assert s.attributes["low"] == Attribute("low", Kind.RFID, 5, 9)
    assert s.da == ("v",)


def attr_toml(fields: str, da: str = '["a"]') -> str:
    return f"[schema]\ndistinguishing = {da}\nattributes = [ {{ {fields} }} ]\n"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[other]\nx = 1\n", "has no [schema] table"),
        ("schema = 5\n", "[schema] must be a table"),
        ('[schema]\ndistinguishing = ["a"]\n', "non-empty [[schema.attributes]] list"),
        ('[schema]\ndistinguishing = ["a"]\nattributes = []\n', "non-empty"),
        ('[schema]\ndistinguishing = ["a"]\nattributes = "a"\n', "non-empty"),
        ('[schema]\ndistinguishing = ["a"]\nattributes = [1]\n', "[schema] attributes #1 must be a table"),
        (attr_toml('type = "int", min = 0, max = 1'), "[schema] attributes #1 needs a name"),
        (attr_toml('name = "9lives", type = "int", min = 0, max = 1'), "needs a name that is an identifier"),
        (attr_toml('name = 3, type = "int", min = 0, max = 1'), "needs a name"),
        (attr_toml('name = "a", type = "decimal", min = 0, max = 1'), "type must be one of"),
        (attr_toml('name = "a", min = 0, max = 1'), "type must be one of"),
        (attr_toml('name = "a", type = ["int"], min = 0, max = 1'), "type must be one of"),
        (attr_toml('name = "a", type = {k = 1}, min = 0, max = 1'), "type must be one of"),
        (attr_toml('name = "a", type = "int", max = 1'), "'a' needs min"),
        (attr_toml('name = "a", type = "float", min = 0'), "'a' needs max"),
        (attr_toml('name = "a", type = "int", min = true, max = 1'), "min must be a number"),
        (attr_toml('name = "a", type = "int", min = "0", max = 1'), "min must be a number"),
        (attr_toml('name = "a", type = "float", min = 0, max = 1979-05-27'), "max must be a number"),
        (attr_toml('name = "a", type = "int", min = 0, max = 1.5'), "max must be an integer"),
        (attr_toml('name = "a", type = "string", min = 0.0, max = 3'), "min must be an integer"),
        (attr_toml('name = "a", type = "rfid", min = 0, max = 1.0'), "max must be an integer"),
        (attr_toml('name = "a", type = "float", min = -inf, max = 1'), "min must be finite"),
        (attr_toml('name = "a", type = "float", min = 0, max = nan'), "max must be finite"),
        (attr_toml('name = "a", type = "string", min = -1, max = 3'), "string length bound min is negative"),
        (attr_toml('name = "a", type = "int", min = 5, max = 1'), "min 5 is above max 1"),
        (attr_toml('name = "a", type = "float", min = 0.5, max = 0.25'), "is above max"),
        (attr_toml('name = "a", type = "rfid", min = "1.2.3", max = 1'), "'a' min: rfid code"),
        (attr_toml('name = "a", type = "rfid", min = 0, max = "256.0.0.0"'), "'a' max: rfid field"),
        (attr_toml('name = "a", type = "rfid", min = 0, max = "0.0.0.²"'), "'a' max: rfid field"),
        (attr_toml('name = "a", type = "rfid", min = -1, max = 5'), "outside the rfid range"),
        (
            '[schema]\nattributes = [ { name = "a", type = "int", min = 0, max = 1 } ]\n',
            "distinguishing must be a list",
        ),
        (attr_toml('name = "a", type = "int", min = 0, max = 1', da='"a"'), "distinguishing must be a list"),
        (attr_toml('name = "a", type = "int", min = 0, max = 1', da="[1]"), "distinguishing must be a list"),
        (attr_toml('name = "a", type = "int", min = 0, max = 1', da="[]"), "at least one distinguishing"),
        (attr_toml('name = "a", type = "int", min = 0, max = 1', da='["b"]'), "'b' is not declared"),
        (attr_toml('name = "a", type = "int", min = 0, max = 1', da='["a", "a"]'), "listed twice"),
        (
            (
                '[schema]\ndistinguishing = ["a"]\nattributes = [\n'
                '  { name = "a", type = "int", min = 0, max = 1 },\n'
                '  { name = "a", type = "int", min = 0, max = 1 },\n]\n'
            ),
            "declared twice",
        ),
        ("[schema\n", "is not valid TOML"),
        ("[schema]\nattributes = [\n", "is not valid TOML"),
    ],
)
def test_from_toml_config_errors(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as info:
        Schema.from_toml(write(tmp_path, text))
    assert fragment in str(info.value)


def test_from_toml_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        Schema.from_toml(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        Schema.from_toml(tmp_path)  # a directory


@pytest.mark.parametrize("table", [None, [], "schema", 3])
def test_from_dict_needs_a_table(table):
    with pytest.raises(ConfigError, match="must be a table"):
        Schema.from_dict(table)


def test_from_dict_rfid_bound_above_64_bits():
    # TOML cannot spell it, a Python dict can.
    with pytest.raises(ConfigError, match="outside the rfid range"):
        Schema.from_dict({"distinguishing": ["a"], "attributes": [{"name": "a", "type": "rfid", "max": 1 << 64}]})


@PROPS
@given(
    st.dictionaries(
        st.sampled_from(["name", "type", "min", "max", "x"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=5),
            st.lists(st.integers(), max_size=2),
        ),
    )
)
def test_from_dict_raises_only_config_errors(raw):
    table = {"distinguishing": ["a"], "attributes": [raw]}
    try:
        s = Schema.from_dict(table)
    except ConfigError:
        return
    except OverlayError as exc:  # pragma: no cover - the assertion explains
        raise AssertionError(f"{type(exc).__name__} escaped from_dict") from exc
    attr = s.attributes["a"]
    assert attr.min <= attr.max
