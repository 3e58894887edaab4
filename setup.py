"""The compiled build: the node's hot modules (overlay.build.HOT_MODULES) compiled with mypyc.

Everything else about the package is in pyproject.toml; this file only adds
the extension modules.  ``OVERLAY_COMPILE`` chooses:

- unset or ``auto``: compiled when mypyc imports and a C compiler is on PATH;
  a failed compilation warns and installs pure Python;
- ``1``: compiled, and a failure fails the install;
- ``0``: pure Python (``make venv``: an editable install keeps src/ live).

A build records the SHA-256 of every compiled source in ``overlay/_compiled.json``
(overlay.build rule 2: an edited source runs as pure Python, never behind a
stale extension).
"""

from __future__ import annotations

import json
import os
import runpy
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "src"
_build = runpy.run_path(str(SRC / "overlay" / "build.py"))
HOT_MODULES: tuple[str, ...] = _build["HOT_MODULES"]
MANIFEST: str = _build["MANIFEST"]
source_digest = _build["source_digest"]


# Read before mypyc reads them: the manifest names the sources compiled, even
# when one is edited while the build runs.
DIGESTS = {m: source_digest(SRC / Path(*m.split(".")).with_suffix(".py")) for m in HOT_MODULES}


def _mode() -> str:
    mode = os.environ.get("OVERLAY_COMPILE", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1"):
        sys.exit(f"OVERLAY_COMPILE={mode!r}: use 0 (pure Python), 1 (compiled) or auto")
    return mode


def _compiler() -> str | None:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(shlex.split(cc)[0])


def _sources() -> list[str]:
    return [str(Path("src", *m.split("."))) + ".py" for m in HOT_MODULES]


def _extensions(mode: str) -> list[Any]:
    if mode == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        if mode == "1":
            raise
        print("overlay: mypyc is not installed: pure Python build", file=sys.stderr)
        return []
    if _compiler() is None:
        if mode == "1":
            sys.exit("OVERLAY_COMPILE=1 but no C compiler on PATH (install gcc, or set CC)")
        print(
            "overlay: no C compiler on PATH (gcc and the Python headers; then `make fast`): pure Python build",
            file=sys.stderr,
        )
        return []
    # The type check mypyc runs reads pyproject.toml's [tool.mypy]; its
    # sections for the bench's modules are unused here, and the build
    # environment has only the build's requirements (pyproject.toml): the
    # other dependencies are read as untyped, as the compiled code treats them.
    flags = ["--no-warn-unused-configs", "--ignore-missing-imports"]
    return list(mypycify([*_sources(), *flags], opt_level="3", group_name="overlay"))


class BuildExt(build_ext):
    """Compiles the extensions; ``auto`` falls back to pure Python when that
    fails; writes the manifest of what was compiled (overlay.build rule 2)."""

    def run(self) -> None:
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:  # the compiler's own failures have no common base
            if _mode() == "1":
                raise
            print(f"overlay: compiling the hot modules failed ({exc}): pure Python build", file=sys.stderr)
            self._remove_built()
            return
        manifest = {"modules": DIGESTS}
        for base in {Path(self.build_lib), SRC} if self.inplace else {Path(self.build_lib)}:
            if (base / "overlay").is_dir():
                (base / "overlay" / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")

    def _remove_built(self) -> None:
        for ext in self.extensions:
            for path in (self.get_ext_fullpath(ext.name), str(SRC / self.get_ext_filename(ext.name))):
                Path(path).unlink(missing_ok=True)


setup(ext_modules=_extensions(_mode()), cmdclass={"build_ext": BuildExt})
