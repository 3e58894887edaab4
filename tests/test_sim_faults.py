"""The simulator's node faults and what its clients do about them
(``overlay.testing.sim.faults``, ``.client_faults``): the machinery itself,
on a started cluster driven step by step.  Whether the cluster keeps its
promise under these faults is ``test_simulation_faults``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from overlay.actions import Action, ToClient
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.testing.proxy import Proxy
from overlay.testing.sim import inbox
from overlay.testing.sim.cluster import SimCluster
from overlay.testing.sim.faults import Fault, NodeFaults
from overlay.testing.sim.inbox import ClientLink
from overlay.testing.sim.records import EventRec, SimClient
from overlay.testing.sim.setup import (
    FAULT_HEARTBEAT,
    FAULT_SUSPECT,
    SUSPECT_FACTOR,
    SimParams,
    fault_config,
    make_config,
    quiet_logs,
    random_config,
)

PROBE = pm.PeerError("probe", "a message in flight")


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with quiet_logs():
        yield


def started(n: int = 3, seed: int = 1, **params: Any) -> tuple[SimCluster, NodeFaults]:
    """A cluster with node faults, started and ready, no fault scheduled."""
    config = make_config(n, heartbeat_interval=FAULT_HEARTBEAT, suspect_timeout=FAULT_SUSPECT, name="sim-faults")
    p = dataclasses.replace(SimParams.for_fault_seed(seed), jitter=0.0, **params)
    sim = SimCluster(config, seed, p, keep_trace=True)
    sim.start()
    for held, _ in list(sim.net.inbox.links()):  # what the start left in the inboxes: the tests start from none
        sim.net.flush(held)
    assert sim.node_faults is not None
    return sim, sim.node_faults


def run_for(sim: SimCluster, seconds: float) -> None:
    """Deliver everything ready, move the clock in small steps (no new fault)."""
    net = sim.net
    end = net.now + seconds
    while net.now < end:
        while ready := net.ready_links():
            net.count_step()
            net.deliver(ready[0])
        net.count_step()
        net.advance(faults=False, to=min(end, net.now + 0.05))


def probes(sim: SimCluster, src: int, dst: int) -> int:
    return sum(1 for m in sim.net.links[(src, dst)].queued() if m == PROBE)


def client_on(sim: SimCluster, node: int) -> SimClient:
    return next(c for c in sim.clients if c.node == node and c.connected and c.closed_at is None)


def publish_run(monkeypatch: pytest.MonkeyPatch, sim: SimCluster, c: SimClient, n: int) -> list[EventRec]:
    """``n`` Publishes of ``c`` that its node reads together and dispatches as
    one run (``sim.inbox``): one through ``NodeCore.handle_client``, several
    through ``handle_publishes`` — as the real dispatcher does."""
    assert sim.users.faults is not None
    monkeypatch.setattr(inbox, "run_length", lambda rng, k: k)  # the whole run in one call
    runs = sim.net.runs["publish_runs"]
    recs = []
    sim.net.hold_all = True
    for i in range(n):
        values = {"price": 5.0 + i, "sym": "B", "qty": 2 + i}
        sim.users.faults.publish(c, values, values)
        recs.append(list(sim.events.values())[-1])
    sim.net.hold_all = False
    sim.net.flush(ClientLink(c.node, c.sid))
    assert sim.net.runs["publish_runs"] == runs + (n > 1)
    return recs


def withhold_pubacks(monkeypatch: pytest.MonkeyPatch, sim: SimCluster, c: SimClient) -> list[cm.PubAck]:
    """The PubAcks ``c``'s node sends it from now on never reach it — whichever
    call of the core sends them (a PubAck waits for the event's confirmation:
    ``handle_peer``, ``end_batch``, ``tick``).  Returns them as they are withheld."""
    withheld: list[cm.PubAck] = []
    node, sid, real = c.node, c.sid, sim.net.to_client

    def to_client(at: int, session: int, msg: cm.ClientMessage) -> None:
        if (at, session) == (node, sid) and isinstance(msg, cm.PubAck):
            withheld.append(msg)
            return
        real(at, session, msg)

    monkeypatch.setattr(sim.net, "to_client", to_client)
    return withheld


# -- crash and restart (faults rules 2 and 3) -------------------------------------------------


def test_a_crash_loses_what_is_in_flight_both_ways_and_what_is_sent_meanwhile() -> None:
    sim, nf = started()
    net = sim.net
    for src, dst in ((0, 1), (1, 0), (2, 1), (1, 2), (0, 2)):
        net.send(src, dst, PROBE)
    nf.crash(1, restart_after=1.0)
    assert all(not len(net.links[k]) for k in net.links if 1 in k)
    assert nf.lost["PeerError"] == 4
    assert probes(sim, 0, 2) == 1, "a link between two other nodes keeps its messages"
    net.send(0, 1, PROBE)
    assert not len(net.links[(0, 1)]) and nf.lost["PeerError"] == 5
    assert 1 not in sim.cores and not nf.alive(1)
    clients = [c for c in sim.clients if c.node == 1]
    assert clients and all(not c.connected for c in clients), "its clients see their connection drop"
    assert sim.admins[1].closed_at is not None
    run_for(sim, 0.5)
    assert 1 not in sim.cores, "a crashed node stays down until its restart"
    assert "node 1 crashes; restarts in 1.00s" in sim.net.journal[-1]


def test_a_restart_is_a_new_run_that_boots_and_says_hello_to_every_peer() -> None:
    sim, nf = started(seed=2)
    old = sim.cores[1]
    nf.crash(1, restart_after=0.5)
    run_for(sim, 0.6)
    new = sim.cores[1]
    assert new is not old and new.incarnation == 2 and nf.incarnation[1] == 2
    hellos = [line for line in sim.trace if "(connect) PeerHello" in line and "incarnation=2" in line]
    assert len(hellos) == 2 and all(" 1->" in h for h in hellos), hellos
    answers = [
        line for line in sim.trace if "(connect)" in line and "->1 " in line and "has_routing_table=True" in line
    ]
    assert len(answers) == 2, "each peer's hello reaches the new run"
    run_for(sim, 3.0)
    assert new.ready and new.routing == sim.cores[0].routing, "it fetched the table from its peers"
    assert [s[2:] for s in nf.spans] == [(Fault.CRASH, 1)]


def test_peers_see_the_link_down_then_unreachable_then_back(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, nf = started()
    calls: list[tuple[Any, ...]] = []
    core0 = sim.cores[0]

    def peer_link(node: int, up: bool, now: float) -> list[Action]:
        calls.append(("link", node, up))
        return []

    def peer_unreachable(node: int, now: float) -> list[Action]:
        calls.append(("unreachable", node))
        return []

    def peer_reachable(node: int) -> None:
        calls.append(("reachable", node))

    proxy = Proxy(core0, peer_link=peer_link, peer_unreachable=peer_unreachable, peer_reachable=peer_reachable)
    monkeypatch.setitem(sim.cores, 0, proxy)
    nf.crash(2, restart_after=sim.net.timeout + 1.0)
    assert calls == [("link", 2, False)]
    run_for(sim, sim.net.timeout + 0.5)
    assert calls == [("link", 2, False), ("unreachable", 2)], "reported once, past the peer timeout"
    run_for(sim, 1.0)
    assert calls[2:] == [("reachable", 2), ("link", 2, True)]


@pytest.mark.parametrize("run", [1, 2])
def test_the_clients_of_a_crashed_node_reconnect_elsewhere_and_resend(
    monkeypatch: pytest.MonkeyPatch, run: int
) -> None:
    sim, nf = started(seed=3)
    c = client_on(sim, 1)
    held = {rec.local_id for rec in c.subs.values() if rec.ended_at is None and rec.acked_at is not None}
    withheld = withhold_pubacks(monkeypatch, sim, c)
    recs = publish_run(monkeypatch, sim, c, run)
    run_for(sim, 0.3)
    names = {name for r in recs for name in r.ids()}
    assert len([a for a in withheld if a.event_id in names]) == run, "its node acknowledged them; it never heard"
    assert all(r.acked_at is None for r in recs)
    eid = recs[0].event_id
    nf.crash(1, restart_after=5.0)
    assert all(rec.lost_at is not None for rec in c.subs.values() if rec.local_id in held)
    assert all(rec.died_at == sim.net.step_no for rec in c.subs.values()), "its node's run died at the crash"
    run_for(sim, 0.6)
    assert c.connected and c.node != 1
    sent = [line for line in sim.trace if f"client {c.name}@{c.node} -> Publish" in line]
    assert sent and f"event_id='{eid}'" in sent[0], "the publish not yet PubAcked goes again, with its id"
    assert all(r.sends == 2 and r.acked_at is not None for r in recs)
    again = [r for r in c.subs.values() if r.lost_at is None]
    assert len(again) == len(held), "every subscription it held is made again"
    run_for(sim, 1.0)
    assert all(r.acked_at is not None for r in again), "… and acknowledged again"


# -- partitions (rule 4) ----------------------------------------------------------------------


def test_a_lossy_partition_loses_everything_across_it_then_heals_with_hellos() -> None:
    sim, nf = started(seed=4)
    net = sim.net
    net.send(0, 2, PROBE)
    net.send(2, 1, PROBE)
    net.send(0, 1, PROBE)
    nf.partition(2, 1.0, lossy=True)
    assert probes(sim, 0, 2) == probes(sim, 2, 1) == 0 and probes(sim, 0, 1) == 1
    net.send(1, 2, PROBE)
    net.send(2, 0, PROBE)
    assert nf.lost["PeerError"] == 4
    c = client_on(sim, 2)
    run_for(sim, 1.1)
    assert c.connected and c.node == 2, "the cut node keeps its clients"
    heal = next(i for i, line in enumerate(sim.trace) if "partition heals" in line)
    connects = [line for line in sim.trace[heal : heal + 5] if "(connect)" in line]
    assert len(connects) == 4, "every link of the node reconnects with a hello each way"
    net.send(1, 2, PROBE)
    assert probes(sim, 1, 2) == 1, "links work again"
    assert [s[2:] for s in nf.spans] == [(Fault.PARTITION, 2)]


def test_a_partition_holds_what_crosses_it_until_the_heal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is lost while both runs live (net.peer_link rule 6): in flight
    at the cut, sent before or after a link notices — all delivered after
    the heal, after the hellos, in order."""
    sim, nf = started(seed=5)
    net = sim.net
    downs: list[int] = []
    core1 = sim.cores[1]
    real = core1.peer_link

    def peer_link(node: int, up: bool, now: float) -> list[Action]:
        if not up:
            downs.append(node)
        return real(node, up, now)

    monkeypatch.setitem(sim.cores, 1, Proxy(core1, peer_link=peer_link))
    first = pm.PeerError("probe", "first")
    net.send(1, 0, first)
    nf.partition(0, 1.0, lossy=False)
    cut = nf.cut
    assert cut is not None
    cut.notice = dict.fromkeys(cut.notice, net.now + 0.5)  # every link notices half-way
    net.send(1, 0, PROBE)
    run_for(sim, 0.3)
    assert not downs and nf.lost["PeerError"] == 0
    run_for(sim, 0.3)
    assert downs == [0], "node 1's link to 0 noticed the break"
    net.send(1, 0, PROBE)
    assert probes(sim, 1, 0) == 2 and (1, 0) not in net.ready_links(), "held, not lost"
    run_for(sim, 0.3)
    assert probes(sim, 1, 0) == 2
    run_for(sim, 0.2)
    assert probes(sim, 1, 0) == 0 and nf.lost["PeerError"] == 0, "delivered after the heal"
    heal = next(i for i, line in enumerate(sim.trace) if "partition heals" in line)
    hello = next(i for i, line in enumerate(sim.trace) if i > heal and "1->0 (connect)" in line)
    got = [i for i, line in enumerate(sim.trace) if "1->0 PeerError(code='probe'" in line]
    assert len(got) == 3 and hello < got[0] and "first" in sim.trace[got[0]], "the hello goes first, then in order"


