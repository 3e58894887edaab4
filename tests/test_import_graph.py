"""No import circle among the modules under ``src/`` (``overlay`` and ``overlay_spark``).

The graph is built from the source with ``ast``, not by importing it, and
counts every import statement wherever it stands: at the top of a module,
inside a function (the usual way to hide a circle), and under
``if TYPE_CHECKING:``.  Its rules:

1. A node is a module of the tree: ``pkg/mod.py`` is ``pkg.mod``, and
   ``pkg/__init__.py`` is ``pkg``.
2. An import is an edge to the module it names: ``import a.b.c`` and
   ``from a.b import c`` point at ``a.b.c`` when that is a module of the
   tree, else at the longest prefix that is (``from a.b import name`` → ``a.b``).
   Relative imports are resolved against the importing module's package.
   Modules outside the tree (the standard library, pyspark) are not nodes.
3. The parent packages an import also initialises are not edges: every
   submodule that imports a sibling by its absolute name would otherwise
   make a "circle" with a package ``__init__`` that re-exports it.
4. A circle is a strongly connected component of more than one module; the
   failure lists each with one shortest path round it, every step with the
   file and line of its import.

Any circle fails the test (issue 15 ended the last ones: the node core's,
the shell's and the client's).
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parent.parent / "src"

# Areas of the tree being restructured right now by other parts of issue 15,
# as module-name patterns.  A circle whose every module lies in one of them
# is allowed (and named in a warning) until that work is done; then its
# entry goes, and this test holds the whole tree to no circle at all.


class Import(NamedTuple):
    """Where one module imports another."""

    path: Path
    line: int


Graph = dict[str, dict[str, Import]]


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module under ``root``: name -> (file, whether it is a package's ``__init__``) (rule 1)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or any(part.endswith(".egg-info") for part in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def import_graph(root: Path) -> Graph:
    """module -> {imported module: the first place it is imported} (rules 2 and 3)."""
    mods = modules(root)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for name, (path, is_package) in mods.items():
        package = name if is_package else name.rpartition(".")[0]
        targets: dict[str, Import] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            found: list[str | None] = []
            if isinstance(node, ast.Import):
                found = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                found = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else known(base) for alias in node.names
                ]
            for target in found:
                if target is not None and target != name:
                    here = Import(path, node.lineno)
                    if target not in targets or here.line < targets[target].line:
                        targets[target] = here
        graph[name] = targets
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def path_round(graph: Graph, component: Iterable[str]) -> list[str]:
    """A shortest circle through the first module of ``component`` (breadth first), start repeated at the end."""
    members = sorted(component)
    start = members[0]
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if w in members and w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{members} is not a circle")


def describe(graph: Graph, component: list[str], root: Path) -> str:
    steps = path_round(graph, component)
    lines = [f"{len(component)} modules: {', '.join(component)}"]
    for a, b in itertools.pairwise(steps):
        where = graph[a][b]
        lines.append(f"    {a} -> {b}  ({where.path.relative_to(root.parent)}:{where.line})")
    return "\n".join(lines)


# -- the builder, on a tree made here ----------------------------------------------------------


def write_tree(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_every_kind_of_import_is_an_edge(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.top import thing\n",
            "pkg/top.py": "import json\nimport pkg.sub.leaf\nthing = 1\n",
            "pkg/lazy.py": "def f():\n    from pkg import top\n    return top\n",
            "pkg/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.lazy import f\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/leaf.py": "from .. import typed\nfrom . import other\nfrom ..top import thing\n",
            "pkg/sub/other.py": "import pkg.sub\n",
        },
    )
    graph = import_graph(tmp_path)
    assert set(graph) == {"pkg", "pkg.top", "pkg.lazy", "pkg.typed", "pkg.sub", "pkg.sub.leaf", "pkg.sub.other"}
    assert set(graph["pkg"]) == {"pkg.top"}  # a name from a module: that module
    assert set(graph["pkg.top"]) == {"pkg.sub.leaf"}  # json is not in the tree; pkg and pkg.sub are parents
    assert set(graph["pkg.lazy"]) == {"pkg.top"}  # inside a function; `from pkg import top` is the module
    assert set(graph["pkg.typed"]) == {"pkg.lazy"}  # under TYPE_CHECKING
    assert set(graph["pkg.sub.leaf"]) == {"pkg.typed", "pkg.sub.other", "pkg.top"}  # relative, two levels
    assert graph["pkg.sub.leaf"]["pkg.top"] == Import(tmp_path / "pkg/sub/leaf.py", 3)
    assert set(graph["pkg.sub.other"]) == {"pkg.sub"}
    # top -> leaf -> typed -(TYPE_CHECKING)-> lazy -(in a function)-> top
    (component,) = cycles(graph)
    assert component == ["pkg.lazy", "pkg.sub.leaf", "pkg.top", "pkg.typed"]
    assert path_round(graph, component) == ["pkg.lazy", "pkg.top", "pkg.sub.leaf", "pkg.typed", "pkg.lazy"]
    assert "pkg.typed -> pkg.lazy  (" in describe(graph, component, tmp_path)


def test_a_tree_without_a_circle_has_none(tmp_path: Path) -> None:
    write_tree(
        tmp_path, {"a/__init__.py": "from a.b import x\n", "a/b.py": "from a.c import y\nx = y\n", "a/c.py": "y = 1\n"}
    )
    graph = import_graph(tmp_path)
    assert graph == {
        "a": {"a.b": Import(tmp_path / "a/__init__.py", 1)},
        "a.b": {"a.c": Import(tmp_path / "a/b.py", 1)},
        "a.c": {},
    }
    assert cycles(graph) == []


# -- the tree itself -----------------------------------------------------------------------------------


def test_the_graph_covers_the_tree() -> None:
    graph = import_graph(SRC)
    assert len(graph) >= 60
    assert {"overlay", "overlay.cli", "overlay.cli.parser", "overlay_spark", "overlay_spark.replay"} <= set(graph)
    assert "overlay.cli.node" in graph["overlay.cli.parser"]
    assert "overlay_spark.replay" in graph["overlay.cli.replay"]  # imported inside cmd_replay


def test_no_import_circle() -> None:
    graph = import_graph(SRC)
    bad = [describe(graph, c, SRC) for c in cycles(graph)]
    assert not bad, "import circles:\n" + "\n".join(bad)
