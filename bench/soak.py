"""Soak: a 3-node cluster of real processes under steady mixed traffic for
minutes, one node drained and re-joined midway, every pair audited at the end.

Run as ``flock /tmp/bench.lock .venv/bin/python bench/soak.py [--minutes M]
[--warmup W] [--rate R] [--keyed-rate K] [--logs DIR]`` (the lock: never two
benchmarks at once on the machine).  Default: 10 minutes.

This file holds the command line; next to it, ``soak_run.py`` holds the run
(``Soak``: the processes, the clients, the traffic, the drain, the samples)
and ``soak_report.py`` the report of the audit and the verdict.

What it does:

1. **Cluster.**  Three ``overlay node`` processes (``overlay.testing.NodeProcesses``)
   of a generated config: balancing on, slices of ``--slice`` s, the failure
   settings' defaults; TLS on every port with development certificates
   (``overlay.testing.dev_tls``: peers authenticated by their certificates,
   clients verifying the nodes, the admin endpoint over HTTPS); and
   ``[auth]``: every client presents a token signed with the run's own
   Ed25519 key (``overlay.auth``), with only the roles it needs — publishers
   ``publish``, subscribers ``subscribe``, the operator ``admin`` for the
   drain.  ``--no-tls``: plain TCP, peers proving a secret (the run says so).
2. **Traffic**, all of it through ``AgentClient``s (each connected to every
   node, as a real client of a 3-node cluster is):

   * *load*: 400 price ranges with a ``venue`` no event has, on one access
     node each — the matcher tests them (SPEC §5's load, so balancing has
     something to balance) but nothing is notified;
   * *plain*: ``--rate`` events/s from 16 publishing tasks, each waiting for
     its PubAck, 70 % of the prices in [0, 200] (``skewed_price``);
   * *ordered*: ``--keyed-rate`` events/s over ``--keys`` lanes, each
     publishing one key's ranks 1…``--ranks`` in order (``Publish.key`` and
     ``rank``), then the next key (a key is an order id: a short life);
   * *bands*: 8 price bands tiling [0, 1000], each held on two access nodes
     (``AgentClient`` failover): every event is delivered to one band;
   * *group*: 3 instances of group ``workers`` on ``sym = "A"`` (half the
     events), one client each;
   * *churn*: ``--churn`` lanes, each subscribing a random price range,
     keeping it 3–10 s, unsubscribing, and again.

3. **Drain and re-join.**  At ``--drain-at`` of the run, node 2 is drained
   (``POST /drain`` with an admin token: its channels move to the others,
   its clients are told to go), stopped cleanly (SIGTERM) ``--stop-after``
   s after the drain answered (an operator's pause: its clients try to come
   back meanwhile), left down ``--down`` s, and started again: it joins the
   running cluster empty and takes load back through balancing.
4. **Every minute** (``--every``): events/s (PubAck'ed in the interval),
   deliveries/s (handed to the application), p99 publish→delivery of those
   deliveries, RSS and open file descriptors of every node process (from
   ``/proc``), and what happened (drain, stop, start).
5. **At the end**, once nothing more arrives: the audit of every (event,
   receiver) pair (``overlay.testing.Audit``) — bands and churned
   subscriptions exactly once for acknowledged pairs (a churned one is owed
   what was PubAck'ed before it asked to unsubscribe), the group: each event
   to exactly one instance, and every key's ranks in order at every receiver.

Targets: no loss; no duplicate; keys in order; per node process, RSS and
descriptors flat within 10 % after warm-up (``--warmup`` minutes from the
process's start: the first sample after it is the baseline, every later one
within ±10 % of it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final

from soak_report import report
from soak_run import Soak

# The machine may be shared: the run's processes at this priority (inherited)
# so the neighbours disturb it less.
BENCH_NICE: Final = -10


async def main_async(args: argparse.Namespace, workdir: Path) -> bool:
    soak = Soak(args, workdir)
    try:
        await soak.run()
        stats = await soak.node_stats()
        verdict = soak.audit.verdict()
        if args.dump:
            tl = soak.timeline
            extra = {
                "timeline": vars(tl),
                "attempts": {q: n for q, n in soak.attempts.items() if n > 1},
                "churn_homes": soak.churn_homes,
            }
            args.dump.write_text(json.dumps(soak.audit.dump() | extra))
        return report(soak, verdict, stats)
    finally:
        await soak.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the traffic (default 10)")
    ap.add_argument(
        "--warmup", type=float, default=2.0, help="minutes from a process's start before flatness counts (default 2)"
    )
    ap.add_argument("--every", type=float, default=60.0, help="seconds between two samples (default 60)")
    ap.add_argument("--rate", type=float, default=200.0, help="plain events/s (default 200)")
    ap.add_argument("--keyed-rate", type=float, default=40.0, help="keyed events/s over all keys (default 40)")
    ap.add_argument("--keys", type=int, default=8, help="keys published at a time (default 8)")
    ap.add_argument("--ranks", type=int, default=20, help="events per key (default 20)")
    ap.add_argument("--churn", type=int, default=4, help="subscription churn lanes (default 4)")
    ap.add_argument("--max-events", type=int, default=0, help="at most this many plain events (default: rate × length)")
    ap.add_argument(
        "--drain-at", type=float, default=0.4, help="when node 2 is drained, as a fraction of the run (default 0.4)"
    )
    ap.add_argument(
        "--stop-after", type=float, default=2.0, help="seconds from the drain's answer to the node's stop (default 2)"
    )
    ap.add_argument("--down", type=float, default=10.0, help="seconds the drained node stays stopped (default 10)")
    ap.add_argument("--slice", type=float, default=1.0, help="T in seconds (default 1)")
    ap.add_argument("--no-tls", action="store_true", help="plain TCP instead of TLS (tokens still on)")
    ap.add_argument("--logs", type=Path, help="copy the nodes' logs into this directory")
    ap.add_argument("--capture", type=Path, help="every node captures its traffic into this directory (SPEC §13)")
    ap.add_argument("--dump", type=Path, help="write everything the audit saw to this JSON file (a post-mortem)")
    args = ap.parse_args()
    for name in ("minutes", "every", "rate", "keyed_rate", "slice"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.keys < 1 or args.ranks < 1 or min(args.churn, args.down, args.stop_after) < 0 or not 0 < args.drain_at < 1:
        ap.error("--keys and --ranks ≥ 1, --churn, --down and --stop-after ≥ 0, 0 < --drain-at < 1")
    with contextlib.suppress(OSError):
        os.nice(BENCH_NICE)
    # The clients' reconnections (node 2 refusing them while it is drained, then
    # down) would break the table: what the nodes told them is counted instead (error_cb).
    logging.getLogger("overlay.client").setLevel(logging.ERROR)
    # uvloop's run and asyncio's differ in their keywords: typed as what both take.
    runner: Callable[[Coroutine[Any, Any, Any]], Any]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        t0 = time.monotonic()
        try:
            ok = runner(main_async(args, Path(tmp)))
        finally:
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.logs / log.name)
        print(f"\n(run in {time.monotonic() - t0:.0f} s)")
        print("targets met" if ok else "TARGET MISSED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
