"""The ``overlay`` command line (SPEC §14).

    overlay node --config F --id N [--capture DIR]   run one node until SIGINT/SIGTERM
    overlay node join --config F --id N      run node N (in F) joining a running cluster that does not list it
    overlay node drain N --config F [--token T]   move every channel off node N; waits, prints a summary
    overlay cluster up F [--duration S] [--capture DIR] [--traffic]
                                             every node of F as subprocesses
    overlay pub --config F [--node N] [--key K [--rank R]] [EVENT ...]   (events from stdin if none)
    overlay sub --config F [--node N] EXPR [--group G [--weight W]] [--count K] [--seconds S]
    overlay status --config F                the cluster at a glance
    overlay channel split --config F CH --attr A (--at V | --values a,b)
    overlay channel place --config F CH --node N
    overlay demo F [--seconds S]             cluster + bounded demo traffic (make run)
    overlay replay RUN_DIR [--master URL] [--out DIR]   Spark replay of a capture (SPEC §13)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp

from overlay.capture import with_capture_dir
from overlay.client import AgentClient, Client, load_agent_settings
from overlay.config import ClusterConfig, NodeConfig, load_config
from overlay.errors import OverlayError

__all__ = ["main"]

log = logging.getLogger("overlay.cli")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # uvloop is a dependency; this only guards odd platforms
        return asyncio.run(coro)


def _addresses(cfg: ClusterConfig, node: int | None) -> list[tuple[str, int]]:
    nodes = [cfg.node(node)] if node is not None else list(cfg.nodes)
    return [(n.host, n.port) for n in nodes]


# -- node ---------------------------------------------------------------------------


async def _node_main(cfg: ClusterConfig, node_id: int) -> None:
    from overlay.net.node import Node

    node = Node(cfg, node_id, freeze_gc=True)  # its own process (net.node: gc.freeze)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, node.stop)
    await node.run()


def cmd_node(args: argparse.Namespace) -> int:
    if args.action == "drain":
        from overlay.membership_cli import cmd_drain

        return cmd_drain(args)
    if args.id is None:
        raise OverlayError("overlay node: --id N is required (the node to run)")
    cfg = load_config(args.config)
    cfg.node(args.id)
    if args.capture:
        cfg = with_capture_dir(cfg, args.capture)
    _run(_node_main(cfg, args.id))
    return 0


# -- cluster up ----------------------------------------------------------------------


async def _wait_ready(cfg: ClusterConfig, timeout: float) -> None:
    """Every node answers its clients and reports ready."""
    deadline = asyncio.get_running_loop().time() + timeout
    for n in cfg.nodes:
        while True:
            try:
                c = await Client([(n.host, n.port)], client_id="overlay-cli", reconnect=False).connect(timeout=2)
                try:
                    status = await c.admin("status", timeout=2)
                finally:
                    await c.close()
                if status["ready"]:
                    break
            except (OSError, OverlayError, asyncio.TimeoutError, TimeoutError):
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise OverlayError(f"node {n.id} at {n.host}:{n.port} not ready after {timeout}s")
            await asyncio.sleep(0.1)


class LocalCluster:
    """Every node of a config as a subprocess; ``stop`` ends them all cleanly."""

    def __init__(self, config_path: str, log_level: str = "info", *, capture: str | None = None) -> None:
        self.config_path = config_path
        self.capture = capture  # every node captures to this run directory (SPEC §13)
        self.cfg = load_config(config_path)
        self.log_level = log_level
        self.procs: dict[int, asyncio.subprocess.Process] = {}

    async def start(self, timeout: float = 30.0) -> None:
        for n in self.cfg.nodes:
            self.procs[n.id] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "overlay", "--log-level", self.log_level,
                "node", "--config", self.config_path, "--id", str(n.id),
                *(["--capture", self.capture] if self.capture else []),
                start_new_session=True,  # Ctrl-C reaches us; we stop the nodes in order
            )
        await _wait_ready(self.cfg, timeout)

    async def stop(self, timeout: float = 10.0) -> None:
        for p in self.procs.values():
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for nid, p in self.procs.items():
            try:
                await asyncio.wait_for(p.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("node %d did not stop within %ss; killing it", nid, timeout)
                p.kill()
                await p.wait()


async def _until_signal(seconds: float | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass


async def _cluster_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.config, args.log_level, capture=args.capture)
    try:
        await cluster.start()
        print(f"cluster {cluster.cfg.cluster.name!r} ready: " + ", ".join(
            f"node {n.id} at {n.host}:{n.port}" for n in cluster.cfg.nodes), flush=True)
        print("admin: " + ", ".join(admin_url(n.host, n.admin_port) + "/" for n in cluster.cfg.nodes if n.admin_port), flush=True)
        if args.traffic:
            from overlay.traffic import run_traffic

            await run_traffic(cluster.cfg, args.duration or 60.0)
        else:
            await _until_signal(args.duration)
    finally:
        print("stopping the cluster…", flush=True)
        await cluster.stop()
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    return _run(_cluster_up(args))


# -- pub / sub ------------------------------------------------------------------------


async def _pub(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    events = args.events or [line.strip() for line in sys.stdin if line.strip()]
    failed = 0
    # The routing agent (SPEC §12) over every node, or the one --node names.
    agent = AgentClient(_addresses(cfg, args.node), client_id="overlay-pub", settings=load_agent_settings(args.config))
    async with agent as c:
        for i, text in enumerate(events):
            # --rank R is the first event's; the next ones follow it (R+1, R+2, …).
            rank = args.rank + i if args.rank else 0
            try:
                event_id = await c.publish(text, key=args.key, rank=rank)
                print(json.dumps({"event_id": event_id, "event": text}), flush=True)
            except OverlayError as exc:
                failed += 1
                print(f"error: {exc}", file=sys.stderr)
    return 1 if failed else 0


def cmd_pub(args: argparse.Namespace) -> int:
    if args.rank and not args.key:
        print("error: --rank needs --key (ranks order the events of one key)", file=sys.stderr)
        return 2
    return _run(_pub(args))


async def _sub(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    # Held on two access nodes (one for a group) and moved when one is lost (SPEC §12).
    agent = AgentClient(_addresses(cfg, args.node), client_id="overlay-sub", settings=load_agent_settings(args.config))
    async with agent as c:
        sub = await c.subscribe(args.expression, group=args.group, weight=args.weight)
        homes = sorted(cfg.nodes[i].id if args.node is None else args.node for i in sub.homes)
        print(json.dumps({"subscribed": args.expression, "nodes": homes, "group": args.group}), file=sys.stderr, flush=True)
        n = 0

        async def consume() -> None:
            nonlocal n
            async for note in sub:
                print(json.dumps({"event_id": note.event_id, "event": note.event, "subscriptions": list(note.sub_ids)}), flush=True)
                n += 1
                if args.count and n >= args.count:
                    return

        consumer = asyncio.ensure_future(consume())
        waiter = asyncio.ensure_future(_until_signal(args.seconds))
        await asyncio.wait({consumer, waiter}, return_when=asyncio.FIRST_COMPLETED)
        consumer.cancel()
        waiter.cancel()
        await sub.close()
    return 0


def cmd_sub(args: argparse.Namespace) -> int:
    return _run(_sub(args))


# -- status / channel ------------------------------------------------------------------


# How long `overlay status` waits for one node's admin endpoint: a node that
# takes longer is as good as down to an operator looking at the table.
STATUS_TIMEOUT: Final = 3.0


def admin_url(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{port}"


async def _client_status(n: NodeConfig) -> tuple[dict[str, Any] | None, str]:
    """A node without an admin port in the config (0: ephemeral) is asked over
    the client protocol instead."""
    try:
        c = await Client([(n.host, n.port)], client_id="overlay-status", reconnect=False).connect(timeout=2)
        try:
            return await c.admin("status", timeout=5), ""
        finally:
            await c.close()
    except (OSError, OverlayError, asyncio.TimeoutError, TimeoutError) as exc:
        return None, f"down: {n.host}:{n.port} does not answer ({type(exc).__name__})"


async def _http_status(http: aiohttp.ClientSession, n: NodeConfig) -> tuple[dict[str, Any] | None, str]:
    url = admin_url(n.host, n.admin_port)
    try:
        async with http.get(f"{url}/status") as resp:
            if resp.status != 200:
                return None, f"{url} answered HTTP {resp.status}"
            return await resp.json(), ""
    except aiohttp.ClientConnectorError:
        return None, f"down: nothing listens on {url}"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return None, f"down: {url} did not answer ({type(exc).__name__})"


async def node_statuses(cfg: ClusterConfig) -> list[tuple[dict[str, Any] | None, str]]:
    """Every node's ``/status`` from its admin endpoint, or why there is none."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT)) as http:
        return list(
            await asyncio.gather(*(_http_status(http, n) if n.admin_port else _client_status(n) for n in cfg.nodes))
        )


