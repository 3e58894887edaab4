"""A node can die (SPEC §16, issue 16): real ``overlay node`` processes are
killed, paused and cut off while events flow, and afterwards every
acknowledged (event, matching subscription) pair was delivered exactly once.

Each scenario runs three node processes (``overlay.testing.NodeProcesses``)
with the failure settings' defaults (heartbeats every 0.25 s, suspected
after 1.5 s of silence, dead when two of the three suspect it), balancing
off so the channels stay where an operator put them:

    0.1 = price in [0, 500]     on node 1 — 70 % of the events: the hottest
    0.3 = price in (500, 750]   on node 2
    0.4 = price in (750, 1000]  on node 0

(``access_only``: 0.2 = (500, 1000] stays on node 0, node 2 owns nothing.)
The clients are in the test process and use the client library:

* subscribers: an ``AgentClient`` holding five subscriptions on two access
  nodes each, the victim one of them, and per node a plain ``Client``
  holding two, whose list of nodes lets it fail over to the next node and
  re-subscribe there;
* publishers: an ``AgentClient`` over every node (it re-sends a publish
  whose node does not answer to another node), 250 events/s from several
  tasks that each wait for their PubAck, for 5 s; the fault comes after 1 s.

The scenarios:

a. ``kill -9`` of node 1, the owner of the hottest channel: the survivors
   declare it dead, node 0 reassigns 0.1, publishes for it are accepted
   again;
b. ``kill -9`` of node 2, an access node only, with a plain publisher and
   subscribers on it: they fail over to node 0, the agent's subscriptions
   to node 1;
c. ``SIGSTOP`` of node 2 until the others declared it dead, then
   ``SIGCONT``: it learns it was declared dead and rejoins as a new run (a
   new incarnation in its event ids), with the current table (no event it
   cannot route) and publishes through it are delivered;
d. node 2 cut off in a network namespace (``overlay.testing.Partition``;
   root only): it answers a client of its own side ``no_quorum`` for a
   publish and a subscribe; the majority reassigns 0.3; after the heal it
   rejoins as a new run and publishes through it are delivered.

After each, the audit (``overlay.testing.Audit``) of what the application
received: a subscription counts from its SubAck — a plain client's whose
node failed from its new SubAck on another node — an event from its PubAck;
it fails on any acknowledged pair lost, any pair delivered twice, any event
delivered where it does not match, any subscription the library gave up.
Events are named by their ``qty``, so a publish the library re-sent under a
new event id shows up as a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest

from overlay.channels import parse_subscription
from overlay.client import AgentClient, AgentSettings, Client, FailoverSubscription
from overlay.client.deliveries import Notification
from overlay.config import load_config
from overlay.messages import client as cm
from overlay.node.homes import rendezvous_home
from overlay.testing import GOLDEN, free_ports, wait_until
from overlay.testing._audit import Audit, consume, publish_steadily
from overlay.testing._processes import NodeProcesses, Partition, log_time, write_cluster_config

pytestmark = pytest.mark.timeout(90)

NODES: Final = 3
SETTINGS: Final = {"slice_seconds": 0.5, "balancing": False, "peer_timeout": 2.0}
RATE: Final = 250.0  # events/s over all publishing tasks
SECONDS: Final = 5.0  # of publishing, the fault after FAULT_AT of them
FAULT_AT: Final = 1.0
AFTER: Final = 100  # events published through the failed node once it is back
# Deaths, recoveries and rejoins come within seconds; a loaded 2-core machine may stretch them.
DETECT_WAIT: Final = 10.0
SETTLE_WAIT: Final = 15.0
PUBLISH_WAIT: Final = 30.0  # for SECONDS of publishing, held up by a fault: a publish times out after 10 s
QUIET: Final = 3.0  # s without a delivery: nothing more is coming
# Of the publishes not refused no_quorum: fewer acknowledged, and the audit
# would judge little.  (The agent raises a node's no_quorum to the publisher
# instead of trying another node: between the heal and the cut-off node's
# rejoin, the publishes it routes there fail.)
MIN_ACKED: Final = 0.8
AGENT_SUBS: Final = (
    "price < 250",
    "price >= 250 and price <= 500",
    "price > 500 and price <= 750",
    "price > 750",
    'sym = "A"',
)
PLAIN_SUBS: Final = ("price <= 500", "price > 500")
# The namespace probe's event: a qty no run publishes (it must be refused).
PROBE_QTY: Final = 999_999_999


def values(qty: int) -> dict[str, Any]:
    """Event ``qty``: 70 % in the hot channel [0, 500], spread evenly (golden ratio)."""
    x = (qty * GOLDEN) % 1.0
    price = x * 500 if qty % 10 < 7 else 500.001 + x * 499.99
    return {"price": round(price, 3), "sym": "AB"[qty % 2], "qty": qty}


@dataclass
class World:
    """The processes, the clients and the audit of one scenario."""

    procs: NodeProcesses
    audit: Audit = field(default_factory=Audit)
    clients: list[Client | AgentClient] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # node -> audit names of the plain subscriptions whose only home it is
    plain_on: dict[int, list[str]] = field(default_factory=dict)
    agent_subs: list[FailoverSubscription] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)
    # (consumer, key) -> the ranks of that key's notifications, as the application got them
    ranks: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    async def layout(self, *, access_only: bool = False) -> None:
        """The channels of the module docstring, placed by an operator."""
        async with Client([self.procs.addr(0)], client_id="operator") as op:
            await op.admin("split", channel="0.0", attr="price", at=500.0)
            await op.admin("place", channel="0.1", node=1)
            if not access_only:
                await op.admin("split", channel="0.2", attr="price", at=750.0)
                await op.admin("place", channel="0.3", node=2)

    async def subscribe(self, victim: int) -> None:
        """The subscribers of the module docstring; the agent's homes are the
        victim and the next node (its list starts there; no probes, so no
        latency reorders it)."""
        schema = load_config(self.procs.config).schema
        order = [victim, *(n for n in range(NODES) if n != victim)]
        agent = AgentClient(
            [self.procs.addr(n) for n in order],
            client_id="agent-sub",
            settings=AgentSettings(probe_interval=0, redundancy=2),
        )
        self.clients.append(agent)
        await agent.connect()
        await wait_until(lambda: len(agent.connected) == NODES, what="the agent connected to every node")
        for k, expr in enumerate(AGENT_SUBS):
            name = f"agent/{k}"
            self.audit.subscription(name, expr, parse_subscription(expr, schema))
            fs = await agent.subscribe(expr, sub_id=f"a{k}", queue_size=100_000)
            self.audit.subacked(name)
            assert 0 in fs.homes, f"{name} is not held on node {victim}: homes {sorted(order[i] for i in fs.homes)}"
            self.agent_subs.append(fs)
            self.tasks.append(asyncio.create_task(consume_ranked(fs, self.audit, name, name, self.ranks)))
        for node in range(NODES):
            c = Client([self.procs.addr(node), self.procs.addr((node + 1) % NODES)], client_id=f"plain-{node}")
            self.clients.append(c)
            names = {f"p{k}": f"plain-{node}/{k}" for k in range(len(PLAIN_SUBS))}
            self.audit.spy_subacks(c, names)
            await c.connect()
            for k, expr in enumerate(PLAIN_SUBS):
                self.audit.subscription(names[f"p{k}"], expr, parse_subscription(expr, schema))
                sub = await c.subscribe(expr, sub_id=f"p{k}", queue_size=100_000)
                name = names[f"p{k}"]
                self.tasks.append(asyncio.create_task(consume_ranked(sub, self.audit, name, name, self.ranks)))
            self.plain_on[node] = list(names.values())

    def home_lost(self, node: int, at: float) -> None:
        """The plain subscriptions on ``node`` count again from their next SubAck."""
        for name in self.plain_on[node]:
            self.audit.lost_home(name, at)

    async def publisher(self) -> Callable[[dict[str, Any]], Awaitable[str]]:
        """``publish`` of an ``AgentClient`` over every node."""
        agent = AgentClient([self.procs.addr(n) for n in range(NODES)], client_id="agent-pub")
        self.clients.append(agent)
        await agent.connect()
        await wait_until(lambda: len(agent.connected) == NODES, what="the publisher connected to every node")
        return agent.publish

    def publish(
        self, publish: Callable[[dict[str, Any]], Any], qtys: Sequence[int], rate: float = RATE
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(publish_steadily(publish, self.audit, values, qtys, rate=rate))
        self.tasks.append(task)
        return task

    async def started(self, n: int) -> None:
        await wait_until(lambda: len(self.audit.events) >= n, timeout=DETECT_WAIT, what=f"{n} publishes started")

    def kill(self, node: int) -> float:
        """SIGKILL ``node``; it is the one node allowed to be gone (``alive``)."""
        self.killed.add(node)
        return self.procs.kill(node)

    def alive(self) -> None:
        """Every node the test did not kill still runs: one that exited fails
        the test at once, with its log, instead of a wait running out."""
        for n in range(NODES):
            if n not in self.killed and not self.procs.alive(n):
                raise AssertionError(f"node {n} exited ({self.procs.procs[n].returncode})\n{self.procs.tail(n, 6000)}")

    async def finished(self, *publishing: asyncio.Task[None]) -> None:
        """Until the publishers are done (``PUBLISH_WAIT``), every node alive meanwhile."""
        deadline = time.monotonic() + PUBLISH_WAIT
        pending = set(publishing)
        while pending:
            self.alive()
            assert time.monotonic() < deadline, f"publishing still under way after {PUBLISH_WAIT}s"
            _, pending = await asyncio.wait(pending, timeout=0.2)
        for task in publishing:
            task.result()

    async def settled(self) -> None:
        """Until every acknowledged pair is delivered, or nothing was
        delivered for ``QUIET`` s (re-sends come every ``resend_after`` = 1 s),
        or ``SETTLE_WAIT`` passed; then the verdict lists what is missing."""
        audit = self.audit
        seen, since = -1, time.monotonic()
        deadline = since + SETTLE_WAIT
        while time.monotonic() < deadline and audit.missing():
            self.alive()
            total = sum(audit.delivered.values())
            if total != seen:
                seen, since = total, time.monotonic()
            elif time.monotonic() - since > QUIET:
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(0.5)  # a duplicate arrives after the first copy: give it a moment to show

    def check(self) -> None:
        """The audit; the nodes' logs with it when it fails."""
        audit = self.audit
        verdict = audit.verdict()
        # The whole audit, next to the nodes' logs, for a post-mortem.
        (self.procs.logs / "audit.json").write_text(json.dumps(audit.dump()))
        logs = "\n".join(self.procs.tail(n, 2500) for n in range(NODES))
        for n in range(NODES):
            assert "Traceback" not in self.procs.log(n), self.procs.tail(n, 6000)
        acked = sum(1 for e in audit.events.values() if e.acked < float("inf"))
        refused = sum(1 for why in audit.failed.values() if cm.ErrorCode.NO_QUORUM in why)
        assert verdict.expected > 0 and acked >= MIN_ACKED * (len(audit.events) - refused), (
            f"only {acked} of {len(audit.events)} publishes acknowledged ({refused} refused no_quorum); failures: "
            f"{sorted(set(audit.failed.values()))[:5]}"
        )
        assert verdict.ok, f"{verdict}\n{logs}"

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(BaseException):
                await t
        for c in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path, addresses: list[tuple[str, int]] | None = None, prefix: dict[int, list[str]] | None = None
) -> AsyncIterator[World]:
    addresses = addresses or [("127.0.0.1", p) for p in free_ports(NODES)]
    config = write_cluster_config(tmp_path / "cluster.toml", addresses, name="failures", settings=SETTINGS)
    procs = NodeProcesses(config, addresses, tmp_path, prefix=prefix)
    world = World(procs)
    try:
        procs.start_all()
        await procs.all_ready()
        yield world
    finally:
        await world.close()
        procs.stop()


