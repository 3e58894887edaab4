"""The tasks a client starts, kept until they end (STYLE: nothing fire-and-forget)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["OwnedTasks"]

log = logging.getLogger("overlay.client")


class OwnedTasks:
    """Every task of one client object.

    Invariant: a task started here is in ``_tasks`` until it ends; one that
    fails is logged with its traceback when it ends; ``close()`` cancels
    every task still running and waits for each to end — all but the task
    calling it (an error callback that closes the client), which must end
    by itself."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task: object) -> bool:
        return task in self._tasks

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s failed", task.get_name(), exc_info=exc)

    async def close(self) -> None:
        """Cancel every task and wait until each has ended (the caller's own excepted)."""
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me]
        for task in tasks:
            task.cancel()
        if tasks:
            # wait(), not gather(): a cancel of close() itself still ends close().
            await asyncio.wait(tasks)
