"""Event payloads end to end, with real nodes on loopback (issue 18 item 1).

An event's payload is opaque bytes, delivered unchanged with every
notification and never matched: these tests publish payloads on every path
an event takes — delivered by its owner's node, across nodes, ordered per
key, to a group and re-dispatched to another instance, during a migration of
its channel, after its owner's death, through the routing agent — and check
each notification carries exactly the bytes published.  The deterministic
cores (``tests/coreworld.py``: Reforward, re-sends, re-routes) and the
simulator (``overlay.testing.sim``) check every event's payload too.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path

import pytest

from conftest import CONFIGS, LOCAL, CapturedUntil
from overlay import cli
from overlay.channels import ChannelId
from overlay.cli.pubsub import decode_payload_fields
from overlay.client.subscription import Subscription
from overlay.errors import LocalProtocolError, RequestError
from overlay.messages import client as cm
from overlay.testing import WAIT, LoopbackCluster, wait_until, with_tls_table

pytestmark = pytest.mark.timeout(90)

EC = ChannelId(0, 0)
BINARY = bytes(range(256)) * 3  # every byte value: no text encoding passes it by luck


def payload(i: int) -> bytes:
    """A payload of its own per event: binary, of a size that varies."""
    return i.to_bytes(4, "big") + BINARY[: (i * 37) % len(BINARY)]


async def received(sub: Subscription, n: int) -> dict[str, bytes]:
    notes = [await sub.next(WAIT) for _ in range(n)]
    return {note.event_id: note.payload for note in notes}


async def test_a_payload_arrives_unchanged_from_its_owners_node_and_across_nodes() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False) as cl:
        # Two channels: price <= 500 stays on node 0, price > 500 on node 2.
        await cl.admin(0, "split", channel="0.0", attr="price", at=500.0)
        await cl.admin(0, "place", channel="0.2", node=2)
        local = await (await cl.client(0)).subscribe("price >= 0")  # the owner's own access node
        remote = await (await cl.client(1)).subscribe("price >= 0")  # a Notification away
        pub = await cl.client(1)
        sent = {}
        for i in range(12):
            price = 100.0 if i % 2 else 900.0
            sent[await pub.publish({"price": price, "sym": "AB"}, payload=payload(i))] = payload(i)
        sent[await pub.publish({"price": 1.0, "sym": "AB"})] = b""  # none: b""
        sent[await pub.publish({"price": 2.0, "sym": "AB"}, payload="café ✓")] = "café ✓".encode()
        assert await received(local, len(sent)) == sent
        assert await received(remote, len(sent)) == sent
        # Windowed publishes carry theirs too.
        for i in range(20, 30):
            await pub.publish_windowed({"price": float(i * 30), "sym": "W"}, payload=payload(i))
        await pub.flush(timeout=WAIT)
        got = await received(remote, 10)
        assert sorted(got.values()) == sorted(payload(i) for i in range(20, 30))


async def test_a_payload_over_max_payload_is_refused_by_the_client_and_by_the_node() -> None:
    async with LoopbackCluster(LOCAL, 2, balancing=False, max_payload=1024) as cl:
        c = await cl.client(0)
        await c.publish({"price": 1.0, "sym": "A"}, payload=b"x" * 1024)  # the limit itself is fine
        with pytest.raises(RequestError) as err:  # told the limit at the Welcome: refused unsent
            await c.publish({"price": 1.0, "sym": "A"}, payload=b"x" * 1025)
        assert err.value.code == cm.ErrorCode.PAYLOAD_TOO_LARGE and "1024" in str(err.value)
        with pytest.raises(LocalProtocolError, match="a payload is bytes or str"):
            await c.publish({"price": 1.0, "sym": "A"}, payload=12)  # type: ignore[arg-type]
        raw = await cl.raw(1)  # a client that does not check: the node does
        reply = await raw.publish({"price": 1.0, "sym": "A"}, payload=b"y" * 5000)
        assert isinstance(reply, cm.Error) and reply.code == cm.ErrorCode.PAYLOAD_TOO_LARGE
        assert "5000 bytes" in reply.message and "[cluster] max_payload" in reply.message
        assert cl.stat("rejected_payload_too_large") == 1 and cl.nodes[1].core.stats["events_in"] == 0
        ok = await raw.publish({"price": 1.0, "sym": "A"}, payload=b"z" * 10)  # the session goes on
        assert isinstance(ok, cm.PubAck)


async def test_a_full_outbox_of_payload_bytes_answers_choke_and_nothing_is_lost() -> None:
    # 64 KiB of kept payloads: a burst of 40 events of 16 KiB is paced by Chokes.
    async with LoopbackCluster(LOCAL, 2, balancing=False, outbox_bytes=64 * 1024) as cl:
        sub = await (await cl.client(1)).subscribe("price >= 0")
        raw = await cl.raw(0)
        body = b"p" * (16 * 1024)
        replies = await asyncio.gather(
            *[raw.publish_nowait({"price": float(i), "sym": "A"}, payload=body) for i in range(40)]
        )
        assert any(isinstance(r, cm.Choke) for r in replies)  # some were paced
        assert cl.stat("choked_outbox_full") >= 1
        acked = [r for r in replies if isinstance(r, cm.PubAck)]
        got = await received(sub, len(acked))
        assert set(got) == {r.event_id for r in acked} and set(got.values()) == {body}
        await wait_until(lambda: cl.nodes[0].core.outbox.bytes == 0, WAIT, "the outbox emptied")


async def test_ordered_events_carry_their_payloads_in_rank_order() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False) as cl:
        sub = await (await cl.client(2)).subscribe("price >= 0")
        pub = await cl.client(1)
        for r in range(1, 9):
            await pub.publish({"price": float(r), "sym": "K"}, key="k1", rank=r, payload=payload(r))
        notes = [await sub.next(WAIT) for _ in range(8)]
        assert [(n.rank, n.payload) for n in notes] == [(r, payload(r)) for r in range(1, 9)]


async def test_a_group_copy_carries_the_payload_and_so_does_its_re_dispatch() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False) as cl:
        refusing = await cl.raw(1, auto_ack=False)  # answers each copy with a decline
        taking = await cl.raw(2)
        await refusing.subscribe("price >= 0", group="g", weight=1000.0)  # chosen first
        await taking.subscribe("price >= 0", group="g", weight=1.0)
        pub = await cl.client(0)
        ids = {await pub.publish({"price": float(i), "sym": "G"}, payload=payload(i)): payload(i) for i in range(5)}
        await wait_until(lambda: len(refusing.notes) >= 1, WAIT, "a copy to the refusing instance")
        for note in list(refusing.notes):
            assert note.payload == ids[note.event_id]
            refusing.send(cm.Ack(note.event_id, 0.0, note.tag, declined=True))
        await wait_until(lambda: {n.event_id for n in taking.notes} >= set(ids), WAIT, "every event taken")
        assert {n.event_id: n.payload for n in taking.notes} == ids
        assert cl.stat("deliveries_declined") >= 1


async def test_payloads_survive_a_migration_of_their_channel_under_traffic() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False) as cl:
        sub = await (await cl.client(2)).subscribe("price >= 0")
        pub = await cl.client(1)
        sent: dict[str, bytes] = {}
        stop = asyncio.Event()

        async def publish() -> None:
            i = 0
            while not stop.is_set() or i < 20:
                sent[await pub.publish({"price": float(i % 1000), "sym": "M"}, payload=payload(i))] = payload(i)
                i += 1

        task = asyncio.create_task(publish())
        try:
            await wait_until(lambda: len(sent) >= 10, WAIT, "traffic before the move")
            await cl.admin(0, "place", channel="0.0", node=1)  # events in flight are re-forwarded (SPEC §8.2)
            await cl.admin(1, "place", channel="0.0", node=2)  # through its owner
            stop.set()
            await task
        finally:
            task.cancel()
        assert EC in cl.nodes[2].core.local
        assert await received(sub, len(sent)) == sent


async def test_payloads_survive_the_death_of_their_owner() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False, heartbeat_interval=0.1, suspect_timeout=0.6) as cl:
        assert EC in cl.nodes[0].core.local
        sub = await (await cl.client(1)).subscribe("price < 100")
        pub = await cl.client(2)
        before = {await pub.publish({"price": 1.0, "sym": "D"}, payload=payload(1)): payload(1)}
        assert await received(sub, 1) == before
        await cl.crash_node(0)
        await wait_until(
            lambda: any(EC in cl.nodes[i].core.local and not cl.nodes[i].core.recovery.rebuilding for i in (1, 2)),
            WAIT,
            "EC rebuilt on a live node",
        )
        after = {await pub.publish({"price": float(i), "sym": "D"}, payload=payload(i)): payload(i) for i in range(5)}
        assert await received(sub, 5) == after


async def test_the_routing_agent_publishes_payloads() -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False) as cl:
        sub = await (await cl.client(0)).subscribe("price >= 0")
        agent = await cl.agent(0, 1, 2, probe_interval=0)
        sent = {await agent.publish({"price": float(i), "sym": "A"}, payload=payload(i)): payload(i) for i in range(6)}
        assert await received(sub, 6) == sent


# -- the CLI -------------------------------------------------------------------------------------


def cluster_toml(cl: LoopbackCluster, tmp_path: Path, max_payload: int = 64 * 1024) -> Path:
    """A config file for the CLI naming the running nodes (as ``test_failover``'s)."""
    text = with_tls_table((CONFIGS / "local.toml").read_text(), cl.config.tls)  # the cluster's plain TCP
    for i in range(len(cl.nodes)):
        text = re.sub(rf"port = 710{i}\n", f"port = {cl.addr(i)[1]}\n", text)
    text = re.sub(r"admin_port = \d+", "admin_port = 0", text)
    text = text.replace("[cluster]", f"[cluster]\nmax_payload = {max_payload}", 1)
    path = tmp_path / "cluster.toml"
    path.write_text(text + "\n[agent]\nwindow = 8\nprobe_interval = 0\n")
    return path


async def test_cli_pub_with_a_payload_and_sub_printing_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with LoopbackCluster(LOCAL, 3, balancing=False) as cl:
        cfg = cluster_toml(cl, tmp_path)
        parse = cli.build_parser().parse_args
        sub_args = parse(["sub", "--config", str(cfg), 'sym = "PAY"', "--count", "3", "--seconds", "20"])
        subscriber = asyncio.ensure_future(cli.run_sub(sub_args))
        seen = CapturedUntil(capsys, '"subscribed"')  # printed once both homes acknowledged
        await wait_until(seen.found, WAIT, "the CLI subscription acknowledged")
        binary = tmp_path / "blob.bin"
        binary.write_bytes(BINARY)
        pubs = [
            ["--payload", "order #17 filled ✓", '{price: 1.5, sym: "PAY"}'],
            ["--payload-file", str(binary), '{price: 2.5, sym: "PAY"}'],
            ['{price: 3.5, sym: "PAY"}'],
        ]
        for extra in pubs:
            assert await cli.run_pub(parse(["pub", "--config", str(cfg), *extra])) == 0
        assert await asyncio.wait_for(subscriber, WAIT) == 0
        lines = [json.loads(x) for x in seen.rest().out.splitlines()]
        published = {x["event_id"]: x for x in lines if "subscriptions" not in x}
        notified = {x["event_id"]: x for x in lines if "subscriptions" in x}
        assert set(published) == set(notified) and len(published) == 3
        by_price = {x["event"]["price"]: x for x in notified.values()}
        assert by_price[1.5]["payload"] == "order #17 filled ✓" and "payload_base64" not in by_price[1.5]
        assert base64.b64decode(by_price[2.5]["payload_base64"]) == BINARY and "payload" not in by_price[2.5]
        assert decode_payload_fields(by_price[2.5]) == BINARY
        assert "payload" not in by_price[3.5] and "payload_base64" not in by_price[3.5]
        assert sorted(x.get("payload_bytes", 0) for x in published.values()) == [
            0,
            len("order #17 filled ✓".encode()),
            len(BINARY),
        ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--payload", "a", "--payload-file", "f"], "not allowed with argument"),
        (["--payload-file", "{missing}"], "no such file"),
        (["--payload-file", "{dir}"], "is a directory"),
        (["--payload", "x" * 2000], "--payload is 2000 bytes; the cluster takes payloads of at most 1024 bytes"),
        (["--payload-file", "{big}"], "is over 1024 bytes; the cluster takes payloads of at most 1024"),
    ],
)
def test_cli_pub_payload_mistakes_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    text = (CONFIGS / "local.toml").read_text().replace("[cluster]", "[cluster]\nmax_payload = 1024", 1)
    text = text.replace('"certs/', f'"{CONFIGS}/certs/')
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    (tmp_path / "big").write_bytes(b"b" * 1025)
    names = {"{missing}": str(tmp_path / "nope.bin"), "{dir}": str(tmp_path), "{big}": str(tmp_path / "big")}
    argv = [names.get(a, a) for a in argv]
    try:
        code = cli.main(["pub", "--config", str(cfg), *argv, '{price: 1.0, sym: "A"}'])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
