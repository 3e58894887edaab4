"""The ``overlay`` command line (SPEC §14).

    overlay node --config F --id N [--capture DIR]   run one node until SIGINT/SIGTERM
    overlay node join --config F --id N      run node N (in F) joining a running cluster that does not list it
    overlay node drain N --config F [--token T]   move every channel off node N; waits, prints a summary
    overlay cluster up F [--duration S] [--capture DIR] [--traffic] [--keep-going]
                                             every node of F as subprocesses
    overlay pub --config F [--node N] [--key K [--rank R]] [EVENT ...]   (events from stdin if none)
    overlay sub --config F [--node N] EXPR [--group G [--weight W]] [--count K] [--seconds S]
    overlay status --config F                the cluster at a glance
    overlay channel split --config F CH --attr A (--at V | --values a,b)
    overlay channel place --config F CH --node N
    overlay token create --config F --role R [--scope R=EXPR] [--ttl 1h] [--subject ID]   a signed client token
    overlay token verify --config F [TOKEN]  what a token allows, or why it is refused
    overlay token keys DIR                   an Ed25519 key pair for [auth]
    overlay certs dev DIR --config F [--client NAME]   development CA and certificates for F's nodes
    overlay demo F [--seconds S] [--keep-going]   cluster + bounded demo traffic (make run)
    overlay replay RUN_DIR [--master URL] [--out DIR]   Spark replay of a capture (SPEC §13)

Rules every command keeps:

1. Arguments and the config file are checked before anything starts or
   connects.  A bad one is one line on stderr and exit 2 — argparse's own
   errors too (``args.Parser``).
2. SIGINT and SIGTERM cancel the command's main task; the handlers are the
   first thing installed in its event loop (``running.run_command``).  A
   client command (pub, sub, status, channel, node drain) closes its
   connections within ``CLOSE_TIMEOUT`` and exits 130 (SIGINT) or 143
   (SIGTERM); one that still has not ended ``INTERRUPT_GRACE`` after the
   signal exits anyway.  A server (node, cluster up, demo) stops its node(s)
   and exits 0: a signal is how it is meant to end; a second signal hurries
   it (``LocalCluster.stop`` kills).
3. No traceback reaches the user: an ``OverlayError`` is one line
   ``overlay: …`` (exit 2 when the command line or the config is at fault, 1
   when the cluster or the machine failed the command); anything else is
   ``overlay: internal error: …`` (exit 1) — with ``--log-level debug`` the
   traceback is shown instead.
4. ``cluster up`` and ``demo`` (``LocalCluster``) start nodes only on free
   ports, name whatever holds a taken one, accept a node as ready only when
   its Welcome names the node id and cluster of the config, and watch every
   node: one that exits, at start-up or later, is reported with its exit code
   and its last lines of log, and the others are stopped (exit 1) — unless
   ``--keep-going`` was given and the cluster was ready: then the others keep
   running, still watched, and the command exits 1 only when no node is left
   (naming every death in order).

The modules, one per command group, and what they share:

* ``running``       — exit codes, ``UsageError``/``CommandFailed``, signals (rule 2);
* ``args``          — every argparse validator, config look-ups, ``Parser`` (rule 1);
* ``ports``         — who holds a port (rule 4);
* ``local_cluster`` — ``LocalCluster``: a config's nodes as subprocesses (rule 4);
* ``node``          — ``node`` (run, join) and ``cluster up``;
* ``pubsub``        — ``pub`` and ``sub``;
* ``status``        — ``status``;
* ``admin``         — ``channel split|place`` and ``node drain``;
* ``certs``         — ``certs dev`` (``overlay.security.certs``);
* ``token``         — ``token create|verify|keys`` (``overlay.auth``);
* ``demo``          — ``demo`` (``make run``), over ``workload``, which
  ``traffic`` (``cluster up --traffic``) drives too;
* ``replay``        — ``replay`` (the Spark jobs: ``overlay_spark``, the replay extra);
* ``parser``        — ``build_parser``, assembling the commands above.

Imports go one way, from ``parser`` down to ``running``, and no module of
the package takes a name from this ``__init__``: no circle
(``tests/test_import_graph.py``).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import Final

from overlay.cli.args import config_node
from overlay.cli.local_cluster import LocalCluster, wait_ready
from overlay.cli.parser import build_parser
from overlay.cli.ports import check_ports_free, port_holders
from overlay.cli.pubsub import run_pub, run_sub
from overlay.cli.running import (
    EXIT_FAILED,
    EXIT_SIGNAL_BASE,
    EXIT_USAGE,
    CommandFailed,
    UsageError,
    finish_within,
    first_cause,
    one_line,
    print_error,
    run_command,
    setup_logging,
)
from overlay.cli.status import format_status, node_statuses
from overlay.cli.workload import traffic_failed
from overlay.errors import ConfigError, ExpressionError, LocalProtocolError, OverlayError, SchemaError

__all__ = [
    "CommandFailed",
    "LocalCluster",
    "UsageError",
    "build_parser",
    "check_ports_free",
    "config_node",
    "finish_within",
    "format_status",
    "main",
    "node_statuses",
    "port_holders",
    "run_command",
    "run_pub",
    "run_sub",
    "traffic_failed",
    "wait_ready",
]


# -- main (rule 3) ----------------------------------------------------------------------

# Errors of the user's making: the command line, the config file, an
# expression or a value that does not fit the schema.
USAGE_ERRORS: Final = (UsageError, ConfigError, ExpressionError, SchemaError, LocalProtocolError)


def _report(exc: OverlayError) -> int:
    print_error(exc)
    return EXIT_USAGE if isinstance(exc, USAGE_ERRORS) else EXIT_FAILED


def _stdout_gone() -> int:
    """stdout was closed under us (``overlay sub … | head``): say nothing more,
    and keep the interpreter's final flush from failing on it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C outside an event loop (loading, reading stdin)
        return EXIT_SIGNAL_BASE + signal.SIGINT
    except BrokenPipeError:
        return _stdout_gone()
    except OverlayError as exc:
        return _report(exc)
    except TimeoutError:
        print("overlay: timed out waiting for the cluster", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"overlay: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        if args.log_level == "debug":
            raise
        cause = first_cause(exc)
        print(
            f"overlay: internal error: {type(cause).__name__}: {one_line(cause)} (--log-level debug shows where)",
            file=sys.stderr,
        )
        return EXIT_FAILED