# -- pause (rule 5) ---------------------------------------------------------------------------


def test_a_paused_node_receives_nothing_then_the_backlog() -> None:
    sim, nf = started(seed=6)
    net = sim.net
    nf.pause(1, 1.0)
    net.send(0, 1, PROBE)
    run_for(sim, 0.9)
    assert probes(sim, 0, 1) == 1 and 1 in sim.cores
    run_for(sim, 0.2)
    assert probes(sim, 0, 1) == 0
    assert [line.split(": ", 1)[1] for line in net.journal] == ["node 1 pauses for 1.00s", "node 1 resumes"]


# -- clients' refusals (client_faults rules 2 and 3) --------------------------------------------


def _answer_once(monkeypatch: pytest.MonkeyPatch, sim: SimCluster, node: int, code: str) -> None:
    """``node`` refuses the next Publish with ``code`` — alone, or the first of
    a run (the rest of the run as usual) —, then serves as usual."""
    core = sim.cores[node]
    real_client, real_run = core.handle_client, core.handle_publishes
    left = [1]

    def refuse(sid: int, msg: cm.ClientMessage, now: float) -> list[Action]:
        if isinstance(msg, cm.Publish) and left:
            left.pop()
            return [ToClient(sid, cm.Error(msg.seq, code, "refused by the test"))]
        return real_client(sid, msg, now)

    def refuse_first(sid: int, msgs: list[cm.Publish], now: float) -> list[Action]:
        if not left:
            return real_run(sid, msgs, now)
        first, *rest = msgs
        return refuse(sid, first, now) + (real_run(sid, rest, now) if rest else [])

    monkeypatch.setitem(sim.cores, node, Proxy(core, handle_client=refuse, handle_publishes=refuse_first))


