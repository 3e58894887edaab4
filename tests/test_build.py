"""overlay.build: which build runs (compiled or pure Python), and its rules.

The compiled build itself is tested by running the whole suite on it
(``make test-compiled``); these check, on either build, what decides it:
the hot modules' list (rule 4) and the stale-extension guard (rules 1, 2),
on a package tree made in a temporary directory.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
from pathlib import Path

import pytest

from overlay import build
from overlay.build import HOT_MODULES, MANIFEST, judge, source_digest

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parent.parent / "src"
EXT = importlib.machinery.EXTENSION_SUFFIXES[0]
MODS = ("overlay.a", "overlay.sub.b")


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
    assert "stale" in v.describe() and "overlay.sub.b" in v.describe() and "make fast" in v.describe()


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
