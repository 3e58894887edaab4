"""``overlay pub`` and ``overlay sub``: client commands over the routing agent
(SPEC §12).

Events and the expression are checked against the config's schema before
anything connects (rule 1 of ``overlay.cli``); ``pub`` prints one JSON line
per accepted event, ``sub`` one per notification.  Ctrl-C ends either within
2 s (exit 130; 143 for SIGTERM), whatever the cluster does.

Payloads: ``pub --payload TEXT`` (sent as UTF-8) or ``--payload-file F``
(its bytes), read and checked against ``[cluster] max_payload`` before
anything connects, go with every event of the command; ``sub`` prints a
notification's payload as ``payload`` when it is UTF-8 text, else as
``payload_base64`` — never both, never neither when there is one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Any, Final

from overlay.channels import parse_event, parse_expression
from overlay.cli.args import (
    add_command,
    addresses,
    client_id_for,
    cluster_tls,
    config_node,
    group_name,
    node_id,
    positive_float,
    positive_int,
    sequence_key,
    user_token,
)
from overlay.cli.running import (
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    EXIT_FAILED,
    EXIT_OK,
    CommandFailed,
    UsageError,
    finish_within,
    log,
    one_line,
    run_command,
)
from overlay.client import AgentClient, load_agent_settings
from overlay.client.connection import check_order
from overlay.config import ClusterConfig, load_config
from overlay.errors import (
    ConnectionLost,
    ExpressionError,
    LocalProtocolError,
    OverlayError,
    RequestError,
    SchemaError,
)

__all__ = [
    "cmd_pub",
    "cmd_sub",
    "decode_payload_fields",
    "payload_fields",
    "read_payload",
    "register",
    "run_pub",
    "run_sub",
]

PUB_EXAMPLES: Final = """\
examples:
  overlay pub --config cluster_configs/local.toml '{price: 42.5, sym: "IBM", qty: 10}'
  overlay pub --config F --node 1 '{price: 1, sym: "A"}' '{price: 2, sym: "B"}'
  overlay pub --config F --key order-17 --rank 1 '{price: 1, sym: "A"}' '{price: 2, sym: "A"}'
  overlay pub --config F --payload 'order #17 filled' '{price: 1, sym: "A"}'
  overlay pub --config F --payload-file report.pdf '{price: 1, sym: "A"}'
  generate-events | overlay pub --config F                      (one event per line)

Prints one JSON line per accepted event: {"event_id": …, "event": …} (and
"payload_bytes" when it carries a payload).
Ctrl-C ends it within 2 s (exit 130; 143 for SIGTERM)."""

SUB_EXAMPLES: Final = """\
examples:
  overlay sub --config cluster_configs/local.toml 'price < 100 and sym = "IBM"'
  overlay sub --config F 'sym prefix "A"' --count 10 --seconds 30
  overlay sub --config F 'qty > 1000' --group workers --weight 2