async def owners(procs: NodeProcesses, node: int) -> dict[str, list[int]]:
    """Channel -> owners, in node ``node``'s routing table."""
    status = await procs.status(node)
    return {r["id"]: r["owners"] for r in status["routing"]}


async def wait_dead(procs: NodeProcesses, victim: int, survivors: Sequence[int], after: float) -> float:
    """Until every survivor holds ``victim`` dead and the coordinator (the
    lowest survivor) reassigned its channels; when it did."""
    await asyncio.gather(*(procs.wait_log(n, f"node {victim} is dead", DETECT_WAIT, after=after) for n in survivors))
    line = await procs.wait_log(min(survivors), "reassigning the", DETECT_WAIT, after=after)
    return log_time(line)


# == a: the owner of the hottest channel =================================================


async def test_kill_9_of_the_hot_channels_owner_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    async with cluster(tmp_path) as world:
        procs, victim = world.procs, 1
        await world.layout()
        await world.subscribe(victim)
        pub = await world.publisher()
        publishing = world.publish(pub, range(int(RATE * SECONDS)))
        await world.started(int(RATE * FAULT_AT))
        killed = world.kill(victim)
        world.home_lost(victim, killed)
        recovered = await wait_dead(procs, victim, [0, 2], killed)
        await world.finished(publishing)
        await world.settled()
        for n in (0, 2):
            table = await owners(procs, n)
            assert victim not in table["0.1"], f"node {n} still routes the hot channel to the dead node: {table}"
        # Publishes for the dead node's channel are accepted again after the recovery.
        after = [e for e in world.audit.events.values() if e.started > recovered + 1.0 and e.values["price"] <= 500]
        assert after and all(e.acked < float("inf") for e in after[-20:]), "the hot channel takes no publishes"
        world.check()


