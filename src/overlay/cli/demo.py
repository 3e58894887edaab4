"""``make run``: the local cluster with bounded, skewed demo traffic, shown live.

Publishers send events whose ``price`` is hot around one region of the event
space (70 % of events in the lowest tenth); subscribers on every node hold a
mix of narrow and wide subscriptions.  After a one-line legend, every second
the terminal shows events published and per-subscription deliveries, each
node's balancing state, load level ``dc`` and channel count, and the spread
``S/dc̄`` that balancing drives down as the overloaded initializer splits and
moves channels to the others.  Every line fits in ``LINE_WIDTH`` columns.

What "deliveries" counts: one per (event, subscription) pair that reached its
subscriber — every subscription of a client gets each event it matches.  The
admin page's "notified per subscription" counts the same pairs where the
channels' owners send them (``notifications_out``), so the two agree but for
notifications still in flight or dropped for a slow consumer.  (The node's
``notifies_out`` counts Notify frames: one per client session per event.)

Bounded by ``seconds`` and by ``MAX_EVENTS``; Ctrl-C stops everything cleanly;
a node that dies ends the demo with its exit status and last lines of log
(``overlay.cli.local_cluster.LocalCluster``) — or, with ``--keep-going``, is
reported and shown ``down`` while the others take over its channels and its
clients (the workload's clients fail over: ``workload.failover_list``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import unicodedata
from typing import Any, Final

from overlay.cli.args import add_command, positive_float
from overlay.cli.local_cluster import LocalCluster, ready_lines, stopping_line
from overlay.cli.ports import check_ports_free
from overlay.cli.running import run_command
from overlay.cli.status import statuses
from overlay.cli.workload import MAX_EVENTS, PUBLISHERS, SUBSCRIBERS_PER_NODE, run_workload
from overlay.config import ClusterConfig, load_config

__all__ = ["LEGEND", "cmd_demo", "register", "run_demo"]

# A terminal's width that every printed line fits in (a split window, a CI log).
LINE_WIDTH: Final = 100
# S/dc̄ at which the spread bar is full: √(n−1) with everything on one node is
# 1.41 for three nodes, so the bar starts full and empties as balancing works.
BAR_FULL: Final = 1.5
BAR_WIDTH: Final = 12
# Columns of one node in a line: " 0▲  123k 12" (id, state, dc, channels).
NODE_CELL: Final = 12
# A node's balancing state as one character (SPEC §5).
STATE_MARK: Final = {"OVERLOADED": "▲", "STABLE": "=", "UNDERLOADED": "▼", "BUSY": "◆"}
LEGEND: Final = "    t pub/s del/s | node+state (▲over =stable ▼under ◆busy) dc ch | del: per-subscription deliveries"


EXAMPLES: Final = """\
examples:
  overlay demo cluster_configs/local.toml                       (what `make run` does)
  overlay demo cluster_configs/hetero5.toml --seconds 120
  overlay demo cluster_configs/local.toml --keep-going          (kill -9 a node's pid: watch the failover)

Ctrl-C stops the traffic and every node cleanly (exit 0).  A node that dies
stops the demo (exit 1) — with --keep-going it is reported, shown "down",
and the demo goes on; exit 1 only once no node is left."""


async def _drive(cfg: ClusterConfig, seconds: float, published: list[int], delivered: list[int]) -> None:
    """The workload, printing a line a second until ``seconds`` are over."""

    async def report(published: list[int], delivered: list[int], stop: asyncio.Event) -> None:
        print(
            f"{SUBSCRIBERS_PER_NODE * len(cfg.nodes)} subscriptions, {PUBLISHERS} publishers; "
            f"{seconds:.0f}s or {MAX_EVENTS} events, Ctrl-C to stop\n",
            flush=True,
        )
        print(LEGEND, flush=True)
        start = time.monotonic()
        last = (start, 0, 0)
        while time.monotonic() - start < seconds and published[0] < MAX_EVENTS:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            answers = await statuses(cfg)
            dt = now - last[0]
            print(_line(now - start, (published[0] - last[1]) / dt, (delivered[0] - last[2]) / dt, answers), flush=True)
            last = (now, published[0], delivered[0])

    await run_workload(cfg, "demo", 7, report, published, delivered)


async def run_demo(config_path: str, seconds: float, log_level: str = "warning", *, keep_going: bool = False) -> int:
    cluster = LocalCluster(config_path, "warning" if log_level == "info" else log_level, keep_going=keep_going)
    check_ports_free(cluster.cfg.nodes)  # before saying we start (LocalCluster.start checks again)
    print(f"starting {len(cluster.cfg.nodes)} nodes from {config_path} …", flush=True)
    await cluster.start()
    print("cluster ready; the live page is at each node's admin URL:", flush=True)
    print("\n".join(ready_lines(cluster)), flush=True)
    published = [0]
    delivered = [0]
    try:
        await cluster.supervise(_drive(cluster.cfg, seconds, published, delivered))
    finally:
        print(f"\npublished {published[0]} events, {delivered[0]} per-subscription deliveries", flush=True)
        print(stopping_line(cluster), flush=True)
        await cluster.stop()
    return 0


def _si(x: float) -> str:
    """A count in at most 5 characters: 999, 9.9k, 999k, 9.9M, 999M, 9.9G."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            v = x / div
            return f"{v:.1f}{suffix}" if v < 10 else f"{v:.0f}{suffix}"
    return f"{x:.0f}"


def _columns(text: str) -> int:
    """Terminal columns of ``text``: combining marks (the bar of dc̄) take none."""
    return sum(1 for ch in text if not unicodedata.combining(ch))


def _line(t: float, pub_rate: float, del_rate: float, statuses: list[dict[str, Any] | None]) -> str:
    """One line a second (see ``LEGEND``): traffic, then each node's state, load
    level and channels, then the spread S/dc̄ of the load levels (what balancing
    lowers) and the moves so far; the bar only where the width allows.  Up to
    five nodes with one-digit ids, it fits in ``LINE_WIDTH`` columns."""
    parts = [f"{t:>4.0f}s {_si(pub_rate):>5} {_si(del_rate):>5} |"]
    levels = []
    moves = 0
    for st in statuses:
        if st is None:
            parts.append(f" {'down':<{NODE_CELL - 1}}")
            continue
        levels.append(st["dc"])
        moves += st["stats"].get("migrations", 0) + st["stats"].get("replications", 0)
        mark = STATE_MARK.get(st["state"], "?")
        parts.append(f" {st['node']}{mark} {_si(st['dc']):>5} {len(st['channels']):>2}")
    line = "".join(parts)
    tail = f" moves {moves}"
    if not (levels and sum(levels) > 0):
        return line + " |" + tail
    mean = sum(levels) / len(levels)
    ratio = (sum((v - mean) ** 2 for v in levels) / len(levels)) ** 0.5 / mean
    spread = f" S/dc̄ {ratio:4.2f}"
    if _columns(line + " |" + spread + tail) <= LINE_WIDTH:  # the separator, where it fits
        line += " |"
    line += spread
    room = LINE_WIDTH - _columns(line + tail) - 1
    if room >= 4:  # a bar narrower than that shows nothing
        line += " " + _bar(ratio, min(BAR_WIDTH, room))
    return line + tail


def _bar(x: float, width: int = BAR_WIDTH) -> str:
    filled = min(width, round(x / BAR_FULL * width))
    return "█" * filled + "·" * (width - filled)


def cmd_demo(args: argparse.Namespace) -> int:
    load_config(args.config)
    return run_command(run_demo(args.config, args.seconds, args.log_level, keep_going=args.keep_going), server=True)


def register(sub: Any) -> None:
    """The ``demo`` subcommand."""
    d = add_command(sub, "demo", "local cluster with bounded demo traffic, shown live (make run)", EXAMPLES)
    d.add_argument("config")
    d.add_argument("--seconds", type=positive_float, default=60.0, help="stop after this many seconds (default 60)")
    d.add_argument(
        "--keep-going",
        action="store_true",
        help="when a node dies, report it and go on with the others (default: stop the demo, exit 1)",
    )
    d.set_defaults(func=cmd_demo)
