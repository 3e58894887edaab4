"""Kept while test_docs (another owner's) still imports ``AdminCluster``: the
cluster is ``overlay.testing.LoopbackCluster`` now; import it from there."""

from __future__ import annotations

from typing import Any

from conftest import LOCAL
from overlay.testing import LoopbackCluster

__all__ = ["AdminCluster"]


# The old class's name, for its importers.
def AdminCluster(n: int = 3, **settings: Any) -> LoopbackCluster:
    """``n`` nodes of local.toml with their admin ports in the config."""
    return LoopbackCluster(LOCAL, n, admin=True, **settings)