# == b: an access node with publishers and subscribers ==================================


async def test_kill_9_of_an_access_node_its_clients_fail_over(tmp_path: Path) -> None:
    async with cluster(tmp_path) as world:
        procs, victim = world.procs, 2
        await world.layout(access_only=True)  # node 2 owns nothing
        await world.subscribe(victim)
        pub = await world.publisher()
        # A plain publisher on the victim that fails over to node 0 (its list's next).
        plain = Client([procs.addr(victim), procs.addr(0)], client_id="plain-pub")
        world.clients.append(plain)
        await plain.connect()
        n = int(RATE * SECONDS)
        publishing = [
            world.publish(pub, range(0, n, 2)),
            world.publish(plain.publish, range(1, n, 2), rate=RATE / 2),
        ]
        await world.started(int(RATE * FAULT_AT))
        killed = world.kill(victim)
        world.home_lost(victim, killed)
        await world.finished(*publishing)
        await world.settled()
        assert plain.node_id == 0, "the plain publisher did not fail over to node 0"
        for fs in world.agent_subs:
            assert fs.failovers >= 1 and len(fs.homes) == 2, (fs.sub_id, fs.failovers, sorted(fs.homes))
        world.check()


# == e: the home of the keys and the owner of a group's channel ==========================


async def test_kill_9_of_the_keys_home_and_the_groups_owner_keeps_order_and_one_instance(tmp_path: Path) -> None:
    """Keyed publishes whose keys' home is node 1, which also owns the hot
    channel a group subscribes to, are killed with it: every acknowledged
    pair is delivered once (the group counts as one subscription fed by its
    two instances, on the nodes that live), and each consumer sees each key's
    ranks rise."""
    async with cluster(tmp_path) as world:
        procs, victim = world.procs, 1
        await world.layout()  # 0.1 = price in [0, 500] on node 1
        await world.subscribe(victim)
        keys = [k for k in (f"key{i}" for i in range(200)) if rendezvous_home(k, list(range(NODES))) == victim][:4]
        ranks = world.ranks
        schema = load_config(procs.config).schema
        group_expr = "price <= 500"
        world.audit.subscription("group", group_expr, parse_subscription(group_expr, schema))
        for node in (0, 2):
            inst = Client([procs.addr(node)], client_id=f"worker-{node}")
            world.clients.append(inst)
            await inst.connect()
            sub = await inst.subscribe(group_expr, sub_id="w", queue_size=100_000, group="workers")
            world.audit.subacked("group")
            world.tasks.append(asyncio.create_task(consume_ranked(sub, world.audit, "group", f"worker-{node}", ranks)))
        agent = await world.publisher()

        def keyed(event: dict[str, Any]) -> Any:
            return agent(event, key=keys[event["qty"] % len(keys)])

        publishing = world.publish(keyed, range(int(RATE * SECONDS)))
        await world.started(int(RATE * FAULT_AT))
        killed = world.kill(victim)
        world.home_lost(victim, killed)
        await wait_dead(procs, victim, [0, 2], killed)
        await world.finished(publishing)
        await world.settled()
        taken = sum([(await procs.status(n))["stats"].get("ordered_keys_taken_over", 0) for n in (0, 2)])
        assert taken >= len(keys), f"the keys' backups took over {taken} keys"
        for (who, key), seen in sorted(ranks.items()):
            assert all(b > a for a, b in itertools.pairwise(seen)), f"{who} saw key {key} out of rank order: {seen}"
        world.check()


