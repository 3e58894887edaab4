"""Mutated wire input: what ``bench/fuzz.py`` sends a live node and the
decoders' property tests (``tests/test_fuzz_*.py``) feed the codec.

Rules this module keeps:

1. One ``random.Random`` drives every choice, so a seed reproduces an input
   (the property tests hand Hypothesis's own ``Random`` in).
2. ``samples(schema)`` is one valid message of every type of both unions
   (``overlay.messages``), built over the schema a node runs, so a mutation
   of one is one field away from an input the node acts on.
3. A message is mutated in its msgpack form — an array-like struct is a
   list, its tag first — by ``Mutator.message``: a value anywhere in it
   replaced (by a value of another type, NaN, ±inf, 1e308, a huge or
   negative int, an empty or long string, an unknown enum value, a deep
   nesting), an item dropped or added, a list grown, the tag swapped for
   another type's, a part of another message spliced in.  ``Mutator.frames``
   mutates the bytes of a stream of frames: cut short, bits flipped, bytes
   inserted or deleted, a length prefix rewritten (zero, off by a few, over
   the limit), garbage without a prefix.
4. Every input is bounded: a mutated body stays under ``max_size`` bytes
   unless the mutation is an oversize prefix on purpose, which costs the
   sender only its 4 bytes.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import typing
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from overlay.channels.channel import ChannelId
from overlay.channels.expressions import parse_subscription
from overlay.channels.groups import GroupState, InstanceState
from overlay.channels.routing_table import RouteEntry
from overlay.channels.schema import Kind, Schema, Value
from overlay.channels.space import EventSpace
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import DEFAULT_MAX_FRAME_SIZE, HEADER, ClientUnion

__all__ = ["NASTY", "Mutator", "event_values", "samples", "tags"]

# Values that break a field in one way each: every type msgpack has, the
# numbers SPEC §16 names (NaN, ±inf, 1e308, huge and negative integers), the
# strings that look like something (an enum member of another field, an
# expression, a number), and containers empty, nested and of the wrong shape.
NASTY: Final[tuple[object, ...]] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    7,
    255,
    65535,
    65536,
    2**31,
    2**53,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    0.0,
    -0.0,
    0.5,
    -1.5,
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    5e-324,
    "",
    " ",
    "0",
    "1.5",
    "nan",
    "x",
    "\x00",
    "é",
    "price",
    "0.0",
    "price < 1",
    "{price: 1}",
    "SUBSCRIBE_NEW",
    "EVENT_DISPATCHED",
    "REPLY_SUCCESS",
    "composite",
    "BOGUS_ENUM_VALUE",
    "x" * 257,
    b"",
    b"\xff\xfe",
    [],
    [0],
    [None],
    [[]],
    ["range", "price", [0, 1, True, False]],
    {},
    {"": None},
    {"price": math.nan},
    {1: 2},
)

# The largest string or list a mutation makes: past every bound of the
# messages (256-character identifiers, 16 KiB tokens) yet far below a frame.
LONG: Final = 20_000
# How deep a nesting in a mutated tree goes (the encoder, like the decoder,
# stops near Python's recursion limit); ``frames`` nests deeper in raw bytes.
DEEP: Final = 200
# A raw nesting past the decoder's depth limit.
DEEPER: Final = 5_000
# Children of one list or map a mutation may pick among (a grown list has thousands).
_FANOUT: Final = 64
# Tags of the two protocols, for a swapped tag.
_ALL_TAGS: Final = tuple(sorted({t.__name__ for t in typing.get_args(pm.PeerUnion) + typing.get_args(ClientUnion)}))


def tags() -> tuple[str, ...]:
    """Every message tag of both protocols."""
    return _ALL_TAGS


def _mid(lo: float, hi: float, kind: Kind) -> Value:
    if kind is Kind.FLOAT:
        return float(lo + (hi - lo) / 2)
    return int(lo + (hi - lo) // 2)


def event_values(schema: Schema) -> dict[str, Value]:
    """A valid event of ``schema``: every attribute at a value inside its domain."""
    out: dict[str, Value] = {}
    for name, attr in schema.attributes.items():
        if attr.kind is Kind.STRING:
            out[name] = "A" * max(int(attr.min), min(1, int(attr.max)))
        else:
            out[name] = _mid(attr.min, attr.max, attr.kind)
    return out


def _filter_text(schema: Schema) -> str:
    name = schema.da[0]
    attr = schema.attributes[name]
    if attr.kind is Kind.STRING:
        return f'{name} prefix "A"'
    return f"{name} <= {attr.format(_mid(attr.min, attr.max, attr.kind))}"


def samples(schema: Schema, *, node: int = 0, peer: int = 1) -> tuple[list[cm.ClientMessage], list[pm.PeerMessage]]:
    """Rule 2: one valid message of every type, client and peer, over
    ``schema``, on the whole space's channel ``0.0`` of node ``node``, as
    from node ``peer``."""
    values = event_values(schema)
    text = _filter_text(schema)
    f = parse_subscription(text, schema)
    ch = ChannelId(node, 0)
    other = ChannelId(peer, 1)
    whole = EventSpace.whole(schema)
    stored = StoredSubscription(f"{peer}:1:s:1", f, "fuzz", peer)
    sub = pm.Subscription(stored.id, f, "fuzz", peer, pm.DispatchSign.SUBSCRIBE_NEW, ch)
    unsub = pm.UnSubscription(stored.id, f, "fuzz", peer, pm.DispatchSign.UNSUBSCRIBE_NEW, ch)
    ev = pm.Event(f"{peer}-1-1", values, peer, pm.DispatchSign.EVENT_NEW, ch, 1.0, payload=b"\x00fuzz\xff")
    group = GroupState("g", {"i": InstanceState(1000)})
    client: list[cm.ClientMessage] = [
        cm.Hello("fuzz"),
        cm.Welcome(node, 1, True, "fuzz"),
        cm.Publish(1, values, 1.0),
        cm.Publish(2, "{" + ", ".join(f"{k}: {schema.attributes[k].format(v)}" for k, v in values.items()) + "}"),
        cm.Publish(3, values, 1.0, "k", 1, "e1"),
        cm.Publish(4, values, 1.0, event_id="e2", payload=b"\x00fuzz\xff" * 8),
        cm.PubAck(1, "e"),
        cm.PubAcks((1, 2), ("e", "f")),
        cm.Subscribe(4, "s", text),
        cm.Subscribe(5, "g", text, "workers", 2.0),
        cm.SubAck(4, "s", 1),
        cm.Unsubscribe(6, "s"),
        cm.UnsubAck(6, "s"),
        cm.Notify("e", values, ("s",), 1.0, "k", 1, 1),
        cm.Notify("e", values, ("s",), 1.0, payload=b"\x00fuzz\xff"),
        cm.Ack("e", 0.5, 1),
        cm.Revoke(1, "e"),
        cm.Choke(1, 0.01),
        cm.Error(1, cm.ErrorCode.PROTOCOL, "x"),
        cm.Admin(7, "status"),
        cm.Admin(8, "split", {"channel": str(ch), "attr": schema.da[0], "at": values[schema.da[0]]}),
        cm.AdminReply(7, {"ok": True}),
    ]
    peer_msgs: list[pm.PeerMessage] = [
        pm.PeerHello(peer, "fuzz"),
        pm.PeerAuth(peer, "fuzz", b"n" * 16),
        pm.PeerChallenge(node, b"n" * 16, b"p" * 32),
        pm.PeerProof(b"p" * 32),
        pm.PeerError("protocol_error", "x"),
        pm.RoutingTableInit((pm.RouteItem(ch, RouteEntry(whole, (node,))),), 1, True),
        pm.ReplyRoutingTableInit(peer),
        sub,
        unsub,
        pm.SubscriptionApplied(stored.id, ch, True, (other,)),
        ev,
        pm.Notification(ev.event_id, values, ("1",), ch, 1.0, origin=peer, confirm=(node,), payload=ev.payload),
        pm.NotificationAck(ev.event_id, (stored.id,), 0.5, code=pm.AckCode.ACKED),
        pm.LIEM(peer, "UNDERLOADED", 1.0, 0.5, 1.0, 1),
        pm.RequestLoadBalance(10.0, 0.5, 1, True),
        pm.ReplyRequestLoadBalance(pm.ReplySign.REPLY_SUCCESS, 1),
        pm.ChannelTransfer((pm.ChannelSpec(other, whole, (pm.PastOwner(node, 1.0),)),), 1),
        pm.ReplyChannelTransfer(pm.ReplySign.REPLY_SUCCESS, (ch,), 1),
        pm.SubscriptionMove(pm.SubscriptionType.ATOMIC, (pm.ChannelSubscriptions(other, (stored,), (group,)),), 1),
        pm.ReplySubscriptionMove(1),
        pm.UpdateRoutingTable((other,), (pm.RouteItem(ch, RouteEntry(whole, (node, peer))),), 1, peer),
        pm.ReplyUpdateGlobal(1, peer),
        pm.CompleteLoadBalance(1),
        pm.Reforward(
            ch,
            (
                pm.ReforwardItem(pm.ReforwardSign.SUBSCRIBE, sub),
                pm.ReforwardItem(pm.ReforwardSign.UNSUBSCRIBE, unsub),
                pm.ReforwardItem(pm.ReforwardSign.EVENT_MESSAGE, ev),
            ),
            1,
        ),
        pm.Heartbeat(1, (node,), (pm.DeadNode(7, 1),), 1, 1.0, -1.0),
        pm.Rebuild(ch, (stored,), True, 7),
        pm.DeliveryHandover(
            1,
            ch,
            (
                pm.TrackedDelivery(
                    ev, (pm.CopyInFlight(stored.id, peer, "g"),), (pm.GroupTries("g", (stored.id,), ()),)
                ),
            ),
            (pm.GroupChoice(ev.event_id, "g", stored.id),),
        ),
        pm.EventsMatched((ev.event_id,), ((node,),)),
        pm.EventsDelivered((ev.event_id,)),
        pm.LinkAck(1),
        pm.TableRequest(1, 1, 0, (pm.ChannelVersion(ch, 1 << 20),)),
        pm.TableReply(
            1, 1, (pm.RouteItem(ch, RouteEntry(whole, (node,)), 1 << 20),), (pm.ChannelVersion(other, 1 << 20),)
        ),
        pm.KeySync(1, (pm.KeyOp("k", ev, 1), pm.KeyOp("k", seq=2), pm.KeyOp("j", forget=True))),
        pm.KeySync(2, (), handover=True, last=True),
        pm.KeyAsk(1),
        pm.KeySynced(1),
    ]
    # net.peer_link rule 7: one of every type a Batch may carry, in one frame.
    peer_msgs.append(pm.Batch(tuple(m for m in peer_msgs if isinstance(m, pm.Batched))))
    return client, peer_msgs


Plain = Any  # a msgpack value: None, bool, int, float, str, bytes, list, dict
Path = tuple[Any, ...]


def _paths(value: Plain, limit: int = 4096) -> list[Path]:
    """Nodes of a plain value, the root first (``()``), breadth first: at
    most ``limit`` of them (a grown list has thousands)."""
    out: list[Path] = []
    todo: list[tuple[Path, Plain]] = [((), value)]
    while todo and len(out) < limit:
        path, v = todo.pop(0) if len(todo) < 64 else todo.pop()
        out.append(path)
        if isinstance(v, list):  # a grown list: every ``step``-th item, not a million paths
            step = len(v) // _FANOUT + 1
            todo.extend(((*path, i), v[i]) for i in range(0, len(v), step))
        elif isinstance(v, dict):
            todo.extend(((*path, k), item) for k, item in itertools.islice(v.items(), _FANOUT))
    return out


def _get(value: Plain, path: Path) -> Plain:
    for step in path:
        value = value[step]
    return value


def _set(root: Plain, path: Path, new: Plain) -> Plain:
    if not path:
        return new
    parent = _get(root, path[:-1])
    parent[path[-1]] = new
    return root


class Mutator:
    """Rules 1, 3 and 4 over one random source."""

    def __init__(self, rng: random.Random, *, max_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.rng = rng
        self.max_size = max_size

    # -- values ----------------------------------------------------------------------------

    def value(self) -> Plain:
        """A value to put where another was: a nasty one, or a generated one."""
        r = self.rng
        kind = r.randrange(10)
        if kind < 5:
            return copy.deepcopy(r.choice(NASTY))  # never a shared list a later mutation grows
        if kind == 5:
            return r.choice([r.randrange(-(2**63), 2**64), -r.randrange(1 << 20), r.randrange(1 << 20)])
        if kind == 6:
            return r.choice([r.uniform(-1e6, 1e6), r.uniform(-1e308, 1e308), r.random()])
        if kind == 7:
            n = r.choice([0, 1, 2, 8, 255, 256, 257, 4096, LONG])
            return "".join(r.choice("aZ09 _.-{}[]<=\"'\\é") for _ in range(min(n, 64))) * max(1, n // 64)
        if kind == 8:
            return self._deep(r.choice([10, 100, DEEP]))
        return [self.value() for _ in range(r.randrange(4))]

    def _deep(self, depth: int) -> Plain:
        v: Plain = self.rng.choice([0, "x", None, {}])
        for _ in range(depth):
            v = [v] if self.rng.random() < 0.8 else {"a": v}
        return v

    # -- messages (rule 3) -------------------------------------------------------------------

    def plain(self, msg: msgspec.Struct) -> Plain:
        """A message in its msgpack form (a new tree each call)."""
        return msgspec.msgpack.decode(msgspec.msgpack.encode(msg))

    def tree(self, msg: msgspec.Struct, donors: Sequence[msgspec.Struct] | None = None, *, rounds: int = 0) -> Plain:
        """``msg``'s msgpack form mutated ``rounds`` times (1–3 when 0)."""
        root = self.plain(msg)
        for _ in range(rounds or self.rng.choice((1, 1, 1, 2, 3))):
            root = self._mutate_once(root, donors or [])
        return root

    def message(self, msg: msgspec.Struct, donors: Sequence[msgspec.Struct] | None = None, *, rounds: int = 0) -> bytes:
        """A mutated body of ``msg`` (no length prefix), under ``max_size`` (rule 4)."""
        body = self.encode(self.tree(msg, donors, rounds=rounds))
        return body if len(body) <= self.max_size else body[: self.max_size]

    def mutate(self, root: Plain, donors: Sequence[msgspec.Struct] | None = None) -> Plain:
        """``root`` (a msgpack form, changed in place where it can be) mutated once."""
        return self._mutate_once(root, donors or [])

    def encode(self, root: Plain) -> bytes:
        """``root`` in msgpack; what msgpack cannot hold (an int past 64 bits) becomes a string."""
        try:
            return msgspec.msgpack.encode(root)
        except (OverflowError, TypeError, ValueError, RecursionError):  # an int past 64 bits, a surrogate
            return msgspec.msgpack.encode("unencodable")

    def _mutate_once(self, root: Plain, donors: Sequence[msgspec.Struct]) -> Plain:
        r = self.rng
        paths = _paths(root)
        path = r.choice(paths)
        node = _get(root, path)
        op = r.randrange(9)
        if op <= 2:  # replace a value anywhere
            return _set(root, path, self.value())
        if op == 3 and isinstance(node, list) and node:  # drop an item (a missing field)
            del node[r.randrange(len(node))]
            return root
        if op == 3 and isinstance(node, dict) and node:
            del node[r.choice(list(node))]
            return root
        if op == 4 and isinstance(node, list):  # an extra trailing field or item
            node.append(self.value())
            return root
        if op == 4 and isinstance(node, dict):
            node[r.choice(["", "x", "price", "sym", 1])] = self.value()
            return root
        if op == 5 and isinstance(node, list) and node:  # grow a list: a huge tuple
            item = node[r.randrange(len(node))]
            packed = self.encode(item)
            # Rule 4: the copies stay under one frame.  A container is copied,
            # not referenced (a later mutation inside a shared one would grow
            # every reference), and at most a hundred times (its copies are
            # objects to build); a scalar is immutable and may be shared.
            n = min(r.choice([2, 10, 100, 1000, 10_000]), self.max_size // (len(packed) + 1))
            if isinstance(item, (list, dict)):
                node.extend(msgspec.msgpack.decode(packed) for _ in range(min(n, 100)))
            else:
                node.extend([item] * n)
            return root
        if op == 6 and isinstance(root, list) and root and isinstance(root[0], str):  # another type's tag
            root[0] = r.choice(_ALL_TAGS)
            return root
        if op == 7 and donors:  # a part of another message spliced in
            donor = self.plain(r.choice(donors))
            return _set(root, path, _get(donor, r.choice(_paths(donor))))
        if op == 8 and isinstance(node, (str, int, float)) and not isinstance(node, bool):
            return _set(root, path, self._near(node))
        return _set(root, path, self.value())

    def _near(self, v: str | int | float) -> Plain:
        """A value of the same type as ``v``, just past what it was."""
        r = self.rng
        if isinstance(v, str):
            return r.choice(["", v * 2, v[:-1], v + "\x00", v.upper(), v + "é" * 300, "-" + v])
        if isinstance(v, int):
            return r.choice([v + 1, v - 1, -v, v * 65536, -(2**63) if v > 0 else 2**63 - 1])
        return r.choice([v + 1e-9, -v, v * 1e300, math.nextafter(v, math.inf), math.copysign(math.inf, v)])

    # -- frames (rule 3) ------------------------------------------------------------------------

    def frames(self, bodies: list[bytes]) -> bytes:
        """A byte stream of these bodies framed, then mutated at the byte level."""
        data = bytearray(b"".join(HEADER.pack(len(b)) + b for b in bodies))
        ops: list[Callable[[bytearray], bytes]] = [
            self._truncate,
            self._flip,
            self._insert,
            self._delete,
            self._prefix,
            self._garbage,
            self._oversize,
            self._nested,
        ]
        return self.rng.choice(ops)(data)

    def _truncate(self, data: bytearray) -> bytes:
        return bytes(data[: self.rng.randrange(len(data) + 1)])

    def _flip(self, data: bytearray) -> bytes:
        for _ in range(self.rng.choice((1, 2, 8))):
            if data:
                data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        return bytes(data)

    def _insert(self, data: bytearray) -> bytes:
        at = self.rng.randrange(len(data) + 1)
        data[at:at] = self.rng.randbytes(self.rng.choice((1, 4, 64)))
        return bytes(data)

    def _delete(self, data: bytearray) -> bytes:
        at = self.rng.randrange(len(data) + 1)
        del data[at : at + self.rng.choice((1, 4, 64))]
        return bytes(data)

    def _prefix(self, data: bytearray) -> bytes:
        """The first frame's length rewritten: zero, off by a few, the limit, past it."""
        if len(data) < HEADER.size:
            return bytes(data)
        (n,) = HEADER.unpack_from(data)
        new = self.rng.choice([0, 1, max(0, n - 1), n + 1, n + 7, self.max_size, self.max_size + 1, 2**32 - 1])
        HEADER.pack_into(data, 0, new)
        return bytes(data)

    def _garbage(self, data: bytearray) -> bytes:
        """Random bytes where a frame should start (the prefix is whatever they say)."""
        return self.rng.randbytes(self.rng.choice((1, 3, 4, 5, 64, 1024))) + bytes(data)

    def _oversize(self, data: bytearray) -> bytes:
        """A prefix over the limit, and a little of a body that would never end."""
        size = self.rng.randrange(self.max_size + 1, 2**32)
        return HEADER.pack(size) + self.rng.randbytes(self.rng.choice((0, 1, 100)))

    def _nested(self, data: bytearray) -> bytes:
        """A frame of a tag and a nesting past the decoder's depth limit, after the stream."""
        tag = msgspec.msgpack.encode(self.rng.choice(_ALL_TAGS))
        body = b"\x92" + tag + b"\x91" * self.rng.choice((DEEP, DEEPER)) + b"\x00"
        return bytes(data) + HEADER.pack(len(body)) + body
