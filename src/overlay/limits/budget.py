"""The node-wide budget of bytes queued for clients, and the slow-consumer policy (sans-IO).

Theory of operation — the rules this module keeps (``overlay.net.clients``
carries them out; ``now`` is given, on a monotonic clock):

1. Every client session has an ``Account``: the bytes of the frames queued
   for it (``add``, each frame counted as its length plus ``FRAME_OVERHEAD``
   for the objects around it) until its connection's writer took them *and*
   the transport accepted them (``sent``, after the writer's drain
   returned).  ``total`` is the sum over every open account; ``close``
   releases an account's bytes at once and makes it inert (a late ``sent``
   or ``add`` changes nothing).
2. **Stalled**: a session whose writer has been waiting for its connection
   to accept data (``waiting`` … ``moving``) for ``grace`` seconds or more
   has not read for that long while data waited for it: ``stalled`` names
   it, and the node disconnects it (``slow_consumer``).  A session with
   nothing waiting, or one that reads slowly but steadily (each drain
   returns within ``grace``), is never stalled.
3. **Over budget**: ``add`` says when ``total`` went past ``limit``; then
   ``over_share`` names the sessions to disconnect: the largest first,
   until what the others hold is within the budget.  Each of them holds
   more than its share (``limit`` divided among the sessions holding
   bytes): when n accounts hold more than ``limit`` together, the largest
   holds more than ``limit / n``, and after it is gone the same holds of
   the n − 1 left.  So one slow subscriber cannot make the node drop
   anybody else's notifications.
4. Bounded: one account per open session; the bytes queued for clients
   stay under ``limit`` plus one burst of frames (what one batch of the
   core's actions queues before the check that follows it).
"""

from __future__ import annotations

from typing import Final

__all__ = ["FRAME_OVERHEAD", "Account", "QueueBudget"]

# Bytes a queued frame costs besides its own length: the bytes object's
# header and its slot in the queue (CPython: 33 + 8, rounded up).
FRAME_OVERHEAD: Final = 48


class Account:
    """One session's queued bytes (rule 1).  ``waiting_since`` is when its
    writer started to wait for the connection (0.0: not waiting)."""

    __slots__ = ("bytes", "open", "sid", "waiting_since")

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.bytes = 0
        self.waiting_since = 0.0
        self.open = True


class QueueBudget:
    """Rules 1–4.  Invariant: ``total`` is the sum of ``bytes`` over ``accounts``,
    which holds exactly the open accounts."""

    def __init__(self, limit: int, grace: float) -> None:
        self.limit = limit
        self.grace = grace
        self.total = 0
        self.accounts: dict[int, Account] = {}

    def open(self, sid: int) -> Account:
        acct = self.accounts[sid] = Account(sid)
        return acct

    def close(self, sid: int) -> int:
        """Rule 1: the session is gone; the bytes it held, released."""
        acct = self.accounts.pop(sid, None)
        if acct is None:
            return 0
        held = acct.bytes
        self.total -= held
        acct.bytes = 0
        acct.open = False
        acct.waiting_since = 0.0
        return held

    def add(self, acct: Account, n: int) -> bool:
        """Rule 1 for a frame of ``n`` bytes queued; True when ``total`` is now past ``limit`` (rule 3)."""
        if not acct.open:
            return False
        n += FRAME_OVERHEAD
        acct.bytes += n
        self.total += n
        return self.total > self.limit

    def sent(self, acct: Account, n: int, frames: int) -> None:
        """Rule 1: ``frames`` frames of ``n`` bytes in all left the account."""
        if not acct.open:
            return
        n += frames * FRAME_OVERHEAD
        acct.bytes -= n
        self.total -= n

    @staticmethod
    def waiting(acct: Account, now: float) -> None:
        """Rule 2: the session's writer waits for its connection to take data."""
        acct.waiting_since = now

    @staticmethod
    def moving(acct: Account) -> None:
        """Rule 2: the connection took the data; the session is reading."""
        acct.waiting_since = 0.0

    def stalled(self, now: float) -> list[Account]:
        """Rule 2: the sessions that have not read for ``grace`` seconds while data waited, longest first."""
        grace = self.grace
        late = [a for a in self.accounts.values() if a.waiting_since and now - a.waiting_since >= grace]
        late.sort(key=lambda a: a.waiting_since)
        return late

    def over_share(self) -> list[Account]:
        """Rule 3: the sessions to disconnect so the rest fit the budget (none when within it)."""
        excess = self.total - self.limit
        if excess <= 0:
            return []
        out: list[Account] = []
        for acct in sorted(self.accounts.values(), key=lambda a: a.bytes, reverse=True):
            if excess <= 0 or acct.bytes <= 0:
                break
            out.append(acct)
            excess -= acct.bytes
        return out

    def share(self) -> int:
        """What each session holding bytes may hold when the budget is exhausted (rule 3)."""
        holding = sum(1 for a in self.accounts.values() if a.bytes > 0)
        return self.limit // holding if holding else self.limit
