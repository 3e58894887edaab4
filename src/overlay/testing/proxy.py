"""A test double in front of an object of the node: what a test asks of it, from outside.

A test that changes or watches what one object is asked (a core refusing a
Publish, a core's peer messages recorded, a node's replies to its clients
delayed) used to replace that object's methods on its instance.  The node's
hot classes are compiled (mypyc native classes, ``overlay.build``): their
methods cannot be replaced, and Python code cannot subclass them.  So the
test puts a ``Proxy`` where its caller looks the object up instead — the
simulator's and ``coreworld``'s ``cores`` dict (``monkeypatch.setitem``), a
``Node``'s ``connections`` — and the object itself stays as it is.

Rules:

1. Every attribute the test does not override is the object's: read from
   it, and written to it (a harness that sets one on the proxy sets it on
   the object).
2. An override is a plain function with the signature of the method it
   stands for; it may call the object's own method (``proxy.target.send``).
3. Only what goes through the proxy changes: the object's calls of its own
   methods, and its collaborators' calls, do not (for what a core's parts
   tell each other it has explicit seams: ``NodeCore.observe``; for what
   its shell hands it, ``Dispatcher.intercept``).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["Proxy"]

T = TypeVar("T")


class Proxy(Generic[T]):
    """Rule 1: ``target`` with the methods named in ``overrides`` replaced, for the caller only."""

    def __init__(self, target: T, **overrides: Any) -> None:
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "_overrides", overrides)

    def __getattr__(self, name: str) -> Any:
        # Only called for what the proxy itself does not hold: the overrides first, then the target.
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "target"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.target, name, value)  # rule 1
