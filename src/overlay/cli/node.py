"""``overlay node`` (run one node; ``node join``; ``node drain N``) and
``overlay cluster up`` (every node of a config, ``LocalCluster``).

A server command: SIGINT or SIGTERM stops its node(s) cleanly and it exits 0
(rule 2 of ``overlay.cli``); a second signal hurries it.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Final

from overlay.capture import with_capture_dir, with_capture_payload
from overlay.cli.admin import cmd_drain
from overlay.cli.args import add_command, check_dir_option, config_node, node_id, positive_float
from overlay.cli.local_cluster import LocalCluster, ready_lines, stopping_line
from overlay.cli.ports import check_ports_free
from overlay.cli.running import EXIT_OK, STOP_SIGNALS, UsageError, log, run_command
from overlay.cli.traffic import run_traffic
from overlay.config import ClusterConfig, load_config
from overlay.limits.descriptors import raise_descriptor_limit
from overlay.security import NodeSecurity, node_security

__all__ = ["cmd_cluster", "cmd_node", "register"]

NODE_EXAMPLES: Final = """\
examples:
  overlay node --config cluster_configs/local.toml --id 0
  overlay node join --config grown.toml --id 3      (node 3 joins the running nodes of grown.toml)
  overlay node drain 1 --config cluster_configs/local.toml
  overlay node --config F --id 0 --capture runs/x   (record what the node handles, for replay)

Ctrl-C or SIGTERM stops the node cleanly (exit 0); a second one at once.  `node drain`
waits for the drain: Ctrl-C ends the wait within 2 s (exit 130; 143 for SIGTERM)."""

CLUSTER_EXAMPLES: Final = """\
examples:
  overlay cluster up cluster_configs/local.toml                 (until Ctrl-C)
  overlay cluster up cluster_configs/hetero5.toml --duration 60 --traffic --capture runs/x
  overlay replay runs/x
  overlay cluster up cluster_configs/local.toml --keep-going    (kill a node, watch the others fail over)

Starts nothing when a configured port is taken (it names the process holding
it).  When a node dies (its exit status and last lines of log are printed):
  by default      every other node is stopped; exit 1
  --keep-going    the others keep running and are still watched; exit 1, with
                  every death in order, only once no node is left
