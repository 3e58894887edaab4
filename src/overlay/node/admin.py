"""Operator commands on the client protocol: status, split, place, drain, journal (SPEC §14).

One rule for admin rights, as on the admin HTTP endpoint: the commands that
change the cluster (``split``, ``place``, ``drain``) need a session whose
token has the ``admin`` role when the cluster has ``[auth]`` (refused
``forbidden``, naming the roles it has), or, without ``[auth]``, whose Hello
carried the cluster's legacy admin token when one is set (refused
``unauthorized``); reading (``status``, ``journal``) needs neither.  An operator's split or move of a
replicated channel first gives it back to its first owner alone
(``UpdateRoutingTable``), and the other replicas drop their copies
(``node.updates`` rule 3).  A command that waits on a session or a table
update is answered when that completes (``done``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, Final

from overlay.actions import Action, ToClient
from overlay.balance.split import Cut
from overlay.channels.channel import ChannelId
from overlay.channels.predicates import MAX_SET_SIZE
from overlay.channels.routing_table import RouteEntry
from overlay.errors import Forbidden, LocalProtocolError, OverlayError
from overlay.messages import client as cm
from overlay.node.balancing import Balancing
from overlay.node.context import NodeContext
from overlay.node.migration import Migration
from overlay.node.sessions import Session, Sessions
from overlay.node.splits import Splits
from overlay.node.updates import TableUpdates

__all__ = ["CHANGING_COMMANDS", "Admin"]

log = logging.getLogger("overlay.node")

# Journal entries per admin("journal") reply: a few hundred bytes each, so a
# page stays far below the 1 MiB default frame cap.
JOURNAL_PAGE: Final = 500

# Admin commands that change the cluster: they need the admin token, when one is set.
CHANGING_COMMANDS: Final = frozenset({"split", "place", "drain"})

# Each command's arguments: any other is refused by name — ignored, drain's
# `node` drained the access node whatever node it named.
ARGUMENTS: Final = {
    "status": frozenset[str](),
    "split": frozenset({"channel", "attr", "at", "values"}),
    "place": frozenset({"channel", "node"}),
    "drain": frozenset({"node"}),  # if given, this node's id (as POST /drain's)
    "journal": frozenset({"since", "limit"}),
}

Status = Callable[[], dict[str, Any]]
Drain = Callable[[float, tuple[int, int]], list[Action]]


class Admin:
    """The commands; ``status`` describes the node (``node.status``), ``drain``
    starts a drain (``node.membership``)."""

    def __init__(
        self,
        ctx: NodeContext,
        sessions: Sessions,
        migration: Migration,
        balancing: Balancing,
        splits: Splits,
        updates: TableUpdates,
        *,
        status: Status,
        drain: Drain,
    ) -> None:
        self._ctx = ctx
        self._sessions = sessions
        self._migration = migration
        self._balancing = balancing
        self._splits = splits
        self._updates = updates
        self._status = status
        self._drain = drain

    def handle(self, sess: Session, msg: cm.Admin, now: float, out: list[Action]) -> None:
        if msg.command in CHANGING_COMMANDS and not sess.admin and sess.rights is not None:
            try:
                sess.rights.check_admin(msg.command)
            except Forbidden as exc:
                self._forbid(sess, msg, exc, out)
                return
        if msg.command in CHANGING_COMMANDS and not sess.admin:
            self._ctx.stats["rejected_unauthorized"] += 1
            log.warning(
                "node %d: client %r (session %d) sent %r without the admin token; refused",
                self._ctx.id,
                sess.client_id,
                sess.id,
                msg.command,
            )
            out.append(
                ToClient(
                    sess.id,
                    cm.Error(
                        msg.seq,
                        cm.ErrorCode.UNAUTHORIZED,
                        (
                            f"{msg.command!r} changes the cluster and needs its admin token: connect with Client(token=...) "
                            "or `overlay … --token T` (or set OVERLAY_ADMIN_TOKEN)"
                        ),
                    ),
                )
            )
            return
        try:
            self._check_arguments(msg)
            match msg.command:
                case "status":
                    out.append(ToClient(sess.id, cm.AdminReply(msg.seq, self._status())))
                case "split":
                    self._split(sess.id, msg, now, out)
                case "place":
                    chid = _parse_chid(msg.args.get("channel"))
                    receiver = msg.args.get("node")
                    if isinstance(receiver, bool) or not isinstance(receiver, int):
                        raise LocalProtocolError("place needs an integer 'node'")
                    if chid not in self._ctx.local:
                        raise LocalProtocolError(self._not_owner(chid))
                    if receiver == self._ctx.id and not self._ctx.routing[chid].replicated:
                        self._stays(sess.id, msg.seq, chid, "already", out)
                        return
                    if receiver != self._ctx.id and receiver not in self._ctx.peers:
                        raise LocalProtocolError(
                            f"node {receiver} cannot receive channels: it is not a member of the cluster "
                            f"(members: {sorted({self._ctx.id, *self._ctx.peers})})"
                        )
                    self._own_alone(chid, out)  # a replicated channel: first back to one owner
                    if receiver == self._ctx.id:
                        self._stays(sess.id, msg.seq, chid, "alone now (its other replicas dropped it)", out)
                        return
                    _, acts = self._migration.start([chid], receiver, now, forced=True, admin=(sess.id, msg.seq))
                    out.extend(acts)
                case "drain":  # answered when the localTable is empty (node.membership)
                    out.extend(self._drain(now, (sess.id, msg.seq)))
                case "journal":
                    # The balancing journal from entry `since` on, at most `limit` entries
                    # (a reply must fit in one frame; page with since += len(reply)).
                    since, limit = msg.args.get("since", 0), msg.args.get("limit", JOURNAL_PAGE)
                    if not (type(since) is int and type(limit) is int and since >= 0 and limit > 0):  # not bool
                        raise LocalProtocolError("journal takes non-negative integers 'since' and 'limit'")
                    page = list(itertools.islice(self._ctx.journal.entries, since, since + min(limit, JOURNAL_PAGE)))
                    out.append(ToClient(sess.id, cm.AdminReply(msg.seq, page)))
                case _:
                    raise LocalProtocolError(
                        f"unknown admin command {msg.command!r} (status, split, place, drain, journal)"
                    )
        except (OverlayError, KeyError, ValueError, TypeError) as exc:
            out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.ADMIN, str(exc))))

    def _check_arguments(self, msg: cm.Admin) -> None:
        known = ARGUMENTS.get(msg.command)
        if known is None:
            return  # an unknown command: refused by name below
        extra = sorted(set(msg.args) - known)
        if extra:
            takes = f"its arguments: {', '.join(sorted(known))}" if known else "it takes none"
            raise LocalProtocolError(f"{msg.command} has no argument {', '.join(map(repr, extra))} ({takes})")
        node = msg.args.get("node", self._ctx.id)
        if msg.command == "drain" and (type(node) is not int or node != self._ctx.id):
            raise LocalProtocolError(
                f"this is node {self._ctx.id}: drain drains the node it is sent to, not {node!r} "
                "(`overlay node drain N` reaches node N)"
            )

    def _forbid(self, sess: Session, msg: cm.Admin, exc: Forbidden, out: list[Action]) -> None:
        self._ctx.stats["rejected_forbidden"] += 1
        if not sess.auth_logged:  # once per session (node.clients rule A4)
            sess.auth_logged = True
            log.warning("node %d: client %r (session %d) refused: %s", self._ctx.id, sess.client_id, sess.id, exc)
        out.append(ToClient(sess.id, cm.Error(msg.seq, cm.ErrorCode.FORBIDDEN, str(exc))))

    def _stays(self, sid: int, seq: int, chid: ChannelId, how: str, out: list[Action]) -> None:
        """A ``place`` onto this node itself: nothing moves; say so."""
        node = self._ctx.id
        note = f"channel {chid} is on node {node} {how}"
        out.append(
            ToClient(sid, cm.AdminReply(seq, {"channel": str(chid), "receiver": node, "moved": False, "note": note}))
        )

    def _not_owner(self, chid: ChannelId) -> str:
        entry = self._ctx.routing.get(chid)
        if entry is None:
            return f"channel {chid} does not exist"
        return f"channel {chid} is owned by node {entry.owner}, not node {self._ctx.id}"

    def _split(self, sid: int, msg: cm.Admin, now: float, out: list[Action]) -> None:
        chid = _parse_chid(msg.args.get("channel"))
        ch = self._ctx.local.get(chid)
        if ch is None:
            raise LocalProtocolError(self._not_owner(chid))
        if self._migration.moving(chid):
            raise LocalProtocolError(f"channel {chid} is moving; split it later")
        if chid in self._migration.arriving():
            raise LocalProtocolError(f"channel {chid} is still arriving; split it later")
        if chid == self._balancing.splitting():
            raise LocalProtocolError(f"channel {chid} is being split already; try again later")
        attr_name = msg.args.get("attr")
        if not isinstance(attr_name, str) or not self._ctx.schema.is_da(attr_name):
            raise LocalProtocolError(
                f"split needs 'attr', one of the distinguishing attributes {list(self._ctx.schema.da)}, got {attr_name!r}"
            )
        attr = self._ctx.schema.attribute(attr_name)
        if "values" in msg.args:
            values = msg.args["values"]
            if not isinstance(values, list) or not 1 <= len(values) <= MAX_SET_SIZE:
                raise LocalProtocolError(f"split 'values' must be a list of 1 to {MAX_SET_SIZE} strings")
            low, high = ch.space.take_strings(attr.name, [str(attr.check(v)) for v in values])
        else:
            at = msg.args.get("at")
            if isinstance(at, bool) or not isinstance(at, (int, float)):
                raise LocalProtocolError("split needs a numeric 'at' or a list of 'values'")
            checked = attr.check(at)  # finite, of the attribute's type, in its domain (SPEC §16): NaN split everything
            if isinstance(checked, str):  # (the check refuses a number for a string attribute)
                raise LocalProtocolError(f"a split on string attribute {attr.name!r} takes 'values', not 'at'")
            low, high = ch.space.cut(attr, checked)
        self._own_alone(chid, out)  # a replicated channel: its other replicas would keep the parent
        self._splits.split_now(ch, Cut(attr.name, low, high, 0, 0), now, out, admin=(sid, msg.seq))

    def _own_alone(self, chid: ChannelId, out: list[Action]) -> None:
        """An operator splits or places a replicated channel: its first owner
        (this node, which holds every subscription, as each replica does)
        takes it back alone first; the other replicas drop their copies when
        the update reaches them (``node.core`` rule 9)."""
        entry = self._ctx.routing[chid]
        if not entry.replicated:
            return
        if entry.owner != self._ctx.id:
            raise LocalProtocolError(
                f"channel {chid} is replicated on nodes {list(entry.owners)}: ask node {entry.owner}, its first owner"
            )
        alone = RouteEntry(entry.space, (self._ctx.id,))
        self._ctx.routing.set(chid, alone)
        self._ctx.stats["replicas_collapsed"] += 1
        log.info(
            "node %d: channel %s back on this node alone (was on %s) for an operator's command",
            self._ctx.id,
            chid,
            list(entry.owners),
        )
        self._updates.broadcast((), [(chid, alone)], out)

    def done(self, admin: tuple[int, int], result: Any, out: list[Action]) -> None:
        sid, seq = admin
        if sid in self._sessions:
            out.append(ToClient(sid, cm.AdminReply(seq, result)))


def _parse_chid(raw: object) -> ChannelId:
    if isinstance(raw, str) and raw.count(".") == 1:
        node, seq = raw.split(".")
        if node.isdigit() and seq.isdigit():
            return ChannelId(int(node), int(seq))
    raise LocalProtocolError(f"channel ids look like 'node.seq' (e.g. '0.0'), got {raw!r}")