async def _statuses(cfg: ClusterConfig) -> list[dict[str, Any] | None]:
    return [st for st, _ in await node_statuses(cfg)]


def _level_bar(x: float, top: float, width: int = 10) -> str:
    filled = min(width, int(round(width * x / top))) if top > 0 else 0
    return "█" * filled + "·" * (width - filled)


def format_status(
    cfg: ClusterConfig, statuses: Sequence[dict[str, Any] | None], reasons: Sequence[str] | None = None
) -> str:
    """One line per node (state, load level dc, channels, S/dc̄ as it sees it),
    a cluster line, then the routing table."""
    reasons = list(reasons or [""] * len(statuses))
    levels = [st["dc"] for st in statuses if st]
    top = max(levels, default=0.0)
    rows = [f"{'node':>4}  {'admin':<22} {'state':<11} {'load level dc':<21} {'channels':>8} {'subs':>6} {'S/dc̄':>6}"]
    for n, st, why in zip(cfg.nodes, statuses, reasons):
        where = admin_url(n.host, n.admin_port) if n.admin_port else f"{n.host}:{n.port}"
        if st is None:
            rows.append(f"{n.id:>4}  {where:<22} {why or 'down'}")
            continue
        ratio = st.get("spread_ratio")
        if ratio is None and st.get("spread") is not None and st.get("mean_dc"):
            ratio = st["spread"] / st["mean_dc"]
        subs = st.get("subscriptions", sum(c.get("subscriptions", 0) for c in st["channels"]))
        rows.append(
            f"{n.id:>4}  {where:<22} {st['state']:<11} {_level_bar(st['dc'], top)} {st['dc']:>10.1f} "
            f"{len(st['channels']):>8} {subs:>6} {'–' if ratio is None else f'{ratio:.3f}':>6}"
        )
    up = [st for st in statuses if st]
    line = f"cluster {cfg.cluster.name!r}: {len(up)}/{len(statuses)} nodes answer"
    if up:
        mean = sum(levels) / len(levels)
        spread = (sum((x - mean) ** 2 for x in levels) / len(levels)) ** 0.5
        line += f", {len(up[0]['routing'])} channels, dc̄ {mean:.1f}, S/dc̄ {spread / mean if mean else 0.0:.3f}"
    rows.append(line)
    if up:
        rows.append("routing table:")
        for r in up[0]["routing"]:
            rows.append(f"  {r['id']:<8} node {','.join(map(str, r['owners'])):<6} {r['space']}")
    return "\n".join(rows)


