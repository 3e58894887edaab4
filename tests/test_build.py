"""overlay.build: which build runs (compiled or pure Python), and its rules.

The compiled build itself is tested by running the whole suite on it
(``make test``, when a C compiler is there); these check, on either build,
what decides it: the hot modules' list (rule 4), the stale-extension guard
(rules 1, 2) on a package tree made in a temporary directory and on a copy of
this one, ``OVERLAY_PURE`` (rule 7), and what mypyc would compile wrongly
without an error (rule 6: an ``await`` in an ``except`` or ``finally``).
"""

from __future__ import annotations

import ast
import asyncio
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LOCAL
from overlay import build
from overlay.build import HOT_MODULES, MANIFEST, PURE_ENV, judge, source_digest
from overlay.client.limits import CLIENT_MAGIC
from overlay.messages import client as cm
from overlay.messages.codec import HEADER, client_reader, encode_frame
from overlay.testing import WAIT, LoopbackCluster, override

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parent.parent / "src"
EXT = importlib.machinery.EXTENSION_SUFFIXES[0]
MODS = ("overlay.a", "overlay.sub.b")
# A cold interpreter importing the node's modules on a busy 2-core machine.
PROCESS_TIMEOUT = 45.0


def _defines_a_struct(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = ast.unparse(base)
                if name.endswith("Struct") and name != "struct.Struct":
                    out.append(node.name)
    return out


def test_every_hot_module_exists_and_defines_no_msgspec_struct() -> None:
    """Rule 4: mypyc would compile a Struct's class without its keywords."""
    for name in HOT_MODULES:
        path = SRC.joinpath(*name.split(".")).with_suffix(".py")
        assert path.is_file(), name
        assert not _defines_a_struct(path), f"{name} defines {_defines_a_struct(path)}: keep Structs out of it"


def _tree(tmp_path: Path, *, built: tuple[str, ...] = MODS, manifest: bool = True) -> Path:
    for name in MODS:
        src = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"X = {name!r}\n")
        if name in built:
            src.with_name(src.stem + EXT).write_bytes(b"")
    if manifest:
        digests = {m: source_digest(tmp_path.joinpath(*m.split(".")).with_suffix(".py")) for m in MODS}
        (tmp_path / "overlay" / MANIFEST).write_text(json.dumps({"modules": digests}))
    return tmp_path


def test_no_extension_is_pure_python(tmp_path: Path) -> None:
    v = judge(_tree(tmp_path, built=(), manifest=False), MODS)
    assert not v.compiled and v.stale == () and v.describe() == "pure Python"


def test_every_extension_current_is_compiled(tmp_path: Path) -> None:
    v = judge(_tree(tmp_path), MODS)
    assert v.compiled and v.stale == ()
    assert v.describe().startswith("compiled (mypyc")


def test_an_edited_source_makes_the_whole_build_pure(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "overlay" / "sub" / "b.py").write_text("X = 'edited'\n")
    v = judge(root, MODS)
    assert not v.compiled and v.stale == ("overlay.sub.b",)
    assert "stale" in v.describe() and "overlay.sub.b" in v.describe() and "make venv" in v.describe()


def test_extensions_without_a_manifest_or_with_one_missing_are_not_used(tmp_path: Path) -> None:
    assert judge(_tree(tmp_path, manifest=False), MODS).stale == MODS
    other = tmp_path / "other"
    other.mkdir()
    v = judge(_tree(other, built=("overlay.a",)), MODS)
    assert not v.compiled and v.stale == ("overlay.sub.b",)


