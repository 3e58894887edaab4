"""The simulator hands its cores runs of messages as the real dispatcher does
(``overlay.testing.sim.inbox``; ``overlay.net.dispatch`` rule 1): a peer's
Events in a row through ``NodeCore.handle_peer_events``, a session's
Publishes in a row through ``handle_publishes``, anything else alone.
Whether the cluster keeps its invariants with them is ``test_simulation``
and ``test_simulation_faults``.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from overlay.actions import Action
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.net.dispatch import DISPATCH_BATCH
from overlay.testing.proxy import Proxy
from overlay.testing.sim import inbox
from overlay.testing.sim.cluster import SimCluster
from overlay.testing.sim.inbox import ClientInbox, ClientLink, run_length
from overlay.testing.sim.setup import SimParams, make_config, quiet_logs, random_config


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with quiet_logs():
        yield


def _publish(seq: int) -> cm.Publish:
    return cm.Publish(seq, {"price": 1.0, "sym": "A", "qty": seq})


def _event(n: int) -> pm.Event:
    return pm.Event(f"0-{n}", {"price": 1.0, "sym": "A", "qty": n}, 0, pm.DispatchSign.EVENT_NEW)


# -- rule 2: how many arrive together ------------------------------------------------------------


def test_a_run_length_is_one_all_or_some_in_between_never_past_the_dispatchers_batch() -> None:
    rng = random.Random(1)
    assert run_length(rng, 0) == 0 and run_length(rng, 1) == 1
    seen = Counter(run_length(rng, 5) for _ in range(2000))
    assert set(seen) == {1, 2, 3, 4, 5}, seen
    assert seen[1] > 600 and seen[5] > 600, "single and whole deliveries are both common"
    assert max(run_length(rng, 500) for _ in range(200)) == DISPATCH_BATCH


# -- rules 1 and 4: the client inbox -------------------------------------------------------------


def test_a_sessions_publishes_in_a_row_form_a_run_that_anything_else_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox, "run_length", lambda rng, n: n)
    box = ClientInbox()
    a, b = ClientLink(0, 1), ClientLink(0, 2)
    ack = cm.Ack("e", tag=3)
    for msg in (_publish(1), _publish(2), ack, _publish(3)):
        box.hold(a, 0.5, msg)
    box.hold(b, 0.7, _publish(9))
    assert len(box) == 5 and list(box.links()) == [(a, 0.5), (b, 0.7)]
    rng = random.Random(0)
    assert box.take_run(a, rng) == [_publish(1), _publish(2)]
    assert box.take_run(a, rng) == [ack], "an Ack goes alone"
    assert box.take_run(a, rng) == [_publish(3)] and a not in box, "an emptied session leaves the inbox"
    assert box.drop(b) == 1 and not len(box)


def test_a_run_holds_at_most_the_dispatchers_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox, "run_length", lambda rng, n: n)
    box = ClientInbox()
    link = ClientLink(2, 1)
    for seq in range(1, DISPATCH_BATCH + 4):
        box.hold(link, 0.0, _publish(seq))
    assert len(box.take_run(link, random.Random(0))) == DISPATCH_BATCH
    assert len(box.take_run(link, random.Random(0))) == 3


def test_a_crash_drops_what_its_node_had_not_dispatched() -> None:
    box = ClientInbox()
    for node, sid in ((0, 1), (1, 1), (1, 2)):
        box.hold(ClientLink(node, sid), 0.0, _publish(1))
    assert box.drop_node(1) == 2 and [link for link, _ in box.links()] == [ClientLink(0, 1)]


# -- the network: runs reach the batched entry points --------------------------------------------


def started(**params: Any) -> SimCluster:
    p = dataclasses.replace(SimParams(), jitter=0.0, **params)
    sim = SimCluster(make_config(3), 1, p, keep_trace=True)
    sim.start()
    for held, _ in list(sim.net.inbox.links()):
        sim.net.flush(held)
    while ready := sim.net.ready_links():
        sim.net.count_step()
        sim.net.deliver(ready[0])
    return sim


def record_calls(monkeypatch: pytest.MonkeyPatch, sim: SimCluster, node: int) -> list[tuple[str, Any]]:
    """The core of ``node``'s entry points called from now on, with what each got (handled as usual)."""
    calls: list[tuple[str, Any]] = []
    core = sim.cores[node]
    spies: dict[str, Any] = {}
    for name in ("handle_peer", "handle_peer_events", "handle_client", "handle_publishes"):
        real = getattr(core, name)

        def spy(origin: int, what: Any, now: float, name: str = name, real: Any = real) -> list[Action]:
            calls.append((name, what))
            result: list[Action] = real(origin, what, now)
            return result

        spies[name] = spy
    monkeypatch.setitem(sim.cores, node, Proxy(core, **spies))
    return calls