async def _status(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    answers = await node_statuses(cfg)
    print(format_status(cfg, [st for st, _ in answers], [why for _, why in answers]))
    return 0 if all(st for st, _ in answers) else 1


def cmd_status(args: argparse.Namespace) -> int:
    return _run(_status(args))


async def _owner_of(cfg: ClusterConfig, channel: str) -> int:
    for st in await _statuses(cfg):
        if st:
            for r in st["routing"]:
                if r["id"] == channel:
                    return int(r["owners"][0])
            raise OverlayError(f"channel {channel} is not in the routing table")
    raise OverlayError("no node answered")


async def _channel(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    owner = await _owner_of(cfg, args.channel)
    kw: dict[str, Any] = {"channel": args.channel}
    if args.action == "split":
        kw["attr"] = args.attr
        if args.values:
            kw["values"] = args.values.split(",")
        else:
            kw["at"] = float(args.at) if "." in args.at else int(args.at)
        cmd = "split"
    else:
        kw["node"] = args.node
        cmd = "place"
    async with Client(_addresses(cfg, owner), client_id="overlay-admin") as c:
        print(json.dumps(await c.admin(cmd, **kw)))
    return 0


def cmd_channel(args: argparse.Namespace) -> int:
    return _run(_channel(args))


def cmd_replay(args: argparse.Namespace) -> int:
    # The Spark jobs live in the repository's spark/ directory (SPEC §13);
    # OVERLAY_SPARK_DIR points elsewhere when the package is installed alone.
    spark_dir = os.environ.get("OVERLAY_SPARK_DIR") or str(Path(__file__).resolve().parents[2] / "spark")
    if not Path(spark_dir, "overlay_spark").is_dir():
        raise OverlayError(f"the Spark jobs are not in {spark_dir}; set OVERLAY_SPARK_DIR to the repository's spark/")
    if spark_dir not in sys.path:
        sys.path.insert(0, spark_dir)
    from overlay_spark.replay import run_from_args

    return run_from_args(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from overlay.demo import run_demo

    return _run(run_demo(args.config, args.seconds, args.log_level))


# -- parser ---------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="overlay", description="content-based pub/sub overlay")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    sub = p.add_subparsers(dest="command", required=True)

    n = sub.add_parser("node", help="run one node; `node join` (a new node), `node drain N` (empty node N)")
    n.add_argument("action", nargs="?", choices=["join", "drain"], help="join: run --id N joining a running cluster; drain N")
    n.add_argument("target", nargs="?", type=int, help="drain: the node to drain")
    n.add_argument("--config", required=True)
    n.add_argument("--id", type=int, default=None)
    n.add_argument("--token", default=None, help="drain: admin token (default: $OVERLAY_ADMIN_TOKEN, then the config's)")
    n.add_argument("--timeout", type=float, default=300.0, help="drain: seconds to wait for it to finish")
    n.add_argument("--capture", metavar="DIR", help="write this node's capture to DIR (overrides cluster.capture_dir)")
    n.set_defaults(func=cmd_node)

    c = sub.add_parser("cluster", help="run every node of a config locally")
    c.add_argument("action", choices=["up"])
    c.add_argument("config")
    c.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    c.add_argument("--capture", metavar="DIR", help="every node captures to DIR (one file per node), for `overlay replay DIR`")
    c.add_argument("--traffic", action="store_true", help="drive the demo workload (make run's) until the end")
    c.set_defaults(func=cmd_cluster)

    pb = sub.add_parser("pub", help="publish events (arguments, or one per stdin line)")
    pb.add_argument("--config", required=True)
    pb.add_argument("--node", type=int, default=None, help="only this access node (default: the routing agent picks)")
    pb.add_argument("--key", default="", help="sequence key: events with one key arrive in order (SPEC §10)")
    pb.add_argument("--rank", type=_positive_int, default=0, help="explicit rank of the first event (needs --key)")
    pb.add_argument("events", nargs="*")
    pb.set_defaults(func=cmd_pub)

    sb = sub.add_parser("sub", help="subscribe and print notifications as JSON lines")
    sb.add_argument("--config", required=True)
    sb.add_argument("--node", type=int, default=None, help="only this access node (default: any two, with failover)")
    sb.add_argument("expression")
    sb.add_argument("--group", default="", help="join this subscriber group: one instance gets each event (SPEC §11)")
    sb.add_argument("--weight", type=_positive_float, default=1.0, help="static weight Ws within the group")
    sb.add_argument("--count", type=int, default=0, help="stop after this many notifications")
    sb.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    sb.set_defaults(func=cmd_sub)

    st = sub.add_parser("status", help="show the cluster")
    st.add_argument("--config", required=True)
    st.set_defaults(func=cmd_status)

    ch = sub.add_parser("channel", help="operator commands on channels")
    ch.add_argument("action", choices=["split", "place"])
    ch.add_argument("channel", help="channel id, e.g. 0.0")
    ch.add_argument("--config", required=True)
    ch.add_argument("--attr", help="split: attribute to cut")
    ch.add_argument("--at", help="split: cut an ordered attribute after this value")
    ch.add_argument("--values", help="split: comma-separated string values for the new type-1 child")
    ch.add_argument("--node", type=int, help="place: the receiving node")
    ch.set_defaults(func=cmd_channel)

    d = sub.add_parser("demo", help="local cluster with bounded demo traffic (make run)")
    d.add_argument("config")
    d.add_argument("--seconds", type=float, default=60.0)
    d.set_defaults(func=cmd_demo)

    rp = sub.add_parser("replay", help="replay a run's capture on Spark: spread, migrations, re-matching, audit")
    rp.add_argument("run_dir", help="directory holding the run's node-*.ndjson files")
    rp.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    rp.add_argument("--out", default=None, help="report directory (default RUN_DIR/report)")
    rp.add_argument("--tail-guard", type=float, default=None,
                    help="seconds before the first node stopped whose events the loss checks skip (default: one slice)")
    rp.add_argument("--partitions", type=int, default=8, help="Spark shuffle partitions")
    rp.add_argument("--quiet", action="store_true", help="no progress lines")
    rp.set_defaults(func=cmd_replay)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except OverlayError as exc:
        print(f"overlay: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
