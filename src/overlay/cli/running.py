"""Running a command: exit codes, its errors, signals (rules 2 and 3 of ``overlay.cli``).

A command is a coroutine run by ``run_command`` in a fresh event loop, as a
task that SIGINT and SIGTERM cancel (``_guarded``); a client command gets
``CLOSE_TIMEOUT`` to close its connections and the process ``INTERRUPT_GRACE``
to be gone.  ``UsageError`` (exit 2) and ``CommandFailed`` (exit 1) are how a
command says what went wrong; ``one_line`` puts any error on one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, Final, TypeVar

from overlay.errors import ExpressionError, OverlayError

__all__ = [
    "CLOSE_TIMEOUT",
    "CONNECT_TIMEOUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGNAL_BASE",
    "EXIT_USAGE",
    "STOP_SIGNALS",
    "CommandFailed",
    "UsageError",
    "finish_within",
    "first_cause",
    "log",
    "one_line",
    "print_error",
    "run_command",
    "setup_logging",
]

# One logger for the whole command line: its lines read ``overlay.cli: …``.
log = logging.getLogger("overlay.cli")

T = TypeVar("T")

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
# A command ended by a signal exits 128 + its number, as a shell reports it.
EXIT_SIGNAL_BASE: Final = 128
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)

# Rule 2.  A client command gets this long to close its connections after a
# signal (an unsubscribe, a goodbye to each node)...
CLOSE_TIMEOUT: Final = 0.5
# ... and the whole process this long to be gone: past it, it exits without
# waiting for the rest, so that Ctrl-C ends a command within 2 s whatever the
# cluster does (a node that vanished mid-request never answers).
INTERRUPT_GRACE: Final = 1.5
# How long a client command waits for the first node to answer: a node that is
# starting answers within a second or two; a cluster that is not there should
# be reported while the user still watches.
CONNECT_TIMEOUT: Final = 5.0


class UsageError(OverlayError):
    """The command line asks for something that cannot be (exit 2)."""


class CommandFailed(OverlayError):
    """The cluster or the machine failed the command (exit 1).  ``details`` are
    printed after the message, one per line (e.g. a dead node's last log lines)."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = list(details)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# -- running a command (rule 2) ------------------------------------------------------


def _loop_run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency; this only guards odd platforms
        return asyncio.run(coro)
    return uvloop.run(coro)


def _exit_now(code: int) -> None:
    """The last resort of rule 2: a command still running ``INTERRUPT_GRACE``
    after a signal is left behind (what it waits for will not come)."""
    log.debug("still closing %.1fs after the signal; exiting without waiting", INTERRUPT_GRACE)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe: nothing more to say
            stream.flush()
    os._exit(code)


async def _guarded(main: Coroutine[Any, Any, int], server: bool) -> int:
    """Run ``main`` as a task that SIGINT/SIGTERM cancel (rule 2)."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(main)
    caught: list[int] = []

    def on_signal(signum: int) -> None:
        if not caught and not server:
            loop.call_later(INTERRUPT_GRACE, _exit_now, EXIT_SIGNAL_BASE + signum)
        caught.append(signum)
        task.cancel()  # again on a second signal: it hurries the clean-up

    # Signals reach the main thread only: a command run in another thread
    # (a test, an embedding program) leaves them to whoever owns it.
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, on_signal, int(sig))
    try:
        code = await task
    except asyncio.CancelledError:
        if not caught:
            raise
        code = EXIT_OK
    if caught and not server:
        return EXIT_SIGNAL_BASE + caught[0]
    return code


def run_command(main: Coroutine[Any, Any, int], *, server: bool = False) -> int:
    """Run a command's coroutine in a fresh event loop under rule 2."""
    return _loop_run(_guarded(main, server))


async def finish_within(aw: Awaitable[Any], timeout: float, what: str) -> None:
    """Await clean-up for at most ``timeout`` s, its errors logged, not raised:
    closing a client must not hold up (or fail) the end of a command."""
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
            log.debug("%s: not done after %.1fs; left behind", what, timeout)
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.debug("%s failed: %r", what, task.exception())


def one_line(exc: BaseException) -> str:
    """An error's text on one line (an expression error draws a caret under
    the text on two more lines: here the position says it)."""
    if isinstance(exc, ExpressionError):
        return f"{exc.reason} at position {exc.position} of {exc.text!r}"
    return " ".join(str(exc).split("\n"))


def print_error(exc: BaseException) -> None:
    """An error as the user sees it (rule 3): ``overlay: …`` on one line, then
    its ``details`` (a ``CommandFailed``'s), one per line, on stderr."""
    print(f"overlay: {one_line(exc)}", file=sys.stderr, flush=True)
    for line in getattr(exc, "details", ()):
        print(line, file=sys.stderr, flush=True)


def first_cause(exc: BaseException) -> BaseException:
    """A TaskGroup's error says only how many tasks failed: its first member says what happened."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
