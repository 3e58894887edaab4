"""overlay.client.protocol: the client's state machine, without a loop, a socket or a clock.

Bytes and messages go in (``receive_data``/``receive``, ``tick(now)``); the
frames to write (``data_to_send``) and the events for the driver come out.
Rule numbers are the module's.
"""

from __future__ import annotations

import pytest

from overlay.client.deliveries import Notification
from overlay.client.events import (
    Connected,
    Delivered,
    Event,
    Failed,
    NodeError,
    Replied,
    SubscriptionLost,
)
from overlay.client.limits import CLIENT_MAGIC, NOT_READY_RETRY, REQUEST_TIMEOUT
from overlay.client.protocol import TRANSITIONS, Call, ClientProtocol, ConnState
from overlay.errors import (
    ConnectionLost,
    LocalProtocolError,
    NotReady,
    RemoteProtocolError,
    RequestError,
    SlowConsumerError,
)
from overlay.messages import client as cm
from overlay.messages.codec import client_reader, encode_frame

WALL = 1_700_000_000.0
EVENT = {"price": 1.0, "sym": "A"}


def welcome(node: int = 3, ack_timeout: float = 2.0) -> cm.Welcome:
    return cm.Welcome(node, 1, True, "test", ack_timeout)


def feed(p: ClientProtocol, *msgs: cm.ClientMessage, now: float = 0.0) -> list[Event]:
    """The node sends ``msgs``: through the framing, as bytes."""
    events: list[Event] = []
    for msg in p.receive_data(b"".join(encode_frame(m) for m in msgs)):
        events += p.receive(msg, now, WALL)
    return events


def sent(p: ClientProtocol) -> list[cm.ClientMessage]:
    """What the client writes, decoded as the node would."""
    return client_reader().feed(p.data_to_send())


def handshake(p: ClientProtocol, *, now: float = 0.0, node: int = 3) -> list[Event]:
    p.connect()
    p.receive_data(CLIENT_MAGIC)
    return feed(p, welcome(node), now=now)


def opened(**kwargs: str) -> ClientProtocol:
    p = ClientProtocol("c1", **kwargs)
    handshake(p)
    return p


def subscribed(p: ClientProtocol, sub_id: str, expression: str = "price < 10", group: str = "") -> None:
    rid = p.subscribe(sub_id, expression, group=group, now=0.0, timeout=REQUEST_TIMEOUT)
    (sub,) = sent(p)
    assert isinstance(sub, cm.Subscribe)
    assert feed(p, cm.SubAck(sub.seq, sub_id)) == [Replied(rid, cm.SubAck(sub.seq, sub_id))]


# -- rule 1: the connection's states ------------------------------------------------------


def test_the_hello_and_welcome_open_the_session_even_byte_by_byte() -> None:
    p = ClientProtocol("c1", token="t0k")
    out = p.connect()
    assert out.startswith(CLIENT_MAGIC)
    assert client_reader().feed(out[len(CLIENT_MAGIC) :]) == [cm.Hello("c1", cm.PROTOCOL_VERSION, "t0k")]
    assert p.state is ConnState.HANDSHAKE
    data = CLIENT_MAGIC + encode_frame(welcome(node=5, ack_timeout=1.5)) + encode_frame(cm.Revoke(1, "e"))
    msgs: list[cm.ClientMessage] = []
    for i in range(len(data)):
        msgs += p.receive_data(data[i : i + 1])
    assert msgs[0] == welcome(node=5, ack_timeout=1.5)
    assert p.receive(msgs[0], 0.0, WALL) == [Connected(5, "test", True, 1)]
    assert (p.state, p.node_id, p.cluster, p.deliveries.window, p.conn) == (ConnState.OPEN, 5, "test", 1.5, 1)
    assert msgs[1:] == [cm.Revoke(1, "e")]  # what came with the Welcome is the next message


def test_a_node_answering_with_another_preamble_is_refused() -> None:
    p = ClientProtocol("c1")
    p.connect()
    with pytest.raises(RemoteProtocolError, match="OVP1"):
        p.receive_data(b"OVP1")


def test_a_session_refused_in_the_hello_is_a_request_error_and_back_to_idle() -> None:
    p = ClientProtocol("c1")
    p.connect()
    p.receive_data(CLIENT_MAGIC)
    with pytest.raises(RequestError) as err:
        feed(p, cm.Error(-1, cm.ErrorCode.DRAINING, "leaving"))
    assert err.value.code == cm.ErrorCode.DRAINING and p.state is ConnState.IDLE
    p.connect()  # a new attempt may start


