"""overlay.node.keyhome on its own: one ``KeyHome`` on a bare ``NodeContext``.

Node 2 is the home; ``roles`` reads a dict the test changes (a death, a new
run), ``route`` records what the home dispatches, and the routing table is
set by hand (one channel, owned by node 0)."""

from __future__ import annotations

from pathlib import Path

from overlay.actions import Action, ToPeer
from overlay.channels import ChannelId
from overlay.channels.routing_table import RouteEntry
from overlay.channels.space import EventSpace
from overlay.config import load_config
from overlay.messages import peer as pm
from overlay.node.context import NodeContext
from overlay.node.keyhome import KeyHome

_LOADED = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
CH = ChannelId(0, 1)
KEY = "k0"


class Rig:
    """Node 2's KeyHome; ``roles`` maps the key to (home, backup)."""

    def __init__(self) -> None:
        self.ctx = NodeContext(_LOADED, 2, 1)
        self.ctx.routing.set(CH, RouteEntry(EventSpace.whole(self.ctx.schema), (0,)))
        self.roles: dict[str, tuple[int, int | None]] = {KEY: (2, 1)}
        self.routed: list[pm.Event] = []
        self.verdicts: list[str] = []
        self.home = KeyHome(
            self.ctx,
            roles=lambda key: self.roles[key],
            route=lambda ev, out: self.routed.append(ev),
            verdict=lambda ev, out: self.verdicts.append(ev.event_id),
            refuse=lambda ev, code, detail, out: None,
            note=lambda node, code, eid: None,
            dead=set(),
        )

    def synced(self) -> None:
        """The batch's syncs go out and their backups answer them (rule 2)."""
        out: list[Action] = []
        for a in self.home.end_batch():
            if isinstance(a, ToPeer) and isinstance(a.msg, pm.KeySync):
                self.home.on_synced(a.node, pm.KeySynced(a.msg.no), out)


def test_an_event_released_to_the_dead_old_run_of_the_keys_new_home_is_dispatched_again() -> None:
    # Fault seed 785: node 0 (home of the key and owner of its channel) is
    # dead; its backup, node 2, sequences rank 1 and releases it to node 0's
    # old run, where it is lost.  Node 0's new run asks for its keys (rule 6):
    # node 2 hands the key over marked released, so the new home keeps rank 1
    # in flight and sends nothing.  When the recovery re-sends (node 0's
    # restart announcement), node 2 must dispatch it again (rule 9): it is the
    # only node that would.
    r = Rig()
    out: list[Action] = []
    ev = pm.Event("c9/e1", {"price": 5.0, "sym": "AB"}, 2, pm.DispatchSign.EVENT_NEW, CH, key=KEY)
    r.home.sequence(ev, out)
    r.synced()
    assert r.verdicts == ["c9/e1"] and [(e.event_id, e.rank) for e in r.routed] == [("c9/e1", 1)]
    r.roles[KEY] = (0, 2)  # node 0's new run is back: the key's home again
    out = []
    r.home.on_ask(0, out)
    handed = [a.msg for a in out if isinstance(a, ToPeer) and a.node == 0 and isinstance(a.msg, pm.KeySync)]
    copies = [op.copy for m in handed for op in m.ops if op.copy is not None]
    assert [(c.key, c.released) for c in copies] == [(KEY, True)]  # the new home will not release it
    assert KEY not in r.home.sequencer
    r.routed.clear()
    r.home.redispatch(out)
    assert [(e.event_id, e.rank, e.home) for e in r.routed] == [("c9/e1", 1, 2)]
    assert r.ctx.stats["ordered_redispatched"] == 1


def test_an_event_whose_completion_was_passed_on_is_not_dispatched_again() -> None:
    r = Rig()
    out: list[Action] = []
    ev = pm.Event("c9/e1", {"price": 5.0, "sym": "AB"}, 2, pm.DispatchSign.EVENT_NEW, CH, key=KEY)
    r.home.sequence(ev, out)
    r.synced()
    r.roles[KEY] = (0, 2)
    r.home.on_ask(0, out)
    r.home.on_complete("c9/e1", out)  # passed on to the new home (rule 7): nothing in flight here now
    r.routed.clear()
    r.home.redispatch(out)
    assert r.routed == [] and len(r.home.in_flight) == 0
