"""The simulated clients of ``SimCluster``: sessions on the cores, what they
send (publish, subscribe, unsubscribe, operators' split and place, close,
join), what they receive and check as it comes, and the moving hot spot of
the event workload (rules 2 and 4 of ``overlay.testing.sim.cluster``).
Under node faults, what the clients do about them — ids on every publish,
retries, reconnecting elsewhere — is ``sim.client_faults``'.  What a node
read from a client and has not dispatched yet — a pipelining publisher's
burst, for one — waits in its inbox (``sim.inbox``).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Final

import msgspec

from overlay.channels.space import RangeConstraint
from overlay.messages import client as cm
from overlay.messages.codec import HEADER, client_reader

from .client_faults import ClientFaults
from .inbox import MAX_BURST, P_BURST, ClientLink
from .network import SimNetwork
from .records import EventRec, SimClient, SubRec
from .setup import SimParams
from .workload import PRICE_MAX, QTY_MAX, SYMS, SubSpec, clamp_price, literal, payload_of, random_spec

__all__ = ["SimClients"]

# Deterministic: sets and dicts encode sorted, so the trace hash does not
# depend on PYTHONHASHSEED.  The bytes still go through the real decoder.
_encoder: Final = msgspec.msgpack.Encoder(order="deterministic")


class SimClients:
    """Every simulated client and what it did and saw (the records the
    invariants judge), acting on ``net`` with the scenario's ``rng``."""

    def __init__(self, net: SimNetwork, params: SimParams, rng: random.Random) -> None:
        self._net = self.net = net
        self.params = params
        self.rng = rng
        self.clients: list[SimClient] = []
        self.by_session: dict[tuple[int, int], SimClient] = {}
        self.admins: dict[int, SimClient] = {}
        self.events: dict[str, EventRec] = {}
        self.event_names: dict[str, EventRec] = {}  # with node faults: the cluster's names of the events
        self.subs: list[SubRec] = []
        self.notes: Counter[tuple[str, str, str]] = Counter()
        self.key_ranks: dict[tuple[str, str, str], list[int]] = {}  # (client, sub, key) -> ranks as notified
        self.admin_results: Counter[str] = Counter()
        self.notifies = 0
        self._sub_no = 0
        self._client_no = 0
        self._hot_center = 0.0
        self._hot_width = 100.0
        self._next_shift = 0.0
        self._hot_point = (clamp_price(rng.uniform(0, PRICE_MAX)), rng.choice(SYMS))
        self.faults = ClientFaults(self, rng) if params.node_faults else None
        # Under node faults: each group's filter, every instance's (SPEC §11: equivalent instances).
        self.group_specs: dict[str, SubSpec] = {}
        if self.faults is not None and params.p_group:
            self.group_specs = {f"g{i}": random_spec(rng) for i in range(params.groups)}

    def shift_hot_spot(self, active: bool) -> None:
        """Now and then, while the run is active, the hot spot moves."""
        net, rng = self._net, self.rng
        if active and net.now >= self._next_shift:
            self._hot_center = rng.uniform(0, PRICE_MAX)
            self._hot_width = rng.choice((10.0, 50.0, 200.0))
            self._next_shift = net.now + rng.uniform(2, 5) * net.slice

    def open(self, node: int, *, admin: bool = False) -> SimClient:
        self._client_no += 1
        sid = self._net.cores[node].client_opened()
        c = SimClient(f"{'admin' if admin else 'c'}{self._client_no}", node, sid, client_reader(), admin=admin)
        self.by_session[(node, sid)] = c
        if not admin:
            self.clients.append(c)
        self.send(c, cm.Hello(c.name))
        return c

    def send(self, c: SimClient, msg: cm.ClientMessage) -> None:
        client = ClientLink(c.node, c.sid)
        if client in self._net.inbox and type(msg) is not cm.Publish and type(msg) is not cm.Ack:
            # What the node read before goes first (sim.inbox rule 3).  An Ack
            # queues behind it instead: it is sent while a core's actions are
            # carried out, and a core is not called back from inside its own call.
            self._net.flush(client)
            if not c.connected:  # it lost its session meanwhile: this request goes with the next (client_faults rule 4)
                return
        body = _encoder.encode(msg)
        h = self._net.hash
        h.update(b"C%d:%d>" % (c.node, c.sid))
        h.update(body)
        decoded = client_reader().feed(HEADER.pack(len(body)) + body)
        if decoded != [msg]:
            self._net.failures.append(f"client {type(msg).__name__} did not survive the codec: {decoded!r}")
            return
        if self._net.keep_trace:
            self._net.trace.append(f"{self._net.step_no} t={self._net.now:.3f} client {c.name}@{c.node} -> {msg!r}")
        self._net.from_client(client, decoded[0])

    def receive(self, node: int, sid: int, msg: cm.ClientMessage) -> None:
        """``msg`` from ``node`` to the client of session ``sid``."""
        body = _encoder.encode(msg)
        self._read(node, sid, HEADER.pack(len(body)) + body, body)

    def receive_frame(self, node: int, sid: int, frame: bytes) -> None:
        """One session's frame of a ``Notifies``, as the shell encoded it (``messages.codec`` rule 4)."""
        self._read(node, sid, frame, None)

    def _read(self, node: int, sid: int, frame: bytes, body: bytes | None) -> None:
        """The client of session ``sid`` reads ``frame`` (whose deterministic body,
        for the trace hash, is ``body``, else that of what it decodes to)."""
        c = self.by_session.get((node, sid))
        closed = c is None or c.closed_at is not None
        (msg,) = (client_reader() if c is None or closed else c.reader).feed(frame)
        self._net.hash.update(b"c%d:%d<" % (node, sid))
        self._net.hash.update(_encoder.encode(msg) if body is None else body)
        if c is None or closed:
            if self._net.late_for(node, sid):  # answered before the client left (a pipelined request's)
                self._net.runs["answers_after_leaving"] += 1
                return
            self._net.failures.append(
                f"step {self._net.step_no}: node {node} sent {type(msg).__name__} to closed session {sid}"
            )
            return
        if self._net.keep_trace:
            self._net.trace.append(f"{self._net.step_no} t={self._net.now:.3f} {node} -> client {c.name}: {msg!r}")
        match msg:
            case cm.Welcome():
                pass
            case cm.PubAck():
                kind, data = c.pending.pop(msg.seq, ("?", None))
                if kind == "event" and self.faults is not None:
                    self.faults.acked(c, msg, data)
                    return
                if kind != "pub":
                    self._net.failures.append(f"{c.name}: PubAck for seq {msg.seq} ({kind})")
                    return
                values, pub_at = data
                if msg.event_id in self.events:
                    self._net.failures.append(f"event id {msg.event_id} given twice")
                self.events[msg.event_id] = EventRec(msg.event_id, values, pub_at, c.name)
            case cm.SubAck():
                kind, rec = c.pending.pop(msg.seq, ("?", None))
                if kind != "sub" or rec.local_id != msg.sub_id:
                    self._net.failures.append(f"{c.name}: SubAck {msg!r} answers {kind}")
                    return
                if rec.acked_at is not None:
                    self._net.failures.append(f"{c.name}: second SubAck for {rec.local_id}")
                rec.acked_at = self._net.step_no
            case cm.UnsubAck():
                kind, rec = c.pending.pop(msg.seq, ("?", None))
                if kind != "unsub" or rec.local_id != msg.sub_id:
                    self._net.failures.append(f"{c.name}: UnsubAck {msg!r} answers {kind}")
                    return
                rec.unsub_acked_at = self._net.step_no
            case cm.Notify():
                self.notifies += 1
                if msg.payload != payload_of(msg.event):
                    self._net.failures.append(
                        f"{c.name}: Notify of {msg.event_id} carries payload {msg.payload!r}, "
                        f"not its event's {payload_of(msg.event)!r}"
                    )
                if len(set(msg.sub_ids)) != len(msg.sub_ids):
                    self._net.failures.append(
                        f"{c.name}: Notify of {msg.event_id} lists a subscription twice: {msg.sub_ids}"
                    )
                for lid in msg.sub_ids:
                    self.notes[(msg.event_id, c.name, lid)] += 1
                    if msg.key:
                        self.key_ranks.setdefault((c.name, lid, msg.key), []).append(msg.rank)
                    rec = c.subs.get(lid)
                    if rec is not None and rec.ended_at is not None:
                        self._net.failures.append(
                            f"step {self._net.step_no}: {c.name} notified of {msg.event_id} on {lid} after unsubscribing"
                        )
                if msg.tag:  # a tracked copy (keyed, or a group instance's): taken at once, once recorded
                    self.send(c, cm.Ack(msg.event_id, 0.0, msg.tag))
            case cm.Revoke():
                pass  # every copy was acked as it came: the Ack already sent stands (node.acks rule 2)
            case cm.Error() | cm.Choke() if self.faults is not None:
                kind, data = c.pending.pop(msg.seq, ("?", None))
                if kind == "?" and isinstance(msg, cm.Error) and msg.code == cm.ErrorCode.UNDELIVERABLE:
                    self.faults.returned(msg)  # a group had no instance for an acknowledged event
                elif kind == "?":
                    self._net.failures.append(f"{c.name}: unexpected {msg!r}")
                else:
                    self.faults.refused(c, kind, data, msg)
            case cm.Error():
                kind, data = c.pending.pop(msg.seq, ("?", None))
                if kind == "sub":
                    data.failed = True
                    if msg.code != cm.ErrorCode.NOT_READY:
                        self._net.failures.append(
                            f"{c.name}: subscribe {data.spec.text()!r} refused: {msg.code} {msg.message}"
                        )
                elif kind == "pub":
                    if msg.code != cm.ErrorCode.NOT_READY:
                        self._net.failures.append(f"{c.name}: publish {data[0]} refused: {msg.code} {msg.message}")
                elif kind == "admin":
                    self.admin_results[f"{data}:refused"] += 1
                else:
                    self._net.failures.append(f"{c.name}: unexpected {msg!r} ({kind})")
            case cm.AdminReply():
                kind, data = c.pending.pop(msg.seq, ("?", None))
                if kind != "admin":
                    self._net.failures.append(f"{c.name}: AdminReply {msg!r} answers {kind}")
                    return
                self.admin_results[f"{data}:ok"] += 1
            case _:
                self._net.failures.append(f"{c.name}: unexpected {msg!r}")

    def next_seq(self, c: SimClient, kind: str, data: Any) -> int:
        c.seq += 1
        c.pending[c.seq] = (kind, data)
        return c.seq

    def subscribe(self, c: SimClient, spec: SubSpec, group: str = "") -> SubRec:
        """A new subscription of ``c`` (an instance of ``group``), sent."""
        self._sub_no += 1
        rec = SubRec(
            c,
            f"s{self._sub_no}",
            spec,
            self._net.step_no,
            run=(c.node, self._net.cores[c.node].incarnation),
            group=group,
        )
        c.subs[rec.local_id] = rec
        self.subs.append(rec)
        self.send_subscribe(c, rec)
        return rec

    def send_subscribe(self, c: SimClient, rec: SubRec) -> None:
        """(Again, after a refusal:) ``rec``'s Subscribe; its global id as the node made it."""
        seq = self.next_seq(c, "sub", rec)
        self.send(c, cm.Subscribe(seq, rec.local_id, rec.spec.text(), group=rec.group))
        if not c.connected:  # the node closed the session at once
            return
        entry = self._net.cores[c.node].sessions[c.sid].subs.get(rec.local_id)
        if entry is not None:
            rec.gid, rec.filter = entry

    def act(self, only: tuple[str, ...] | None = None) -> bool:
        """One client action; False when nobody could act."""
        rng = self.rng
        p = self.params
        kinds = ("publish", "subscribe", "unsubscribe", "admin", "close", "join")
        weights: tuple[float, ...] = (p.w_publish, p.w_subscribe, p.w_unsubscribe, p.w_admin, p.w_close, p.w_join)
        if only is not None:
            weights = tuple(w if k in only else 0.0 for k, w in zip(kinds, weights))
        kind = rng.choices(kinds, weights)[0]
        if kind == "join":
            self.open(rng.choice(self._net.ids if self.faults is None else self._net.serving() or self._net.ids))
            return True
        if kind == "admin":
            return self._admin_act()
        live = [
            c
            for c in self.clients
            if c.closed_at is None and c.connected and self._net.stall_until[c.node] <= self._net.now
        ]
        if not live:
            return False
        c = rng.choice(live)
        if kind == "publish":
            net = self._net
            # A pipelining publisher writes a burst at once: it waits in the node's inbox (sim.inbox rule 3).
            burst = p.batching and net.batch_rng.random() < P_BURST
            net.hold_all = burst
            try:
                for _ in range(net.batch_rng.randint(2, MAX_BURST) if burst else 1):
                    self.publish(c)
            finally:
                net.hold_all = False
        elif kind == "subscribe":
            if self.group_specs and rng.random() < p.p_group:
                group = rng.choice(sorted(self.group_specs))
                self.subscribe(c, self.group_specs[group], group)
            else:
                self.subscribe(c, random_spec(rng))
        elif kind == "unsubscribe":
            cands = [
                r
                for r in c.subs.values()
                if r.unsub_sent_at is None and r.gid is not None and not r.failed and r.lost_at is None
            ]
            if not cands:
                return False
            rec = rng.choice(cands)
            # What the node read before goes first (sim.inbox rule 3): the
            # subscription is given up from the node's reading of this on.
            self._net.flush(ClientLink(c.node, c.sid))
            if not c.connected or rec.lost_at is not None:  # its session went meanwhile
                return True
            rec.unsub_sent_at = self._net.step_no
            seq = self.next_seq(c, "unsub", rec)
            self.send(c, cm.Unsubscribe(seq, rec.local_id))
        elif kind == "close":
            self._net.flush(ClientLink(c.node, c.sid))  # what the node read before the close goes first
            if not c.connected:  # it lost the session meanwhile (client_faults rule 4)
                return True
            c.closed_at = self._net.step_no
            self._net.hash.update(b"X%d:%d" % (c.node, c.sid))
            self._net.execute(c.node, self._net.cores[c.node].client_closed(c.sid))
        return True

    def publish(self, c: SimClient) -> None:
        """One Publish of ``c`` (under node faults, with its id: ``client_faults`` rule 1)."""
        rng = self.rng
        p = self.params
        values = self._event_values()
        event: Any = values
        if self.faults is not None:
            if rng.random() < 0.2:
                event = "{" + ", ".join(f"{k}: {literal(v)}" for k, v in values.items()) + "}"
            key = f"k{rng.randrange(p.keys)}" if p.p_keyed and rng.random() < p.p_keyed else ""
            self.faults.publish(c, values, event, key)
            return
        seq = self.next_seq(c, "pub", (values, self._net.step_no))
        if rng.random() < 0.2:
            event = "{" + ", ".join(f"{k}: {literal(v)}" for k, v in values.items()) + "}"
        self.send(c, cm.Publish(seq, event, publish_time=self._net.now, payload=payload_of(values)))

    def _admin_act(self) -> bool:
        rng = self.rng
        nodes = [i for i in self._net.serving() if self._net.cores[i].ready]
        if self.faults is not None:
            nodes = [i for i in nodes if self.admins[i].connected and self.admins[i].closed_at is None]
        if not nodes:
            return False
        node = rng.choice(nodes)
        core = self._net.cores[node]
        chans = sorted(core.local.ids())
        if not chans:
            return False
        chid = rng.choice(chans)
        a = self.admins[node]
        if rng.random() < 0.5:
            ch = core.local[chid]
            if rng.random() < 0.7:
                c = ch.space.constraint("price")
                assert isinstance(c, RangeConstraint)
                lo, hi = float(c.interval.lo), float(c.interval.hi)
                at = clamp_price(rng.uniform(lo, hi))
                args: dict[str, Any] = {"channel": str(chid), "attr": "price", "at": at}
            else:
                args = {"channel": str(chid), "attr": "sym", "values": sorted(rng.sample(SYMS, rng.randint(1, 3)))}
            seq = self.next_seq(a, "admin", "split")
            self.send(a, cm.Admin(seq, "split", args))
        else:
            others = [i for i in self._net.ids if i != node]
            seq = self.next_seq(a, "admin", "place")
            self.send(a, cm.Admin(seq, "place", {"channel": str(chid), "node": rng.choice(others)}))
        return True

    def _event_values(self) -> dict[str, Any]:
        rng = self.rng
        p = self.params
        r = rng.random()
        if p.hot_point and r < 0.3:
            price, sym = self._hot_point
        elif p.hot_price and r < 0.5:
            price, sym = self._hot_point[0], rng.choice(SYMS)
        else:
            if rng.random() < 0.6:
                price = clamp_price(rng.gauss(self._hot_center, self._hot_width))
            else:
                price = clamp_price(rng.uniform(0, PRICE_MAX))
            sym = rng.choice(SYMS)
        return {"price": price, "sym": sym, "qty": rng.randint(0, QTY_MAX)}
