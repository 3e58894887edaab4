"""``RawClient``: the client protocol spoken directly, for tests of what a node sends.

It sets every field of Publish (key, rank) and Subscribe (group, weight)
itself and acks each notification with the load factor it is told to report,
so a test of ordering, groups or load factors does not depend on the client
library's own ordering, load-factor or re-send code (``overlay.client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame
from overlay.net.node import CLIENT_MAGIC
from overlay.testing._loopback import WAIT

__all__ = ["RawClient"]


class RawClient:
    """A client on one node.  Every Notify lands in ``notes``; with
    ``auto_ack`` each is acked after ``delay`` seconds (one at a time, as a
    real consumer), carrying ``lf``; ``acked`` holds (event id, receive → ack
    seconds).  A Revoke of a copy not acked yet is declined (as the client
    library does, ``overlay.node.acks`` rule 2) unless ``answer_revokes`` is
    off: a client whose whole process hangs.  Errors that answer no request
    land in ``errors``.

    Invariant: every request's future is in ``_waiting`` until its reply (or
    an Error of its seq) arrives; ``close`` cancels and awaits both tasks.
    """

    def __init__(
        self,
        addr: tuple[str, int],
        *,
        auto_ack: bool = True,
        lf: float = 0.0,
        delay: float = 0.0,
        answer_revokes: bool = True,
        ssl: SSLContext | None = None,
        version: int = 1,
    ) -> None:
        self.addr = addr
        self.client_id = f"raw-{id(self)}"  # its Hello's: what the nodes name its subscriptions' subscriber
        self.version = version  # Hello.version: 1 gets a PubAck each, BATCHED_ACKS PubAcks frames
        self.pubacks_frames = 0  # PubAcks frames received
        self.ssl = ssl  # TLS with this context (its CA), or plain TCP
        self.auto_ack = auto_ack
        self.answer_revokes = answer_revokes
        self.lf = lf
        self.delay = delay
        self.revoked: set[int] = set()  # tags given back
        self.notes: list[cm.Notify] = []
        self.errors: list[cm.Error] = []
        self.acked: list[tuple[str, float]] = []
        self._acked_tags: set[int] = set()
        self._seq = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[cm.ClientMessage]] = {}
        self._todo: asyncio.Queue[tuple[cm.Notify, float]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self, timeout: float = WAIT) -> RawClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*self.addr, ssl=self.ssl), timeout)
        self._writer = writer
        writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(self.client_id, self.version)))
        assert await asyncio.wait_for(reader.readexactly(4), timeout) == CLIENT_MAGIC
        welcome: asyncio.Future[cm.ClientMessage] = asyncio.get_running_loop().create_future()
        self._tasks.append(asyncio.create_task(self._read(reader, welcome), name=f"raw-read-{id(self)}"))
        self._tasks.append(asyncio.create_task(self._consume(), name=f"raw-ack-{id(self)}"))
        await asyncio.wait_for(welcome, timeout)
        return self

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):  # ours, cancelled just above; whatever it ended with is moot
                await t
        if self._writer is not None:
            self._writer.close()

    def send(self, msg: cm.ClientMessage) -> None:
        assert self._writer is not None, "connect() first"
        self._writer.write(encode_frame(msg))

    async def _read(self, reader: asyncio.StreamReader, welcome: asyncio.Future[cm.ClientMessage]) -> None:
        frames = client_reader()
        while data := await reader.read(1 << 16):
            for msg in frames.feed(data):
                match msg:
                    case cm.Welcome():
                        welcome.set_result(msg)
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
                    case cm.PubAcks():
                        self.pubacks_frames += 1
                        for seq, event_id in zip(msg.seqs, msg.event_ids):
                            fut = self._waiting.pop(seq, None)
                            if fut is not None and not fut.done():
                                fut.set_result(cm.PubAck(seq, event_id))
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
        """Send ``make(seq)``; the future of its reply."""
        seq = next(self._seq)
        fut: asyncio.Future[cm.ClientMessage] = asyncio.get_running_loop().create_future()
        self._waiting[seq] = fut
        self.send(make(seq))
        return fut

    async def request(self, make: Callable[[int], cm.ClientMessage], timeout: float = WAIT) -> cm.ClientMessage:
        return await asyncio.wait_for(self.request_nowait(make), timeout)

    def publish_nowait(
        self, event: dict[str, Any], key: str = "", rank: int = 0, *, payload: bytes = b""
    ) -> asyncio.Future[cm.ClientMessage]:
        return self.request_nowait(lambda seq: cm.Publish(seq, event, time.time(), key, rank, payload=payload))

    async def publish(
        self, event: dict[str, Any], key: str = "", rank: int = 0, *, payload: bytes = b""
    ) -> cm.ClientMessage:
        return await asyncio.wait_for(self.publish_nowait(event, key, rank, payload=payload), WAIT)

    async def subscribe(
        self, expr: str, group: str = "", weight: float = 1.0, sub_id: str | None = None
    ) -> cm.ClientMessage:
        sid = sub_id or f"s{next(self._seq)}"
        return await self.request(lambda seq: cm.Subscribe(seq, sid, expr, group, weight))