@pytest.mark.parametrize("state", list(ConnState))
@pytest.mark.parametrize("what", [*Call, cm.Welcome, cm.Error])
def test_every_pair_outside_the_table_is_refused_and_changes_nothing(state: ConnState, what: object) -> None:
    if (state, what) in TRANSITIONS or (state is ConnState.OPEN and not isinstance(what, Call)):
        return  # legal; in OPEN, messages are the dispatcher's (next test)
    p = ClientProtocol("c1")
    p.state = state
    with pytest.raises(LocalProtocolError if isinstance(what, Call) else RemoteProtocolError, match=state.name):
        match what:
            case Call.CONNECT:
                p.connect()
            case Call.LOST:
                p.connection_lost()
            case Call.CLOSE:
                p.close("x")
            case _:
                p._transition(what)  # type: ignore[arg-type]  # the message types of the table
    assert p.state is state


def test_in_the_hello_only_a_welcome_or_an_error_is_legal() -> None:
    p = ClientProtocol("c1")
    p.connect()
    p.receive_data(CLIENT_MAGIC)
    with pytest.raises(RemoteProtocolError, match="PubAck in state HANDSHAKE"):
        feed(p, cm.PubAck(1, "0-1"))
    assert p.state is ConnState.HANDSHAKE


@pytest.mark.parametrize("msg", [welcome(), cm.Publish(1, EVENT), cm.Hello("x"), cm.Ack("e")])
def test_an_open_session_refuses_what_a_node_never_sends(msg: cm.ClientMessage) -> None:
    p = opened()
    with pytest.raises(RemoteProtocolError, match=f"{type(msg).__name__} in state OPEN"):
        feed(p, msg)
    assert p.state is ConnState.OPEN


def test_nothing_is_received_while_idle_or_closed() -> None:
    p = ClientProtocol("c1")
    with pytest.raises(LocalProtocolError):
        p.receive_data(b"x")
    with pytest.raises(LocalProtocolError):
        p.receive(cm.PubAck(1, "e"), 0.0, WALL)


# -- rule 2: requests ---------------------------------------------------------------------------


def test_a_request_goes_out_with_a_seq_and_its_answer_comes_back_by_id() -> None:
    p = opened()
    rid = p.request(cm.Admin(0, "status"), now=0.0, timeout=5.0, retry=True)
    (msg,) = sent(p)
    assert isinstance(msg, cm.Admin) and msg.seq > 0
    assert feed(p, cm.AdminReply(msg.seq, {"ok": 1})) == [Replied(rid, cm.AdminReply(msg.seq, {"ok": 1}))]
    assert len(p.requests) == 0


def test_a_waiting_request_times_out_and_the_other_goes_out_on_connect() -> None:
    p = ClientProtocol("c1")
    late = p.request(cm.Admin(0, "status"), now=0.0, timeout=1.0, retry=True)
    kept = p.request(cm.Admin(0, "journal"), now=0.0, timeout=9.0, retry=True)
    assert p.next_timer() == 1.0
    (failed,) = p.tick(1.0)
    assert isinstance(failed, Failed) and failed.request == late and isinstance(failed.error, TimeoutError)
    handshake(p, now=2.0)
    (msg,) = sent(p)
    assert isinstance(msg, cm.Admin) and msg.command == "journal"
    assert feed(p, cm.AdminReply(msg.seq, 1)) == [Replied(kept, cm.AdminReply(msg.seq, 1))]


def test_a_one_shot_request_returns_a_choke_or_an_error_as_its_answer() -> None:
    p = opened()
    rid = p.request(cm.Publish(0, EVENT), now=0.0, timeout=5.0, retry=False)
    (msg,) = sent(p)
    assert feed(p, cm.Choke(msg.seq, 0.5)) == [Replied(rid, cm.Choke(msg.seq, 0.5))]
    assert p.chokes == 0  # the caller's to count (rule 6)
    rid = p.request(cm.Publish(0, EVENT), now=0.0, timeout=5.0, retry=False)
    (msg,) = sent(p)
    error = cm.Error(msg.seq, cm.ErrorCode.NOT_READY, "starting")
    assert feed(p, error) == [Replied(rid, error)]


