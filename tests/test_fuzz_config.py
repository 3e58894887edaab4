"""Fuzzing config loading (issue 17 item 5, ``overlay.config``).

A cluster file comes from an operator, but a typo must still be a
``ConfigError`` naming the key, not a traceback: random TOML text, the
shipped config's text with bytes changed, and its table as a dict with any
value replaced, dropped or added (``overlay.testing.Mutator``: wrong types,
NaN, ±inf, 1e308, huge integers, strings, nestings).  Each loads a
``ClusterConfig`` or raises ``ConfigError`` — never another exception.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CONFIGS
from overlay.config import ClusterConfig, config_from_dict, load_agent_settings, load_config
from overlay.errors import ConfigError
from overlay.testing import Mutator

pytestmark = pytest.mark.timeout(120)

TEXT = (CONFIGS / "local.toml").read_text()
DOC = tomllib.loads(TEXT)
SOME = settings(max_examples=300, deadline=None)


def loads(text: str | bytes) -> None:
    """Write ``text`` to a file of its own and load it both ways (nodes, clients)."""
    fd, name = tempfile.mkstemp(suffix=".toml")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
        with contextlib.suppress(ConfigError):
            assert isinstance(load_config(name), ClusterConfig)
        with contextlib.suppress(ConfigError):
            load_agent_settings(name)
    finally:
        Path(name).unlink()


@SOME
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    loads(text)


@SOME
@given(st.randoms(use_true_random=False))
def test_the_shipped_config_with_bytes_changed(rng: random.Random) -> None:
    data = bytearray(TEXT.encode())
    for _ in range(rng.choice((1, 2, 5))):
        at = rng.randrange(len(data))
        op = rng.randrange(3)
        if op == 0:
            data[at] = rng.choice(b'=[]{}"\n#.,-+0123456789aezinf ')
        elif op == 1:
            del data[at : at + rng.randrange(1, 20)]
        else:
            data[at:at] = rng.choice(
                [b"nan", b"inf", b"-inf", b"1e308", b"99999999999999999999", b"[[nodes]]\n", b'"x"']
            )
    loads(bytes(data))


@SOME
@given(st.randoms(use_true_random=False))
def test_the_shipped_table_with_values_mutated(rng: random.Random) -> None:
    m = Mutator(rng)
    doc = m.tree(DOC)  # type: ignore[arg-type]  # a plain dict: Mutator walks it like a message
    if len(m.encode(doc)) > 50_000:  # a grown list of deep nestings: slow to walk, and no file is like it
        return
    with contextlib.suppress(ConfigError):
        config_from_dict(doc if isinstance(doc, dict) else {"cluster": doc})


# -- findings, kept as regressions -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "x = " + "[" * 5000 + "]" * 5000,  # tomllib parses recursively
        "[cluster]\nname = " + "[" * 900 + "1.5" + "]" * 900,  # the finiteness check walks recursively
        "[agent]\nwindow = " + "{a = " * 2000 + "1" + "}" * 2000,
    ],
    ids=["array", "array-of-a-known-table", "inline-tables"],
)
def test_a_value_nested_too_deeply_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=r"nested too deeply|not valid TOML"):
        load_config(path)
    if "[agent]" in text:
        with pytest.raises(ConfigError, match=r"nested too deeply|not valid TOML"):
            load_agent_settings(path)


def test_a_table_key_that_is_not_a_string_is_named() -> None:
    """config_from_dict takes any dict (tests, LoopbackCluster overrides):
    an int key was a TypeError from the did-you-mean hint."""
    with pytest.raises(ConfigError, match="unknown table 1"):
        config_from_dict({**DOC, 1: 2})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"unknown key 7 in \[cluster\]"):
        config_from_dict({**DOC, "cluster": {**DOC["cluster"], 7: 1}})


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """tomllib decodes the file itself: a byte that is not UTF-8 was a UnicodeDecodeError."""
    path = tmp_path / "latin1.toml"
    path.write_bytes(TEXT.encode().replace(b'name = "local"', b'name = "l\xa7cal"'))
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(path)
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_agent_settings(path)
