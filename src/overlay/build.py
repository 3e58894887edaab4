"""Which build of the node's hot path a process runs: compiled (mypyc) or pure Python.

``setup.py`` compiles the modules of ``HOT_MODULES`` with mypyc when it can
(README, "Compiled build"); each then has an extension module next to its
``.py``, which Python's import system prefers.  This module only uses the
standard library: ``setup.py`` reads ``HOT_MODULES`` from it without
importing the package.  Rules:

1. Compiled is all or nothing.  The compiled modules call each other natively
   through one shared library, so a mix of compiled and pure copies would
   run two different classes under one name.
2. A compiled module runs only while its ``.py`` is the source it was compiled
   from.  The build records each source's SHA-256 in ``MANIFEST`` next to
   the package; when one differs (``src/`` edited since the build) or an
   extension has no manifest, ``guard`` makes every hot module import from
   its ``.py`` (rule 1) and says why: a stale extension never silently
   shadows an edited source.
3. ``BUILD`` names the build in one line: ``overlay --version``, the node's
   start-up log line and bench/throughput.py's header print it.
4. Modules that define a ``msgspec.Struct`` are not compiled: mypyc drops a
   compiled class's keywords (``frozen``, ``array_like``, ``tag``), which
   would change the wire format without an error.  tests/test_build.py checks
   ``HOT_MODULES`` against this.
5. Every class of a hot module is native: nothing sets a method or an
   undeclared attribute on one, nor subclasses it outside the hot modules —
   the simulator and the tests go through explicit seams
   (``overlay.node.observer``, ``Dispatcher.intercept``,
   ``overlay.testing.proxy``; tests/test_seams.py checks).  A module constant
   a test lowers is not ``Final`` (mypyc inlines a ``Final``).
6. No ``await`` in an ``except`` or ``finally`` block of a hot module: mypyc
   (2.4.1) then leaves the exception set as the thread's current one — for
   good after a ``finally``, while suspended after an ``except`` — and every
   later exception anywhere in the process gets it as its ``__context__``
   (a cancelled client session's CancelledError, with its frames, chained
   under unrelated errors).  Catch, leave the block, await, raise again.
   tests/test_build.py checks the sources.
7. ``OVERLAY_PURE=1`` in the environment runs a compiled tree as pure Python
   (rule 1's source imports, as for a stale build): CI runs the simulator and
   the hot modules' unit tests that way too, so both builds are tested.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Final

__all__ = ["BUILD", "HOT_MODULES", "MANIFEST", "PURE_ENV", "Verdict", "guard", "judge", "source_digest"]

# The node's per-event path (issue 19): what a Publish goes through from its
# frame to its PubAck and Notify.  Pure logic and the loop's plumbing of it;
# every one passes the whole test suite compiled (make test).
HOT_MODULES: Final = (
    "overlay.histograms",
    "overlay.limits.bucket",
    "overlay.limits.budget",
    "overlay.limits.quotas",
    "overlay.messages.codec",
    "overlay.channels._buckets",
    "overlay.channels._plain",
    "overlay.channels.event_check",
    "overlay.channels.channel",
    "overlay.channels.matcher",
    "overlay.channels.routing_table",
    "overlay.net.clients",
    "overlay.net.dispatch",
    "overlay.node.clients",
    "overlay.node.context",
    "overlay.node.core",
    "overlay.net.queues",
    "overlay.node.dedup",
    "overlay.node.notify",
    "overlay.node.ordering",
    "overlay.node.outbox",
    "overlay.node.router",
)
# Written by setup.py's build next to the package: {"modules": {name: sha256 of its source}}.
MANIFEST: Final = "_compiled.json"
# Rule 7: set to 1, a compiled tree runs as pure Python.
PURE_ENV: Final = "OVERLAY_PURE"

_ROOT: Final = Path(__file__).resolve().parent.parent  # the directory holding the package


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source(root: Path, name: str) -> Path:
    return root.joinpath(*name.split(".")).with_suffix(".py")


def _extension(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = base.with_name(base.name + suffix)
        if p.exists():
            return p
    return None


class Verdict:
    """What ``judge`` found: ``compiled`` (rule 1: all or none) and, when an
    extension is there but not used, ``stale`` (the modules that say why)."""

    __slots__ = ("compiled", "forced_pure", "stale")

    def __init__(self, compiled: bool, stale: Sequence[str] = (), *, forced_pure: bool = False) -> None:
        self.compiled = compiled
        self.stale = tuple(stale)
        self.forced_pure = forced_pure  # rule 7: a current compiled build not used

    def describe(self) -> str:
        """Rule 3's line."""
        if self.compiled:
            return f"compiled (mypyc, {len(HOT_MODULES)} hot modules)"
        if self.forced_pure:
            return f"pure Python ({PURE_ENV}=1; the compiled modules are not used)"
        if self.stale:
            shown = ", ".join(self.stale[:3]) + (", …" if len(self.stale) > 3 else "")
            return f"pure Python (compiled modules stale or unrecorded: {shown}; `make venv` rebuilds, `make pure` removes)"
        return "pure Python"


def judge(root: Path, modules: Sequence[str] = HOT_MODULES, *, pure: bool = False) -> Verdict:
    """Rules 1 and 2 for the package tree under ``root``; ``pure``: rule 7."""
    built = [m for m in modules if _extension(root, m) is not None]
    if not built:
        return Verdict(False)
    if pure:
        return Verdict(False, forced_pure=True)
    try:
        recorded = json.loads((root / "overlay" / MANIFEST).read_text())["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = {}
    stale = []
    for m in modules:
        src = _source(root, m)
        if m not in built or not isinstance(recorded, dict) or recorded.get(m) != source_digest(src):
            stale.append(m)
    return Verdict(not stale, stale)


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Rule 2: the hot modules from their ``.py``, ahead of the extension next to it."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self._sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        src = self._sources.get(fullname)
        return None if src is None else importlib.util.spec_from_file_location(fullname, src)


def guard(root: Path = _ROOT) -> Verdict:
    """Rules 1 and 2 for this process, before any hot module is imported
    (``overlay/__init__`` calls it): a stale build runs as pure Python."""
    verdict = judge(root, pure=os.environ.get(PURE_ENV, "").strip() == "1")
    if not verdict.compiled and (verdict.stale or verdict.forced_pure):
        sys.meta_path.insert(0, _SourceFinder({m: _source(root, m) for m in HOT_MODULES}))
    return verdict


_VERDICT: Final = guard()
# Rule 3.
BUILD: Final = _VERDICT.describe()
