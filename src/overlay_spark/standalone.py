"""A Spark standalone cluster on loopback — one master, one worker — for the
tests and the bench to run ``overlay replay --master spark://…`` against.

Rules:

1. Both daemons are ``spark-class`` of pyspark's own install (no separate
   Spark download), bound to 127.0.0.1 on ephemeral ports (RPC and web UI;
   the master's REST server, whose port is fixed, is off), with their logs
   and the worker's directory under ``work``.
2. Start-up is bounded: the master's URL is read from its log, then the
   worker's registration; either not seen within ``timeout`` seconds is a
   ``StandaloneError`` that quotes the log's last lines.
3. Each daemon runs in its own process group, so stopping it also stops
   the executors the worker launched: SIGTERM, then SIGKILL after
   ``STOP_GRACE`` seconds.  ``stop`` runs on every exit of the ``with``
   block — no JVM outlives it.
4. Memory stays at Spark's defaults (an executor gets 1 GiB) unless the
   caller passes ``worker_memory``: the replay must fit in them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Final

__all__ = ["STOP_GRACE", "StandaloneCluster", "StandaloneError", "spark_home"]

# Rule 3: seconds a daemon gets to stop after SIGTERM.
STOP_GRACE: Final = 10.0
_POLL: Final = 0.2
_MASTER_URL: Final = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED: Final = "Successfully registered with master"


class StandaloneError(Exception):
    """The local standalone cluster did not start (the message quotes the daemon's log)."""


def spark_home() -> Path:
    """pyspark's install directory: it holds ``bin/spark-class`` and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class StandaloneCluster:
    """``with StandaloneCluster(tmp) as c: … c.url …`` — rules 1–4."""

    def __init__(self, work: Path, *, cores: int = 2, worker_memory: str | None = None, timeout: float = 90.0) -> None:
        self.work = Path(work)
        self.cores = cores
        self.worker_memory = worker_memory
        self.timeout = timeout
        self.url = ""
        self._procs: list[subprocess.Popen[bytes]] = []

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.work / "logs"),
            # Rule 1: the REST submission server listens on a fixed port (6066).
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )
        return env

    def _start(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.work / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                start_new_session=True,  # rule 3: its own process group
            )
        self._procs.append(proc)
        return proc, log

    def _wait_for(self, proc: subprocess.Popen[bytes], log: Path, what: str, pattern: re.Pattern[str] | str) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            if isinstance(pattern, str):
                if pattern in text:
                    return pattern
            elif (m := pattern.search(text)) is not None:
                return m.group(1)
            if proc.poll() is not None:
                raise StandaloneError(f"the Spark {what} exited ({proc.returncode}) before it was ready:\n{_tail(log)}")
            time.sleep(_POLL)
        raise StandaloneError(f"the Spark {what} was not ready within {self.timeout:.0f}s:\n{_tail(log)}")

    def start(self) -> StandaloneCluster:
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(exist_ok=True)
        try:
            master, mlog = self._start(
                "master",
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            )
            self.url = self._wait_for(master, mlog, "master", _MASTER_URL)
            args = ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1", "--port", "0"]
            args += ["--webui-port", "0", "--cores", str(self.cores), "--work-dir", str(self.work / "worker")]
            if self.worker_memory:
                args += ["--memory", self.worker_memory]
            worker, wlog = self._start("worker", args)
            self._wait_for(worker, wlog, "worker", _REGISTERED)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Rule 3: the worker (and its executors), then the master."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STOP_GRACE)
            with contextlib.suppress(ProcessLookupError):  # whatever is left in its group (an executor slow to stop)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
