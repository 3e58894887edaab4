"""Real nodes on loopback and a raw protocol client, for ordered delivery and groups.

``OrdCluster`` starts n nodes of ``cluster_configs/local.toml`` (balancing off)
with ``[sequencer]``/``[groups]`` overrides.  ``Raw`` speaks the client
protocol directly (key/rank on Publish, group/weight on Subscribe, ``lf`` on
every Ack, an optional processing delay), so these tests do not depend on the
client library's own ordering or load-factor code.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from loopback import listening_socket
from loopback import wait_until as until
from overlay.config import ClusterConfig, GroupSettings, NodeConfig, SequencerSettings, load_config
from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame
from overlay.net.node import CLIENT_MAGIC, Node

_LOADED = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
BASE = msgspec.structs.replace(_LOADED, cluster=msgspec.structs.replace(_LOADED.cluster, balancing=False))
WAIT = 10.0


class OrdCluster:
    def __init__(
        self, n: int = 3, *, sequencer: dict | None = None, groups: dict | None = None, **cluster: Any
    ) -> None:
        self.socks: dict[int, socket.socket] = {}
        for i in range(n):
            s = listening_socket()
            self.socks[i] = s
        nodes = tuple(NodeConfig(i, "127.0.0.1", s.getsockname()[1], 0, 1.0) for i, s in self.socks.items())
        cfg = BASE.with_nodes(nodes)
        cfg = msgspec.structs.replace(
            cfg,
            cluster=msgspec.structs.replace(cfg.cluster, **cluster),
            sequencer=msgspec.convert(sequencer or {}, SequencerSettings),
            groups=msgspec.convert(groups or {}, GroupSettings),
        )
        self.config: ClusterConfig = cfg
        self.nodes = {i: Node(cfg, i, sock=self.socks[i]) for i in range(n)}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.clients: list[Raw] = []

    def addr(self, i: int) -> tuple[str, int]:
        return ("127.0.0.1", self.socks[i].getsockname()[1])

    async def start(self) -> OrdCluster:
        for i, node in self.nodes.items():
            self.tasks[i] = asyncio.create_task(node.run(), name=f"node-{i}")
        await asyncio.wait_for(asyncio.gather(*(n.started.wait() for n in self.nodes.values())), WAIT)
        await until(lambda: all(n.core.ready for n in self.nodes.values()), what="cluster ready")
        await until(
            lambda: all(l.connected.is_set() for n in self.nodes.values() for l in n.links.values()), what="links up"
        )
        return self

    async def client(self, node: int, **kw: Any) -> Raw:
        c = await Raw(self.addr(node), **kw).connect()
        self.clients.append(c)
        return c

    async def kill(self, i: int) -> None:
        self.nodes[i].stop()
        await asyncio.wait_for(self.tasks.pop(i), WAIT)
        self.socks[i].close()

    async def stop(self) -> None:
        for c in self.clients:
            await c.close()
        for i in list(self.tasks):
            self.nodes[i].stop()
        await asyncio.wait_for(asyncio.gather(*self.tasks.values(), return_exceptions=True), WAIT)
        for s in self.socks.values():
            s.close()

    def stat(self, name: str) -> int:
        return sum(n.core.stats[name] for i, n in self.nodes.items() if i in self.tasks)

    async def admin(self, node_: int, command: str, /, **args: Any) -> Any:
        c = await self.client(node_)
        reply = await c.request(lambda seq: cm.Admin(seq, command, args))
        assert isinstance(reply, cm.AdminReply), reply
        return reply.result


class Raw:
    """A client on one node.  Notifications land in ``notes`` (and ``queue``);
    with ``auto_ack`` each is acked after ``delay`` seconds (one at a time, as
    a real consumer) carrying ``lf``.  A Revoke of a copy not acked yet is
    declined (as the client library does, node_acks rule 2) unless
    ``answer_revokes`` is off: a client whose whole process hangs."""

    def __init__(
        self,
        addr: tuple[str, int],
        *,
        auto_ack: bool = True,
        lf: float = 0.0,
        delay: float = 0.0,
        answer_revokes: bool = True,
    ) -> None:
        self.addr = addr
        self.auto_ack = auto_ack
        self.answer_revokes = answer_revokes
        self.revoked: set[int] = set()  # tags given back
        self._acked_tags: set[int] = set()
        self.lf = lf
        self.delay = delay
        self.notes: list[cm.Notify] = []
        self.errors: list[cm.Error] = []
        self.acked: list[tuple[str, float]] = []  # (event id, processing latency)
        self._seq = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[cm.ClientMessage]] = {}
        self._todo: asyncio.Queue[tuple[cm.Notify, float]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    async def connect(self) -> Raw:
        self.reader, self.writer = await asyncio.open_connection(*self.addr)
        self.writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(f"raw-{id(self)}")))
        assert await self.reader.readexactly(4) == CLIENT_MAGIC
        self._welcome: asyncio.Future[cm.ClientMessage] = asyncio.get_running_loop().create_future()
        self._tasks.append(asyncio.create_task(self._read()))
        self._tasks.append(asyncio.create_task(self._consume()))
        await asyncio.wait_for(self._welcome, WAIT)
        return self

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        with contextlib.suppress(Exception):
            self.writer.close()

    def send(self, msg: cm.ClientMessage) -> None:
        self.writer.write(encode_frame(msg))

    async def _read(self) -> None:
        frames = client_reader()
        while data := await self.reader.read(1 << 16):
            for msg in frames.feed(data):
                match msg:
                    case cm.Welcome():
                        self._welcome.set_result(msg)
                    case cm.Notify():
                        self.notes.append(msg)
                        self._todo.put_nowait((msg, time.perf_counter()))
                    case cm.Revoke() if self.answer_revokes and msg.tag not in self._acked_tags:
                        self.revoked.add(msg.tag)
                        self.send(cm.Ack(msg.event_id, 0.0, msg.tag, declined=True))
                    case cm.Error() if msg.seq in self._waiting:
                        self._waiting.pop(msg.seq).set_result(msg)
                    case cm.Error():
                        self.errors.append(msg)
                    case cm.PubAck() | cm.SubAck() | cm.UnsubAck() | cm.AdminReply() | cm.Choke():
                        fut = self._waiting.pop(msg.seq, None)
                        if fut is not None and not fut.done():
                            fut.set_result(msg)

    async def _consume(self) -> None:
        while True:
            note, received = await self._todo.get()
            if not self.auto_ack:
                continue
            if self.delay:
                await asyncio.sleep(self.delay)
            if note.tag in self.revoked:
                continue  # given back meanwhile: never handed over
            self._acked_tags.add(note.tag)
            self.acked.append((note.event_id, time.perf_counter() - received))
            self.send(cm.Ack(note.event_id, self.lf, note.tag))

    def request_nowait(self, make: Callable[[int], cm.ClientMessage]) -> asyncio.Future[cm.ClientMessage]:
        seq = next(self._seq)
        fut: asyncio.Future[cm.ClientMessage] = asyncio.get_running_loop().create_future()
        self._waiting[seq] = fut
        self.send(make(seq))
        return fut

    async def request(self, make: Callable[[int], cm.ClientMessage], timeout: float = WAIT) -> cm.ClientMessage:
        return await asyncio.wait_for(self.request_nowait(make), timeout)

    def publish_nowait(self, event: dict, key: str = "", rank: int = 0) -> asyncio.Future[cm.ClientMessage]:
        return self.request_nowait(lambda seq: cm.Publish(seq, event, time.time(), key, rank))

    async def publish(self, event: dict, key: str = "", rank: int = 0) -> cm.ClientMessage:
        return await asyncio.wait_for(self.publish_nowait(event, key, rank), WAIT)

    async def subscribe(
        self, expr: str, group: str = "", weight: float = 1.0, sub_id: str | None = None
    ) -> cm.ClientMessage:
        sid = sub_id or f"s{next(self._seq)}"
        return await self.request(lambda seq: cm.Subscribe(seq, sid, expr, group, weight))
