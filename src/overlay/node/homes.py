"""A key's home and backup: rendezvous hashing (SPEC §10; ``node.ordering`` rule 1).

Every node computes a key's home itself, with no directory: the node of
the live ones with the highest ``blake2b(node, key)``; its backup is the
second highest (``node.keyhome``).  Removing a node moves only its own
keys, each to its backup: the next node of the same order.
"""

from __future__ import annotations

import hashlib

__all__ = ["rendezvous_home", "rendezvous_pair"]


def _score(data: bytes, n: int) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, salt=n.to_bytes(8, "little")).digest(), "little")


def rendezvous_home(key: str, nodes: list[int]) -> int:
    """Rule 1: the node with the highest ``blake2b(node, key)``."""
    return rendezvous_pair(key, nodes)[0]


def rendezvous_pair(key: str, nodes: list[int]) -> tuple[int, int | None]:
    """Rule 1: the nodes with the highest and the second highest
    ``blake2b(node, key)`` — the key's home and its backup (None: one node)."""
    best, best_h, second, second_h = -1, -1, None, -1
    data = key.encode()
    for n in nodes:
        h = _score(data, n)
        if h > best_h:
            if best >= 0:
                second, second_h = best, best_h
            best, best_h = n, h
        elif h > second_h:
            second, second_h = n, h
    return best, second