async def consume_ranked(
    notifications: AsyncIterator[Notification],
    audit: Audit,
    name: str,
    who: str,
    ranks: dict[tuple[str, str], list[int]],
) -> None:
    """``consume``, noting each keyed notification's rank per consumer and key."""

    async def noted() -> AsyncIterator[Notification]:
        async for note in notifications:
            if note.key:
                ranks.setdefault((who, note.key), []).append(note.rank)
            yield note

    await consume(noted(), audit, name)


# == c: paused past the suspect timeout ==================================================


async def test_a_paused_node_learns_it_was_declared_dead_and_rejoins_as_a_new_run(tmp_path: Path) -> None:
    async with cluster(tmp_path) as world:
        procs, victim = world.procs, 2
        await world.layout()
        await world.subscribe(victim)
        through = Client([procs.addr(victim)], client_id="through-victim")
        world.clients.append(through)
        await through.connect()

        def through_keyed(event: dict[str, Any]) -> Any:
            return through.publish(event, key=f"t{event['qty']}")

        await world.finished(world.publish(through_keyed, range(10_000, 10_010), rate=100.0))
        run_before = (await procs.status(victim))["incarnation"]
        pub = await world.publisher()
        publishing = world.publish(pub, range(int(RATE * SECONDS)))
        await world.started(int(RATE * FAULT_AT))
        paused = procs.pause(victim)
        world.home_lost(victim, paused)
        await wait_dead(procs, victim, [0, 1], paused)
        resumed = procs.resume(victim)
        await procs.wait_log(victim, "starting a new run to rejoin", DETECT_WAIT, after=resumed)
        await procs.ready(victim)
        await world.finished(publishing)
        # The new run serves: publishes through it are delivered (the audit).
        await world.finished(world.publish(through_keyed, range(20_000, 20_000 + AFTER), rate=100.0))
        assert (await procs.status(victim))["incarnation"] != run_before, "node 2 did not start a new run"
        ids = [e.event_id for q, e in world.audit.events.items() if q >= 20_000 and e.event_id]
        assert ids, "nothing published through the new run was acknowledged"
        await world.settled()
        # It serves no stale table: nothing of the new run goes unrouted.
        log = procs.log(victim)
        new_run = log[log.index("starting a new run to rejoin") :]
        assert "has no route" not in new_run and "no channel holds" not in new_run, new_run[-3000:]
        status = await procs.status(victim)
        assert not status["stats"].get("rejected_no_route"), status["stats"]
        assert {r["id"]: r["owners"] for r in status["routing"]} == await owners(procs, 0)
        world.check()


