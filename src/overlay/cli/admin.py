"""Operator commands: ``overlay channel split|place`` and ``overlay node drain N``
(``overlay.node.membership``), each presenting the admin token: a token
with the admin role where the cluster has ``[auth]``, the legacy shared
token otherwise.

``channel`` sends the client protocol's Admin command to the channel's owner
(found in ``overlay status``'s routing table).  ``node drain`` asks node N on
its admin endpoint (``POST /drain``, bearer token) when the config gives it an
admin port, else with the client protocol's Admin command ``drain``; both
wait for the drain to end and print the summary.  An unknown node is refused
here (exit 2); the node itself refuses a drain of the last node of the
cluster or of a node already draining (exit 1).  Ctrl-C ends the wait (rule 2
of ``overlay.cli``); the node may still carry the command out.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Final

import aiohttp

from overlay.channels import Kind, parse_rfid
from overlay.channels.predicates import MAX_SET_SIZE
from overlay.channels.schema import Attribute
from overlay.cli.args import (
    add_command,
    addresses,
    admin_url,
    client_id_for,
    cluster_tls,
    config_node,
    http_connector,
    node_id,
    user_token,
)
from overlay.cli.running import (
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    EXIT_OK,
    CommandFailed,
    UsageError,
    finish_within,
    run_command,
)
from overlay.cli.status import statuses
from overlay.client import Client
from overlay.config import ClusterConfig, NodeConfig, load_config
from overlay.errors import RequestError, SchemaError

__all__ = [
    "admin_token",
    "cmd_channel",
    "cmd_drain",
    "describe_channel_result",
    "drain_node",
    "format_drain",
    "register",
]

EXAMPLES: Final = """\
examples:
  overlay channel split 0.0 --config cluster_configs/local.toml --attr price --at 500
  overlay channel split 0.1 --config F --attr sym --values IBM,AAPL
  overlay channel place 0.2 --config F --node 2

