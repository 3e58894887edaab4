"""A loader process of the subscriptions bench (``bench/subscriptions.py``
rules 3, 5 and 6; started as ``bench/subscriptions.py --loader``).

Rules this module keeps:

1. One raw client connection to one access node: ``--count``
   subscriptions sent pipelined, at most ``--window`` unanswered; every
   SubAck, UnsubAck and error answer frees a place in the window.
2. Nothing per subscription is kept but the counts of answers: a
   subscription is generated, sent and forgotten, so the loader's memory
   stays bounded at a million.
3. Progress goes to stdout as one JSON line at most every
   ``LOADER_REPORT`` seconds, and once when every subscription is answered
   (``finished``).
4. The subscriptions are held until stdin closes; every tagged Notify is
   acked at once, as the client library does.  A line ``churn`` on stdin
   first unsubscribes them all and subscribes them again (same ids, new
   filters), waiting for every answer, and reports the ``round``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame
from overlay.net.clients import CLIENT_MAGIC
from subscriptions_workload import NODES, subscription

LOADER_REPORT: Final = 1.0  # s between two reports of a loader
# How long an answer may take: the loader's Welcome, and a probe's SubAck in the bench.
SUBACK_TIMEOUT: Final = 10.0


async def loader(args: argparse.Namespace) -> None:
    """Subscribe ``--count`` subscriptions on ``--addr``, ``--window`` in flight;
    report JSON lines on stdout; hold them until stdin closes."""
    host, _, port = args.addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(CLIENT_MAGIC + encode_frame(cm.Hello(f"loader-{args.node}")))
    assert await reader.readexactly(4) == CLIENT_MAGIC
    frames = client_reader()
    welcome = asyncio.Event()
    room = asyncio.Semaphore(args.window)
    acked = errors = notified = unacked = 0
    first_error = ""
    done = asyncio.Event()

    async def read() -> None:
        nonlocal acked, errors, notified, unacked, first_error
        while data := await reader.read(1 << 16):
            for msg in frames.feed(data):
                match msg:
                    case cm.Welcome():
                        welcome.set()
                    case cm.SubAck():
                        acked += 1
                        room.release()
                    case cm.UnsubAck():
                        unacked += 1
                        room.release()
                    case cm.Error() if msg.seq:
                        errors += 1
                        first_error = first_error or f"{msg.code}: {msg.message}"
                        room.release()
                    case cm.Notify():
                        notified += 1
                        if msg.tag:  # only a tagged Notify is answered (client deliveries rule 1)
                            writer.write(encode_frame(cm.Ack(msg.event_id, 0.0, msg.tag)))
                    case _:
                        pass  # Revoke (never: every copy is acked at once), node notices
            if acked + unacked + errors >= target:
                done.set()
        done.set()

    def report(**extra: Any) -> None:
        line = {"acked": acked, "errors": errors, "notified": notified, "first_error": first_error, **extra}
        print(json.dumps(line), flush=True)

    async def send_all(make: Callable[[int], cm.ClientMessage]) -> None:
        for k in range(args.count):
            await room.acquire()
            writer.write(encode_frame(make(k)))
            if k % 64 == 63:
                await writer.drain()
        await writer.drain()

    target = args.count

    reading = asyncio.create_task(read())
    await asyncio.wait_for(welcome.wait(), SUBACK_TIMEOUT)
    rng = random.Random(args.seed * 1000 + args.node)
    started = last = time.monotonic()
    seq = itertools.count(1)

    def subscribe(k: int) -> cm.Subscribe:
        nonlocal last
        if time.monotonic() - last > LOADER_REPORT:
            last = time.monotonic()
            report()
        return cm.Subscribe(next(seq), f"L{args.node}-{k}", subscription(rng, k % NODES))

    await send_all(subscribe)
    if args.count:
        await done.wait()
    report(seconds=time.monotonic() - started, finished=True)
    # Hold the subscriptions until the bench is done with them; a line
    # "churn" on stdin first drops them all and subscribes them again (rule 6).
    run = asyncio.get_running_loop().run_in_executor
    rounds = 0
    while (await run(None, sys.stdin.readline)).strip() == "churn":
        rounds += 1
        t0 = time.monotonic()
        for make in (lambda k: cm.Unsubscribe(next(seq), f"L{args.node}-{k}"), subscribe):
            done.clear()
            target = acked + unacked + errors + args.count  # every message answered
            await send_all(make)
            if args.count:
                await done.wait()
        report(round=rounds, seconds=time.monotonic() - t0, unacked=unacked)
    report(closing=True)
    reading.cancel()
    with contextlib.suppress(BaseException):
        await reading
    writer.close()
