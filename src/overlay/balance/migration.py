"""Migration sessions: moving channels from an overloaded node to a receiver.

Theory of operation (SPEC §8.1 steps 3–9 and §8.2):

1. One session moves a set of channels from the *moving-out* node ``g_i`` to
   one *receiver* ``g_j``.  Both sides hold a session object keyed by
   ``(g_i, session_id)``; every message of the session carries the id.
2. Moving-out states and the message that moves each on::

       REQUESTED  --ReplyRequestLoadBalance(SUCCESS)-->   TRANSFERRING   (<1>)
       REQUESTED  --ReplyRequestLoadBalance(FAIL)---->    ABORTED
       TRANSFERRING --ReplyChannelTransfer(SUCCESS)-->    MOVING         (<2>)
       TRANSFERRING --ReplyChannelTransfer(FAIL)----->    ABORTED
       MOVING     --ReplySubscriptionMove------------>    UPDATING       (<3>)
       UPDATING   --(every ReplyUpdateGlobal in)----->    DONE

   A timeout in REQUESTED or TRANSFERRING aborts.  From <2> on the sender
   has reforwarded messages the receiver alone now holds, so a timeout in
   MOVING or UPDATING does not roll back by itself: the session keeps
   waiting for a slow peer (the links reconnect and deliver what is queued)
   and logs that it waits — but not for a peer that is gone (rule 5).
3. Reforward: from <2> on (states MOVING, UPDATING, and after DONE through the
   node's routing table) every Subscription, UnSubscription and Event for a
   moving channel that reaches ``g_i`` goes to the receiver as a Reforward, in
   arrival order, instead of being processed here.  Before <2> they are
   processed here and the subscriptions are part of the SubscriptionMove
   snapshot, which is taken at <2>, so nothing needs recording twice.
4. The receiver applies SubscriptionMove before any Reforward of that
   session: both travel on the high-priority queue of the same link, which is
   FIFO, so arrival order is send order; a Reforward before the move is a
   protocol error.
5. Rollback (ABORTED before <3>): the moving-out node never changed its
   tables, so rollback is dropping the session; a receiver that added channels
   for it removes them again on ``abort``.  The receiver times out on its own
   only before ChannelTransfer.  Past <2> the sender rolls back only when the
   receiver is *unreachable* (its link down longer than the timeout, as the
   shell reports) — a slow receiver is waited for — and then re-applies here,
   in order, everything it had reforwarded (``log``): nothing is lost; events
   the receiver matched before it died may be notified twice (at-least-once
   in that failure).  A peer that is gone (unreachable past the timeout, or
   restarted) is not waited for in UPDATING either: the tables have moved,
   so the session completes without its ReplyUpdateGlobal, and a receiver
   whose sender is gone keeps the channels the table gives it and drops the
   others — both sides leave BUSY and balancing goes on among live nodes.
6. An illegal (state, message) pair raises ``RemoteProtocolError`` and
   changes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final

from overlay.channels.channel import ChannelId
from overlay.errors import RemoteProtocolError
from overlay.messages import peer as pm

__all__ = ["InState", "IncomingMigration", "OutState", "OutgoingMigration"]


class OutState(enum.Enum):
    REQUESTED = "requested"
    TRANSFERRING = "transferring"
    MOVING = "moving"
    UPDATING = "updating"
    DONE = "done"
    ABORTED = "aborted"


class InState(enum.Enum):
    ACCEPTED = "accepted"
    CHANNELS_ADDED = "channels_added"
    SUBSCRIPTIONS_ADDED = "subscriptions_added"
    DONE = "done"
    ABORTED = "aborted"


_OUT_TRANSITIONS: Final[dict[tuple[OutState, type], OutState]] = {
    (OutState.REQUESTED, pm.ReplyRequestLoadBalance): OutState.TRANSFERRING,
    (OutState.TRANSFERRING, pm.ReplyChannelTransfer): OutState.MOVING,
    (OutState.MOVING, pm.ReplySubscriptionMove): OutState.UPDATING,
}

_IN_TRANSITIONS: Final[dict[tuple[InState, type], InState]] = {
    (InState.ACCEPTED, pm.ChannelTransfer): InState.CHANNELS_ADDED,
    (InState.CHANNELS_ADDED, pm.SubscriptionMove): InState.SUBSCRIPTIONS_ADDED,
    (InState.SUBSCRIPTIONS_ADDED, pm.Reforward): InState.SUBSCRIPTIONS_ADDED,
    (InState.SUBSCRIPTIONS_ADDED, pm.CompleteLoadBalance): InState.DONE,
}


class OutgoingMigration:
    """The moving-out side of one session (rules 2, 3, 5).

    Invariant: ``reforwarding`` is True exactly from <2> on; ``channels`` never
    changes after construction.
    """

    def __init__(
        self,
        session: int,
        receiver: int,
        channels: Sequence[ChannelId],
        *,
        started: float,
        timeout: float,
        forced: bool = False,
    ) -> None:
        self.session = session
        self.receiver = receiver
        # Empty until the receiver accepts when the balancer picks them then.
        self.channels: tuple[ChannelId, ...] = tuple(channels)
        self.state = OutState.REQUESTED
        # A replication (SPEC §8.3 degenerate case) copies the channel: it stays
        # here too, and only subscriptions are reforwarded after <2>.
        self.replicate = False
        self.candidate: Any = None  # the receiver's scores, for the balancing log
        self.replans = 0  # channel choices made so far (node.balancing rule 3)
        # What was reforwarded while MOVING, in order: re-applied here if the
        # receiver is lost before <3> (rule 5).
        self.log: list[tuple[ChannelId, pm.Subscription | pm.UnSubscription | pm.Event]] = []
        # splitInfos: parent -> children, for the splits this session committed.
        self.split_infos: dict[ChannelId, tuple[ChannelId, ...]] = {}
        self.started = started
        self.deadline = started + timeout
        self.timeout = timeout
        self.forced = forced
        self.reason = ""
        self.waiting_updates: set[int] = set()
        self.subscriptions_moved = 0
        self.bytes_moved = 0
        self.times: dict[str, float] = {"<1>": started}

    @property
    def reforwarding(self) -> bool:
        return self.state in (OutState.MOVING, OutState.UPDATING, OutState.DONE)

    @property
    def active(self) -> bool:
        return self.state not in (OutState.DONE, OutState.ABORTED)

    def on(self, msg: pm.PeerMessage, now: float) -> OutState:
        """Advance on a reply from the receiver; returns the new state."""
        key = (self.state, type(msg))
        new = _OUT_TRANSITIONS.get(key)
        if new is None:
            raise RemoteProtocolError(
                f"{type(msg).__name__} is not expected by moving-out session {self.session} in state {self.state.value}"
            )
        failed = (
            isinstance(msg, (pm.ReplyRequestLoadBalance, pm.ReplyChannelTransfer))
            and getattr(msg, "status", getattr(msg, "reply_sign", None)) is pm.ReplySign.REPLY_FAIL
        )
        if failed:
            self.reason = getattr(msg, "reason", "") or "receiver refused"
            self.state = OutState.ABORTED
            return self.state
        self.state = new
        self.deadline = now + self.timeout
        if new is OutState.MOVING:
            self.times["<2>"] = now
        elif new is OutState.UPDATING:
            self.times["<3>"] = now
        return new

    def updates_sent(self, peers: Sequence[int], now: float) -> None:
        self.waiting_updates = set(peers)
        self.deadline = now + self.timeout
        if not self.waiting_updates:  # nobody to wait for: done at <3>
            self.state = OutState.DONE
            self.times["done"] = now

    def on_update_reply(self, peer: int, now: float) -> OutState:
        if self.state is not OutState.UPDATING:
            raise RemoteProtocolError(
                f"ReplyUpdateGlobal from node {peer} not expected by session {self.session} in state {self.state.value}"
            )
        self.waiting_updates.discard(peer)
        if not self.waiting_updates:
            self.state = OutState.DONE
            self.times["done"] = now
        return self.state

    def expired(self, now: float) -> bool:
        return self.active and now >= self.deadline

    def five_sets(self) -> dict[str, list[str]]:
        """SPEC §8.1 step 7 from transferChannels, splitInfos and newedChannels.

        Splits are committed when planned (``overlay.node.balancing`` rule 3)
        and moves at <3>; the sets describe the session's whole change.
        """
        moved = set(self.channels)
        newed = {c for kids in self.split_infos.values() for c in kids}
        return {
            "localAdd": sorted(str(c) for c in newed - moved),
            "localDel": sorted(str(c) for c in set(self.split_infos) | (moved if not self.replicate else set())),
            "globalAdd": sorted(str(c) for c in newed),
            "globalUpdate": sorted(str(c) for c in moved),
            "globalDel": sorted(str(c) for c in self.split_infos),
        }

    def abort(self, reason: str) -> None:
        """Rule 5: only legal before <3>."""
        if self.state in (OutState.UPDATING, OutState.DONE):
            raise RemoteProtocolError(
                f"session {self.session} cannot abort in state {self.state.value}: the routing tables already changed"
            )
        self.reason = reason
        self.state = OutState.ABORTED


class IncomingMigration:
    """The receiver side of one session (rules 4, 5)."""

    def __init__(self, origin: int, session: int, *, started: float, timeout: float) -> None:
        self.origin = origin
        self.session = session
        self.state = InState.ACCEPTED
        self.channels: tuple[ChannelId, ...] = ()
        self.deadline = started + timeout
        self.timeout = timeout

    @property
    def active(self) -> bool:
        return self.state not in (InState.DONE, InState.ABORTED)

    def on(self, msg: pm.PeerMessage, now: float) -> InState:
        key = (self.state, type(msg))
        new = _IN_TRANSITIONS.get(key)
        if new is None:
            raise RemoteProtocolError(
                f"{type(msg).__name__} is not expected by receiving session "
                f"{self.origin}/{self.session} in state {self.state.value}"
            )
        if isinstance(msg, pm.ChannelTransfer):
            self.channels = tuple(c.ch_id for c in msg.channels)
        self.state = new
        self.deadline = now + self.timeout
        return new

    def expired(self, now: float) -> bool:
        # Once this side confirmed the channels (ReplyChannelTransfer), the
        # sender may be past <2> and reforwarding here: rolling back alone would
        # lose what it sends.  Only the sender may end the session then.
        return self.state is InState.ACCEPTED and now >= self.deadline

    def abort(self) -> None:
        self.state = InState.ABORTED
