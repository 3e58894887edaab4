"""The node core: one node's protocol logic, one SPEC concept per module.

``NodeCore`` (``node.core``) is the thin dispatcher the asyncio shell
(``overlay.net.node``) and the deterministic simulator drive: messages and
``now`` in, ``overlay.actions`` out.  Each component it composes owns its
state; the README maps every SPEC section to its module.
"""

from overlay.node.core import NodeCore

__all__ = ["NodeCore"]