A node that dies during start-up stops them all, --keep-going or not.
Ctrl-C, SIGTERM or the end of --duration stops every node still running
cleanly (exit 0, naming any that died on the way); a second Ctrl-C kills them."""


async def _node_main(cfg: ClusterConfig, nid: int, security: NodeSecurity) -> int:
    from overlay.net.node import Node  # the node's own imports: not for the client commands

    before, after = raise_descriptor_limit()  # net.node rule 17: the process's own limit, as high as it may go
    if after != before:
        log.info("node %d: open files limit raised from %d to %d (net.node rule 17)", nid, before, after)
    node = Node(cfg, nid, freeze_gc=True, security=security)  # its own process (net.node: gc.freeze)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    signals = 0

    def on_signal() -> None:
        # The first signal stops the node cleanly (its queues flushed); a second
        # one cancels it where it is.
        nonlocal signals
        signals += 1
        if signals == 1:
            node.stop()
        else:
            main.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    try:
        await node.run()
        while node.rejoin_reason and not signals:
            # Declared dead while paused or cut off (net.node rule 14): a new,
            # empty run on the same ports fetches the table and joins again.
            log.warning("node %d: starting a new run to rejoin the cluster", nid)
            # The run that ended unfroze what it had frozen (net.gc_freeze rule 4):
            # the new one collects it and freezes afresh.
            node = Node(cfg, nid, freeze_gc=True, security=security)
            await node.run()
    except asyncio.CancelledError:
        if signals < 2:
            raise
        log.warning("node %d: stopped at once (second signal); queued frames are lost", nid)
    return EXIT_OK


def cmd_node(args: argparse.Namespace) -> int:
    if args.action == "drain":
        return cmd_drain(args)
    if args.target is not None:
        raise UsageError(f"a node to run is given with --id N, not as {args.target!r} (that is for `node drain N`)")
    if args.id is None:
        raise UsageError("--id N is required: the node of the config to run")
    cfg = load_config(args.config)
    check_ports_free([config_node(cfg, args.id, "--id")])
    check_dir_option("--capture", args.capture)
    if args.capture:
        cfg = with_capture_dir(cfg, args.capture)
    if args.capture_payload:
        if not cfg.cluster.capture_dir:
            raise UsageError("--capture-payload needs a capture: give --capture DIR or set [cluster] capture_dir")
        cfg = with_capture_payload(cfg)
    security = node_security(cfg, args.id)  # rule 1: a missing certificate is one line, before anything listens
    return run_command(_node_main(cfg, args.id, security), server=True)


async def _forever(seconds: float | None) -> None:
    if seconds is None:
        await asyncio.Event().wait()
    else:
        await asyncio.sleep(seconds)


# How long `cluster up --traffic` drives the cluster without --duration.
DEFAULT_TRAFFIC_SECONDS: Final = 60.0


async def _cluster_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.config, args.log_level, capture=args.capture, keep_going=args.keep_going)
    await cluster.start()
    try:
        if args.keep_going:
            print(
                f"cluster {cluster.cfg.cluster.name!r} ready; a node that dies is reported and the others "
                f"keep running (--keep-going); Ctrl-C stops it:",
                flush=True,
            )
        else:
            print(f"cluster {cluster.cfg.cluster.name!r} ready, Ctrl-C stops it:", flush=True)
        print("\n".join(ready_lines(cluster)), flush=True)
        if args.traffic:
            await cluster.supervise(run_traffic(cluster.cfg, args.duration or DEFAULT_TRAFFIC_SECONDS))
        else:
            await cluster.supervise(_forever(args.duration))
    finally:
        print(stopping_line(cluster), flush=True)
        await cluster.stop()
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    load_config(args.config)
    check_dir_option("--capture", args.capture)
    return run_command(_cluster_up(args), server=True)


def register(sub: Any) -> None:
    """The ``node`` and ``cluster`` subcommands."""
    n = add_command(sub, "node", "run one node; `node join` (a new node), `node drain N` (empty node N)", NODE_EXAMPLES)
    n.add_argument(
        "action", nargs="?", choices=["join", "drain"], help="join: run --id N joining a running cluster; drain N"
    )
    n.add_argument("target", nargs="?", type=node_id, help="drain: the node to drain")
    n.add_argument("--config", required=True)
    n.add_argument("--id", type=node_id, default=None)
    n.add_argument(
        "--token",
        default=None,
        help="drain: a token with the admin role (default: $OVERLAY_TOKEN); without [auth], the legacy admin "
        "token (default: $OVERLAY_ADMIN_TOKEN, then the config's)",
    )
    n.add_argument("--timeout", type=positive_float, default=300.0, help="drain: seconds to wait for it to finish")
    n.add_argument("--capture", metavar="DIR", help="write this node's capture to DIR (overrides cluster.capture_dir)")
    n.add_argument(
        "--capture-payload",
        action="store_true",
        help="record each event's payload in the capture, not only its size (sets cluster.capture_payload)",
    )
    n.set_defaults(func=cmd_node)

    c = add_command(sub, "cluster", "run every node of a config locally", CLUSTER_EXAMPLES)
    c.add_argument("action", choices=["up"])
    c.add_argument("config")
    c.add_argument("--duration", type=positive_float, default=None, help="stop after this many seconds")
    c.add_argument(
        "--capture", metavar="DIR", help="every node captures to DIR (one file per node), for `overlay replay DIR`"
    )
    c.add_argument("--traffic", action="store_true", help="drive the demo workload (make run's) until the end")
    c.add_argument(
        "--keep-going",
        action="store_true",
        help="when a node dies, report it and keep the others running (default: stop them all and exit 1); "
        "exit 1 once no node is left",
    )
    c.set_defaults(func=cmd_cluster)