# == d: a partition ======================================================================

PROBE: Final = """
import asyncio, json, sys
from overlay.client import Client
from overlay.errors import OverlayError, RequestError

async def main(host, port, qty):
    c = await Client([(host, port)], client_id="probe", reconnect=False).connect(timeout=5)
    out = {}
    try:
        try:
            await c.publish_once({"price": 1.0, "sym": "A", "qty": qty}, timeout=5)
            out["publish"] = "accepted"
        except RequestError as exc:
            out["publish"] = str(exc.code)
        try:
            await c.subscribe("price < 1", sub_id="probe", timeout=5)
            out["subscribe"] = "accepted"
        except RequestError as exc:
            out["subscribe"] = str(exc.code)
    finally:
        await c.close()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


async def test_a_node_cut_off_refuses_with_no_quorum_and_rejoins_after_the_heal(tmp_path: Path) -> None:
    if why := Partition.available():
        pytest.skip(why)
    with Partition() as part:
        ports = free_ports(NODES)
        addresses = [(part.host_address, ports[0]), (part.host_address, ports[1]), (part.node_address, ports[2])]
        victim = 2
        async with cluster(tmp_path, addresses, {victim: part.exec_prefix}) as world:
            procs = world.procs
            await world.layout()
            await world.subscribe(victim)
            pub = await world.publisher()
            publishing = world.publish(pub, range(int(RATE * SECONDS)))
            await world.started(int(RATE * FAULT_AT))
            cut = part.cut()
            world.home_lost(victim, cut)
            # The minority side: once it suspects both peers it has no quorum.
            for peer in (0, 1):
                await procs.wait_log(victim, f"node {peer} suspected", DETECT_WAIT, after=cut)
            host, port = addresses[victim]
            status, out = await part.in_namespace(PROBE, host, str(port), str(PROBE_QTY))
            assert status == 0, out
            assert json.loads(out.strip().splitlines()[-1]) == {"publish": "no_quorum", "subscribe": "no_quorum"}, out
            # The majority side declares it dead and gives its channel to a live node.
            await wait_dead(procs, victim, [0, 1], cut)
            table = await owners(procs, 0)
            assert victim not in table["0.3"], table
            healed = part.heal()
            await procs.wait_log(victim, "starting a new run to rejoin", DETECT_WAIT, after=healed)
            await procs.ready(victim)
            await world.finished(publishing)
            through = Client([procs.addr(victim)], client_id="through-victim")
            world.clients.append(through)
            await through.connect()
            await world.finished(world.publish(through.publish, range(20_000, 20_000 + AFTER), rate=100.0))
            await world.settled()
            assert await owners(procs, victim) == await owners(procs, 0)
            world.check()
