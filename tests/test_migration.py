"""overlay.balance.migration: the two session state machines, without a network.

SPEC §8.1 steps 3–9 and §8.2; STYLE habit 2: every legal transition, every
illegal (state, message) pair raises ``RemoteProtocolError`` and changes
nothing.
"""

from __future__ import annotations

import itertools
import typing

import pytest

from conftest import make_schema
from overlay.balance.migration import (
    IncomingMigration,
    InState,
    OutgoingMigration,
    OutState,
)
from overlay.channels import ChannelId, EventSpace, parse_subscription
from overlay.errors import RemoteProtocolError
from overlay.messages import peer as pm

SCHEMA = make_schema()
CH = (ChannelId(0, 1), ChannelId(0, 2))
SESSION = 5
TIMEOUT = 5.0
T0 = 100.0

OK = pm.ReplySign.REPLY_SUCCESS
FAIL = pm.ReplySign.REPLY_FAIL
_SUB = pm.Subscription(
    "1:1:a:1", parse_subscription("price < 5", SCHEMA), "a", 1, pm.DispatchSign.SUBSCRIBE_DISPATCHED, CH[0]
)

# One instance of every peer message type, for the illegal-pair sweeps.
SAMPLES: dict[type, pm.PeerMessage] = {
    pm.PeerHello: pm.PeerHello(1, "c"),
    pm.PeerError: pm.PeerError("x", "y"),
    pm.RoutingTableInit: pm.RoutingTableInit(()),
    pm.ReplyRoutingTableInit: pm.ReplyRoutingTableInit(1),
    pm.Subscription: _SUB,
    pm.UnSubscription: pm.UnSubscription("s", _SUB.sub_exp, "a", 1, pm.DispatchSign.UNSUBSCRIBE_DISPATCHED, CH[0]),
    pm.SubscriptionApplied: pm.SubscriptionApplied("s", CH[0], True),
    pm.Event: pm.Event("e", {"price": 1.0}, 1, pm.DispatchSign.EVENT_DISPATCHED, CH[0]),
    pm.Notification: pm.Notification("e", {}, ("s",), CH[0]),
    pm.NotificationAck: pm.NotificationAck("e", ("s",)),
    pm.LIEM: pm.LIEM(1, "STABLE", 1.0, 1.0, 1.0),
    pm.RequestLoadBalance: pm.RequestLoadBalance(1.0, 1.0, SESSION, True),
    pm.ReplyRequestLoadBalance: pm.ReplyRequestLoadBalance(OK, SESSION),
    pm.ChannelTransfer: pm.ChannelTransfer(tuple(pm.ChannelSpec(c, EventSpace.whole(SCHEMA)) for c in CH), SESSION),
    pm.ReplyChannelTransfer: pm.ReplyChannelTransfer(OK, CH, SESSION),
    pm.SubscriptionMove: pm.SubscriptionMove(pm.SubscriptionType.ATOMIC, (), SESSION),
    pm.ReplySubscriptionMove: pm.ReplySubscriptionMove(SESSION),
    pm.UpdateRoutingTable: pm.UpdateRoutingTable((), (), SESSION, 0),
    pm.ReplyUpdateGlobal: pm.ReplyUpdateGlobal(SESSION, 0),
    pm.CompleteLoadBalance: pm.CompleteLoadBalance(SESSION),
    pm.DeliveryHandover: pm.DeliveryHandover(SESSION, CH[0], ()),
    pm.Reforward: pm.Reforward(CH[0], (pm.ReforwardItem(pm.ReforwardSign.SUBSCRIBE, _SUB),), SESSION),
    pm.Heartbeat: pm.Heartbeat(1),
    pm.Rebuild: pm.Rebuild(CH[0], (_SUB.stored(),)),
    pm.EventsMatched: pm.EventsMatched(("e",), ((1,),)),
    pm.EventsDelivered: pm.EventsDelivered(("e",)),
    pm.LinkAck: pm.LinkAck(1),
    pm.PeerAuth: pm.PeerAuth(1, "local", b"n" * 32),
    pm.PeerChallenge: pm.PeerChallenge(2, b"n" * 32, b"p" * 32),
    pm.PeerProof: pm.PeerProof(b"p" * 32),
    pm.KeySync: pm.KeySync(1, (pm.KeyOp("k", seq=2),)),
    pm.KeySynced: pm.KeySynced(1),
    pm.KeyAsk: pm.KeyAsk(1),
    pm.TableRequest: pm.TableRequest(1, 0, 0),
    pm.TableReply: pm.TableReply(1, 0),
    pm.Batch: pm.Batch((pm.NotificationAck("e", ("s",)),)),
}