def test_a_peers_ready_events_in_a_row_go_to_handle_peer_events(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = started()
    net = sim.net
    monkeypatch.setattr(inbox, "run_length", lambda rng, n: n)
    monkeypatch.setattr("overlay.testing.sim.network.run_length", lambda rng, n: n)
    calls = record_calls(monkeypatch, sim, 1)
    other = pm.EventsDelivered(("0-9",))  # a normal-queue message, not an Event
    for msg in (_event(1), _event(2), _event(3), other, _event(4)):
        net.send(0, 1, msg)
    net.links[(0, 1)].push(net.now + 1.0, _event(5))  # not ready yet: not part of the run before it
    before = net.deliveries
    for _ in range(3):
        net.deliver((0, 1))
    assert [(name, len(what) if isinstance(what, list) else type(what).__name__) for name, what in calls] == [
        ("handle_peer_events", 3),
        ("handle_peer", "EventsDelivered"),
        ("handle_peer", "Event"),
    ]
    assert calls[0][1] == [_event(1), _event(2), _event(3)], "in order, each through the codec"
    assert net.deliveries == before + 5 and net.runs["event_runs"] == 1 and net.runs["events_in_runs"] == 3
    assert (0, 1) not in net.ready_links()


def test_a_sessions_publishes_wait_and_go_as_one_run_before_its_next_request(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = started()
    net = sim.net
    monkeypatch.setattr(inbox, "run_length", lambda rng, n: n)
    c = next(c for c in sim.clients if c.node == 0)
    calls = record_calls(monkeypatch, sim, 0)
    net.hold_all = True  # a pipelining publisher's burst
    for _ in range(3):
        sim.users.publish(c)
    net.hold_all = False
    link = ClientLink(c.node, c.sid)
    assert not calls and link in net.ready_links() and len(net.inbox) == 3, "read, not dispatched yet"
    sim.users.send(c, cm.Ack("e", tag=0))
    assert not calls and len(net.inbox) == 4, "an Ack waits behind them"
    sim.users.send(c, cm.Unsubscribe(c.seq + 1, "nope"))
    assert [name for name, _ in calls] == ["handle_publishes", "handle_client", "handle_client"]
    assert [type(m).__name__ for m in calls[0][1]] == ["Publish"] * 3
    assert [type(what).__name__ for _, what in calls[1:]] == ["Ack", "Unsubscribe"], "the session is FIFO"
    assert link not in net.inbox and net.runs["publish_runs"] == 1


def test_batching_off_draws_nothing_and_hands_over_one_message_at_a_time() -> None:
    sim = SimCluster(random_config(3), 3, dataclasses.replace(SimParams.for_seed(3), batching=False))
    result = sim.run()
    assert result.ok, result.describe()
    assert sim.net.batch_rng.getstate() == random.Random("batch:3").getstate()
    assert not any(result.stats[k] for k in ("event_runs", "publish_runs")), result.stats
    on = SimCluster(random_config(3), 3).run()
    assert on.stats["event_runs"] and on.trace_hash != result.trace_hash
