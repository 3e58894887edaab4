"""The user documentation in docs/: its Python examples run, its links resolve.

1. Every ```python block of ``docs/client.md`` is marked, by an HTML comment
   on the line before it, ``<!-- runnable -->`` (a complete program) or
   ``<!-- fragment -->`` (a piece of one).  A fragment must compile (top-level
   ``await`` allowed).  A runnable block is run as a user would run it — its
   own Python process — against a real three-node cluster started in this
   test's event loop on loopback ephemeral ports (``admincluster``, the
   config of ``cluster_configs/local.toml``, with TLS): its one ``ADDRESSES
   = […]`` line is replaced by the cluster's addresses, the
   ``cluster_configs/local.toml`` it reads the CA from is a copy naming the
   cluster's certificates, and its standard output must equal the ```text
   block that follows it in the page.
2. Every relative link in docs/*.md, README.md and spark/SCHEMA.md names a
   file that exists, and every ``#anchor`` a heading of that file (GitHub's
   anchor rules); none of them refers users to the internal specification,
   which they do not have.

Bounded: each example gets ``EXAMPLE_TIMEOUT`` seconds, then its process is
killed and the test fails.
"""

from __future__ import annotations

import ast
import asyncio
import re
import sys
import unicodedata
from pathlib import Path
from typing import NamedTuple

import pytest

from admincluster import AdminCluster
from overlay.testing import with_tls_table

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CLIENT_MD = DOCS / "client.md"
# A cold interpreter importing overlay on a busy 2-core machine, then the example.
EXAMPLE_TIMEOUT = 60.0
ADDRESSES_LINE = re.compile(r"^ADDRESSES = \[.*\]$", re.M)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
MARK = re.compile(r"<!-- (runnable|fragment) -->\s*$")

pytestmark = pytest.mark.timeout(300)


class Block(NamedTuple):
    line: int
    mark: str | None
    code: str
    output: str | None  # the ```text block after a runnable one


def blocks(path: Path) -> list[Block]:
    """The ```python blocks of a page, each with its mark and expected output."""
    text = path.read_text()
    fences = [(m.start(), m.group(1), m.group(2)) for m in FENCE.finditer(text)]
    out = []
    for i, (start, lang, body) in enumerate(fences):
        if lang != "python":
            continue
        before = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        output = nxt[2] if nxt is not None and nxt[1] == "text" else None
        out.append(Block(text.count("\n", 0, start) + 1, mark.group(1) if mark else None, body, output))
    return out


def runnable() -> list[Block]:
    return [b for b in blocks(CLIENT_MD) if b.mark == "runnable"]


def test_every_python_block_is_marked_and_fragments_compile() -> None:
    found = blocks(CLIENT_MD)
    assert len([b for b in found if b.mark == "runnable"]) >= 5
    for b in found:
        assert b.mark is not None, f"docs/client.md:{b.line}: mark the block <!-- runnable --> or <!-- fragment -->"
        if b.mark == "fragment":
            compile(b.code, f"docs/client.md:{b.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        else:
            assert b.output is not None, f"docs/client.md:{b.line}: a runnable block is followed by its ```text output"
            assert len(ADDRESSES_LINE.findall(b.code)) == 1, f"docs/client.md:{b.line}: one ADDRESSES = [...] line"


@pytest.mark.parametrize("block", runnable(), ids=lambda b: f"client.md:{b.line}")
async def test_runnable_example_prints_what_the_page_says(block: Block, tmp_path: Path) -> None:
    async with AdminCluster(3, tls=True) as cl:
        addresses = [cl.addr(i) for i in range(3)]
        code = ADDRESSES_LINE.sub(f"ADDRESSES = {addresses!r}", block.code)
        # The examples read the cluster's CA from cluster_configs/local.toml, relative
        # to where they run: here, a copy naming this cluster's certificates.
        (tmp_path / "cluster_configs").mkdir()
        local = with_tls_table((ROOT / "cluster_configs" / "local.toml").read_text(), cl.config.tls)
        (tmp_path / "cluster_configs" / "local.toml").write_text(local)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), EXAMPLE_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            pytest.fail(f"docs/client.md:{block.line}: the example did not finish in {EXAMPLE_TIMEOUT}s")
    assert proc.returncode == 0, f"docs/client.md:{block.line} failed:\n{err.decode()}"
    assert out.decode().splitlines() == block.output.splitlines(), err.decode()


# -- links ----------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case; letters, marks, digits, ``-``
    and ``_`` kept; spaces become ``-``; everything else goes."""
    text = heading.strip().lower().replace("`", "")
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {anchor(h) for h in HEADING.findall(text)}


def pages() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), ROOT / "README.md", ROOT / "spark" / "SCHEMA.md"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = FENCE.sub("", page.read_text())
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, frag = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not bad, f"{page.name}: {bad}"


def _for_users(page: Path) -> str:
    """The page's text, without the README's map of the code: that one table is
    for developers and maps SPEC sections to modules (issue 15)."""
    text = page.read_text()
    if page.name == "README.md" and "## How it works (map of the code)" in text:
        start = text.index("## How it works (map of the code)")
        end = text.index("\n## ", start + 1)
        text = text[:start] + text[end:]
    return text


def test_no_page_points_users_at_the_internal_spec() -> None:
    for page in pages():
        text = _for_users(page)
        assert "SPEC.md" not in text and "SPEC" not in text and "§" not in text, (
            f"{page.name} refers to the internal spec"
        )


def test_the_docs_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert f"({page.name}" in index, f"docs/README.md does not link {page.name}"
