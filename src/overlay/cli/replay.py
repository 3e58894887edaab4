"""``overlay replay RUN_DIR``: a run's capture replayed on Spark (SPEC §13).

The Spark jobs are ``overlay_spark``, installed with the ``replay`` extra
(pyspark, matplotlib): a node or a client installs without them, and
``overlay replay`` without them is refused in one line (exit 2) that says
what to install.  The checks: 0 every validation passed, 1 one failed (each
named), 2 a bad argument or a capture that cannot be read.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Final

from overlay.cli.args import add_command, check_dir_option, non_negative_float, positive_int
from overlay.cli.running import UsageError

__all__ = ["REPLAY_EXTRA", "cmd_replay", "register", "spark_conf"]

# What `pip install 'overlay[replay]'` adds, as the modules the replay imports.
REPLAY_EXTRA: Final = ("pyspark", "matplotlib")

EXAMPLES: Final = """\
examples:
  overlay cluster up cluster_configs/hetero5.toml --capture runs/x --duration 60 --traffic
  overlay replay runs/x                                         (writes runs/x/report/)
  overlay replay runs/x --master spark://host:7077 --out /tmp/report
  overlay replay runs/x --master spark://host:7077 --conf spark.executor.memory=2g --conf spark.cores.max=8

Needs the replay extra (pip install 'overlay[replay]') and Java.
Exits 1 when a validation fails, 2 when the capture cannot be read."""


def spark_conf(text: str) -> tuple[str, str]:
    """One ``--conf KEY=VALUE``: a Spark setting (its key starts with ``spark.``)
    and a value, both non-empty."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. spark.executor.memory=2g)")
    if not key:
        raise argparse.ArgumentTypeError(f"{text!r} has no key before '='")
    if any(c.isspace() for c in key):
        raise argparse.ArgumentTypeError(f"{key!r} is not a Spark setting: a key has no spaces")
    if not key.startswith("spark."):
        raise argparse.ArgumentTypeError(f"{key!r} is not a Spark setting: Spark's keys start with 'spark.'")
    if not value:
        raise argparse.ArgumentTypeError(f"{key} has no value after '='")
    return key, value


def _check_extra() -> None:
    """The replay extra is installed, or a ``UsageError`` (exit 2) says to
    install it — before Spark or a JVM start."""
    missing = []
    for module in REPLAY_EXTRA:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise UsageError(
            f"replay needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"install overlay[replay] (pip install 'overlay[replay]')"
        )


def cmd_replay(args: argparse.Namespace) -> int:
    run = Path(args.run_dir)
    if not run.is_dir():
        raise UsageError(f"{run} is not a directory{'' if run.exists() else ' (it does not exist)'}")
    if not any(run.glob("node-*.ndjson")):
        raise UsageError(f"{run} holds no capture (node-*.ndjson): `overlay cluster up F --capture {run}` makes one")
    check_dir_option("--out", args.out)
    _check_extra()
    from overlay_spark.records import CaptureError
    from overlay_spark.replay import run_replay

    try:
        res = run_replay(
            args.run_dir,
            master=args.master,
            out=args.out,
            tail_guard=args.tail_guard,
            partitions=args.partitions,
            conf=dict(args.conf or ()),
            stream=None if args.quiet else sys.stderr,
        )
    except CaptureError as exc:  # no header, an unknown schema version: the capture's fault (exit 2)
        raise UsageError(f"cannot replay {exc}") from None
    if args.quiet:  # no progress, but warnings and failures are still said
        for note in res.details["notes"]:
            if note.startswith("warning: "):
                print(note, file=sys.stderr)
        if res.failed:
            print(f"FAILED: {', '.join(res.failed)}", file=sys.stderr)
    return res.exit_code


def register(sub: Any) -> None:
    """The ``replay`` subcommand."""
    rp = add_command(sub, "replay", "replay a run's capture on Spark: spread, migrations, re-matching, audit", EXAMPLES)
    rp.add_argument("run_dir", help="directory holding the run's node-*.ndjson files")
    rp.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    rp.add_argument("--out", default=None, help="report directory (default RUN_DIR/report)")
    rp.add_argument(
        "--tail-guard",
        type=non_negative_float,
        default=None,
        help="seconds before the first node stopped whose events the loss checks skip (default: one slice)",
    )
    rp.add_argument("--partitions", type=positive_int, default=8, help="Spark shuffle partitions")
    rp.add_argument(
        "--conf",
        type=spark_conf,
        action="append",
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable; wins over the replay's own defaults)",
    )
    rp.add_argument("--quiet", action="store_true", help="no progress lines")
    rp.set_defaults(func=cmd_replay)