def test_a_one_shot_request_on_a_lost_connection_fails_and_a_retrying_one_is_sent_again() -> None:
    p = opened()
    once = p.request(cm.Publish(0, EVENT), now=0.0, timeout=5.0, retry=False)
    again = p.request(cm.Publish(0, EVENT, 1.0), now=0.0, timeout=5.0, retry=True)
    first = sent(p)
    (failed,) = p.connection_lost()
    assert isinstance(failed, Failed) and failed.request == once and isinstance(failed.error, ConnectionLost)
    handshake(p, now=1.0)
    (resent,) = sent(p)
    assert isinstance(resent, cm.Publish) and resent.publish_time == 1.0 and resent.seq > first[1].seq
    assert feed(p, cm.PubAck(first[1].seq, "old")) == []  # an answer to the lost attempt is not ours
    assert feed(p, cm.PubAck(resent.seq, "0-1")) == [Replied(again, cm.PubAck(resent.seq, "0-1"))]


def test_a_retrying_request_waits_out_a_choke_then_goes_again_under_a_new_seq() -> None:
    p = opened()
    rid = p.request(cm.Publish(0, EVENT), now=0.0, timeout=5.0, retry=True)
    (first,) = sent(p)
    assert feed(p, cm.Choke(first.seq, 0.25), now=1.0) == []
    assert p.chokes == 1 and p.next_timer() == 1.25
    assert p.tick(1.2) == [] and not p.has_output  # nothing before the delay
    assert p.tick(1.25) == []
    (second,) = sent(p)
    assert second.seq != first.seq
    assert feed(p, cm.PubAck(second.seq, "0-9")) == [Replied(rid, cm.PubAck(second.seq, "0-9"))]


def test_not_ready_is_retried_until_the_deadline_would_pass_then_fails_not_ready() -> None:
    p = opened()
    rid = p.request(cm.Subscribe(0, "s", "price < 1"), now=0.0, timeout=0.12, retry=True)
    (first,) = sent(p)
    assert feed(p, cm.Error(first.seq, cm.ErrorCode.NOT_READY, "starting"), now=0.0) == []
    p.tick(NOT_READY_RETRY)
    (second,) = sent(p)
    events = feed(p, cm.Error(second.seq, cm.ErrorCode.NOT_READY, "still starting"), now=0.08)
    assert len(events) == 1 and isinstance(events[0], Failed) and events[0].request == rid
    assert isinstance(events[0].error, NotReady) and "still starting" in str(events[0].error)


def test_any_other_error_fails_a_retrying_request_with_its_code_and_position() -> None:
    p = opened()
    rid = p.request(cm.Subscribe(0, "s", "price <"), now=0.0, timeout=5.0, retry=True)
    (msg,) = sent(p)
    (event,) = feed(p, cm.Error(msg.seq, cm.ErrorCode.BAD_EXPRESSION, "end of text", 7))
    assert isinstance(event, Failed) and event.request == rid and isinstance(event.error, RequestError)
    assert (event.error.code, event.error.position) == (cm.ErrorCode.BAD_EXPRESSION, 7)


def test_a_request_given_up_is_forgotten_and_its_late_answer_ignored() -> None:
    p = opened()
    rid = p.request(cm.Admin(0, "status"), now=0.0, timeout=5.0, retry=True)
    (msg,) = sent(p)
    p.cancel(rid)
    assert feed(p, cm.AdminReply(msg.seq, 1)) == [] and len(p.requests) == 0


def test_a_request_over_the_frame_limit_is_refused_before_anything_is_queued() -> None:
    p = ClientProtocol("c1", max_frame=1024)
    handshake(p)
    with pytest.raises(LocalProtocolError, match="frame limit"):
        p.request(cm.Publish(0, {"sym": "x" * 2000}), now=0.0, timeout=1.0, retry=True)
    assert len(p.requests) == 0 and not p.has_output


def test_close_fails_every_pending_request_and_refuses_new_ones() -> None:
    p = opened()
    rid = p.request(cm.Admin(0, "status"), now=0.0, timeout=5.0, retry=True)
    (event,) = p.close("the client is closed")
    assert isinstance(event, Failed) and event.request == rid and isinstance(event.error, ConnectionLost)
    assert p.state is ConnState.CLOSED and not p.has_output and p.next_timer() is None
    with pytest.raises(ConnectionLost, match="the client is closed"):
        p.request(cm.Admin(0, "status"), now=0.0, timeout=5.0, retry=True)
    with pytest.raises(ConnectionLost):
        p.publish_windowed(EVENT, wall=WALL)


