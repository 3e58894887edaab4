"""overlay.channels.event_check: Schema.valid_event's pass, compiled, held to it (its rule 1)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_schema
from overlay.channels import Attribute, Kind, Schema
from overlay.channels.event_check import EventCheck
from overlay.channels.schema import RFID_MAX
from overlay.errors import SchemaError

_VALID = {"price": 10.5, "qty": 3, "sym": "ab", "tag": 7}


def _agrees(schema: Schema, values: dict[str, Any]) -> bool:
    """The check and valid_event agree on ``values``; what the check says."""
    ok = EventCheck(schema).valid(values)
    try:
        fast = schema.valid_event(values) is values  # its own pass took the dict itself
    except SchemaError:
        fast = False
    assert ok == fast, values
    return ok


@pytest.mark.parametrize(
    ("change", "ok"),
    [
        ({}, True),
        ({"note": ""}, True),  # a string may be empty where its min length is 0
        ({"price": 0}, True),  # an int where a float attribute is: a number
        ({"price": 1000}, True),
        ({"price": 1000.0000001}, False),
        ({"price": -0.0}, True),
        ({"price": float("nan")}, False),
        ({"price": float("inf")}, False),
        ({"price": True}, False),  # a bool is no number
        ({"price": "1"}, False),
        ({"qty": 3.0}, False),  # a float is not an int
        ({"qty": False}, False),
        ({"qty": 100}, True),
        ({"qty": 101}, False),
        ({"qty": -1}, False),
        ({"qty": 2**70}, False),
        ({"tag": RFID_MAX}, True),  # the rfid bound, past a machine word's signed range
        ({"tag": RFID_MAX + 1}, False),
        ({"sym": ""}, False),  # shorter than its min length
        ({"sym": "x" * 8}, True),
        ({"sym": "x" * 9}, False),
        ({"sym": 1}, False),
        ({"unknown": 1}, False),
        ({"note": "x" * 33}, False),
    ],
)
def test_the_check_takes_what_valid_event_takes_itself(change: dict[str, Any], ok: bool) -> None:
    assert _agrees(make_schema(), {**_VALID, **change}) is ok


@pytest.mark.parametrize("missing", ["price", "qty", "sym", "tag"])
def test_an_event_without_a_distinguishing_attribute_is_refused(missing: str) -> None:
    values = {k: v for k, v in _VALID.items() if k != missing}
    assert _agrees(make_schema(), values) is False


def test_int_values_compare_exactly_with_float_bounds() -> None:
    """Rule 2: 2**53 + 1 is above a bound of 2**53 as Python compares, though
    equal to it once converted to a float."""
    schema = Schema([Attribute("x", Kind.FLOAT, 0, float(2**53))], ["x"])
    assert _agrees(schema, {"x": 2**53}) is True
    assert _agrees(schema, {"x": 2**53 + 1}) is False


_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=40),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["price", "qty", "sym", "tag", "note", "other"]), _values, max_size=6))
def test_the_check_agrees_with_valid_event_on_any_values(values: dict[str, Any]) -> None:
    _agrees(make_schema(), values)


def test_bounds_given_as_floats_by_hand_compare_as_python_does() -> None:
    """An Attribute built directly (no config check) with float bounds on an
    int or string attribute: the check still agrees with valid_event."""
    schema = Schema([Attribute("n", Kind.INT, 0.5, 3.5), Attribute("s", Kind.STRING, 0.5, 2.5)], ["n"])
    for values in (
        {"n": 0},
        {"n": 1},
        {"n": 3},
        {"n": 4},
        {"n": 1, "s": ""},
        {"n": 1, "s": "ab"},
        {"n": 1, "s": "abc"},
    ):
        _agrees(schema, values)
