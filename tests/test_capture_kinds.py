"""Every record kind a node writes is documented and the replay reads or skips it.

No Spark here: the kinds the nodes can write are collected from the code —
the tagged record structs of ``overlay.capture`` and, by reading the source
with ``ast``, every journal record (``….record("kind", now, field=…)`` and
``….journal({"kind": …})``) under ``src/overlay`` — and held to:

1. ``overlay_spark.kinds``: each is in ``CONSUMED`` (parsed, with a schema in
   ``KIND_SCHEMAS``) or in ``SKIPPED`` (with a reason), never both, and the
   lists name no kind the nodes do not write;
2. ``spark/SCHEMA.md``: each has a section, and every field the code writes
   is named in it;
3. ``docs/capture.md``: each has a row saying whether the replay reads or
   skips it, as ``overlay_spark.kinds`` does;
4. an unknown kind is warned about, not dropped silently (kinds rule 2).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from overlay import capture
from overlay.node.membership import DrainState
from overlay_spark import kinds

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(30)

SRC = ROOT / "src" / "overlay"
SCHEMA_MD = ROOT / "spark" / "SCHEMA.md"
CAPTURE_MD = ROOT / "docs" / "capture.md"
# Fields every record has (Record) or every journal record gets from NodeCore.record.
COMMON = {"kind", "node", "n", "time", "slice"}


def _struct_kinds() -> dict[str, set[str]]:
    """Tagged record structs of overlay.capture: kind -> fields."""
    out: dict[str, set[str]] = {}
    todo = list(capture.Record.__subclasses__())  # the base is no kind
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        tag = cls.__struct_config__.tag
        if isinstance(tag, str):
            out[tag] = set(cls.__struct_fields__) - COMMON
    return out


def _sequencer_fields() -> set[str]:
    """The ``sequencer`` record is the node's ``seq_*`` counters: the Sequencer's ``counters`` keys."""
    text = (SRC / "seq" / "sequencer.py").read_text()
    return set(re.findall(r'counters\["([a-z_]+)"\]', text))


def _drain_summary_fields() -> set[str]:
    """``decision`` phase ``drain`` done/failed spreads the drain summary (minus node and channels)."""
    return set(DrainState(0.0, None).summary(0)) - {"node", "channels"} | {"error"}


# What ``….record("kind", now, …)`` is called on to journal a record: the node
# core itself (``self``, a mixin's or a test's ``core``) or a component's
# ``Journal`` (``self._ctx.journal``, ``ctx.journal``).
RECORDERS = ("self", "core", "journal")

# ``**`` spreads whose keys the source does not show: kind -> their keys, for
# the one module that spreads into records of that kind (wherever the node
# core puts it: a second module spreading into the same kind fails the test).
SPREADS = {
    "sequencer": _sequencer_fields,
    "decision": _drain_summary_fields,
}


def _literal_kinds(node: ast.expr) -> list[str] | None:
    """``"kind"`` or ``"a" if … else "b"``; None when the kind is not a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        a, b = _literal_kinds(node.body), _literal_kinds(node.orelse)
        return a + b if a is not None and b is not None else None
    return None


def _calls(tree: ast.AST) -> Iterator[tuple[ast.Call, str]]:
    """Every call with the name of the function it is in."""

    def walk(node: ast.AST, fn: str) -> Iterator[tuple[ast.Call, str]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            if isinstance(child, ast.Call):
                yield child, fn
            yield from walk(child, name)

    yield from walk(tree, "")


def _journal_kinds() -> dict[str, set[str]]:
    """Journal records written under src/overlay: kind -> fields (rule 2's source read)."""
    out: dict[str, set[str]] = defaultdict(set)
    spreaders: dict[str, set[Path]] = defaultdict(set)
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for call, fn in _calls(tree):
            f = call.func
            if not isinstance(f, ast.Attribute) or not call.args:
                continue
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            receiver = ast.unparse(f.value)
            if f.attr == "record" and receiver.split(".")[-1] in RECORDERS:
                found = _literal_kinds(call.args[0])
                assert found is not None, (
                    f"{where}: a journal record whose kind is not a literal; this test cannot see it"
                )
                keys = {k.arg for k in call.keywords if k.arg is not None}
                spread = any(k.arg is None for k in call.keywords)
            elif f.attr == "journal" and receiver.endswith("capture"):
                arg = call.args[0]
                if not isinstance(arg, ast.Dict):
                    assert fn == "record", (
                        f"{where}: capture.journal() of something built elsewhere; this test cannot see its kind"
                    )
                    continue  # NodeCore.record itself: its callers are read above
                entries = dict(zip(arg.keys, arg.values))
                kind_node = next(
                    (v for k, v in entries.items() if isinstance(k, ast.Constant) and k.value == "kind"), None
                )
                found = _literal_kinds(kind_node) if kind_node is not None else None
                assert found is not None, f"{where}: a journal dict without a literal kind"
                keys = {k.value for k in arg.keys if isinstance(k, ast.Constant)}
                spread = None in arg.keys
            else:
                continue
            for kind in found:
                if spread:
                    resolve = SPREADS.get(kind)
                    assert resolve is not None, f"{where}: `**` spread in a {kind!r} record; add its keys to SPREADS"
                    spreaders[kind].add(path)
                    assert len(spreaders[kind]) == 1, (
                        f"{where}: a second module spreads into {kind!r} records "
                        f"({', '.join(sorted(p.name for p in spreaders[kind]))}); SPREADS cannot tell their keys apart"
                    )
                    keys = keys | resolve()
                out[kind] |= keys - COMMON
    return dict(out)


def written_kinds() -> dict[str, set[str]]:
    """Every kind the nodes can write, with the fields they write for it."""
    structs, journal = _struct_kinds(), _journal_kinds()
    assert not set(structs) & set(journal), "a kind written both as a struct and as a journal dict"
    return {**structs, **journal}


def schema_sections() -> dict[str, str]:
    """SCHEMA.md: kind -> the text of its section (a ``### `kind` …`` heading up to the next heading)."""
    text = SCHEMA_MD.read_text()
    out: dict[str, str] = {}
    parts = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2]):
        if heading.startswith("### "):
            for kind in re.findall(r"`([a-z_]+)`", heading.split("—")[0]):
                out[kind] = heading + body
    return out