# -- the publish window (overlay.client.window through the protocol) ----------------------------


def test_pipelined_publishes_are_kept_until_their_puback() -> None:
    p = opened()
    seqs = [p.publish_windowed({"price": float(i), "sym": "A"}, wall=WALL) for i in range(3)]
    assert [m.seq for m in sent(p)] == seqs and len(p.window) == 3
    assert not p.window.room(3) and p.window.room(4)
    assert feed(p, cm.PubAck(seqs[1], "0-2")) == [] and len(p.window) == 2


def test_one_pubacks_frame_answers_pipelined_and_one_shot_publishes_in_order() -> None:
    p = opened()
    seqs = [p.publish_windowed({"price": float(i), "sym": "A"}, wall=WALL) for i in range(3)]
    rid = p.request(cm.Publish(0, EVENT), now=0.0, timeout=5.0, retry=True)
    one_shot = sent(p)[-1].seq  # type: ignore[attr-defined]
    acks = cm.PubAcks((seqs[0], one_shot, seqs[2], 999), ("0-1", "0-4", "0-3", "0-9"))  # 999: given up on
    assert feed(p, acks) == [Replied(rid, cm.PubAck(one_shot, "0-4"))]
    assert [len(p.window), seqs[1] in p.window, len(p.requests)] == [1, True, 0]


def test_a_pubacks_frame_whose_lists_differ_in_length_is_a_protocol_error() -> None:
    p = opened()
    p.publish_windowed(EVENT, wall=WALL)
    with pytest.raises(RemoteProtocolError, match="2 seqs but 1 event ids"):
        feed(p, cm.PubAcks((1, 2), ("0-1",)))


def test_the_hello_says_the_client_takes_pubacks() -> None:
    out = ClientProtocol("c1").connect()
    (hello,) = client_reader().feed(out[len(CLIENT_MAGIC) :])
    assert isinstance(hello, cm.Hello) and hello.version == cm.PROTOCOL_VERSION >= cm.BATCHED_ACKS


def test_a_choked_pipelined_publish_goes_again_after_the_delay_and_pauses_new_ones() -> None:
    p = opened(event_prefix="c1")
    seq = p.publish_windowed(EVENT, wall=WALL)
    sent(p)
    feed(p, cm.Choke(seq, 0.5), now=10.0)
    assert p.chokes == 1 and p.window.pause_left(10.1) == pytest.approx(0.4)
    assert p.tick(10.4) == [] and not p.has_output
    p.tick(10.5)
    assert sent(p) == [cm.Publish(seq, EVENT, WALL, event_id="c1.1")]  # the same publish, seq and id
    assert p.window.pause_left(10.5) == 0.0


def test_a_pipelined_publish_not_ready_goes_again_and_a_refusal_waits_for_flush() -> None:
    p = opened()
    a = p.publish_windowed(EVENT, wall=WALL)
    b = p.publish_windowed({"price": 9999.0, "sym": "A"}, wall=WALL)
    sent(p)
    feed(p, cm.Error(a, cm.ErrorCode.NOT_READY, "starting"), cm.Error(b, cm.ErrorCode.BAD_EVENT, "out of range"))
    assert p.window.errors == 1 and len(p.window) == 1
    p.tick(NOT_READY_RETRY)
    assert [m.seq for m in sent(p)] == [a]
    err = p.window.take_error()
    assert isinstance(err, RequestError) and err.code == cm.ErrorCode.BAD_EVENT
    assert p.window.take_error() is None


# -- rule 3: the re-subscribe list ---------------------------------------------------------------


def test_a_new_connection_resubscribes_then_resends_requests_then_pipelined_publishes() -> None:
    p = opened()
    subscribed(p, "a", "price < 10")
    subscribed(p, "g", "price > 5", group="workers")
    rid = p.request(cm.Admin(0, "status"), now=0.0, timeout=5.0, retry=True)
    seq = p.publish_windowed(EVENT, wall=WALL)
    sent(p)
    p.connection_lost()
    handshake(p, now=1.0, node=4)
    out = sent(p)
    assert [type(m) for m in out] == [cm.Subscribe, cm.Subscribe, cm.Admin, cm.Publish]
    assert [(m.sub_id, m.expression, m.group) for m in out[:2]] == [  # type: ignore[union-attr]
        ("a", "price < 10", ""),
        ("g", "price > 5", "workers"),
    ]
    assert out[3].seq == seq  # type: ignore[union-attr]
    assert feed(p, cm.SubAck(out[0].seq, "a"), cm.SubAck(out[1].seq, "g")) == []  # the protocol's own requests
    assert feed(p, cm.AdminReply(out[2].seq, 1)) == [Replied(rid, cm.AdminReply(out[2].seq, 1))]


