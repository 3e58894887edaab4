"""A publisher-chosen event id (``node.clients``): the node checks it without a
regex per publish (``plain_event_id``, and its copy inline in the publish
path), and must accept and refuse exactly what ``EVENT_ID`` does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coreworld import World
from overlay.messages import client as cm
from overlay.node.clients import EVENT_ID, plain_event_id

# Ids near every edge: empty, at and past the bound, each allowed punctuation,
# ASCII just outside the set, control characters, non-ASCII look-alikes.
EDGES = [
    "",
    "a",
    "a" * 128,
    "a" * 129,
    "ab12cd34.17",
    "x._:-y",
    "a b",
    "a/b",
    "a\n",
    "\na",
    "a\x00",
    "é",
    "ａ",  # fullwidth a
    "a\u200b",
    "𝟙",
    "a+b",
    "@",
    "[",
    "`",
    "{",
    "~",
]


def _regex(event_id: str) -> bool:
    return EVENT_ID.fullmatch(event_id) is not None


def test_the_edges_are_judged_as_the_regex_judges_them() -> None:
    for event_id in EDGES:
        assert plain_event_id(event_id) == _regex(event_id), event_id


@given(st.text(max_size=140))
def test_any_text_is_judged_as_the_regex_judges_it(event_id: str) -> None:
    assert plain_event_id(event_id) == _regex(event_id)


@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=140))
def test_any_ascii_text_is_judged_as_the_regex_judges_it(event_id: str) -> None:
    assert plain_event_id(event_id) == _regex(event_id)


def test_a_publish_s_id_is_accepted_or_refused_as_the_regex_says() -> None:
    w = World()
    sid = w.client(1, "pub")
    for i, event_id in enumerate(e for e in EDGES if e):  # "" is no chosen id: the node names the event
        seq = 100 + i
        w.net.client_send(1, sid, cm.Publish(seq, {"price": 1.0, "sym": "A"}, event_id=event_id))
        w.net.run()
        (reply,) = [m for m in w.net.received(1, sid) if getattr(m, "seq", None) == seq]
        if _regex(event_id):
            assert type(reply) is cm.PubAck and reply.event_id == f"pub/{event_id}", event_id
        else:
            assert type(reply) is cm.Error and reply.code == cm.ErrorCode.BAD_EVENT, event_id
            assert reply.message == f"event id {event_id!r} must be 1-128 letters, digits or ._:-"


def test_a_chosen_id_needs_a_plain_client_id_whichever_session_published_last() -> None:
    """The publish path remembers the last client id it passed (compared by
    identity): a session whose client id is not plain is refused before and
    after one whose id is, and that one keeps being accepted."""
    w = World()
    good = w.client(1, "pub")
    bad = w.client(1, "bad id")
    for i, sid in enumerate((good, bad, good, bad, bad, good)):
        seq = 200 + i
        w.net.client_send(1, sid, cm.Publish(seq, {"price": 1.0, "sym": "A"}, event_id=f"e{i}"))
        w.net.run()
        (reply,) = [m for m in w.net.received(1, sid) if getattr(m, "seq", None) == seq]
        if sid == good:
            assert type(reply) is cm.PubAck and reply.event_id == f"pub/e{i}"
        else:
            assert type(reply) is cm.Error and reply.code == cm.ErrorCode.BAD_EVENT
            assert "needs a client id of 1-128 printable characters" in reply.message
