"""overlay.node.ordering / node.groups on sans-IO cores joined by CoreLink (no event loop).

The exact legs of an ordered delivery: access → home (EVENT_NEW), the home's
``sequenced`` verdict and PubAck, release → owner → subscriber's access node,
the client's Ack → ``acked`` to the owner → ``complete`` to the home → next
rank.  Batched notes leave on ``end_batch`` (here: on tick, as the shell
also does).  Plus the rendezvous hash's minimal disruption.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from overlay.config import load_config
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.node.ordering import rendezvous_home
from overlay.testing.corelink import CoreLink

_LOADED = load_config(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.toml")
CONFIG = msgspec.structs.replace(_LOADED, cluster=msgspec.structs.replace(_LOADED.cluster, balancing=False))
EVENT = {"price": 5.0, "sym": "AB", "qty": 1}


def test_rendezvous_moves_only_the_keys_of_the_node_that_left() -> None:
    keys = [f"k{i}" for i in range(3000)]
    before = {k: rendezvous_home(k, [0, 1, 2, 3]) for k in keys}
    after = {k: rendezvous_home(k, [0, 1, 3]) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != 2)
    assert all(after[k] in (0, 1, 3) for k in keys)
    share = sum(1 for k in keys if before[k] == 2) / len(keys)
    assert 0.2 < share < 0.3  # spread evenly


def _settle(net: CoreLink, rounds: int = 6) -> None:
    for _ in range(rounds):
        net.run()
        for i in net.cores:
            net.tick(i, net.now)
        net.run()


def test_one_event_per_key_in_flight_and_the_legs_of_a_delivery() -> None:
    net = CoreLink(CONFIG)
    net.start()
    key = next(k for k in (f"key{i}" for i in range(100)) if rendezvous_home(k, [0, 1, 2]) == 2)
    sub = net.open_client(1, "sub")
    assert any(isinstance(m, cm.SubAck) for m in net.request(1, sub, cm.Subscribe(1, "s", "price >= 0")))
    pub = net.open_client(0, "pub")
    mark = len(net.trace)
    net.client_send(0, pub, cm.Publish(1, EVENT, 0.0, key, 0))
    net.client_send(0, pub, cm.Publish(2, EVENT, 0.0, key, 0))
    _settle(net)
    legs = [(s, d, type(m).__name__, getattr(m, "code", None)) for s, d, m in net.trace[mark:]]
    assert legs[:2] == [(0, 2, "Event", None), (0, 2, "Event", None)]  # both to the home
    assert (2, 0, "NotificationAck", "sequenced") in legs
    assert [m.seq for m in net.received(0, pub, kind=cm.PubAck)] == [1, 2]
    notes = net.received(1, sub, kind=cm.Notify)
    assert [(n.key, n.rank) for n in notes] == [(key, 1)]  # rank 2 waits for rank 1's ack
    assert net.cores[2].ordering.sequencer.context(key)[:2] == ("PROCESSING", 1)
    net.client_send(1, sub, cm.Ack(notes[0].event_id, 0.0, notes[0].tag))
    mark = len(net.trace)
    _settle(net)
    legs = [(s, d, getattr(m, "code", None)) for s, d, m in net.trace[mark:] if isinstance(m, pm.NotificationAck)]
    assert legs[:2] == [(1, 0, "acked"), (0, 2, "complete")]  # subscriber's node → owner → home
    notes = net.received(1, sub, kind=cm.Notify)
    assert [(n.key, n.rank) for n in notes] == [(key, 1), (key, 2)]


def test_a_duplicate_rank_is_refused_at_the_home_with_the_publish_seq() -> None:
    net = CoreLink(CONFIG)
    net.start()
    key = next(k for k in (f"key{i}" for i in range(100)) if rendezvous_home(k, [0, 1, 2]) == 1)
    pub = net.open_client(0, "pub")
    net.client_send(0, pub, cm.Publish(7, EVENT, 0.0, key, 1))
    net.client_send(0, pub, cm.Publish(8, EVENT, 0.0, key, 1))
    _settle(net)
    assert [m.seq for m in net.received(0, pub, kind=cm.PubAck)] == [7]
    (err,) = net.received(0, pub, kind=cm.Error)
    assert (err.seq, err.code) == (8, cm.ErrorCode.DUPLICATE_RANK)
    assert net.cores[1].ordering.sequencer.counters["rejected_duplicate"] == 1


def test_a_home_whose_link_only_drops_stays_the_home_and_the_event_waits_for_the_link() -> None:
    """Links lose nothing while both runs live: a home moves on a death, not
    on a link's blink (two homes would sequence one key; node.ordering rule 1)."""
    net = CoreLink(CONFIG)
    net.start()
    key = next(k for k in (f"key{i}" for i in range(100)) if rendezvous_home(k, [0, 1, 2]) == 2)
    pub = net.open_client(0, "pub")
    net.pause(0, 2)  # the event to the home waits on the link
    net.client_send(0, pub, cm.Publish(1, EVENT, 0.0, key, 0))
    net.execute(0, net.cores[0].peer_link(2, False, net.now))
    assert net.cores[0].ordering.home_of(key) == 2
    _settle(net)
    assert net.received(0, pub, kind=cm.PubAck) == []
    net.release()
    net.execute(0, net.cores[0].peer_link(2, True, net.now))
    _settle(net)
    assert [m.seq for m in net.received(0, pub, kind=cm.PubAck)] == [1]
    assert net.cores[2].ordering.sequencer.context(key) is not None
    assert all(net.cores[i].ordering.sequencer.context(key) is None for i in (0, 1))


def test_recent_publishes_are_remembered_in_two_generations_at_constant_cost() -> None:
    from overlay.node import NodeCore
    from overlay.node.ordering import RECENT_PUBLISHES

    core = NodeCore(CONFIG, 0)
    n = RECENT_PUBLISHES
    for i in range(3 * n + 5):
        core.ordering.remember_publish(f"0-{i}", 1, i, 1000.0)
    last = 3 * n + 4
    assert all(
        core.ordering.recent_publish(f"0-{i}") == (1, i) for i in range(last - n + 1, last + 1)
    )  # at least the last n
    assert core.ordering.recent_publish("0-0") is None  # and not forever
    assert len(core.ordering._recent_pubs) + len(core.ordering._recent_pubs_old) <= 2 * n


def test_recent_publishes_are_remembered_for_a_bounded_time_whatever_the_rate() -> None:
    """A slow publisher's events are forgotten after two generations' time, not
    after 2·RECENT_PUBLISHES of them: the memory follows the rate (bench/soak.py)."""
    from overlay.node import NodeCore
    from overlay.node.ordering import RECENT_PUBLISH_SECONDS

    core = NodeCore(CONFIG, 0)
    t0, rate = 1000.0, 10.0  # publishes per second
    span = 2 * RECENT_PUBLISH_SECONDS
    count = int(3 * span * rate)
    for i in range(count):
        core.ordering.remember_publish(f"0-{i}", 1, i, t0 + i / rate)
    last = count - 1
    kept = range(last - int(RECENT_PUBLISH_SECONDS * rate) + 1, last + 1)  # the last RECENT_PUBLISH_SECONDS, at least
    assert all(core.ordering.recent_publish(f"0-{i}") == (1, i) for i in kept)
    assert core.ordering.recent_publish(f"0-{last - int(span * rate) - 1}") is None  # never more than twice that
    assert len(core.ordering._recent_pubs) + len(core.ordering._recent_pubs_old) <= span * rate + 1