Prints one JSON line per notification on stdout, the subscription's homes on stderr;
a payload shows as "payload" (UTF-8 text) or "payload_base64" (any other bytes).
Ctrl-C ends it within 2 s, even when the cluster is gone (exit 130; 143 for SIGTERM)."""


TOKEN_HELP: Final = "a signed token, where the cluster has [auth] (default: $OVERLAY_TOKEN; `overlay token create`)"


async def _connect(agent: AgentClient, config: str) -> None:
    where = ", ".join(f"{h}:{p}" for h, p in agent.addresses)
    log.debug("connecting to %s", where)
    try:
        await agent.connect(timeout=CONNECT_TIMEOUT)
    except RequestError as exc:  # every node refused the session: the token is at fault (exit 2)
        raise UsageError(f"the cluster refused the session: {exc.reason}") from None
    except TimeoutError:
        raise CommandFailed(
            f"no node answers at {where} within {CONNECT_TIMEOUT:.0f}s: is the cluster up? "
            f"(`overlay cluster up {config}`)"
        ) from None


async def _close_agent(agent: AgentClient) -> None:
    await finish_within(agent.close(), CLOSE_TIMEOUT, "closing the connections")


def _stdin_events() -> list[str]:
    return [line.strip() for line in sys.stdin if line.strip()]


async def run_pub(args: argparse.Namespace) -> int:
    args.key = args.key or ""  # None: no --key (register)
    cfg = load_config(args.config)
    events = args.events or _stdin_events()
    payload: bytes | None = getattr(args, "payload_data", None)  # read by cmd_pub, before the loop started
    if payload is None:
        payload = read_payload(args, cfg.cluster.max_payload)
    failed = 0
    # The routing agent (SPEC §12) over every node, or the one --node names.
    token = user_token(args.token, cfg)
    agent = AgentClient(
        addresses(cfg, args.node),
        client_id=client_id_for(token, "overlay-pub"),
        settings=load_agent_settings(args.config),
        token=token,
        ssl=cluster_tls(cfg),
    )
    try:
        await _connect(agent, args.config)
        for i, text in enumerate(events):
            # --rank R is the first event's; the next ones follow it (R+1, R+2, …).
            rank = args.rank + i if args.rank else 0
            try:
                event_id = await agent.publish(text, payload=payload, key=args.key, rank=rank)
                line: dict[str, Any] = {"event_id": event_id, "event": text}
                if payload:
                    line["payload_bytes"] = len(payload)
                print(json.dumps(line), flush=True)
            except OverlayError as exc:
                failed += 1
                print(f"error: event {i + 1}: {one_line(exc)}", file=sys.stderr)
            except TimeoutError:
                failed += 1
                print(f"error: event {i + 1}: no node acknowledged it in time", file=sys.stderr)
    finally:
        await _close_agent(agent)
    return EXIT_FAILED if failed else EXIT_OK


def _check_events(cfg: ClusterConfig, events: Sequence[str], source: str) -> None:
    for i, text in enumerate(events):
        try:
            parse_event(text, cfg.schema)
        except (ExpressionError, SchemaError) as exc:
            raise UsageError(f"{source} {i + 1}: {one_line(exc)}") from None


def read_payload(args: argparse.Namespace, limit: int) -> bytes:
    """``--payload TEXT`` as UTF-8, or ``--payload-file F``'s bytes (b"" for
    neither), within ``[cluster] max_payload``: a usage error otherwise."""
    if args.payload_file is not None:
        try:
            with open(args.payload_file, "rb") as fh:
                data = fh.read(limit + 1)  # no more than one byte past the limit is read
        except FileNotFoundError:
            raise UsageError(f"--payload-file {args.payload_file}: no such file") from None
        except IsADirectoryError:
            raise UsageError(f"--payload-file {args.payload_file}: is a directory, not a file") from None
        except OSError as exc:
            raise UsageError(f"--payload-file {args.payload_file}: cannot read it: {exc.strerror or exc}") from None
        what = f"--payload-file {args.payload_file}"
    elif args.payload is not None:
        try:
            data = args.payload.encode()
        except UnicodeEncodeError:  # a lone surrogate from an undecodable argument
            raise UsageError("--payload: not valid text; give the bytes with --payload-file") from None
        what = "--payload"
    else:
        return b""
    if len(data) > limit:
        size = f"is {len(data)} bytes" if args.payload_file is None else f"is over {limit} bytes"
        raise UsageError(f"{what} {size}; the cluster takes payloads of at most {limit} bytes ([cluster] max_payload)")
    return data


def payload_fields(payload: bytes) -> dict[str, str]:
    """How ``sub`` prints a payload: ``payload`` when it is UTF-8 text,
    ``payload_base64`` otherwise; nothing for none."""
    if not payload:
        return {}
    try:
        return {"payload": payload.decode()}
    except UnicodeDecodeError:
        return {"payload_base64": base64.b64encode(payload).decode("ascii")}


def decode_payload_fields(line: dict[str, Any]) -> bytes:
    """The payload bytes of a line ``sub`` printed (the inverse of ``payload_fields``)."""
    if "payload" in line:
        return str(line["payload"]).encode()
    if "payload_base64" in line:
        try:
            return base64.b64decode(line["payload_base64"], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"payload_base64 is not base64: {exc}") from None
    return b""


def cmd_pub(args: argparse.Namespace) -> int:
    args.key = args.key or ""  # None: no --key
    if args.rank and not args.key:
        raise UsageError("--rank needs --key (ranks order the events of one key)")
    cfg = load_config(args.config)
    args.payload_data = read_payload(args, cfg.cluster.max_payload)
    if args.node is not None:
        config_node(cfg, args.node)
    if args.events:
        _check_events(cfg, args.events, "event")
    else:  # read before the event loop starts: Ctrl-C ends a blocked read at once
        args.events = _stdin_events()
        if not args.events:
            raise UsageError("no events: give them as arguments, or one per line on stdin")
        _check_events(cfg, args.events, "stdin line")
    try:
        check_order(args.key, args.rank + len(args.events) - 1 if args.rank else 0)
    except LocalProtocolError as exc:
        raise UsageError(str(exc)) from None
    # Rule 1: a missing certificate is the config's fault, said before connecting
    # (after the arguments: a bad event is the user's to fix whatever the config).
    cluster_tls(cfg)
    return run_command(run_pub(args))


async def _notes(sub: Any, count: int | None) -> None:
    n = 0
    async for note in sub:
        line: dict[str, Any] = {"event_id": note.event_id, "event": note.event, "subscriptions": list(note.sub_ids)}
        if note.key:  # an ordered event: its sequence key and rank
            line |= {"key": note.key, "rank": note.rank}
        if note.payload:
            line |= payload_fields(note.payload)
        print(json.dumps(line), flush=True)
        n += 1
        if count and n >= count:
            return


async def run_sub(args: argparse.Namespace) -> int:
    args.group = args.group or ""  # None: no --group (register)
    cfg = load_config(args.config)
    # Held on two access nodes (one for a group) and moved when one is lost (SPEC §12).
    token = user_token(args.token, cfg)
    agent = AgentClient(
        addresses(cfg, args.node),
        client_id=client_id_for(token, "overlay-sub"),
        settings=load_agent_settings(args.config),
        token=token,
        ssl=cluster_tls(cfg),
    )
    try:
        await _connect(agent, args.config)
        try:
            sub = await agent.subscribe(args.expression, group=args.group, weight=args.weight)
        except (TimeoutError, ConnectionLost) as exc:
            raise CommandFailed(f"no node took the subscription: {one_line(exc) or 'timed out'}") from None
        homes = sorted(cfg.nodes[i].id if args.node is None else args.node for i in sub.homes)
        print(
            json.dumps({"subscribed": args.expression, "nodes": homes, "group": args.group}),
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(TimeoutError):  # --seconds are over
            await asyncio.wait_for(_notes(sub, args.count), args.seconds)
        # Acknowledged by the nodes; a node that is gone drops the session's
        # subscriptions with the connection anyway.
        await finish_within(sub.close(), CLOSE_TIMEOUT, "unsubscribing")
    finally:
        await _close_agent(agent)
    return EXIT_OK


def cmd_sub(args: argparse.Namespace) -> int:
    args.group = args.group or ""  # None: no --group
    cfg = load_config(args.config)
    if args.node is not None:
        config_node(cfg, args.node)
    try:
        parse_expression(args.expression, cfg.schema)
    except (ExpressionError, SchemaError) as exc:
        raise UsageError(f"expression: {one_line(exc)}") from None
    cluster_tls(cfg)  # rule 1, after the arguments (cmd_pub)
    return run_command(run_sub(args))


def register(sub: Any) -> None:
    """The ``pub`` and ``sub`` subcommands."""
    pb = add_command(sub, "pub", "publish events (arguments, or one per stdin line)", PUB_EXAMPLES)
    pb.add_argument("--config", required=True)
    pb.add_argument(
        "--node", type=node_id, default=None, help="only this access node (default: the routing agent picks)"
    )
    pb.add_argument(
        "--key",
        type=sequence_key,
        default=None,  # not "": argparse would pass a string default through sequence_key
        help="sequence key: events with one key arrive in order (docs/concepts.md#ordered-delivery-per-key)",
    )
    pb.add_argument("--rank", type=positive_int, default=0, help="explicit rank of the first event (needs --key)")
    pb.add_argument("--token", default=None, help=TOKEN_HELP)
    payload = pb.add_mutually_exclusive_group()
    payload.add_argument(
        "--payload", metavar="TEXT", default=None, help="an opaque payload for every event, sent as UTF-8 text"
    )
    payload.add_argument(
        "--payload-file", metavar="F", default=None, help="an opaque payload for every event: the bytes of file F"
    )
    pb.add_argument("events", nargs="*")
    pb.set_defaults(func=cmd_pub)

    sb = add_command(sub, "sub", "subscribe and print notifications as JSON lines", SUB_EXAMPLES)
    sb.add_argument("--config", required=True)
    sb.add_argument(
        "--node", type=node_id, default=None, help="only this access node (default: any two, with failover)"
    )
    sb.add_argument("expression")
    sb.add_argument(
        "--group",
        type=group_name,
        default=None,  # not "": argparse would pass a string default through group_name
        help="join this subscriber group: one instance gets each event (docs/concepts.md#subscriber-groups)",
    )
    sb.add_argument("--weight", type=positive_float, default=1.0, help="static weight Ws within the group")
    sb.add_argument("--token", default=None, help=TOKEN_HELP)
    sb.add_argument("--count", type=positive_int, default=None, help="stop after this many notifications")
    sb.add_argument("--seconds", type=positive_float, default=None, help="stop after this many seconds")
    sb.set_defaults(func=cmd_sub)