def test_a_subscription_not_acknowledged_yet_is_sent_again_once_not_twice() -> None:
    p = opened()
    rid = p.subscribe("a", "price < 10", now=0.0, timeout=5.0)
    sent(p)
    p.connection_lost()
    handshake(p, now=1.0)
    (again,) = sent(p)
    assert isinstance(again, cm.Subscribe) and again.sub_id == "a"
    assert feed(p, cm.SubAck(again.seq, "a")) == [Replied(rid, cm.SubAck(again.seq, "a"))]
    assert p.subscriptions["a"].acked


def test_an_unsubscribe_pending_across_a_reconnect_completes_without_being_sent() -> None:
    p = opened()
    subscribed(p, "a")
    rid = p.unsubscribe("a", now=0.0, timeout=5.0)
    sent(p)
    p.connection_lost()
    (event,) = [e for e in handshake(p, now=1.0) if not isinstance(e, Connected)]
    assert event == Replied(rid, cm.UnsubAck(0, "a"))
    assert sent(p) == [] and len(p.requests) == 0  # the new session never held "a"


def test_an_unsubscribe_of_a_subscription_still_being_subscribed_is_sent_after_it() -> None:
    p = ClientProtocol("c1")
    p.subscribe("a", "price < 10", now=0.0, timeout=5.0)
    p.unsubscribe("a", now=0.0, timeout=5.0)
    handshake(p)
    assert [type(m) for m in sent(p)] == [cm.Subscribe, cm.Unsubscribe]


def test_a_forgotten_subscription_is_not_resubscribed_and_gets_nothing_more() -> None:
    p = opened()
    subscribed(p, "a")
    p.forget("a")
    p.connection_lost()
    handshake(p)
    assert sent(p) == []
    assert feed(p, cm.Notify("0-1", EVENT, ("a",), tag=2)) == []
    assert sent(p) == [cm.Ack("0-1", 0.0, 2, declined=True)]


def test_a_resubscription_refused_ends_that_subscription() -> None:
    p = opened()
    subscribed(p, "a")
    subscribed(p, "b")
    p.connection_lost()
    handshake(p)
    a, _ = sent(p)
    (event,) = feed(p, cm.Error(a.seq, cm.ErrorCode.BAD_EXPRESSION, "no longer valid"))  # type: ignore[union-attr]
    assert isinstance(event, SubscriptionLost) and event.sub_id == "a" and isinstance(event.error, RequestError)
    assert list(p.subscriptions) == ["b"]


def test_a_resubscription_not_answered_in_time_ends_that_subscription() -> None:
    p = opened()
    subscribed(p, "a")
    p.connection_lost()
    handshake(p, now=100.0, node=7)
    (event,) = p.tick(100.0 + REQUEST_TIMEOUT)
    assert isinstance(event, SubscriptionLost) and isinstance(event.error, ConnectionLost)
    assert "node 7" in str(event.error) and "'a'" in str(event.error) and not p.subscriptions


def test_a_failed_subscribe_leaves_nothing_to_resubscribe() -> None:
    p = opened()
    p.subscribe("a", "price <", now=0.0, timeout=5.0)
    (msg,) = sent(p)
    feed(p, cm.Error(msg.seq, cm.ErrorCode.BAD_EXPRESSION, "end", 7))
    assert "a" not in p.subscriptions
    rid = p.subscribe("b", "price < 1", now=0.0, timeout=5.0)
    sent(p)
    p.cancel(rid)  # the caller gave up
    assert "b" not in p.subscriptions
    subscribed(p, "c")
    with pytest.raises(RequestError, match="already open"):
        p.subscribe("c", "price < 2", now=0.0, timeout=5.0)


# -- rule 5: deliveries -------------------------------------------------------------------------