def test_the_source_finder_imports_the_py_file(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    finder = build._SourceFinder({"overlay.a": root / "overlay" / "a.py"})
    spec = finder.find_spec("overlay.a", None)
    assert spec is not None and spec.origin == str(root / "overlay" / "a.py")
    assert finder.find_spec("overlay.other", None) is None


def test_this_process_runs_the_build_it_reports() -> None:
    """Rule 3: BUILD matches what the hot modules were imported from."""
    import overlay.node.router as router

    compiled = not str(router.__file__).endswith(".py")
    assert build.BUILD.startswith("compiled") == compiled


def test_forced_pure_uses_no_extension_and_says_so(tmp_path: Path) -> None:
    """Rule 7: a current compiled tree, run as pure Python on request."""
    v = judge(_tree(tmp_path), MODS, pure=True)
    assert not v.compiled and v.forced_pure and v.stale == ()
    assert v.describe().startswith("pure Python") and PURE_ENV in v.describe()
    # Nothing compiled: the request changes nothing.
    other = tmp_path / "other"
    other.mkdir()
    assert judge(_tree(other, built=(), manifest=False), MODS, pure=True).describe() == "pure Python"


def _run_build(src: Path, code: str, **env: str) -> list[str]:
    """``code``'s output lines, run by a fresh interpreter on the tree under ``src``."""
    environ = {k: v for k, v in os.environ.items() if k != PURE_ENV} | {"PYTHONPATH": str(src), **env}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environ,
        timeout=PROCESS_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


SHOW = "import overlay.build as b, overlay.node.router as r, overlay.node.core; print(r.__file__); print(b.BUILD)"


def test_overlay_pure_imports_every_hot_module_from_its_source() -> None:
    """Rule 7 in this tree, whichever build it holds."""
    origin, line = _run_build(SRC, SHOW, **{PURE_ENV: "1"})
    assert origin.endswith("router.py") and line.startswith("pure Python"), (origin, line)
    # Without it: what this tree holds (this process may run with it set).
    origin, line = _run_build(SRC, SHOW)
    compiled = judge(SRC).compiled
    assert line.startswith("compiled") == compiled and origin.endswith("router.py") == (not compiled), (origin, line)


def test_an_edited_hot_module_of_a_copy_of_this_tree_runs_as_pure_python(tmp_path: Path) -> None:
    """Rule 2 end to end: a copy of src/ (its extensions and manifest too,
    when this tree is compiled; else empty stand-ins for them, which rule 2
    must never load), one hot module edited: every hot module comes from its
    .py, the edit runs, and the build line names the edited module."""
    src = tmp_path / "src"
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    if not judge(SRC).compiled:
        for name in HOT_MODULES:
            src.joinpath(*name.split(".")).with_name(name.rsplit(".", 1)[1] + EXT).write_bytes(b"")
        digests = {m: source_digest(src.joinpath(*m.split(".")).with_suffix(".py")) for m in HOT_MODULES}
        (src / "overlay" / MANIFEST).write_text(json.dumps({"modules": digests}))
    router = src / "overlay" / "node" / "router.py"
    router.write_text(router.read_text() + "\nEDITED = True\n")
    show = SHOW + "; print(r.EDITED); import overlay.messages.codec as c; print(c.__file__)"
    origin, line, edited, codec = _run_build(src, show)
    assert origin == str(router) and edited == "True" and codec.endswith("codec.py")
    assert line.startswith("pure Python (compiled modules stale") and "overlay.node.router" in line


def _awaits_in_handlers(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            blocks = [*(h.body for h in node.handlers), node.finalbody]
            for stmt in (s for body in blocks for s in body):
                lines += [n.lineno for n in ast.walk(stmt) if isinstance(n, (ast.Await, ast.AsyncWith, ast.AsyncFor))]
    return lines


def test_no_hot_module_awaits_in_an_except_or_finally_block() -> None:
    """Rule 6: mypyc would leave the exception set as the thread's current one."""
    assert _awaits_in_handlers(ast.parse("try:\n    pass\nfinally:\n    await f()\n")) == [4]
    assert _awaits_in_handlers(ast.parse("try:\n    pass\nexcept E:\n    await f()\n")) == [4]
    for name in HOT_MODULES:
        path = SRC.joinpath(*name.split(".")).with_suffix(".py")
        found = _awaits_in_handlers(ast.parse(path.read_text()))
        assert not found, f"{name}: await in an except or finally block at lines {found} (overlay.build rule 6)"


async def test_client_sessions_ended_by_a_bad_frame_or_a_stop_leave_no_exception_set() -> None:
    """Rule 6 at run time: on the compiled build, an ``await`` in the client
    session's ``finally`` left a stopped node's CancelledError as the thread's
    current exception, chained under every later error (``__context__``)."""
    cluster = await LoopbackCluster(override(LOCAL, cluster={"balancing": False}), 1).start()
    try:
        # Ended by a bad frame: its Error still comes before the close.
        reader, writer = await asyncio.open_connection(*cluster.addr(0))
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello("raw")))
        frames, msgs = client_reader(), []
        try:
            assert await asyncio.wait_for(reader.readexactly(len(CLIENT_MAGIC)), WAIT) == CLIENT_MAGIC
            while not msgs:  # the Welcome
                msgs += frames.feed(await asyncio.wait_for(reader.read(65536), WAIT))
            writer.write(HEADER.pack(1) + b"\xc1")
            while data := await asyncio.wait_for(reader.read(65536), WAIT):
                msgs += frames.feed(data)
        finally:
            writer.close()
        assert [type(m) for m in msgs] == [cm.Welcome, cm.Error] and msgs[1].fatal
        # Ended by the node's stop (cancelled): a connection the cluster does not close first.
        reader, writer = await asyncio.open_connection(*cluster.addr(0))
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello("kept")))
        assert await asyncio.wait_for(reader.readexactly(len(CLIENT_MAGIC)), WAIT) == CLIENT_MAGIC
    finally:
        await cluster.stop()
    writer.close()
    await asyncio.sleep(0)
    assert sys.exc_info() == (None, None, None)
    try:
        raise LookupError("a later error")
    except LookupError as exc:
        assert exc.__context__ is None
