"""The ``overlay`` argument parser: the top level (``--version``,
``--log-level``, the exit codes) and each command group's subcommands, which
its own module registers."""

from __future__ import annotations

import argparse
import importlib.metadata
from typing import Final

from overlay.build import BUILD
from overlay.cli import admin, certs, demo, node, pubsub, replay, status, token
from overlay.cli.args import Parser

__all__ = ["EXIT_CODES", "build_parser"]

EXIT_CODES: Final = """\
exit codes:
  0    done (a server — node, cluster up, demo — also after Ctrl-C or SIGTERM)
  1    the cluster or the machine failed the command (no node answers, a node
       died or, with --keep-going, no node is left, a port is taken, an event
       was refused, a replay check failed)
  2    a bad argument or config file, a capture that cannot be read, or
       `overlay replay` without overlay[replay] (one line on stderr says which)
  130  a client command (pub, sub, status, channel, node drain) ended by Ctrl-C
  143  the same, ended by SIGTERM
Ctrl-C ends a client command within 2 s, whatever the cluster does."""

EXAMPLES: Final = """\
examples:
  overlay cluster up cluster_configs/local.toml
  overlay sub --config cluster_configs/local.toml 'price < 100 and sym = "IBM"'
  overlay pub --config cluster_configs/local.toml '{price: 42.5, sym: "IBM", qty: 10}'
  overlay status --config cluster_configs/local.toml
  overlay certs dev cluster_configs/certs --config cluster_configs/local.toml   (TLS for development)
  overlay COMMAND --help        (each command's options and examples)"""


def _version() -> str:
    try:
        return importlib.metadata.version("overlay")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        from overlay import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="overlay",
        description="content-based pub/sub overlay",
        epilog=EXAMPLES + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()} ({BUILD})")
    p.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        help="log level (default info); debug also shows the traceback of an internal error",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order `overlay --help` lists them.
    node.register(sub)  # node, cluster
    pubsub.register(sub)  # pub, sub
    status.register(sub)
    admin.register(sub)  # channel (node drain is node's)
    certs.register(sub)
    token.register(sub)  # token create|verify|keys
    demo.register(sub)
    replay.register(sub)
    return p
