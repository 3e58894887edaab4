"""What a client holds of each Notify until its subscriptions took it (sans-IO).

Rules (the node's side is ``overlay.node.acks``):

1. A Notify lists every subscription of this client that matched; each of
   them gets the notification once.  A tagged Notify (one the node tracks:
   a keyed event's, a group instance's copy) is answered once, when every
   listed subscription took it: one ``Ack`` carrying the Notify's tag and
   the highest load factor among them — ``declined`` when some copy was not
   handed to the application (its queue was full, or it closed).  An
   untagged one is not answered: the node waits for nothing of it, and an
   Ack per delivery was a frame each way for a counter (issue 19).
2. A group instance's copy (a tagged Notify listing a group subscription)
   is *fenced*: it is handed to the application only if the node has not
   asked for it back.  A ``Revoke`` for a copy not handed over yet marks it
   revoked (it is skipped when its turn comes) and is answered at once with
   a decline; a Revoke for a copy already handed, or unknown, is answered
   with a decline too — safe, because the Ack of a copy handed over left
   before the Revoke was read, and the node takes the first answer.
3. The client also never hands over a group copy that has waited longer
   than the node's ``ack_timeout`` (the node revokes it then): it declines
   it instead.  And when the connection that brought a group copy is lost,
   the copy is revoked locally: the node fails it when the session closes,
   and another instance gets the event.
4. Plain copies are never revoked: each subscription gets its events
   exactly once, whoever else is slow.
"""

from __future__ import annotations

import msgspec

from overlay.channels.schema import Value
from overlay.messages import client as cm

__all__ = ["Deliveries", "Notification"]


class Notification(msgspec.Struct, frozen=True):
    """An event delivered to this client.

    ``sub_ids`` lists the client's subscriptions it matched; ``key`` and
    ``rank`` are the event's sequence key and rank when it was published in
    order (``""``/``0`` otherwise); ``tag`` is the node's delivery tag (0 when
    the node does not track it).  ``received`` is this client's wall clock
    when it arrived.  ``payload`` is the event's opaque payload, the bytes
    its publisher sent (``b""`` when it sent none)."""

    event_id: str
    event: dict[str, Value]
    sub_ids: tuple[str, ...]
    publish_time: float = 0.0
    received: float = 0.0
    key: str = ""
    rank: int = 0
    tag: int = 0
    payload: bytes = b""


class _Held:
    __slots__ = ("at", "conn", "declined", "group", "lf", "pending", "revoked")

    def __init__(self, pending: int, group: bool, conn: int, at: float) -> None:
        self.pending = pending  # subscriptions that have not taken it yet
        self.lf = 0.0
        self.declined = False
        self.revoked = False  # rules 2, 3: never to be handed over
        self.group = group
        self.conn = conn
        self.at = at  # monotonic arrival


class Deliveries:
    """Rules 1–4 for one client connection's Notifies.  Every method returns
    the Ack to send, if any; ``window`` is the node's ack_timeout (0: unknown)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], _Held] = {}
        self.window = 0.0
        self.revoked = 0  # copies given back (rules 2, 3)

    def __len__(self) -> int:
        return len(self._held)

    def arrived(self, note: Notification, takers: int, *, group: bool, conn: int, now: float) -> cm.Ack | None:
        """A Notify for ``takers`` open subscriptions (none: answer at once);
        an untagged one is neither held nor answered (rule 1)."""
        if not note.tag:
            return None
        if takers == 0:
            return cm.Ack(note.event_id, 0.0, note.tag, declined=True)
        self._held[(note.event_id, note.tag)] = _Held(takers, group, conn, now)
        return None

    def claim(self, note: Notification, lf: float, now: float) -> tuple[bool, cm.Ack | None]:
        """A subscription is about to hand ``note`` to the application: whether
        it may (rules 2, 3), and the answer to send if this was the last taker."""
        held = self._held.get((note.event_id, note.tag))
        if held is None:
            return True, None
        if not held.revoked and held.group and self.window and now - held.at > self.window:
            held.revoked = True  # rule 3: the node revokes it about now
            self.revoked += 1
            return False, self._settle(note, held, 0.0, handed=False) or cm.Ack(
                note.event_id, lf, note.tag, declined=True
            )
        if held.revoked:
            return False, self._settle(note, held, 0.0, handed=False)
        return True, self._settle(note, held, lf, handed=True)

    def took(self, note: Notification, lf: float) -> cm.Ack | None:
        """Taken without handing it over (a duplicate the application saw already)."""
        held = self._held.get((note.event_id, note.tag))
        return None if held is None else self._settle(note, held, lf, handed=True)

    def dropped(self, note: Notification) -> cm.Ack | None:
        """A subscription could not take it (queue full, closed): declined."""
        held = self._held.get((note.event_id, note.tag))
        if held is None:
            return None
        held.declined = True
        return self._settle(note, held, 0.0, handed=False)

    def revoke(self, tag: int, event_id: str) -> cm.Ack:
        """Rule 2: the node asks for a group copy back."""
        held = self._held.get((event_id, tag))
        if held is not None and not held.revoked:
            held.revoked = True
            self.revoked += 1
        return cm.Ack(event_id, 0.0, tag, declined=True)

    def connection_lost(self, conn: int) -> None:
        """Rule 3: group copies brought by a connection that is gone."""
        for held in self._held.values():
            if held.group and held.conn == conn and not held.revoked:
                held.revoked = True
                self.revoked += 1

    def _settle(self, note: Notification, held: _Held, lf: float, *, handed: bool) -> cm.Ack | None:
        held.pending -= 1
        if handed and lf > held.lf:
            held.lf = lf
        elif not handed:
            held.declined = True
        if held.pending > 0:
            return None
        del self._held[(note.event_id, note.tag)]
        if held.revoked:
            return None  # answered when it was revoked (or the connection is gone)
        return cm.Ack(note.event_id, held.lf, note.tag, declined=held.declined)
