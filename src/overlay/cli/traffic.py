"""Demo traffic against a running cluster: ``overlay cluster up F --traffic``.

The workload of ``make run`` (``overlay.cli.workload``): subscribers on every node
with a mix of narrow and wide filters, publishers whose events crowd one
region of the event space, so the initializer is overloaded and balancing
has work to do.  Publishing stops ``SETTLE`` seconds before the end, so the
last notifications arrive and the capture ends quiet; then the clients
close (their subscriptions end, as in any run).  Ctrl-C cancels it (the
command's signal handling, ``overlay.cli`` rule 2): the clients are closed
within ``overlay.cli.running.CLOSE_TIMEOUT`` all the same.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from overlay.cli.workload import run_workload
from overlay.config import ClusterConfig

__all__ = ["SETTLE", "run_traffic"]

SETTLE: Final = 3.0
REPORT_EVERY: Final = 5.0
# A sleep may end a hair early (the loop's clock ticks in ms): less than this
# left of a phase is the phase's end, not one more report.
REPORT_SLACK: Final = 0.01


async def run_traffic(cfg: ClusterConfig, seconds: float, *, seed: int = 7) -> tuple[int, int]:
    """Drive the cluster for ``seconds``; returns (events published,
    per-subscription deliveries)."""
    start = time.monotonic()
    until = start + max(0.0, seconds - SETTLE)

    async def report(published: list[int], delivered: list[int], stop: asyncio.Event) -> None:
        print(f"traffic: the demo's workload for {seconds - SETTLE:.0f}s, then {SETTLE:.0f}s to settle", flush=True)
        for end in (until, start + seconds):  # publishing, then settling
            while (left := end - time.monotonic()) > REPORT_SLACK:
                await asyncio.sleep(min(REPORT_EVERY, left))
                print(
                    f"traffic: t={time.monotonic() - start:5.1f}s published {published[0]}, "
                    f"per-subscription deliveries {delivered[0]}",
                    flush=True,
                )
            stop.set()  # publishing stops; the last notifications arrive meanwhile and the capture ends quiet

    published, delivered = [0], [0]
    await run_workload(cfg, "traffic", seed, report, published, delivered)
    return published[0], delivered[0]
