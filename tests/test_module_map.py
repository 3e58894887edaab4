"""The README's "map of the code" names every module under src/, by the SPEC
section it implements, and names no module that does not exist (issue 15:
a newcomer finds any section's code in one hop)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
SRC: Final = ROOT / "src"


def _modules_on_disk() -> set[str]:
    return {".".join(p.relative_to(SRC).with_suffix("").parts) for p in SRC.rglob("*.py") if "egg-info" not in str(p)}


def _is_package(name: str) -> bool:
    return (SRC / Path(*name.split("."))).is_dir()


def _modules_in_readme() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## How it works (map of the code)") :]
    section = section[: section.index("\n## ", 1)]
    out: set[str] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not cells[2].startswith("`"):
            continue
        names = re.findall(r"`([\w.]+)`", cells[2])
        base = names[0]
        pkg = base if _is_package(base) else base.rpartition(".")[0]
        for name in names:
            if name == "__init__":
                out.add(f"{pkg}.__init__")
            elif name.startswith("."):
                out.add(pkg + name)
            elif _is_package(name):
                out.add(f"{name}.__init__")
            else:
                out.add(name)
    return out


def test_every_module_is_in_the_map() -> None:
    missing = _modules_on_disk() - _modules_in_readme()
    assert not missing, f"modules the README's map does not name: {sorted(missing)}"


def test_the_map_names_no_module_that_does_not_exist() -> None:
    stale = _modules_in_readme() - _modules_on_disk()
    assert not stale, f"the README's map names modules that do not exist: {sorted(stale)}"
