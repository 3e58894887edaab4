"""Shared fixtures: a small schema with every attribute kind."""

from __future__ import annotations

import pytest

from overlay.channels import Attribute, Kind, Schema

RFID_MAX = (1 << 64) - 1


def make_schema() -> Schema:
    return Schema(
        [
            Attribute("price", Kind.FLOAT, 0, 1000),
            Attribute("qty", Kind.INT, 0, 100),
            Attribute("sym", Kind.STRING, 1, 8),
            Attribute("tag", Kind.RFID, 0, RFID_MAX),
            Attribute("note", Kind.STRING, 0, 32),
        ],
        ["price", "qty", "sym", "tag"],
    )


@pytest.fixture
def schema() -> Schema:
    return make_schema()
