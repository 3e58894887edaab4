"""The shell half of drain and join (``overlay.node.membership``).

1. ``POST /drain`` on a node's admin endpoint drains that node (token-checked
   by the admin server's auth, registered with ``add_action``).  Optional
   query or JSON ``node``: must name this node — an unknown id is a 404, a
   known other node a 400 that says where to send it.  The reply comes when
   the drain is over: 200 with the summary, 409 when refused or stopped, with
   the reason.  ``?wait=0`` answers 202 at once; ``GET /drain`` shows the
   progress.
2. ``AddPeer`` from the core: open a ``PeerLink`` to the joined node as one
   more task of the node's TaskGroup, and adopt the core's grown config so
   the admin endpoint finds the newcomer's admin port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from overlay.errors import LocalProtocolError
from overlay.net.admin import json_error, json_response

if TYPE_CHECKING:
    from overlay.actions import AddPeer
    from overlay.net.node import Node

__all__ = ["add_peer", "install"]

log = logging.getLogger("overlay.net")

# How often the HTTP handler looks at the drain's progress.
POLL_SECONDS: Final = 0.05
# Longest a POST /drain holds its answer; past it, 202 and the progress so far.
DRAIN_WAIT_MAX: Final = 600.0


def install(node: Node) -> None:
    """Register the drain routes on the node's admin endpoint (before it runs)."""

    async def post_drain(request: web.Request) -> web.Response:
        core = node.core
        args: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            try:
                body = await request.json()
            except (json.JSONDecodeError, ValueError):
                return json_error(400, "the body must be a JSON object")
            if not isinstance(body, dict):
                return json_error(400, "the body must be a JSON object")
            args.update(body)
        target = args.get("node", node.id)
        try:
            target = int(target)
        except (TypeError, ValueError):
            return json_error(400, f"'node' must be an integer, got {target!r}")
        if target != node.id:
            known = {node.id, *core.peers}
            if target not in known:
                return json_error(404, f"unknown node {target}: the cluster has nodes {sorted(known)}")
            return json_error(400, f"this is node {node.id}: POST /drain to node {target}'s admin endpoint")
        try:
            node._execute(core.drain(time.time()))
        except LocalProtocolError as exc:
            return json_error(409, str(exc), node=node.id)
        if str(args.get("wait", "1")).lower() in ("0", "false", "no"):
            return json_response({"node": node.id, "draining": True}, 202)
        dr = core.drain_state
        assert dr is not None
        deadline = time.monotonic() + DRAIN_WAIT_MAX
        while not dr.done and time.monotonic() < deadline and not node._stop.is_set():
            await asyncio.sleep(POLL_SECONDS)
        summary = dr.summary(node.id)
        if not dr.done:
            return json_response({**summary, "draining": True}, 202)
        return json_response(summary, 409 if dr.error else 200)

    async def get_drain(request: web.Request) -> web.Response:
        core = node.core
        dr = core.drain_state
        return json_response(
            {
                "node": node.id,
                "draining": core.draining,
                "local_channels": len(core.local),
                **({"drain": dr.summary(node.id), "done": dr.done} if dr is not None else {}),
            }
        )

    node.admin.add_action("/drain", post_drain)
    node.admin.app.router.add_get("/drain", get_drain)


def add_peer(node: Node, act: AddPeer) -> None:
    """Rule 2: a link to a node that joined, started in the node's TaskGroup."""
    from overlay.net.node import PeerLink

    peer = act.peer
    node.config = node.core.config
    if peer.id in node.links or node._tg is None:
        return
    link = PeerLink(node, peer)
    node.links[peer.id] = link
    node._tg.create_task(link.run(), name=f"link-{node.id}->{peer.id}")
    log.info("node %d: link to joined node %d at %s:%d", node.id, peer.id, peer.host, peer.port)
