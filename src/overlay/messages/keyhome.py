"""Peer messages that replicate a key's sequencer state (SPEC §10 and §16):
its home's changes to the backup, and the hand-over of a key to a new home
(``node.keyhome``).

Rules this module keeps:

1. A ``KeySync`` carries its home's sequencer operations in order, numbered;
   the backup answers ``KeySynced(no)`` once it holds all up to ``no``.
2. ``KeyCopy`` is a key's whole state; a long list of events is cut and the
   rest follow as ``KeyOp.event`` (``overlay.seq`` rule 8).
3. These travel on the high queue: a keyed event's PubAck and release wait
   for ``KeySynced``, so they must not queue behind the events.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from overlay.messages.client import MAX_RANK
from overlay.messages.peer_base import Ident, PeerMessage, Rank
from overlay.messages.routing import Event

__all__ = [
    "KeyAsk",
    "KeyCopy",
    "KeyOp",
    "KeySync",
    "KeySynced",
]


class KeyCopy(msgspec.Struct, frozen=True, array_like=True):
    """A key's state at its home (``overlay.seq`` rule 8): the sequence rank,
    the last rank assigned, and its events not complete, each with its rank
    (a long one is cut: more come as ``KeyOp.event``)."""

    key: Ident
    seq: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANK + 1)]
    last_assigned: Rank
    events: tuple[Event, ...] = ()
    # A live home handing the key over: its event of ``seq`` is out, and its
    # completion will be passed on (node.keyhome rule 7).
    released: bool = False


class KeyOp(msgspec.Struct, frozen=True, array_like=True):
    """One change of a key at its home (``node.keyhome`` rule 2): ``event``
    arrived (at its rank); every rank below ``seq`` is complete; ``copy`` is
    the whole state; ``forget``: the home forgot the key."""

    key: Ident
    event: Event | None = None
    seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK + 1)] = 0
    copy: KeyCopy | None = None
    forget: bool = False


class KeySync(PeerMessage, frozen=True):
    """A key's home → its backup, batched (``node.keyhome``; high queue): what its
    sequencer did, in order; answered ``KeySynced(no)``.  ``handover``: any
    node → a key's new home, the states it holds of the key; ``last`` on the
    final answer to a ``KeyAsk`` (node.keyhome rule 6)."""

    no: Annotated[int, msgspec.Meta(ge=0)]
    ops: tuple[KeyOp, ...]
    handover: bool = False
    last: bool = False


class KeyAsk(PeerMessage, frozen=True):
    """A new run → every member, once at its start (``node.keyhome`` rule 6):
    send me what you hold of the keys I am home of (``KeySync`` marked
    ``handover``, ``last`` on the final one, empty if you hold nothing)."""

    incarnation: Annotated[int, msgspec.Meta(ge=0)] = 0


class KeySynced(PeerMessage, frozen=True):
    """The backup holds everything of ``KeySync`` ``no`` and before (node.keyhome rule 2)."""

    no: Annotated[int, msgspec.Meta(ge=0)]
