"""The admin endpoint's adapters of aiohttp (``overlay.net.admin`` rules 9e and 10).

``BoundedSite`` is aiohttp's ``SockSite`` with the TLS handshake bounded;
``HttpLog`` is aiohttp's server log with a request it cannot parse counted
and told in one line.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["BoundedSite", "HttpLog"]

log = logging.getLogger("overlay.admin")


class BoundedSite(web.SockSite):
    """Rule 9e: aiohttp's ``SockSite`` with the TLS handshake bounded."""

    __slots__ = ("_handshake",)

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, *, ssl_context: Any, handshake: float) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context)
        self._handshake = handshake

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            sock=self._sock,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=self._handshake if self._ssl_context is not None else None,
        )


class HttpLog(logging.LoggerAdapter):  # type: ignore[type-arg]  # generic only in typeshed
    """aiohttp's server log, keeping rule 10; a handler's exception keeps its traceback."""

    def __init__(self, node_id: int, stats: Counter[str]) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.node_id = node_id
        self.stats = stats

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kw: Any) -> None:
        if not self._bad_request(args, exc_info):
            self.logger.error(msg, *args, exc_info=exc_info, **kw)

    def debug(self, msg: object, *args: object, exc_info: Any = None, **kw: Any) -> None:
        if not self._bad_request(args, exc_info):  # aiohttp's own choice for a first line not HTTP at all
            self.logger.debug(msg, *args, exc_info=exc_info, **kw)

    def _bad_request(self, args: tuple[object, ...], exc: Any) -> bool:
        if not isinstance(exc, HttpProcessingError):
            return False
        self.stats["http_bad_requests"] += 1
        why = " ".join(str(exc.message).split())[:200]  # the parser's message spans lines
        log.info("node %d: bad HTTP request from %s (%d): %s", self.node_id, args[0] if args else "?", exc.code, why)
        return True
