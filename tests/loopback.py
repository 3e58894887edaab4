"""Kept while tests of other owners still import it (test_cli, test_replay,
test_quick_start): the helpers live in ``overlay.testing``; import them from there."""

from __future__ import annotations

from overlay.testing import bound_socket as listening_socket
from overlay.testing import free_ports, nodes_quiet, wait_until

__all__ = ["free_ports", "listening_socket", "nodes_quiet", "wait_until"]