def test_samples_cover_every_peer_message_type():
    assert set(SAMPLES) == set(typing.get_args(pm.PeerUnion))


# -- moving-out side -----------------------------------------------------------------------


def outgoing(now: float = T0) -> OutgoingMigration:
    return OutgoingMigration(SESSION, 2, list(CH), started=now, timeout=TIMEOUT)


def out_in(state: OutState) -> OutgoingMigration:
    """A session driven by legal messages into ``state``."""
    m = outgoing()
    path = {
        OutState.REQUESTED: [],
        OutState.TRANSFERRING: [pm.ReplyRequestLoadBalance(OK, SESSION)],
        OutState.MOVING: [pm.ReplyRequestLoadBalance(OK, SESSION), pm.ReplyChannelTransfer(OK, CH, SESSION)],
        OutState.UPDATING: [
            pm.ReplyRequestLoadBalance(OK, SESSION),
            pm.ReplyChannelTransfer(OK, CH, SESSION),
            pm.ReplySubscriptionMove(SESSION),
        ],
    }
    if state in path:
        for i, msg in enumerate(path[state]):
            m.on(msg, T0 + i + 1)
    elif state is OutState.DONE:
        m = out_in(OutState.UPDATING)
        m.updates_sent([1], T0 + 10)
        m.on_update_reply(1, T0 + 11)
    else:
        m.abort("test")
    assert m.state is state
    return m


def _snapshot(m: OutgoingMigration | IncomingMigration) -> dict[str, object]:
    return {k: (dict(v) if isinstance(v, dict) else set(v) if isinstance(v, set) else v) for k, v in vars(m).items()}


def test_outgoing_happy_path_and_times():
    m = outgoing()
    assert m.state is OutState.REQUESTED and m.active and not m.reforwarding
    assert m.channels == CH
    assert m.on(pm.ReplyRequestLoadBalance(OK, SESSION), 101.0) is OutState.TRANSFERRING  # <1> accepted
    assert m.deadline == 101.0 + TIMEOUT
    assert m.on(pm.ReplyChannelTransfer(OK, CH, SESSION), 102.0) is OutState.MOVING  # <2>
    assert m.times["<2>"] == 102.0 and m.deadline == 102.0 + TIMEOUT
    assert m.on(pm.ReplySubscriptionMove(SESSION), 103.0) is OutState.UPDATING  # <3>
    assert m.times["<3>"] == 103.0
    m.updates_sent([1, 2], 104.0)
    assert m.deadline == 104.0 + TIMEOUT
    assert m.on_update_reply(2, 105.0) is OutState.UPDATING
    assert m.waiting_updates == {1}
    assert m.on_update_reply(1, 106.0) is OutState.DONE
    assert m.times == {"<1>": T0, "<2>": 102.0, "<3>": 103.0, "done": 106.0}
    assert not m.active
    assert m.channels == CH  # never changes


def test_outgoing_request_refused_aborts_with_the_reason():
    m = outgoing()
    assert m.on(pm.ReplyRequestLoadBalance(FAIL, SESSION, "busy"), 101.0) is OutState.ABORTED
    assert m.reason == "busy"
    assert not m.active and not m.reforwarding


