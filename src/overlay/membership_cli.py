"""``overlay node drain N --config F [--token T]`` (``overlay.node_membership``).

Node N is asked on its admin endpoint (``POST /drain``, bearer token) when
the config gives it an admin port, else with the client protocol's Admin
command ``drain``; both wait for the drain to end and print the summary.
An unknown node is refused here; the node itself refuses a drain of the
last node of the cluster or of a node already draining.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import aiohttp

from overlay.client import Client
from overlay.config import NodeConfig, load_config
from overlay.errors import OverlayError

__all__ = ["cmd_drain", "drain_node", "format_drain"]

TOKEN_ENV = "OVERLAY_ADMIN_TOKEN"


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


async def drain_node(n: NodeConfig, token: str, timeout: float) -> dict[str, Any]:
    """Drain node ``n``; the summary, or ``OverlayError`` with the node's reason."""
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
            raise OverlayError(f"node {n.id}: {url} did not answer ({type(exc).__name__} {exc})".strip()) from None
        if resp.status != 200:
            raise OverlayError(f"node {n.id} refused the drain (HTTP {resp.status}): {body.get('error', body)}")
        return body
    try:
        async with Client([(n.host, n.port)], client_id="overlay-drain", reconnect=False) as c:
            result: dict[str, Any] = await c.admin("drain", timeout=timeout)
            return result
    except OSError as exc:
        raise OverlayError(f"node {n.id} at {n.host}:{n.port} does not answer ({exc})") from None


def format_drain(s: dict[str, Any]) -> str:
    return (
        f"node {s['node']} drained: {s['channels_moved']} channels moved ({', '.join(s['channels']) or '-'}), "
        f"{s['subscriptions_moved']} subscriptions moved, {len(s['replicas_left'])} replica sets left, "
        f"{s['seconds']:.2f}s; it can be stopped now"
    )


def cmd_drain(args: argparse.Namespace) -> int:
    if args.target is None:
        raise OverlayError("overlay node drain: which node? e.g. `overlay node drain 1 --config F`")
    cfg = load_config(args.config)
    n = next((x for x in cfg.nodes if x.id == args.target), None)
    if n is None:
        raise OverlayError(f"unknown node {args.target}: {args.config} lists nodes {cfg.node_ids}")
    token = args.token or os.environ.get(TOKEN_ENV) or cfg.cluster.admin_token
    summary = asyncio.run(drain_node(n, token, args.timeout))
    print(format_drain(summary), flush=True)
    return 0
