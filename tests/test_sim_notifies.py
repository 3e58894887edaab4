"""The simulator carries out ``Notifies`` as the shell does — one action, the
frames encoded once (``overlay.messages.codec`` rule 4), each session reading
its own — and checks what the action must be to mean one Notify per session
(``overlay.testing.sim.invariants`` rule 8).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import msgspec
import pytest

from overlay.actions import Notifies
from overlay.messages import client as cm
from overlay.messages.codec import NotifyFrames
from overlay.testing.sim.cluster import SimCluster
from overlay.testing.sim.invariants import check_notifies
from overlay.testing.sim.setup import SimParams, make_config, quiet_logs
from overlay.testing.sim.workload import payload_of

EVENT = {"price": 1.0, "sym": "A", "qty": 1}
NOTE = cm.Notify("0-1", EVENT, ("s1",), 2.5, payload=payload_of(EVENT))  # the payload the clients check


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with quiet_logs():
        yield


def findings(act: Notifies) -> list[str]:
    return check_notifies(act, NotifyFrames(act.msg))


def test_a_notify_per_session_each_with_its_own_ids_is_fine() -> None:
    assert findings(Notifies(NOTE, [1, 2, 3], [("s1",), ("s7", "s8"), ("s1",)])) == []
    assert findings(Notifies(NOTE, [4], [("s1",)])) == []


@pytest.mark.parametrize(
    ("act", "what"),
    [
        (Notifies(NOTE, [1, 2], [("s1",)]), "lists 1 sub_ids"),
        (Notifies(NOTE, [], []), "no session"),
        (Notifies(NOTE, [1, 2], [("s2",), ("s1",)]), "its first session"),
        (Notifies(NOTE, [1, 1], [("s1",), ("s2",)]), "a session twice"),
        (Notifies(msgspec.structs.replace(NOTE, tag=5), [1, 2], [("s1",), ("s2",)]), "tagged 5"),
        (Notifies(NOTE, [1, 2], [("s1",), ()]), "session 2 gets sub_ids ()"),
        (Notifies(NOTE, [1, 2], [("s1",), ("s3", "s3")]), "gets sub_ids ('s3', 's3')"),
    ],
)
def test_a_notifies_that_is_not_one_notify_per_session_is_a_finding(act: Notifies, what: str) -> None:
    found = findings(act)
    assert any(what in f for f in found), found


def test_a_frame_that_is_not_its_sessions_notify_is_a_finding() -> None:
    class Stale:
        """Frames that give every session the first one's ids (around the real
        ones: a compiled NotifyFrames is not subclassed, overlay.build)."""

        def __init__(self, frames: NotifyFrames) -> None:
            self.frames = frames

        def frame(self, sub_ids: tuple[str, ...]) -> bytes:
            return self.frames.frame(NOTE.sub_ids)

    act = Notifies(NOTE, [1, 2], [("s1",), ("s2",)])
    found = check_notifies(act, Stale(NotifyFrames(NOTE)))  # type: ignore[arg-type]
    assert len(found) == 1 and "session 2's frame decodes to" in found[0], found


def test_each_session_reads_its_own_frame_and_a_bad_action_fails_the_run() -> None:
    p = dataclasses.replace(SimParams(), jitter=0.0)
    sim = SimCluster(make_config(3), 1, p)
    sim.start()
    a, b = (c for c in sim.clients if c.node == 0)
    sim.net.execute(0, [Notifies(NOTE, [a.sid, b.sid], [("s1",), ("s2", "s3")])])
    assert sim.notes[("0-1", a.name, "s1")] == 1
    assert sim.notes[("0-1", b.name, "s2")] == sim.notes[("0-1", b.name, "s3")] == 1
    assert not sim.failures
    sim.net.execute(0, [Notifies(NOTE, [a.sid, a.sid], [("s1",), ("s1",)])])
    assert any("a session twice" in f for f in sim.failures), sim.failures
