"""A dead node's channels get new owners, rebuilt from the access nodes (SPEC §16).

Rules:

1. When a node is declared dead (``node.liveness``), every live node stops
   waiting for it: its sessions end (``node.migration``: before <3> they
   roll back, from <3> they complete), its expected receipts are given up
   (``node.outbox``), it counts as unreachable until a new run of it says
   hello.
2. The *coordinator* (``node.liveness`` rule 6) reassigns the dead node's
   channels in one ``UpdateRoutingTable`` marked ``dead``: a replicated
   channel just loses that replica; every other channel goes to the live
   node the receiver evaluator ``rank_u`` (SPEC §7) ranks best for a load
   of the dead node's last known load shared over its channels, counting
   what this recovery already gave each node, and leaving out nodes that
   rejoined lately (``node.liveness`` damping) while another is available.
   Each reassignment is a *recovery* change of the table
   (``channels.routing_table`` rule 6): newer than the entry it replaces,
   older than a change the dead owner made that the coordinator had not
   seen.  The same update re-states, at their own versions, the entries of
   the channels the dead node's latest updates named (``node.updates`` rule
   4): a node it died while telling learns them now.  The coordinator looks
   again on every tick: an update naming a dead owner that was on its way
   gets the same treatment.
3. On such an update every node (the coordinator too) merges it like any
   table update (``node.updates`` rule 2) and, for the items its table
   holds now (one a newer change overtook is left to that change), creates
   the channels it is given first, adopts the death, drops its own copy of a channel the
   update gives to another node, and — being the access node of its
   clients, the source of truth of their subscriptions (``node.sessions``
   rule 5) — sends each new owner one ``Rebuild`` (in chunks of
   ``REBUILD_CHUNK``) with every subscription it holds that overlaps the
   channel; what its clients' (un)subscriptions waited on there is applied.
   Then its outbox re-sends every unconfirmed event (to the new owners), and
   the keys it is home of their events in flight (``node.keyhome`` rule 9).
4. The new owner creates each channel empty and *holds* the events that
   reach it (at most ``MAX_HELD`` per channel; past that an event is dropped
   unacknowledged, counted, and its access node re-sends it) until every
   live node has sent its last ``Rebuild`` — a Rebuild may come before the
   update, and creates the channel then; one for a channel already here
   (re-stated: the dead node had just handed it over) is applied, and its
   sender not waited for when the update comes within ``peer_timeout``.  A Rebuild also names the group
   copies the dead owner gave the sender's instances lately
   (``node.groups`` rule 9): a re-sent event goes to the same instance.  Then the held events are matched
   in arrival order.  A node that dies or restarts meanwhile is not waited
   for; a live node is (links lose nothing while both runs live), with a
   warning every ``peer_timeout`` naming who is missing.  A Rebuild is the
   whole truth of its access node: on its last chunk, any subscription the
   channel holds from that node that the Rebuild did not name is removed
   (an unsubscription lost with the old owner; a replica that kept a
   subscription its first owner had dropped).  Chunks are collected per
   (channel, access node), at most ``MAX_REBUILDS_OPEN`` at once (the
   oldest, a sender that died midway, is forgotten).
5. A node that restarted before anyone declared it dead finds the table
   still naming it owner of channels it lost (``node.boot`` rule 4): it
   re-creates and holds them as in rule 4, and announces them in an update
   marked ``dead`` with its own id — its previous run's channels — so every
   access node sends it their subscriptions and re-sends what was not
   confirmed; nobody declares anything dead for it.  The announcement claims
   nothing — it carries the entries at the versions of the table the new
   run adopted, and changes no table but one that was older still: a node
   whose table gives such a channel to another node, or deleted it (the new
   run took a table older than a recovery or a split), answers with its
   newer entry or tombstone, which makes the new run drop it (rule 3).  A
   node whose table gives it a channel it does not hold for another reason
   (a lost update, ``node.updates`` rule 3) does the same (``recreate``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from overlay.actions import Action, ToPeer
from overlay.balance.evaluators import rank_u
from overlay.channels.channel import Channel, ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.liveness import Liveness
from overlay.node.sessions import Sessions
from overlay.node.updates import TableUpdates

__all__ = ["MAX_HELD", "REBUILD_CHUNK", "Recovery"]

log = logging.getLogger("overlay.node")

# Subscriptions per Rebuild frame: well under the frame cap for long filters.
REBUILD_CHUNK: Final = 500
# Events a rebuilding channel holds; past it the access nodes' re-sends cover.
MAX_HELD: Final = 20_000
# Rebuilds whose chunks are being collected at once (rule 4): one per channel
# and access node in a recovery, far below this.
MAX_REBUILDS_OPEN: Final = 10_000

Match = Callable[[Channel, pm.Event, list[Action]], None]
PeerGone = Callable[[int, list[Action]], None]
Resend = Callable[[float, list[Action]], None]
Loads = Callable[[], dict[int, tuple[float, float]]]  # node -> (dc, capacity), this node included
DeadLoad = Callable[[int], float]
Damped = Callable[[int, float], bool]
Arriving = Callable[[], set[ChannelId]]
GroupChoices = Callable[[int, ChannelId], tuple[pm.GroupChoice, ...]]
LearnChoices = Callable[[tuple[pm.GroupChoice, ...], ChannelId], None]


def theirs_replicated(ctx: NodeContext, chid: ChannelId) -> bool:
    entry = ctx.routing.get(chid)
    return entry is not None and entry.replicated


class _Rebuilding:
    __slots__ = ("dead", "deadline", "held", "waiting")

    def __init__(self, dead: int, waiting: set[int], deadline: float) -> None:
        self.dead = dead
        self.waiting = waiting
        self.deadline = deadline
        self.held: list[pm.Event] = []


class Recovery:
    """Rules 1–4 for one node."""

    def __init__(
        self,
        ctx: NodeContext,
        liveness: Liveness,
        updates: TableUpdates,
        sessions: Sessions,
        *,
        match: Match,
        peer_gone: PeerGone,
        resend: Resend,
        loads: Loads,
        dead_load: DeadLoad,
        damped: Damped,
        arriving: Arriving,
        redispatch: Resend = lambda now, out: None,
        group_choices: GroupChoices = lambda dead, chid: (),
        learn_choices: LearnChoices = lambda choices, chid: None,
    ) -> None:
        self._ctx = ctx
        self._liveness = liveness
        self._updates = updates
        self._sessions = sessions
        self._match = match
        self._peer_gone = peer_gone
        self._resend_events = resend
        self._redispatch = redispatch
        self._loads = loads
        self._dead_load = dead_load
        self._damped = damped
        self._arriving = arriving  # channels an incoming migration is bringing (node.arrivals)
        self._group_choices = group_choices
        self._learn_choices = learn_choices
        self.rebuilding: dict[ChannelId, _Rebuilding] = {}
        # (channel, access node) -> the subscription ids of its Rebuild so far (rule 4)
        self._rebuilt_ids: dict[tuple[ChannelId, int], set[str]] = {}
        # (channel, dead node) -> access node -> when its last Rebuild came with
        # no rebuild under way here: the update that begins one may follow (rule 4).
        self._early: dict[tuple[ChannelId, int], dict[int, float]] = {}
        self._gone: set[int] = set()  # dead nodes rule 1 ran for, until they come back

    # -- rule 1 -----------------------------------------------------------------------------------

    def node_dead(self, node: int, now: float, out: list[Action], *, reassign: bool = True) -> None:
        """``node`` was declared dead (here or by a peer): rules 1 and 2."""
        ctx = self._ctx
        if node not in self._gone:
            self._gone.add(node)
            ctx.unreachable.add(node)
            ctx.stats["peers_declared_dead"] += 1
            ctx.journal.record("decision", now, phase="death", peer=node)
            self._peer_gone(node, out)
            for chid, rb in list(self.rebuilding.items()):
                if node in rb.waiting:
                    rb.waiting.discard(node)
                    self._maybe_release(chid, out)
            # What the keys' homes here released to the dead node — an owner, or
            # the receiver of a migration its death aborted (which no recovery
            # update follows) — goes again to the channels' owners now
            # (node.keyhome rule 9; fault seed 963); a channel the dead node
            # owned gets it once more after the recovery's update (rule 3).
            self._redispatch(now, out)
        if reassign and self._liveness.coordinator(now) == ctx.id:
            self._reassign(node, now, out)

    def node_back(self, node: int) -> None:
        """A new run of ``node`` said hello: it is a member again (empty)."""
        self._gone.discard(node)
        self._ctx.unreachable.discard(node)

    # -- rule 2 -----------------------------------------------------------------------------------

    def _dead_owned(self) -> list[tuple[ChannelId, RouteEntry]]:
        dead = self._liveness.dead
        return sorted((c, e) for c, e in self._ctx.routing.items() if any(o in dead for o in e.owners))

    def _reassign(self, node: int, now: float, out: list[Action]) -> None:
        """Rule 2 for every channel the table gives a dead node; with ``node``
        >= 0 (just declared dead) the channels its latest updates named are
        re-stated too, so a broadcast it died in the middle of is completed."""
        ctx = self._ctx
        dead = self._liveness.dead
        theirs = self._dead_owned()
        shrunk = [(c, RouteEntry(e.space, tuple(o for o in e.owners if o not in dead))) for c, e in theirs]
        shrunk = [(c, e) for c, e in shrunk if e.owners and theirs_replicated(ctx, c)]
        alone = [(c, e) for c, e in theirs if not theirs_replicated(ctx, c) or not any(o not in dead for o in e.owners)]
        if shrunk:
            for c, e in shrunk:
                ctx.routing.recover(c, e)  # channels.routing_table rule 6
            self._updates.broadcast((), shrunk, out)
        owned = {c for c, _ in theirs}
        named, deleted = self._updates.recent_from(node) if node >= 0 else ([], [])
        confirm = [c for c in named if c in ctx.routing and c not in owned]
        gone = [c for c in deleted if c not in ctx.routing]  # a split or merge it announced: gone everywhere
        if not alone and not confirm:
            if node >= 0:
                log.info("node %d: dead node %d owned no channel; nothing to reassign", ctx.id, node)
            return
        live = self._liveness.live(now)
        loads = self._loads()
        cands = [n for n in live if not self._damped(n, now)] or live
        origin = node if node >= 0 else min(o for _, e in alone for o in e.owners if o in dead)
        share = self._dead_load(origin) / max(len(alone), 1)
        levels = ctx.config.cluster.levels
        given: dict[int, float] = {}
        items: list[tuple[ChannelId, RouteEntry]] = []
        choices = []
        for chid, entry in alone:
            dc = {n: loads.get(n, (0.0, 1.0)) for n in cands}
            level = {n: dc[n][0] + given.get(n, 0.0) / dc[n][1] for n in cands}
            under = [(level[n], dc[n][1]) for n in cands]
            # Ties of the rounded rank go to the lowest level once the channel is there.
            to = min(
                cands,
                key=lambda n: (-rank_u(level[n], dc[n][1], under, share, levels), level[n] + share / dc[n][1], n),
            )
            given[to] = given.get(to, 0.0) + share
            items.append((chid, RouteEntry(entry.space, (to,))))
            choices.append({"channel": str(chid), "to": to, "level": round(level[to], 6)})
        items.extend((c, ctx.routing[c]) for c in confirm)  # re-stated as they are here
        ctx.journal.record(
            "decision",
            now,
            phase="recovery",
            dead=origin,
            load_share=share,
            moves=choices,
            confirmed=[str(c) for c in confirm],
        )
        log.warning(
            "node %d: reassigning the channels of dead node %d: %s%s",
            ctx.id,
            origin,
            ", ".join(f"{c}->{e.owner}" for c, e in items[: len(choices)]) or "none",
            f"; re-stating {[str(c) for c in confirm]}" if confirm else "",
        )
        for chid, new in items[: len(choices)]:
            ctx.routing.recover(chid, new)  # channels.routing_table rule 6; the re-stated keep their versions
        update = self._updates.broadcast(gone, items, out, dead=origin)
        self.on_update(ctx.id, update, list(update.update_chs), now, out)

    # -- rule 3 -----------------------------------------------------------------------------------

    def on_update(
        self, src: int, msg: pm.UpdateRoutingTable, items: list[pm.RouteItem], now: float, out: list[Action]
    ) -> None:
        """An update marked ``dead`` that was just merged into the routing table
        (rule 3); ``items``: those of its items the table holds now — one a
        newer change overtook is left to that change (``node.updates`` rule 3)."""
        ctx = self._ctx
        dead = msg.dead
        for item in items:  # first: the death's retries (node.sessions rule 6) find them here
            if item.entry.owner == ctx.id:
                self._ensure(item.ch_id, dead, now, out)
        if dead not in self._gone and dead not in (ctx.id, src):  # src == dead: its new run (rule 5)
            self._liveness.declare(dead, 0, f"node {src} reassigned its channels", now)
            self.node_dead(dead, now, out, reassign=False)
        for chid in msg.delete_chs:
            if ctx.routing.deleted(chid) and chid in ctx.local and chid not in self._arriving():
                ctx.local.remove(chid)  # its new run held a channel split or merged since (rule 5)
                ctx.stats["channels_dropped_by_recovery"] += 1
                self.dropped(chid)
        for item in items:
            chid, owner = item.ch_id, item.entry.owner
            if owner != ctx.id:
                # The coordinator gave it to another node — unless a live
                # sender is moving it here: the update re-states the sender
                # as owner, and the migration decides (fault seed 668).
                if chid in ctx.local and chid not in self._arriving():
                    ctx.local.remove(chid)
                    ctx.stats["channels_dropped_by_recovery"] += 1
                self.dropped(chid)
            else:
                self._ensure(chid, dead, now, out)
            self._send_rebuild(chid, item.entry, dead, out)
            self._sessions.rebuilt(chid, out)
        ctx.stats["channels_recovered"] += sum(1 for i in items if i.entry.owner == ctx.id)
        self._resend(now, out)

    def on_restart(self, src: int, msg: pm.UpdateRoutingTable, now: float, out: list[Action]) -> None:
        """Rule 5 at the other nodes: a new run of ``src`` holds the channels it
        names.  Where this node's table agrees, it sends its clients'
        subscriptions; where it does not (the new run took a table older than
        a recovery), it tells ``src`` the entry it holds instead — never the
        other way round: a restart claims nothing."""
        ctx = self._ctx
        # The new run's entries are those of the table it adopted: one newer
        # than this node's is taken first (channels.routing_table rule 7).
        self._updates.merge([(i.ch_id, i.entry, i.version) for i in msg.update_chs], (), f"node {src}'s new run", out)
        correct: list[tuple[ChannelId, RouteEntry]] = []
        gone: list[ChannelId] = []
        for item in msg.update_chs:
            entry = ctx.routing.get(item.ch_id)
            if entry is None and ctx.routing.deleted(item.ch_id):  # split or merged since: a newer change
                gone.append(item.ch_id)
                self._nothing_here(item, src, out)
                continue
            if entry is None:
                # A channel this table never heard of: a split or merge whose
                # announcement died with the old run.  Its space is the new
                # run's word, and this node's clients may hold subscriptions
                # in it: they go, or their events would be lost.
                self._send_rebuild(item.ch_id, item.entry, src, out)
                self._sessions.rebuilt(item.ch_id, out)
                continue
            if entry.owners != (src,):
                correct.append((item.ch_id, entry))
                self._nothing_here(item, src, out)
                continue
            self._send_rebuild(item.ch_id, entry, src, out)
            self._sessions.rebuilt(item.ch_id, out)
        if correct or gone:
            ctx.stats["restart_claims_corrected"] += len(correct) + len(gone)
            log.warning(
                "node %d: node %d's new run holds %s, which this node's table gives to others or deleted: told so",
                ctx.id,
                src,
                [str(c) for c, _ in correct] + [str(c) for c in gone],
            )
            routing = ctx.routing
            upd = pm.UpdateRoutingTable(
                tuple(gone),
                tuple(pm.RouteItem(c, e, routing.version(c)) for c, e in correct),
                0,
                ctx.id,
                src,
                tuple(routing.version(c) for c in gone),
            )
            out.append(ToPeer(src, upd))
        out.append(ToPeer(src, pm.ReplyUpdateGlobal(msg.session, msg.origin)))
        self._resend(now, out)

    def restarted(self, chids: list[ChannelId], out: list[Action]) -> None:
        """Rule 5: this node's new run holds channels its previous run owned."""
        ctx = self._ctx
        now = ctx.now
        for chid in chids:
            self._ensure(chid, ctx.id, now, out)
        ctx.stats["channels_recovered"] += len(chids)
        self._updates.broadcast((), [(c, ctx.routing[c]) for c in chids], out, dead=ctx.id)

    def recreate(self, chids: list[ChannelId], out: list[Action]) -> None:
        """``node.updates`` rule 3: the table gives this node channels it does
        not hold (a lost update, a session that ended here while its sender
        went on): re-created and rebuilt as a restarted run's are (rule 5),
        with this node's own clients' subscriptions."""
        self.restarted(chids, out)
        ctx = self._ctx
        for chid in chids:
            entry = ctx.routing.get(chid)
            if entry is not None and chid in self.rebuilding:
                self._send_rebuild(chid, entry, ctx.id, out)
                self._sessions.rebuilt(chid, out)

    def dropped(self, chid: ChannelId) -> None:
        """``node.updates`` rule 3: ``chid`` left this node; a rebuild of it ends."""
        rb = self.rebuilding.pop(chid, None)
        if rb is not None and rb.held:  # unconfirmed: their access nodes send them again
            self._ctx.stats["events_dropped_rebuilding"] += len(rb.held)

    def _nothing_here(self, item: pm.RouteItem, src: int, out: list[Action]) -> None:
        """Rule 5: this node has nothing for the channel ``src``'s new run names
        (its table gives it to others, or deleted it), and says so to the owner
        that run names — unless that is this node: an empty last Rebuild to
        itself would drop every subscription its own clients hold in a channel
        it does own, a replica say (fault seed 330: a restarted node named this
        node sole owner of a channel both had held; this node's clients'
        subscriptions left its replica, and their events were lost)."""
        if item.entry.owner != self._ctx.id:
            self._send_rebuild(item.ch_id, item.entry, src, out, subs=())

    def _send_rebuild(
        self,
        chid: ChannelId,
        entry: RouteEntry,
        dead: int,
        out: list[Action],
        subs: tuple[StoredSubscription, ...] | None = None,
    ) -> None:
        if subs is None:
            subs = tuple(self._sessions.held(entry.space))
        chunks = [subs[i : i + REBUILD_CHUNK] for i in range(0, len(subs), REBUILD_CHUNK)] or [()]
        self._ctx.stats["rebuild_subscriptions_sent"] += len(subs)
        # What the dead owner gave this node's group instances goes first (node.groups rule 9).
        choices = self._group_choices(dead, chid)
        for i in range(0, len(choices), REBUILD_CHUNK):
            msg = pm.Rebuild(chid, (), last=False, dead=dead, groups=choices[i : i + REBUILD_CHUNK])
            if entry.owner == self._ctx.id:
                self.on_rebuild(self._ctx.id, msg, self._ctx.now, out)
            else:
                out.append(ToPeer(entry.owner, msg))
        for i, chunk in enumerate(chunks):
            msg = pm.Rebuild(chid, chunk, last=i == len(chunks) - 1, dead=dead)
            if entry.owner == self._ctx.id:
                self.on_rebuild(self._ctx.id, msg, self._ctx.now, out)
            else:
                out.append(ToPeer(entry.owner, msg))

    # -- rule 4 -----------------------------------------------------------------------------------

    def _ensure(self, chid: ChannelId, dead: int, now: float, out: list[Action]) -> _Rebuilding | None:
        ctx = self._ctx
        rb = self.rebuilding.get(chid)
        if rb is not None:
            return rb
        if chid not in ctx.local:
            entry = ctx.routing.get(chid)
            if entry is None:
                log.error("node %d: asked to rebuild channel %s that no table names; ignored", ctx.id, chid)
                return None
            ctx.local.add(Channel(chid, entry.space, ctx.schema))
        # (A channel here already — one a dead sender handed over, re-stated —
        # waits too: what the sender's lost Reforwards carried comes back in
        # the Rebuilds.)
        # Every member not dead: a suspected one is slow, not gone — its
        # Rebuild comes late, or its death takes it off the list (rule 4).
        waiting = {ctx.id, *ctx.peers} - set(self._liveness.dead) - {dead}
        # A last Rebuild that overtook this update is in the channel already
        # (fault seed 153: waited for, it held the channel's events for good);
        # one older than a peer timeout belongs to another recovery.
        early = self._early.pop((chid, dead), {})
        waiting -= {src for src, at in early.items() if now - at <= ctx.config.cluster.peer_timeout}
        rb = _Rebuilding(dead, waiting, now + ctx.config.cluster.peer_timeout)
        self.rebuilding[chid] = rb
        log.info("node %d: rebuilding channel %s of dead node %d; waiting for %s", ctx.id, chid, dead, sorted(waiting))
        return rb

    def on_rebuild(self, src: int, msg: pm.Rebuild, now: float, out: list[Action]) -> None:
        ctx = self._ctx
        rb = self.rebuilding.get(msg.ch_id)
        entry = ctx.routing.get(msg.ch_id)
        if rb is None and msg.ch_id not in ctx.local and entry is not None and msg.dead in entry.owners:
            # Before the update that names this node (the table still names
            # the dead node); one naming a live node is late and stale.
            rb = self._ensure(msg.ch_id, msg.dead, now, out)
        if msg.groups:
            self._learn_choices(msg.groups, msg.ch_id)
        ch = ctx.local.get(msg.ch_id)
        if ch is None:
            self._to_heirs(src, msg)
            return
        key = (msg.ch_id, src)
        seen = self._rebuilt_ids.get(key)
        if seen is None:
            if len(self._rebuilt_ids) >= MAX_REBUILDS_OPEN:  # chunks of a sender that died midway
                del self._rebuilt_ids[next(iter(self._rebuilt_ids))]
            seen = self._rebuilt_ids[key] = set()
        for sub in msg.subscriptions:
            if sub.access_node == src:
                seen.add(sub.id)
                if ch.add(sub):
                    ctx.stats["subscriptions_rebuilt"] += 1
        if msg.last:
            del self._rebuilt_ids[key]
            # The access node is the source of truth (rule 4): what the channel
            # holds from it and it no longer holds is gone — an unsubscription
            # that died with the old owner, or was relayed to a replica that
            # never got it (fault seed 593).
            stale = [s.id for s in ch if s.access_node == src and s.id not in seen]
            for sub_id in stale:
                ch.remove(sub_id)
            ctx.stats["subscriptions_dropped_by_rebuild"] += len(stale)
        if rb is not None and msg.last:
            rb.waiting.discard(src)
            self._maybe_release(msg.ch_id, out)
        elif msg.last:  # no rebuild under way: the update that begins one may come next
            early = self._early.get((msg.ch_id, msg.dead))
            if early is None:
                if len(self._early) >= MAX_REBUILDS_OPEN:
                    del self._early[next(iter(self._early))]
                early = self._early[(msg.ch_id, msg.dead)] = {}
            early[src] = now

    def _to_heirs(self, src: int, msg: pm.Rebuild) -> None:
        """Rule 4: a Rebuild for a channel split or merged here meanwhile goes to
        the local channels that replaced it, each subscription where it belongs."""
        ctx = self._ctx
        heirs = [ctx.local[c] for c in self._updates.heirs(msg.ch_id) if c in ctx.local]
        if not heirs:
            ctx.stats["rebuilds_ignored"] += 1
            return
        for sub in msg.subscriptions:
            for ch in heirs:
                if sub.access_node == src and ch.space.overlaps(sub.filter, ctx.schema) and ch.add(sub):
                    ctx.stats["subscriptions_rebuilt"] += 1

    def holds(self, chid: ChannelId, ev: pm.Event) -> bool:
        """Rule 4: keep ``ev`` while its channel waits for Rebuilds."""
        rb = self.rebuilding.get(chid)
        if rb is None:
            return False
        if len(rb.held) >= MAX_HELD:
            self._ctx.stats["events_dropped_rebuilding"] += 1  # unconfirmed: its access node re-sends it
        else:
            rb.held.append(ev)
        return True

    def _maybe_release(self, chid: ChannelId, out: list[Action]) -> None:
        rb = self.rebuilding.get(chid)
        if rb is None or rb.waiting:
            return
        del self.rebuilding[chid]
        ch = self._ctx.local.get(chid)
        log.info(
            "node %d: channel %s rebuilt with %d subscriptions; %d held events go on",
            self._ctx.id,
            chid,
            len(ch) if ch is not None else 0,
            len(rb.held),
        )
        if ch is None:
            return
        for ev in rb.held:
            self._match(ch, ev, out)

    def _resend(self, now: float, out: list[Action]) -> None:
        """Rule 3's end: what the access node keeps, and what the keys' homes have
        in flight (``node.keyhome`` rule 9), to the channels' current owners."""
        self._resend_events(now, out)
        self._redispatch(now, out)

    def tick(self, now: float, out: list[Action]) -> None:
        # Rule 2 again for an update naming a dead owner that came after the
        # recovery (it was on its way when the owner died).
        if self._liveness.dead and self._liveness.coordinator(now) == self._ctx.id and self._dead_owned():
            self._reassign(-1, now, out)
        for chid, rb in list(self.rebuilding.items()):
            if now >= rb.deadline:  # rule 4: a live node's Rebuild is late, not lost — keep waiting
                rb.deadline = now + self._ctx.config.cluster.peer_timeout
                self._ctx.stats["rebuilds_late"] += 1
                log.warning(
                    "node %d: channel %s still waits for the subscriptions of nodes %s (%d events held)",
                    self._ctx.id,
                    chid,
                    sorted(rb.waiting),
                    len(rb.held),
                )

    def peer_restarted(self, node: int, out: list[Action]) -> None:
        """Rule 4: a run that ended (restarted) sends no Rebuild: not waited for."""
        for chid, rb in list(self.rebuilding.items()):
            if node in rb.waiting:
                rb.waiting.discard(node)
                self._maybe_release(chid, out)