def test_the_collection_sees_the_kinds_we_know_of() -> None:
    # A guard on the collector itself: were the source read to find nothing,
    # every other test here would pass vacuously.
    kinds_found = written_kinds()
    for k in (
        "header",
        "end",
        "publish",
        "event",
        "deliver",
        "drop",
        "slice",
        "sequencer",
        "slow",
        "decision",
        "migration",
        "replication",
        "join",
        "leave",
    ):
        assert k in kinds_found, k
    assert {"what", "source", "ms"} <= kinds_found["slow"]
    assert {"expired_dropped", "held", "released"} <= kinds_found["sequencer"]


def test_every_written_kind_is_consumed_or_skipped_and_no_list_is_stale() -> None:
    written = set(written_kinds())
    consumed, skipped = set(kinds.CONSUMED), set(kinds.SKIPPED)
    assert not consumed & skipped, f"both read and skipped: {sorted(consumed & skipped)}"
    assert written - consumed - skipped == set(), "written by the nodes, unknown to the replay"
    assert (consumed | skipped) - written == set(), "named by the replay, written by no node"
    assert set(kinds.KIND_SCHEMAS) == consumed, "a consumed kind needs a schema, a skipped one is not parsed"
    assert skipped >= kinds.NOTE_WHEN_PRESENT
    for k, why in {**kinds.CONSUMED, **kinds.SKIPPED}.items():
        assert why.strip(), f"{k}: say what reads it, or why it is skipped"


def test_every_written_kind_and_field_is_in_schema_md() -> None:
    sections = schema_sections()
    missing_fields = {}
    for kind, fields in sorted(written_kinds().items()):
        assert kind in sections, f"spark/SCHEMA.md has no section for `{kind}`"
        named = set(re.findall(r"`([a-z_0-9]+)`", sections[kind]))
        if fields - named:
            missing_fields[kind] = sorted(fields - named)
    assert not missing_fields, f"fields written but not named in spark/SCHEMA.md: {missing_fields}"


def test_slow_and_sequencer_are_documented_with_their_fields() -> None:
    sections = schema_sections()
    slow = sections["slow"]
    for f in ("what", "source", "ms", "slow_ms"):
        assert f"`{f}`" in slow, f
    assert "`expired_dropped`" in sections["sequencer"]


def test_docs_capture_md_lists_every_kind_with_what_the_replay_does() -> None:
    rows = {}
    for line in CAPTURE_MD.read_text().splitlines():
        m = re.match(r"\|\s*`([a-z_]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2).split("|")[-1].strip().lower()
    for kind in written_kinds():
        assert kind in rows, f"docs/capture.md has no row for `{kind}`"
        expected = "read" if kind in kinds.CONSUMED else "skipped"
        assert rows[kind].startswith(expected), (
            f"docs/capture.md says {rows[kind]!r} for `{kind}`, the replay: {expected}"
        )


def test_an_unknown_kind_is_warned_about_and_named() -> None:
    report = kinds.classify({"publish": 10, "slow": 2, "teleport": 3, "?": 1})
    assert report.unknown == {"teleport": 3, "?": 1}
    assert report.skipped == {"slow": 2} and report.consumed == {"publish": 10}
    assert report.warning is not None
    assert "teleport (3)" in report.warning and "(no kind) (1)" in report.warning
    assert report.use("teleport").startswith("UNKNOWN")
    assert report.use("slow").startswith("skipped: ")
    assert report.use("publish").startswith("read: ")
    assert kinds.classify({"publish": 1, "slice": 4}).warning is None


def test_a_join_in_the_capture_adds_a_note_on_the_node_set() -> None:
    notes = kinds.classify({"join": 3, "slice": 9}).notes([0, 1, 2])
    assert len(notes) == 1 and "`join`" in notes[0] and "[0, 1, 2]" in notes[0]
    assert kinds.classify({"slow": 3}).notes([0]) == []


def test_the_struct_records_encode_with_their_kind_first() -> None:
    # records.load_capture takes the kind from the line's first key.
    line = msgspec.json.encode(capture.Subscribed(1, 2, 3.0, "s"))
    assert line.startswith(b'{"kind":"subscribed"')