Channel ids and owners: `overlay status --config F`.  Ctrl-C ends the wait
within 2 s (exit 130); the node may still carry the command out."""


async def _owner_of(cfg: ClusterConfig, channel: str) -> int:
    for st in await statuses(cfg):
        if st:
            for r in st["routing"]:
                if r["id"] == channel:
                    return int(r["owners"][0])
            known = ", ".join(r["id"] for r in st["routing"])
            raise UsageError(f"channel {channel} does not exist (channels: {known})")
    raise CommandFailed(f"no node of {cfg.path} answers: is the cluster up?")


def _cut_value(cfg: ClusterConfig, attr_name: str, text: str) -> int | float:
    """``--at`` as a value of the attribute's kind, inside its domain."""
    attr = cfg.schema.attribute(attr_name)
    try:
        if attr.kind is Kind.RFID:
            value: int | float = parse_rfid(text) if "." in text else int(text)
        elif attr.kind is Kind.INT:
            value = int(text)
        else:
            value = float(text)
    except ValueError:
        kind = "an integer" if attr.kind is Kind.INT else "a number" if attr.kind is Kind.FLOAT else "an rfid code"
        raise UsageError(f"--at {text!r}: {attr_name} takes {kind}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"--at {text!r} is not a finite number")
    attr.check(value)
    return value


def _split_values(attr: Attribute, text: str) -> list[str]:
    """``--values a,b``, each checked as the node checks it: a mistake is a
    usage error here (exit 2), not the node's refusal (exit 1)."""
    values = text.split(",")
    if len(values) > MAX_SET_SIZE:
        raise UsageError(f"--values lists {len(values)} values; a split takes at most {MAX_SET_SIZE}")
    for v in values:
        try:
            attr.check(v)
        except SchemaError as exc:
            raise UsageError(f"--values {v!r}: {exc}") from None
    return values


def _channel_args(cfg: ClusterConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The admin command and its arguments, checked against the config."""
    chid = args.channel
    node, _, seq = chid.partition(".")
    if not (node.isdecimal() and seq.isdecimal()):
        raise UsageError(f"channel ids look like NODE.SEQ (e.g. 0.0), got {chid!r}")
    if args.action == "place":
        if args.node is None:
            raise UsageError("place needs --node N: the node to move the channel to")
        if args.attr or args.at is not None or args.values:
            raise UsageError("place takes --node only (--attr, --at, --values are for split)")
        config_node(cfg, args.node)
        return "place", {"channel": chid, "node": args.node}
    if args.node is not None:
        raise UsageError("split takes --attr with --at or --values, not --node")
    if not args.attr:
        raise UsageError(f"split needs --attr, one of {', '.join(cfg.schema.da)}")
    try:
        attr = cfg.schema.attribute(args.attr)
        if attr.kind is Kind.STRING:
            if args.at is not None or not args.values:
                raise UsageError(f"{args.attr} is a string attribute: split it with --values a,b (not --at)")
            return "split", {"channel": chid, "attr": args.attr, "values": _split_values(attr, args.values)}
        if args.values or args.at is None:
            raise UsageError(f"{args.attr} is an ordered attribute: split it with --at VALUE (not --values)")
        return "split", {"channel": chid, "attr": args.attr, "at": _cut_value(cfg, args.attr, args.at)}
    except SchemaError as exc:
        raise UsageError(str(exc)) from None


async def _channel(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    command, kw = _channel_args(cfg, args)
    owner = await _owner_of(cfg, args.channel)
    token = admin_token(args.token, cfg)
    c = Client(
        addresses(cfg, owner),
        client_id=client_id_for(token, "overlay-admin"),
        reconnect=False,
        token=token,
        ssl=cluster_tls(cfg),
    )
    try:
        try:
            await c.connect(timeout=CONNECT_TIMEOUT)
        except TimeoutError:
            raise CommandFailed(f"node {owner}, the owner of {args.channel}, does not answer") from None
        except RequestError as exc:
            raise UsageError(f"node {owner} refused the token: {exc.reason}") from None
        print(describe_channel_result(command, await c.admin(command, **kw)), flush=True)
    finally:
        await finish_within(c.close(), CLOSE_TIMEOUT, "closing the connection")
    return EXIT_OK


def describe_channel_result(command: str, result: dict[str, Any]) -> str:
    """What ``channel split``/``place`` did, in one line of plain words."""
    if command == "split" and "children" in result:
        kids = " and ".join(f"{c['id']} ({c['space']}, {c['subscriptions']} subscriptions)" for c in result["children"])
        return f"channel {result['split']} split on {result['attr']} into {kids}, on node {result['node']}"
    if command == "place" and result.get("moved") is False:
        return str(result.get("note", f"channel {result.get('channel')} stays where it is"))
    if command == "place":
        return (
            f"channel {', '.join(result.get('channels', []))} moved to node {result.get('receiver')}: "
            f"{result.get('subscriptions_moved', 0)} subscriptions, {result.get('bytes', 0)} bytes"
        )
    return json.dumps(result)


def cmd_channel(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    _channel_args(cfg, args)
    cluster_tls(cfg)  # rule 1: the certificates too, before connecting
    return run_command(_channel(args))


# -- node drain N --------------------------------------------------------------------


def admin_token(given: str | None, cfg: ClusterConfig) -> str:
    """The token an operator command presents: ``--token``, else, with
    ``[auth]``, ``$OVERLAY_TOKEN`` (a token with the admin role); without it,
    ``OVERLAY_ADMIN_TOKEN``, else the config's ``[cluster] admin_token``."""
    return user_token(given, cfg, admin=True)


async def drain_node(n: NodeConfig, token: str, timeout: float, cfg: ClusterConfig) -> dict[str, Any]:
    """Drain node ``n`` of ``cfg``; the summary, or ``CommandFailed``
    (``RequestError`` over the client protocol) with the node's reason."""
    tls = cluster_tls(cfg)
    if n.admin_port:
        url = f"{admin_url(n.host, n.admin_port, cfg)}/drain"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=timeout), connector=http_connector(tls)
                ) as http,
                http.post(url, headers=headers) as resp,
            ):
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise CommandFailed(f"node {n.id}: {url} did not answer ({type(exc).__name__} {exc})".strip()) from None
        if not isinstance(body, dict):
            raise CommandFailed(f"node {n.id}: {url} answered HTTP {resp.status} with {body!r}, not a JSON object")
        if resp.status in (401, 403):  # the command line's --token (or the environment's) is wrong
            raise UsageError(f"node {n.id} refused the token (HTTP {resp.status}): {body.get('error', body)}")
        if resp.status != 200:
            raise CommandFailed(f"node {n.id} refused the drain (HTTP {resp.status}): {body.get('error', body)}")
        return body
    c = Client(
        [(n.host, n.port)], client_id=client_id_for(token, "overlay-drain"), reconnect=False, token=token, ssl=tls
    )
    try:
        try:
            await c.connect(timeout=min(timeout, CONNECT_TIMEOUT))
        except (TimeoutError, OSError):
            raise CommandFailed(f"node {n.id} at {n.host}:{n.port} does not answer") from None
        except RequestError as exc:
            raise UsageError(f"node {n.id} refused the token: {exc.reason}") from None
        try:
            result: dict[str, Any] = await c.admin("drain", timeout=timeout)
        except TimeoutError:
            raise CommandFailed(f"node {n.id} did not finish draining within {timeout:g}s") from None
        return result
    finally:
        await finish_within(c.close(), CLOSE_TIMEOUT, "closing the connection")