@pytest.mark.parametrize("run", [1, 2])
def test_a_refused_publish_is_retried_with_its_id(monkeypatch: pytest.MonkeyPatch, run: int) -> None:
    sim, _ = started(seed=7)
    c = client_on(sim, 0)
    _answer_once(monkeypatch, sim, 0, cm.ErrorCode.NOT_READY)
    rec, *rest = publish_run(monkeypatch, sim, c, run)
    assert rec.acked_at is None and c.waiting
    assert all(r.acked_at is not None and r.sends == 1 for r in rest), "the rest of the run is served"
    run_for(sim, 0.5)
    assert rec.acked_at is not None and rec.sends == 2 and c.node == 0 and not sim.failures


@pytest.mark.parametrize("run", [1, 2])
def test_no_quorum_sends_the_client_to_another_node(monkeypatch: pytest.MonkeyPatch, run: int) -> None:
    sim, _ = started(seed=8)
    c = client_on(sim, 0)
    subs = [r for r in c.subs.values() if r.ended_at is None]
    _answer_once(monkeypatch, sim, 0, cm.ErrorCode.NO_QUORUM)
    sid = c.sid
    recs = publish_run(monkeypatch, sim, c, run)
    assert not c.connected and all(r.lost_at is not None for r in subs)
    assert sid not in sim.cores[0].sessions, "it closed its session there"
    assert not sim.failures and sim.net.runs["answers_after_leaving"] == run - 1, (
        "the answers to the rest of the run, given before it left, go unread"
    )
    sim.net.execute(0, [ToClient(sid, cm.Error(0, cm.ErrorCode.NOT_READY, "after the close"))])
    assert any("to closed session" in f for f in sim.failures), "one given after the node heard it left is a finding"
    sim.failures.clear()
    run_for(sim, 0.6)
    assert c.connected and c.node != 0 and not sim.failures
    assert all(r.acked_at is not None and r.sends == 2 for r in recs), "the whole run is sent again"