def test_outgoing_transfer_refused_aborts():
    m = out_in(OutState.TRANSFERRING)
    assert m.on(pm.ReplyChannelTransfer(FAIL, CH, SESSION), 102.0) is OutState.ABORTED
    assert m.reason == "receiver refused"  # no reason given: a default one
    assert "<2>" not in m.times


_OUT_LEGAL = {
    (OutState.REQUESTED, pm.ReplyRequestLoadBalance),
    (OutState.TRANSFERRING, pm.ReplyChannelTransfer),
    (OutState.MOVING, pm.ReplySubscriptionMove),
}


@pytest.mark.parametrize(
    ("state", "mtype"),
    [(s, t) for s, t in itertools.product(OutState, SAMPLES) if (s, t) not in _OUT_LEGAL],
    ids=lambda x: x.name if isinstance(x, OutState) else x.__name__,
)
def test_outgoing_illegal_pair_raises_and_changes_nothing(state, mtype):
    m = out_in(state)
    before = _snapshot(m)
    with pytest.raises(RemoteProtocolError, match=mtype.__name__) as info:
        m.on(SAMPLES[mtype], T0 + 50)
    assert state.value in str(info.value)
    assert _snapshot(m) == before


@pytest.mark.parametrize("state", [s for s in OutState if s is not OutState.UPDATING], ids=lambda s: s.name)
def test_update_reply_outside_updating_raises_and_changes_nothing(state):
    m = out_in(state)
    before = _snapshot(m)
    with pytest.raises(RemoteProtocolError, match="ReplyUpdateGlobal"):
        m.on_update_reply(1, T0 + 50)
    assert _snapshot(m) == before


def test_reforwarding_exactly_from_time_2():
    expected = {
        OutState.REQUESTED: False,
        OutState.TRANSFERRING: False,
        OutState.MOVING: True,
        OutState.UPDATING: True,
        OutState.DONE: True,
        OutState.ABORTED: False,
    }
    assert {s: out_in(s).reforwarding for s in OutState} == expected
    # An abort before <2> never reforwarded.
    m = out_in(OutState.TRANSFERRING)
    m.abort("gone")
    assert not m.reforwarding


@pytest.mark.parametrize("state", [OutState.REQUESTED, OutState.TRANSFERRING, OutState.MOVING], ids=lambda s: s.name)
def test_abort_before_time_3(state):
    m = out_in(state)
    m.abort("no answer")
    assert m.state is OutState.ABORTED and m.reason == "no answer" and not m.active


@pytest.mark.parametrize("state", [OutState.UPDATING, OutState.DONE], ids=lambda s: s.name)
def test_abort_refused_after_time_3(state):
    m = out_in(state)
    before = _snapshot(m)
    with pytest.raises(RemoteProtocolError, match="cannot abort"):
        m.abort("too late")
    assert _snapshot(m) == before


def test_outgoing_expiry_follows_the_deadline():
    m = outgoing()
    assert not m.expired(T0 + TIMEOUT - 0.001)
    assert m.expired(T0 + TIMEOUT)
    # A transition restarts the clock.
    m.on(pm.ReplyRequestLoadBalance(OK, SESSION), T0 + 4)
    assert not m.expired(T0 + TIMEOUT)
    assert m.expired(T0 + 4 + TIMEOUT)
    m.on(pm.ReplyChannelTransfer(OK, CH, SESSION), T0 + 8)
    m.on(pm.ReplySubscriptionMove(SESSION), T0 + 9)
    m.updates_sent([1], T0 + 20)
    assert not m.expired(T0 + 20 + TIMEOUT - 0.001)
    assert m.expired(T0 + 20 + TIMEOUT)


@pytest.mark.parametrize("state", [OutState.DONE, OutState.ABORTED], ids=lambda s: s.name)
def test_finished_sessions_never_expire(state):
    assert not out_in(state).expired(T0 + 1e9)


# -- receiver side ----------------------------------------------------------------------------