def format_drain(s: dict[str, Any]) -> str:
    return (
        f"node {s['node']} drained: {s['channels_moved']} channels moved ({', '.join(s['channels']) or '-'}), "
        f"{s['subscriptions_moved']} subscriptions moved, {len(s['replicas_left'])} replica sets left, "
        f"{s['seconds']:.2f}s; it can be stopped now"
    )


async def _drain(n: NodeConfig, token: str, timeout: float, cfg: ClusterConfig) -> int:
    print(format_drain(await drain_node(n, token, timeout, cfg)), flush=True)
    return EXIT_OK


def cmd_drain(args: argparse.Namespace) -> int:
    """``overlay node drain N`` (its arguments are ``node``'s: ``overlay.cli.node``)."""
    if args.target is None:
        raise UsageError("which node? e.g. `overlay node drain 1 --config F`")
    cfg = load_config(args.config)
    n = config_node(cfg, args.target, "drain")
    token = admin_token(args.token, cfg)
    cluster_tls(cfg)  # rule 1: the certificates too, before connecting
    return run_command(_drain(n, token, args.timeout, cfg))


def register(sub: Any) -> None:
    """The ``channel`` subcommand (``node drain`` is registered with ``node``)."""
    ch = add_command(sub, "channel", "operator commands on channels: split one, place one on a node", EXAMPLES)
    ch.add_argument("action", choices=["split", "place"])
    ch.add_argument("channel", help="channel id, e.g. 0.0")
    ch.add_argument("--config", required=True)
    ch.add_argument("--attr", help="split: attribute to cut")
    ch.add_argument("--at", help="split: cut an ordered attribute after this value")
    ch.add_argument("--values", help="split: comma-separated string values for the new type-1 child")
    ch.add_argument("--node", type=node_id, help="place: the receiving node")
    ch.add_argument(
        "--token",
        default=None,
        help="a token with the admin role (default: $OVERLAY_TOKEN); without [auth], the legacy admin token "
        "(default: $OVERLAY_ADMIN_TOKEN, then the config's)",
    )
    ch.set_defaults(func=cmd_channel)