def test_a_run_declared_dead_was_dying_since_its_pause_began() -> None:
    """A paused node a majority declared dead rejoins; its clients' subscriptions
    date its death from the pause (invariants rule 6)."""
    sim, nf = started(seed=10, p_keyed=0.0, p_group=0.0)  # the workload whose start subscribed on node 2
    c = client_on(sim, 2)
    assert c.subs
    run_for(sim, 0.1)
    paused_at = sim.net.step_no
    nf.pause(2, 0.3)
    run_for(sim, 1.0)
    nf.rejoin(2, "declared dead by the test")
    assert not c.connected
    assert {rec.died_at for rec in c.subs.values()} == {paused_at}
    run_for(sim, 1.0)
    assert c.connected and 2 in sim.cores and sim.cores[2].incarnation == 2


def test_a_node_that_never_had_a_fault_may_not_close_sessions() -> None:
    from overlay.actions import CloseClient

    sim, nf = started(seed=9)
    c = client_on(sim, 1)
    sim.net.execute(1, [CloseClient(c.sid, "test")])
    assert any("closed client session" in f for f in sim.failures)
    sim.failures.clear()
    nf.pause(1, 0.1)
    run_for(sim, 0.2)
    sid = c.sid
    sim.net.execute(1, [CloseClient(sid, "rejoining")])
    assert not sim.failures and not c.connected, "after a fault of its own it may: the client goes elsewhere"
    assert sid not in sim.cores[1].sessions, "and the core hears the connection closed"