def test_a_notify_is_delivered_to_the_listed_subscriptions_held_and_answered_once() -> None:
    p = opened()
    subscribed(p, "a")
    subscribed(p, "b")
    (event,) = feed(p, cm.Notify("0-7", EVENT, ("a", "gone", "b", "a"), 1.0, tag=5), now=2.0)
    assert isinstance(event, Delivered) and event.sub_ids == ("a", "b")
    note = event.note
    assert (note.event_id, note.received, note.tag) == ("0-7", WALL, 5)
    assert p.claim(note, 0.25, 2.1) and not p.has_output
    assert p.claim(note, 0.5, 2.2)
    assert sent(p) == [cm.Ack("0-7", 0.5, 5, declined=False)]


def test_a_notify_no_subscription_takes_is_declined_at_once() -> None:
    p = opened()
    assert feed(p, cm.Notify("0-1", EVENT, ("gone",), tag=3)) == []
    assert sent(p) == [cm.Ack("0-1", 0.0, 3, declined=True)]


def test_acks_for_a_lost_connection_are_never_sent_and_its_group_copies_are_void() -> None:
    p = opened()
    subscribed(p, "g", group="workers")
    (event,) = feed(p, cm.Notify("0-1", EVENT, ("g",), tag=4))
    assert isinstance(event, Delivered)
    p.connection_lost()
    assert not p.claim(event.note, 0.0, 0.1) and not p.has_output
    handshake(p)
    assert [type(m) for m in sent(p)] == [cm.Subscribe]


def test_a_revoke_is_answered_with_a_decline() -> None:
    p = opened()
    feed(p, cm.Revoke(8, "0-3"))
    assert sent(p) == [cm.Ack("0-3", 0.0, 8, declined=True)]


def test_dropped_and_took_answer_through_the_deliveries_component() -> None:
    p = opened()
    subscribed(p, "a")
    subscribed(p, "b")
    (event,) = feed(p, cm.Notify("0-2", EVENT, ("a", "b"), tag=6))
    assert isinstance(event, Delivered)
    p.dropped(event.note)
    p.took(event.note, 0.75)
    assert sent(p) == [cm.Ack("0-2", 0.75, 6, declined=True)]


# -- rule 7: the node's news ------------------------------------------------------------------


def test_the_nodes_slow_consumer_error_is_a_slow_consumer_error_naming_the_node() -> None:
    p = opened()
    (event,) = feed(p, cm.Error(-1, cm.ErrorCode.SLOW_CONSUMER, "notification queue full"))
    assert isinstance(event, NodeError) and isinstance(event.error, SlowConsumerError)
    assert (event.error.subscriber, event.error.node_id) == ("", 3)
    (event,) = feed(p, cm.Error(-1, cm.ErrorCode.UNDELIVERABLE, "no instance for 0-9"))
    assert isinstance(event, NodeError) and isinstance(event.error, RequestError)
    assert event.error.code == cm.ErrorCode.UNDELIVERABLE


def test_a_late_answer_to_a_request_given_up_on_is_ignored() -> None:
    p = opened()
    assert feed(p, cm.PubAck(99, "0-1"), cm.SubAck(98, "x"), cm.Choke(97, 1.0)) == []


def test_a_notification_keeps_what_the_notify_said() -> None:
    p = opened()
    subscribed(p, "a")
    (event,) = feed(p, cm.Notify("0-4", EVENT, ("a",), 12.5, "k", 3, 0))
    assert event == Delivered(Notification("0-4", EVENT, ("a",), 12.5, WALL, "k", 3, 0), ("a",))


# -- rule 8: event ids -------------------------------------------------------------------------


def test_every_pipelined_publish_names_its_event_and_keeps_the_name_when_sent_again() -> None:
    p = opened(event_prefix="ab12")
    seqs = [p.publish_windowed(EVENT, wall=WALL) for _ in range(2)]
    assert [m.event_id for m in sent(p)] == ["ab12.1", "ab12.2"]  # type: ignore[attr-defined]
    feed(p, cm.PubAck(seqs[0], "c1/ab12.1"))
    p.connection_lost()
    handshake(p)
    (again,) = sent(p)
    assert isinstance(again, cm.Publish) and (again.seq, again.event_id) == (seqs[1], "ab12.2")
    assert p.next_event_id() == "ab12.3"


def test_two_clients_of_the_same_id_never_name_two_events_alike() -> None:
    a, b = ClientProtocol("same"), ClientProtocol("same")
    assert a.event_prefix != b.event_prefix and a.next_event_id() != b.next_event_id()


