"""What ``pip install .`` gives: the broker, its client and the CLI, with the
Spark jobs inside the wheel but Spark itself only in the ``replay`` extra.

1. The wheel, built from this tree the way pip builds it, holds every module
   under ``src/`` (``overlay`` and ``overlay_spark``) and the admin page's
   files; its metadata asks for pyspark and matplotlib only with the
   ``replay`` extra; its ``overlay`` script is ``overlay.cli:main``.
2. Without the extra (pyspark and matplotlib made unimportable in a fresh
   interpreter), every module of ``overlay`` imports and the CLI runs, and
   ``overlay replay`` says in one line to install ``overlay[replay]``
   (exit 2, no traceback) — whichever of the two is missing.

Bounded: each subprocess gets ``BUILD_TIMEOUT`` or ``PROCESS_TIMEOUT``.
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
# pip builds the wheel in an isolated environment (setuptools from the index).
BUILD_TIMEOUT = 240.0
# A cold interpreter importing every module on a busy 2-core machine.
PROCESS_TIMEOUT = 60.0
REPLAY_EXTRA = ("pyspark", "matplotlib")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel of a copy of this tree (the build writes build/ and
    *.egg-info where it runs: not in the working tree)."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    # Not the compiled build `make venv` left next to the sources (README
    # "Compiled build"): the wheel of a fresh checkout.
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so", "_compiled.json")
    shutil.copytree(SRC, tree / "src", ignore=ignore)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp / "dist"), str(tree)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    (built,) = (tmp / "dist").glob("overlay-*.whl")
    return zipfile.ZipFile(built)


def _source_files(package: str, pattern: str) -> set[str]:
    root = SRC / package
    return {f"{package}/{f.relative_to(root).as_posix()}" for f in root.rglob(pattern) if "__pycache__" not in f.parts}


def test_the_wheel_holds_every_module_and_the_spark_jobs(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    modules = _source_files("overlay", "*.py") | _source_files("overlay_spark", "*.py")
    assert "overlay_spark/replay.py" in modules and "overlay/cli/__init__.py" in modules
    assert not modules - names, f"not in the wheel: {sorted(modules - names)}"
    web = _source_files("overlay", "web/*")
    assert web and not web - names, f"the admin page is not in the wheel: {sorted(web - names)}"


def test_the_wheel_needs_spark_only_for_the_replay_extra(wheel: zipfile.ZipFile) -> None:
    (meta,) = (n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = email.parser.Parser().parsestr(wheel.read(meta).decode())
    requires = metadata.get_all("Requires-Dist") or []
    base = [r for r in requires if "extra ==" not in r]
    assert base, requires
    for package in REPLAY_EXTRA:
        assert not [r for r in base if r.startswith(package)], f"{package} is a base dependency: {base}"
        assert [r for r in requires if r.startswith(package) and 'extra == "replay"' in r], requires
    assert "replay" in (metadata.get_all("Provides-Extra") or [])
    (entry_points,) = (n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "overlay = overlay.cli:main" in wheel.read(entry_points).decode()


def _without_extra(*missing: str) -> str:
    """Python source that makes ``missing`` unimportable, as when the extra is
    not installed (``import pyspark`` raises ImportError)."""
    return f"import sys; sys.modules.update(dict.fromkeys({list(missing)!r}))\n"


def _python(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )


def test_every_module_of_the_broker_imports_without_the_replay_extra() -> None:
    code = _without_extra(*REPLAY_EXTRA) + (
        "import importlib, pkgutil, overlay\n"
        "names = [m.name for m in pkgutil.walk_packages(overlay.__path__, 'overlay.')"
        " if not m.name.endswith('__main__')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "import overlay_spark.kinds\n"
        "from overlay.cli import main\n"
        "print(len(names))\n"
        "sys.exit(main(['status', '--help']))\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split("\n", 1)[0]) >= 60, proc.stdout  # every module, not an empty walk
    assert "examples:" in proc.stdout


@pytest.mark.parametrize("missing", [REPLAY_EXTRA, ("pyspark",), ("matplotlib",)], ids=["both", "pyspark", "mpl"])
def test_replay_without_the_extra_says_what_to_install(missing: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "node-0.ndjson").write_text("")
    code = _without_extra(*missing) + "from overlay.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = _python(code, "replay", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "install overlay[replay]" in proc.stderr, proc.stderr
    for package in REPLAY_EXTRA:
        assert (package in proc.stderr) == (package in missing), proc.stderr
    assert not (tmp_path / "report").exists()  # nothing started
