"""Sans-IO node cores joined by ``overlay.testing.corelink.CoreLink`` (deterministic FIFO
links, high-priority queue first, every peer message through the real codec),
and ``World``: the client sessions a test opened with their subscriptions and
publications, for brute-force expectations.  Shared by the test_node_core*
modules."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import msgspec

from overlay.channels import ChannelId, parse_expression
from overlay.config import load_config
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node import NodeCore
from overlay.testing.corelink import CoreLink

_LOADED = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
# The balancer stays off: these tests drive every session themselves.  Time
# jumps between ticks with nothing delivered, so no peer is ever suspected
# here (tests/test_liveness.py covers failures).
CONFIG = msgspec.structs.replace(
    _LOADED, cluster=msgspec.structs.replace(_LOADED.cluster, balancing=False, suspect_timeout=86400.0)
)
SCHEMA = CONFIG.schema
TIMEOUT = CONFIG.cluster.peer_timeout
EC = ChannelId(0, 0)
LOW = ChannelId(0, 1)  # price ∈ [0, 500] after SPLIT_500
HIGH = ChannelId(0, 2)  # price ∈ (500, 1000]
SPLIT_500 = {"channel": "0.0", "attr": "price", "at": 500.0}

MIGRATION_TYPES = (
    pm.RequestLoadBalance,
    pm.ReplyRequestLoadBalance,
    pm.ChannelTransfer,
    pm.ReplyChannelTransfer,
    pm.SubscriptionMove,
    pm.ReplySubscriptionMove,
    pm.UpdateRoutingTable,
    pm.ReplyUpdateGlobal,
    pm.CompleteLoadBalance,
    pm.Reforward,
)


class World:
    """A started CoreLink plus the client sessions a test opened, with their
    subscriptions and publications, to compute brute-force expectations."""

    def __init__(self, n: int = 3, *, start: bool = True) -> None:
        cfg = CONFIG if n == 3 else CONFIG.with_nodes(CONFIG.nodes[:n])
        self.net = CoreLink(cfg)
        self.subs: dict[tuple[int, int], dict[str, str]] = {}  # (node, sid) -> local id -> expression
        self.events: dict[str, dict] = {}  # event id -> values
        self.payloads: dict[str, bytes] = {}  # event id -> the payload it was published with
        self.published: dict[tuple[int, int, int], str] = {}  # (node, sid, seq) -> event id
        self._seq = 0
        if start:
            self.net.start()

    @property
    def cores(self) -> dict[int, NodeCore]:
        return self.net.cores

    def seq(self) -> int:
        self._seq += 1
        return self._seq

    def client(self, node: int, name: str) -> int:
        sid = self.net.open_client(node, name)
        self.subs[(node, sid)] = {}
        return sid

    def subscribe(self, node: int, sid: int, lid: str, expr: str, *, settle: bool = True, group: str = "") -> int:
        seq = self.seq()
        self.net.client_send(node, sid, cm.Subscribe(seq, lid, expr, group=group))
        self.subs[(node, sid)][lid] = expr
        if settle:
            self.net.run()
            self.assert_replied(node, sid, cm.SubAck, seq)
        return seq

    def unsubscribe(self, node: int, sid: int, lid: str, *, settle: bool = True) -> int:
        seq = self.seq()
        self.net.client_send(node, sid, cm.Unsubscribe(seq, lid))
        del self.subs[(node, sid)][lid]
        if settle:
            self.net.run()
            self.assert_replied(node, sid, cm.UnsubAck, seq)
        return seq

    def publish(self, node: int, sid: int, values: dict, payload: bytes | None = None) -> str:
        """Publish (no delivery yet); returns the event id the node named it.
        The PubAck comes once the event is confirmed (node.outbox): at once
        when nothing waits, else after a run; ``notifies`` checks each came.
        Every event carries a payload (by default bytes of its own, binary,
        naming its seq), so every test through ``notifies`` checks that
        payloads arrive unchanged on whatever path the event took."""
        seq = self.seq()
        if payload is None:
            payload = b"\x00\xff" + seq.to_bytes(4, "big") + b"payload"
        mark = len(self.net.to_clients)
        self.net.client_send(node, sid, cm.Publish(seq, values, payload=payload))
        replies = [m for m in self.net.received(node, sid, since=mark) if getattr(m, "seq", None) == seq]
        if replies:
            (ack,) = replies
            assert isinstance(ack, cm.PubAck), ack
            eid = ack.event_id
        else:  # kept until confirmed: the newest event of the outbox
            eid = self.cores[node].outbox.ids()[-1]
            assert self.cores[node].outbox.waiting(eid) == [(sid, seq)]
        self.events[eid] = values
        self.payloads[eid] = payload
        self.published[(node, sid, seq)] = eid
        return eid

    def assert_acked(self) -> None:
        """Every publish of a session still open got exactly one PubAck, with its event id."""
        for (node, sid, seq), eid in self.published.items():
            if not self.cores[node].sessions.get(sid):
                continue
            acks = [m for m in self.net.received(node, sid, kind=cm.PubAck) if m.seq == seq]
            assert [a.event_id for a in acks] == [eid], (node, sid, seq, eid, acks)

    def admin(self, at: int, sid: int, command: str, /, **args) -> object:
        seq = self.seq()
        self.net.client_send(at, sid, cm.Admin(seq, command, args))
        self.net.run()
        return self.reply(at, sid, seq)

    def reply(self, node: int, sid: int, seq: int) -> object:
        replies = [m for m in self.net.received(node, sid) if getattr(m, "seq", None) == seq]
        assert len(replies) == 1, replies
        return replies[0]

    def assert_replied(self, node: int, sid: int, kind: type, seq: int) -> object:
        r = self.reply(node, sid, seq)
        assert isinstance(r, kind), r
        return r

    def notifies(self) -> Counter:
        """Every Notify sent, as (node, sid, event id, sub ids) → count; and
        every publish was acknowledged (``assert_acked``)."""
        self.assert_acked()
        out: Counter = Counter()
        for node, sid, m in self.net.to_clients:
            if isinstance(m, cm.Notify):
                assert m.event == self.events[m.event_id]
                assert m.payload == self.payloads.get(m.event_id, b""), (m.event_id, m.payload)
                assert len(set(m.sub_ids)) == len(m.sub_ids)  # each subscription once
                out[(node, sid, m.event_id, frozenset(m.sub_ids))] += 1
        return out

    def expected(
        self, subs: dict[tuple[int, int], dict[str, str]] | None = None, events: dict | None = None
    ) -> Counter:
        """Brute force: one Notify per (client, event) listing every matching subscription."""
        subs = self.subs if subs is None else subs
        events = self.events if events is None else events
        out: Counter = Counter()
        for (node, sid), table in subs.items():
            filters = {lid: parse_expression(e, SCHEMA) for lid, e in table.items()}
            for eid, values in events.items():
                hit = frozenset(lid for lid, f in filters.items() if f.matches(values))
                if hit:
                    out[(node, sid, eid, hit)] += 1
        return out

    def stored(self, chid: ChannelId) -> set[str]:
        """Global ids of the subscriptions held by ``chid`` wherever it lives."""
        (owner,) = self.net.owner_of(chid)
        return {s.id for s in self.cores[owner].local[chid]}

    def gid(self, node: int, sid: int, lid: str) -> str:
        return self.cores[node].sessions[sid].subs[lid][0]

    def gids(self, node: int, sid: int, lid: str) -> list[str]:
        """Global ids of every conjunct of a subscription (node.sessions rule 7)."""
        return [gid for gid, _ in self.cores[node].sessions[sid].conjuncts(lid)]


def spread(w: World, admin_sid: int) -> None:
    """Split EC at price 500 and place the upper half on node 2; then split the
    lower half by sym and place the {AB, CD} part on node 1."""
    assert isinstance(w.admin(0, admin_sid, "split", **SPLIT_500), cm.AdminReply)
    assert isinstance(w.admin(0, admin_sid, "place", channel="0.2", node=2), cm.AdminReply)
    assert isinstance(w.admin(0, admin_sid, "split", channel="0.1", attr="sym", values=["AB", "CD"]), cm.AdminReply)
    assert isinstance(w.admin(0, admin_sid, "place", channel="0.3", node=1), cm.AdminReply)
    assert w.net.routing_tables_equal()
    assert sorted(w.cores[0].local.ids()) == [ChannelId(0, 4)]
    assert w.cores[1].local.ids() == [ChannelId(0, 3)]
    assert w.cores[2].local.ids() == [HIGH]


def random_events(rng: random.Random, n: int) -> list[dict]:
    prices = [0.0, 1.0, 99.5, 100.0, 250.0, 499.0, 500.0, 500.5, 750.0, 999.0, 1000.0]
    syms = ["AB", "CD", "EF", "X", "ABC"]
    out = []
    for _ in range(n):
        e = {"price": rng.choice(prices), "sym": rng.choice(syms)}
        if rng.random() < 0.5:
            e["qty"] = rng.randrange(0, 100)
        out.append(e)
    return out


SUBSCRIPTIONS = [
    "price < 100",
    "price >= 500",
    'sym = "AB"',
    'sym prefix "A" and price <= 500',
    "price in [250, 750]",
    'sym in {"CD", "X"}',
    "qty > 50",
    'price > 999 and sym != "AB"',
]