def test_an_error_answering_a_request_given_up_on_the_wire_is_nobodys() -> None:
    """Rule 6 of overlay.client.requests: a ping (an Unsubscribe of no
    subscription) answered after its timeout is not an error of the node's
    for error_cb; an Error of a seq never asked still is."""
    p = opened()
    late = p.request(cm.Unsubscribe(0, "\x00ping"), now=0.0, timeout=1.0, retry=False)
    (msg,) = sent(p)
    (failed,) = p.tick(1.0)
    assert isinstance(failed, Failed) and failed.request == late and isinstance(failed.error, TimeoutError)
    assert feed(p, cm.Error(msg.seq, cm.ErrorCode.UNKNOWN_SUBSCRIPTION, "no such subscription")) == []
    assert p.late_answers == 1
    cancelled = p.request(cm.Admin(0, "status"), now=1.0, timeout=5.0, retry=False)
    (msg,) = sent(p)
    p.cancel(cancelled)
    assert feed(p, cm.Error(msg.seq, cm.ErrorCode.ADMIN, "late")) == []
    (reported,) = feed(p, cm.Error(msg.seq + 50, cm.ErrorCode.PROTOCOL, "unsolicited"))
    assert isinstance(reported, NodeError)


def test_a_plain_subscription_gets_an_event_once_across_a_reconnect() -> None:
    """Rule 9: the same event again after the client subscribed anew (its
    access node died; a key's new home released it again) is acked, not
    delivered twice; a group copy is the node's to de-duplicate; an event a
    subscription dropped may come again."""
    p = opened()
    subscribed(p, "s")
    subscribed(p, "g", group="workers")
    note = cm.Notify("e1", EVENT, ("s",), 1.0, "k", 7, 3)
    (first,) = feed(p, note)
    assert isinstance(first, Delivered) and first.sub_ids == ("s",)
    p.connection_lost()
    handshake(p, now=1.0)
    sent(p)
    assert feed(p, cm.Notify("e1", EVENT, ("s",), 1.0, "k", 7, 9)) == []
    assert p.duplicates == 1 and cm.Ack("e1", 0.0, 9) in sent(p)
    (_group,) = feed(p, cm.Notify("e2", EVENT, ("g",), 1.0, "", 0, 4))
    (again,) = feed(p, cm.Notify("e2", EVENT, ("g",), 1.0, "", 0, 5))
    assert isinstance(again, Delivered) and again.sub_ids == ("g",)
    (third,) = feed(p, cm.Notify("e3", EVENT, ("s",), 1.0))
    assert isinstance(third, Delivered)
    p.dropped(third.note)
    (back,) = feed(p, cm.Notify("e3", EVENT, ("s",), 1.0))
    assert isinstance(back, Delivered)


@pytest.mark.parametrize(
    "message",
    [
        cm.Subscribe(0, "s" * 300, "price < 10"),  # sub_id past the protocol's 256
        cm.Subscribe(0, "s", b"price < 10"),  # type: ignore[arg-type]  # an expression of bytes
        cm.Publish(0, {"price": [1.0], "sym": "A"}),  # a value of a type the protocol lacks
        cm.Publish(0, {"price": True, "sym": "A"}),
        cm.Publish(0, {"price": 1.0, "sym": "A", "qty": 10**30}),  # past 64 bits: the encoder's OverflowError
        cm.Admin(0, "journal", {"since": object()}),  # the encoder's TypeError
        cm.Unsubscribe(0, ""),
    ],
)
def test_a_request_the_nodes_decoder_would_refuse_is_refused_before_anything_is_queued(
    message: cm.ClientMessage,
) -> None:
    # Sent, each was a protocol error that closed the session; sent again on
    # every new connection, each closed every one until the request timed out.
    p = opened()
    with pytest.raises(LocalProtocolError):
        p.request(message, now=0.0, timeout=5.0, retry=True)  # type: ignore[arg-type]
    assert len(p.requests) == 0 and not p.has_output


@pytest.mark.parametrize("event", [{"price": [1.0]}, {"price": False}, {"qty": -(2**64)}, {1: 1.0}, ["a"]])
def test_a_pipelined_publish_of_an_event_the_node_would_refuse_is_refused_before_it_is_kept(event: object) -> None:
    p = opened()
    with pytest.raises(LocalProtocolError):
        p.publish_windowed(event, wall=WALL)  # type: ignore[arg-type]
    assert not p.has_output and not len(p.window)
