"""The SparkSession of a replay, and the progress line shown while Spark works."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final, Generic, TextIO, TypeVar

from pyspark.sql import SparkSession

__all__ = ["JVM_OPTIONS", "Background", "Progress", "make_session", "ship_code"]

# Shuffle partitions: AQE coalesces small ones, so this is an upper bound that
# keeps both cores busy on a laptop and scales on a cluster (--partitions).
DEFAULT_PARTITIONS: Final = 8
# Seconds between two progress lines while a stage runs.
PROGRESS_EVERY: Final = 2.0

# The JVMs' options (driver, and executors on a cluster): the throughput
# collector, whose pauses cost less CPU than G1's concurrent threads in a
# batch job, and the C2 compiler taken to a method only after 3x the default
# calls — a 1M-event replay spent 36 s of its 151 s of CPU compiling with C2,
# most of it methods of the many small jobs' plans that never run hot.
# Measured on that replay: 151 s -> 127 s of CPU (C2 36 -> 25 s, executors
# 74 -> 67 s).  Stopping at C1 (``quick_jvm``) compiles least but runs the
# executors' code 2.4x slower: right only for small captures.
JVM_OPTIONS: Final = (
    "-XX:+UseParallelGC -XX:Tier4InvocationThreshold=15000 -XX:Tier4MinInvocationThreshold=3000 "
    "-XX:Tier4CompileThreshold=30000"
)

_T = TypeVar("_T")


def make_session(
    master: str | None = None,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    quick_jvm: bool = False,
    driver_memory: str = "4g",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A session for the replay; an existing one (tests, spark-submit) is reused.

    ``quick_jvm`` stops the JIT at C1: a JVM that starts in half the time and
    runs slower, right for the small captures of the tests; otherwise the
    JVMs run with ``JVM_OPTIONS``.
    ``conf`` (``overlay replay --conf``) is applied last: it wins over every
    default here.  Executors keep Spark's defaults (1 GiB each): the jobs
    are written to fit in them (``overlay_spark`` rule: no large collect,
    broadcasts bounded).
    """
    conf = dict(conf or {})
    # Python workers run this interpreter, which has ``overlay`` installed: the
    # filter parser the re-matching uses on executors (SPEC §2.2).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not master or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, and no warning about it
    b = SparkSession.builder.appName("overlay-replay")
    if master:
        b = b.master(master)
    elif not SparkSession.getActiveSession():
        b = b.master(os.environ.get("OVERLAY_SPARK_MASTER", "local[*]"))
    b = (
        b.config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.adaptive.enabled", "true")
        # The expressions below are written for SQL's null-on-error semantics.
        .config("spark.sql.ansi.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        # Spark's own default: the small tables of a replay (capacities,
        # slices, subscriptions) are far below it, and an executor keeps
        # its default memory (1 GiB).
        .config("spark.sql.autoBroadcastJoinThreshold", str(10 << 20))
        # Splits of a capture file: tasks small enough to keep both cores of
        # a laptop busy to the end, and an executor's memory per task low.
        .config("spark.sql.files.maxPartitionBytes", str(32 << 20))
        # The cached capture (records rule 2) is not compressed: its columns
        # are mostly distinct ids and times, which the column encoders shrank
        # by 10 % (293 -> 264 MB for the 1M-event capture) for ~5 s more CPU
        # to build it (of ~20) and more to decode it in every later scan.
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        # No pandas/pyarrow here: plain pickled UDF rows, and no warning about it.
        .config("spark.sql.execution.pythonUDF.arrow.enabled", "false")
        # A step run in the background (``Progress.background``) shares the
        # cores with the steps in front of it instead of queueing them.
        .config("spark.scheduler.mode", "FAIR")
    )
    jvm = "-XX:TieredStopAtLevel=1" if quick_jvm else JVM_OPTIONS
    b = b.config("spark.driver.extraJavaOptions", jvm).config("spark.executor.extraJavaOptions", jvm)
    if not master or master.startswith("local"):
        b = b.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark.conf.set("spark.sql.execution.pythonUDF.arrow.enabled", "false")
    for k, v in conf.items():  # the runtime settings above, overridden again by the user's
        if spark.conf.isModifiable(k):
            spark.conf.set(k, v)
    # The CLI logs at INFO; py4j's and matplotlib's chatter is not progress.
    for name in ("py4j", "py4j.clientserver", "matplotlib", "matplotlib.font_manager"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return spark


def ship_code(spark: SparkSession) -> None:
    """Python workers import ``overlay_spark`` (the module of the filter-parsing
    UDF), and on a remote cluster ``overlay`` too (the parser itself; its
    dependencies msgspec and sortedcontainers must be installed there): ship
    them as zips, once per SparkContext."""
    sc = spark.sparkContext
    if getattr(sc, "_overlay_shipped", False):
        return
    packages = [Path(__file__).resolve().parent]
    if not (sc.master or "local").startswith("local"):
        import overlay

        packages.append(Path(overlay.__file__).resolve().parent)
    tmp = Path(tempfile.mkdtemp(prefix="overlay-replay-"))
    for pkg in packages:
        zpath = tmp / f"{pkg.name}.zip"
        with zipfile.ZipFile(zpath, "w") as z:
            for f in pkg.rglob("*.py"):
                z.write(f, Path(pkg.name) / f.relative_to(pkg))
        sc.addPyFile(str(zpath))
    sc._overlay_shipped = True  # type: ignore[attr-defined]


class Background(Generic[_T]):
    """A step running in its own thread (``Progress.background``): its number,
    start, and once done its time and result."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.group = f"replay-step-{step}"
        self.t0 = time.monotonic()
        self.elapsed = 0.0
        self.future: Future[_T] = Future()


class Progress:
    """Step lines (``[3/9] re-matching …``) and, while a step runs, the stages
    Spark is working on with their task counts, every ``PROGRESS_EVERY`` s.

    A step is either run in front (``step``: it lasts until the next one
    starts) or in the background (``background``: its own thread, its
    jobs in a scheduler pool of their own, so that the driver's planning
    of the steps in front — many small jobs, one core — overlaps its
    executors' work); ``wait`` gives its result and its time."""

    def __init__(self, spark: SparkSession, steps: int, *, out: TextIO | None = sys.stderr) -> None:
        self.sc = spark.sparkContext
        self.steps = steps
        self.n = 0
        self.out = out
        self.t0 = time.monotonic()
        self._step_t = self.t0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._open = False
        self._background: list[Background[Any]] = []

    def _print(self, text: str) -> None:
        if self.out is not None:
            print(text, file=self.out, flush=True)

    def _close(self) -> None:
        if self._open:
            self._print(f"      done in {time.monotonic() - self._step_t:.1f}s")
            self._open = False

    def step(self, what: str) -> None:
        self._close()
        now = time.monotonic()
        self.n += 1
        self._step_t = now
        self._open = True
        self.sc.setJobDescription(what)
        self._print(f"[{self.n}/{self.steps}] {what} (t+{now - self.t0:.0f}s)")

    def background(self, what: str, fn: Callable[[], _T], *, pool: str = "background") -> Background[_T]:
        """Step ``what`` as ``fn()`` in a thread of its own, its Spark jobs in
        scheduler pool ``pool``; the steps after it run meanwhile."""
        self._close()
        self.n += 1
        job = Background[_T](self.n)
        self._print(f"[{job.step}/{self.steps}] {what} (t+{job.t0 - self.t0:.0f}s, in the background)")
        sc = self.sc

        def run() -> None:
            # Local properties are the calling thread's (PySpark pins each
            # Python thread to a JVM thread): the description and the pool
            # of the jobs this thread starts.
            sc.setJobGroup(job.group, what)
            sc.setLocalProperty("spark.scheduler.pool", pool)
            try:
                res = fn()
            except BaseException as exc:  # noqa: BLE001 — handed to wait(), which raises it
                job.elapsed = time.monotonic() - job.t0
                job.future.set_exception(exc)
            else:
                job.elapsed = time.monotonic() - job.t0
                job.future.set_result(res)

        threading.Thread(target=run, name=job.group, daemon=True).start()
        self._background.append(job)
        return job

    def wait(self, job: Background[_T]) -> _T:
        """The result of a ``background`` step (its exception, raised here),
        once the step in front is done."""
        self._close()
        try:
            return job.future.result()
        finally:
            self._print(f"      [{job.step}/{self.steps}] done in {job.elapsed:.1f}s")

    def __enter__(self) -> Progress:
        if self.out is not None:
            self._thread = threading.Thread(target=self._watch, name="replay-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for job in self._background:  # a step in front failed: its background steps' jobs are not wanted
            if not job.future.done():
                self.sc.cancelJobGroup(job.group)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._open:
            self._print(
                f"      done in {time.monotonic() - self._step_t:.1f}s; total {time.monotonic() - self.t0:.1f}s"
            )

    def _watch(self) -> None:
        tracker = self.sc.statusTracker()
        last = ""
        while not self._stop.wait(PROGRESS_EVERY):
            try:
                parts = []
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        parts.append(f"stage {sid}: {info.numCompletedTasks}/{info.numTasks} tasks")
            except Exception:  # noqa: BLE001 — the context is stopping; progress is best effort
                return
            line = "      … " + ", ".join(parts) if parts else ""
            if line and line != last:
                self._print(line)
            last = line