def incoming(now: float = T0) -> IncomingMigration:
    return IncomingMigration(0, SESSION, started=now, timeout=TIMEOUT)


def in_in(state: InState) -> IncomingMigration:
    m = incoming()
    steps = [SAMPLES[pm.ChannelTransfer], SAMPLES[pm.SubscriptionMove], SAMPLES[pm.CompleteLoadBalance]]
    order = [InState.ACCEPTED, InState.CHANNELS_ADDED, InState.SUBSCRIPTIONS_ADDED, InState.DONE]
    if state is InState.ABORTED:
        m.abort()
    else:
        for i, msg in enumerate(steps[: order.index(state)]):
            m.on(msg, T0 + i + 1)
    assert m.state is state
    return m


def test_incoming_happy_path():
    m = incoming()
    assert m.state is InState.ACCEPTED and m.active and m.channels == ()
    assert m.on(SAMPLES[pm.ChannelTransfer], 101.0) is InState.CHANNELS_ADDED
    assert m.channels == CH
    assert m.deadline == 101.0 + TIMEOUT
    assert m.on(SAMPLES[pm.SubscriptionMove], 102.0) is InState.SUBSCRIPTIONS_ADDED
    # Any number of Reforwards after the move (SPEC §8.2).
    for i in range(3):
        assert m.on(SAMPLES[pm.Reforward], 103.0 + i) is InState.SUBSCRIPTIONS_ADDED
    assert m.on(SAMPLES[pm.CompleteLoadBalance], 110.0) is InState.DONE
    assert not m.active
    assert m.channels == CH


_IN_LEGAL = {
    (InState.ACCEPTED, pm.ChannelTransfer),
    (InState.CHANNELS_ADDED, pm.SubscriptionMove),
    (InState.SUBSCRIPTIONS_ADDED, pm.Reforward),
    (InState.SUBSCRIPTIONS_ADDED, pm.CompleteLoadBalance),
}


@pytest.mark.parametrize(
    ("state", "mtype"),
    [(s, t) for s, t in itertools.product(InState, SAMPLES) if (s, t) not in _IN_LEGAL],
    ids=lambda x: x.name if isinstance(x, InState) else x.__name__,
)
def test_incoming_illegal_pair_raises_and_changes_nothing(state, mtype):
    m = in_in(state)
    before = _snapshot(m)
    with pytest.raises(RemoteProtocolError, match=mtype.__name__) as info:
        m.on(SAMPLES[mtype], T0 + 50)
    assert state.value in str(info.value)
    assert _snapshot(m) == before


def test_reforward_before_subscription_move_is_a_protocol_error():
    # Migration rule 4: the move and its reforwards share one FIFO high queue.
    for state in (InState.ACCEPTED, InState.CHANNELS_ADDED):
        m = in_in(state)
        with pytest.raises(RemoteProtocolError, match="Reforward"):
            m.on(SAMPLES[pm.Reforward], T0 + 50)
        assert m.state is state


def test_incoming_expiry_only_before_the_channels_are_confirmed():
    m = incoming()
    assert not m.expired(T0 + TIMEOUT - 0.001)
    assert m.expired(T0 + TIMEOUT)
    m.on(SAMPLES[pm.ChannelTransfer], T0 + 3)
    # Confirmed: the sender may be past <2> and reforwarding here, so only
    # the sender may end the session from now on.
    assert not m.expired(T0 + 1e9)
    m.on(SAMPLES[pm.SubscriptionMove], T0 + 4)
    assert not m.expired(T0 + 1e9)
    assert not in_in(InState.DONE).expired(T0 + 1e9)
    assert not in_in(InState.ABORTED).expired(T0 + 1e9)


@pytest.mark.parametrize("state", list(InState), ids=lambda s: s.name)
def test_incoming_abort_from_any_state(state):
    m = in_in(state)
    m.abort()
    assert m.state is InState.ABORTED and not m.active