# -- whole runs: the schedule, determinism, and the runs without node faults --------------------


def test_faults_come_one_at_a_time_with_a_recovery_gap() -> None:
    kinds: set[Fault] = set()
    for seed in range(6):
        sim = SimCluster.for_fault_seed(seed)
        sim.run()
        nf = sim.node_faults
        assert nf is not None
        spans = sorted(nf.spans)
        kinds.update(k for _, _, k, _ in spans)
        for (_, end, *_), (start, *_) in itertools.pairwise(spans):
            assert start >= end + nf.recovery_floor(), f"seed {seed}: faults overlap or follow too closely: {spans}"
        assert sim.net.journal, f"seed {seed}: no fault journalled"
    assert {Fault.CRASH, Fault.PARTITION, Fault.PAUSE} <= kinds


def test_a_run_with_faults_is_a_function_of_its_seed() -> None:
    a, b = SimCluster.for_fault_seed(11).run(), SimCluster.for_fault_seed(11).run()
    assert (a.trace_hash, a.journal, a.failures, a.steps) == (b.trace_hash, b.journal, b.failures, b.steps)
    assert SimCluster.for_fault_seed(12).run().trace_hash != a.trace_hash


def test_a_run_with_faults_does_not_depend_on_the_hash_seed() -> None:
    code = "from overlay.testing.sim.cluster import SimCluster; print(SimCluster.for_fault_seed(13).run().trace_hash)"
    seen = set()
    for hs in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hs}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        seen.add(out.stdout.strip())
    assert len(seen) == 1, seen


def test_runs_without_node_faults_keep_their_delays_below_the_suspicion() -> None:
    for seed in range(20):
        cl = random_config(seed).cluster
        assert cl.suspect_timeout >= SUSPECT_FACTOR * cl.peer_timeout > 2.5 * cl.peer_timeout
        assert cl.suspect_timeout >= 2 * cl.heartbeat_interval
    sim = SimCluster(random_config(3), 3)
    assert sim.node_faults is None and sim.users.faults is None
    assert all(c.incarnation == 0 for c in sim.cores.values()), "their traces stay what they were"
    cl = fault_config(3).cluster
    assert (cl.heartbeat_interval, cl.suspect_timeout) == (FAULT_HEARTBEAT, FAULT_SUSPECT)
    assert 3 <= len(fault_config(3).node_ids) <= 5
