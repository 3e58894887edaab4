"""Shared by every test: Hypothesis profiles, the cluster configs, a small schema.

Hypothesis profiles, chosen with ``HYPOTHESIS_PROFILE`` (default ``ci``):

* ``ci`` — what ``make test`` and CI run: derandomized (the same examples
  every run, so a failure on CI fails again on a laptop), no example
  database (nothing carried between runs), and a 2 s deadline: on a loaded
  2-core machine one example of a property can take ten times its usual
  time, and a deadline there reports the machine, not the code.
* ``dev`` — quick while editing: 20 examples, random, the local database
  replays the last failures first.
* ``thorough`` — a long hunt before a release: 2,000 examples, random, no
  deadline.

A test's own ``@settings`` (``max_examples``, ``deadline``) win over its
profile for the settings it names.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Final, NamedTuple

import pytest
from hypothesis import HealthCheck, settings

from overlay.channels import Attribute, Kind, Schema
from overlay.config import ClusterConfig, load_config

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=timedelta(seconds=2),
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=20)
settings.register_profile("thorough", max_examples=2_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

CONFIGS: Final = Path(__file__).resolve().parent.parent / "cluster_configs"
# Three nodes, one schema (price, sym, qty, venue): the config of `make run`.
LOCAL: Final[ClusterConfig] = load_config(CONFIGS / "local.toml")

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


class Printed(NamedTuple):
    out: str
    err: str


class CapturedUntil:
    """What a command run in this process printed (``capsys``), read while a
    test waits for ``marker`` on stdout or stderr — ``found`` is the
    condition for ``wait_until`` (e.g. ``overlay sub``'s ``"subscribed"``
    line: its SubAcks are in, instead of a sleep for them); ``rest()`` is
    everything printed from the start, what was read while waiting included."""

    def __init__(self, capsys: pytest.CaptureFixture[str], marker: str) -> None:
        self._capsys = capsys
        self._marker = marker
        self._out: list[str] = []
        self._err: list[str] = []

    def _read(self) -> None:
        got = self._capsys.readouterr()
        self._out.append(got.out)
        self._err.append(got.err)

    def found(self) -> bool:
        self._read()
        return any(self._marker in "".join(stream) for stream in (self._out, self._err))

    def rest(self) -> Printed:
        self._read()
        return Printed("".join(self._out), "".join(self._err))
