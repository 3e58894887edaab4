"""The shell half of drain (``overlay.node.membership``): the ``/drain`` routes.

1. ``POST /drain`` on a node's admin endpoint drains that node (token-checked
   by the admin server's auth, registered with ``add_action``).  Optional
   query or JSON ``node``: must name this node — an unknown id is a 404, a
   known other node a 400 that says where to send it.  The reply comes when
   the drain is over: 200 with the summary, 409 when refused or stopped, with
   the reason.  ``?wait=0`` answers 202 at once; ``GET /drain`` shows the
   progress.
2. While a ``POST /drain`` waits, it looks at the drain's progress (the
   core's state: no event to wait on) every ``POLL_SECONDS``, and waits on
   the node's stop in between: a node told to stop answers at once.
3. The routes see the node as a ``NodeView`` (``overlay.net.view``).  The
   shell half of a join — a link to the newcomer, from the core's
   ``AddPeer`` — belongs with the node's links: ``Node.add_peer``.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

from aiohttp import web

from overlay.errors import LocalProtocolError
from overlay.net.admin import AdminServer, json_error, json_response
from overlay.net.view import NodeView

__all__ = ["install"]

# How often the HTTP handler looks at the drain's progress.
POLL_SECONDS: Final = 0.05
# Longest a POST /drain holds its answer; past it, 202 and the progress so far.
DRAIN_WAIT_MAX: Final = 600.0


def _node_id(given: Any) -> int | None:
    """A node id from the query (text) or the JSON body (a number), or None.
    Only a whole number is one: ``int()`` would make 2.5 node 2 and ``true``
    node 1 — draining a node nobody named — and raise OverflowError (a 500)
    on JSON's ``Infinity`` or ``1e400``."""
    if isinstance(given, str) and given.strip().isdecimal():
        return int(given)
    if isinstance(given, int) and not isinstance(given, bool) and given >= 0:
        return given
    return None


def install(admin: AdminServer, node: NodeView) -> None:
    """Register the drain routes on the node's admin endpoint (before it runs)."""

    async def post_drain(request: web.Request) -> web.Response:
        core = node.core
        args: dict[str, Any] = dict(request.query)
        if request.body_exists:  # read already, bounded, by net.admin rule 9b (can_read_body is False then)
            try:
                body = await request.json()
            except (json.JSONDecodeError, ValueError):
                return json_error(400, "the body must be a JSON object")
            if not isinstance(body, dict):
                return json_error(400, "the body must be a JSON object")
            args.update(body)
        target = _node_id(args.get("node", node.id))
        if target is None:
            return json_error(400, f"'node' must be a node id (an integer from 0), got {args['node']!r}")
        if target != node.id:
            known = {node.id, *core.peers}
            if target not in known:
                return json_error(404, f"unknown node {target}: the cluster has nodes {sorted(known)}")
            return json_error(400, f"this is node {node.id}: POST /drain to node {target}'s admin endpoint")
        try:
            node.execute(core.drain(time.time()))
        except LocalProtocolError as exc:
            return json_error(409, str(exc), node=node.id)
        if str(args.get("wait", "1")).lower() in ("0", "false", "no"):
            return json_response({"node": node.id, "draining": True}, 202)
        dr = core.drain_state
        assert dr is not None
        deadline = time.monotonic() + DRAIN_WAIT_MAX
        while not dr.done and time.monotonic() < deadline:  # rule 2
            if await node.wait_stop(POLL_SECONDS):
                break
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

    admin.add_action("/drain", post_drain)
    admin.app.router.add_get("/drain", get_drain)
