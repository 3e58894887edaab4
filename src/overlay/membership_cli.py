"""``overlay node drain N --config F [--token T]`` (``overlay.node_membership``).

Node N is asked on its admin endpoint (``POST /drain``, bearer token) when
the config gives it an admin port, else with the client protocol's Admin
command ``drain``; both wait for the drain to end and print the summary.
An unknown node is refused here (exit 2); the node itself refuses a drain
of the last node of the cluster or of a node already draining (exit 1).
Ctrl-C ends the wait (``overlay.cli`` rule 2); the drain goes on on the node.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import aiohttp

from overlay.cli import (
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    CommandFailed,
    UsageError,
    config_node,
    finish_within,
    run_command,
)
from overlay.client import Client
from overlay.config import NodeConfig, load_config

__all__ = ["cmd_drain", "drain_node", "format_drain"]

TOKEN_ENV = "OVERLAY_ADMIN_TOKEN"


def admin_token(given: str | None, cfg: Any) -> str:
    """The token an operator command presents: ``--token``, else
    ``OVERLAY_ADMIN_TOKEN``, else the config's ``[cluster] admin_token``."""
    return given or os.environ.get(TOKEN_ENV) or cfg.cluster.admin_token


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


async def drain_node(n: NodeConfig, token: str, timeout: float) -> dict[str, Any]:
    """Drain node ``n``; the summary, or ``CommandFailed`` (``RequestError``
    over the client protocol) with the node's reason."""
    if n.admin_port:
        url = f"http://{_connect_host(n.host)}:{n.admin_port}/drain"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
                http.post(url, headers=headers) as resp,
            ):
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise CommandFailed(f"node {n.id}: {url} did not answer ({type(exc).__name__} {exc})".strip()) from None
        if resp.status in (401, 403):  # the command line's --token (or the environment's) is wrong
            raise UsageError(f"node {n.id} refused the token (HTTP {resp.status}): {body.get('error', body)}")
        if resp.status != 200:
            raise CommandFailed(f"node {n.id} refused the drain (HTTP {resp.status}): {body.get('error', body)}")
        return body
    c = Client([(n.host, n.port)], client_id="overlay-drain", reconnect=False, token=token)
    try:
        try:
            await c.connect(timeout=min(timeout, CONNECT_TIMEOUT))
        except (TimeoutError, OSError):
            raise CommandFailed(f"node {n.id} at {n.host}:{n.port} does not answer") from None
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


async def _drain(n: NodeConfig, token: str, timeout: float) -> int:
    print(format_drain(await drain_node(n, token, timeout)), flush=True)
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    if args.target is None:
        raise UsageError("which node? e.g. `overlay node drain 1 --config F`")
    cfg = load_config(args.config)
    n = config_node(cfg, args.target, "drain")
    token = admin_token(args.token, cfg)
    return run_command(_drain(n, token, args.timeout))
