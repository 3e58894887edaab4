"""The sequencer of SPEC §10: unit cases and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.seq import (
    DuplicateRank,
    ExpiryPolicy,
    InvalidRank,
    KeyState,
    Release,
    SeqStatus,
    Sequencer,
    SequencerConfig,
    SequencerFull,
)


def ranks(releases):
    """Ranks released: by one arrival or completion (a Release or None), or by expire (a list)."""
    if releases is None:
        return []
    if isinstance(releases, Release):
        return [releases.rank]
    return [r.rank for r in releases]


def test_in_order_arrivals_release_one_at_a_time():
    s = Sequencer()
    assert ranks(s.arrive("k", 1, "e1", 0.0)) == [1]
    assert s.context("k") == (SeqStatus.PROCESSING, 1, 0)
    assert s.arrive("k", 2, "e2", 0.0) is None  # one in flight at a time
    assert s.context("k") == (SeqStatus.PROCESSING, 1, 1)
    assert ranks(s.complete("k", 1, 0.1)) == [2]
    assert s.complete("k", 2, 0.2) is None
    assert s.context("k") == (SeqStatus.WAITING, 3, 0)


def test_out_of_order_ranks_are_held_until_the_gap_fills():
    s = Sequencer()
    assert s.arrive("k", 3, "e3", 0.0) is None
    assert s.arrive("k", 2, "e2", 0.0) is None
    assert s.context("k") == (SeqStatus.PENDING, 1, 2)
    out = s.arrive("k", 1, "e1", 0.0)
    assert (out.rank, out.event) == (1, "e1")
    assert ranks(s.complete("k", 1, 0.0)) == [2]
    assert ranks(s.complete("k", 2, 0.0)) == [3]


def test_keys_proceed_in_parallel():
    s = Sequencer()
    assert ranks(s.arrive("a", 1, "a1", 0)) == [1]
    assert ranks(s.arrive("b", 1, "b1", 0)) == [1]  # not blocked by a's in-flight event


def test_assigned_ranks_follow_arrival_order():
    s = Sequencer()
    assert ranks(s.arrive("k", None, "x", 0)) == [1]
    assert s.arrive("k", None, "y", 0) is None
    assert ranks(s.complete("k", 1, 0)) == [2]


@pytest.mark.parametrize("rank", [0, -1, 1.5, "2", True])
def test_bad_ranks_are_refused_and_counted(rank):
    s = Sequencer()
    with pytest.raises(InvalidRank):
        s.arrive("k", rank, "e", 0)
    assert s.counters["rejected_bad_rank"] == 1


@pytest.mark.parametrize("key", ["", "x" * 257, None])
def test_bad_keys_are_refused(key):
    with pytest.raises(InvalidRank):
        Sequencer().arrive(key, 1, "e", 0)


def test_duplicates_are_refused_and_counted():
    s = Sequencer()
    s.arrive("k", 1, "e1", 0)
    with pytest.raises(DuplicateRank):
        s.arrive("k", 1, "again", 0)  # in flight
    s.arrive("k", 3, "e3", 0)
    with pytest.raises(DuplicateRank):
        s.arrive("k", 3, "again", 0)  # held
    s.complete("k", 1, 0)
    with pytest.raises(DuplicateRank):
        s.arrive("k", 1, "again", 0)  # released already
    assert s.counters["rejected_duplicate"] == 3


def test_skip_policy_releases_past_a_missing_rank_after_the_ttl():
    s = Sequencer(SequencerConfig(policy=ExpiryPolicy.SKIP, hold_ttl=1.0))
    s.arrive("k", 2, "e2", 0.0)
    s.arrive("k", 4, "e4", 0.5)
    assert s.expire(0.99) == []
    assert ranks(s.expire(1.0)) == [2]
    assert s.counters["gaps_skipped"] == 1 and s.counters["ranks_skipped"] == 1
    s.complete("k", 2, 1.1)
    assert ranks(s.expire(1.5)) == [4]  # the next gap (rank 3) skipped when 4 has waited 1 s
    assert s.counters["gaps_skipped"] == 2


def test_drop_policy_discards_held_events_and_keeps_waiting():
    s = Sequencer(SequencerConfig(policy=ExpiryPolicy.DROP, hold_ttl=1.0))
    s.arrive("k", 2, "e2", 0.0)
    s.arrive("k", 3, "e3", 0.5)
    assert s.expire(1.0) == []
    assert s.counters["expired_dropped"] == 1
    assert s.context("k") == (SeqStatus.PENDING, 1, 1)
    s.expire(1.5)
    assert s.counters["expired_dropped"] == 2
    assert s.context("k") == (SeqStatus.WAITING, 1, 0)
    assert ranks(s.arrive("k", 1, "e1", 2.0)) == [1]  # the missing rank still goes


def test_a_lost_completion_times_out_so_the_key_is_not_blocked():
    s = Sequencer(SequencerConfig(processing_ttl=2.0))
    s.arrive("k", 1, "e1", 0.0)
    s.arrive("k", 2, "e2", 0.0)
    assert ranks(s.expire(2.0)) == [2]
    assert s.counters["processing_timeouts"] == 1


def test_bounds_refuse_and_count():
    s = Sequencer(SequencerConfig(max_keys=1, max_held=1))
    s.arrive("a", 2, "x", 0)
    with pytest.raises(SequencerFull):
        s.arrive("b", 1, "y", 0)
    with pytest.raises(SequencerFull):
        s.arrive("a", 3, "z", 0)
    assert s.counters["rejected_full"] == 2


def test_idle_keys_are_forgotten():
    s = Sequencer(SequencerConfig(key_ttl=10.0))
    s.arrive("k", 1, "e", 0.0)
    s.complete("k", 1, 1.0)
    s.expire(11.0)
    assert s.context("k") is None and s.counters["keys_expired"] == 1


def test_a_release_after_an_idle_spell_times_out_at_its_own_deadline():
    # Rule 7: the idle key's timer is at key_ttl; the release must bring it earlier.
    s = Sequencer(SequencerConfig(processing_ttl=2.0, key_ttl=100.0))
    s.arrive("k", None, "e1", 0.0)
    s.complete("k", 1, 1.0)  # idle until 101
    s.arrive("k", None, "e2", 50.0)  # in flight until 52
    s.arrive("k", None, "e3", 50.0)
    assert s.expire(51.9) == []
    assert ranks(s.expire(52.0)) == [3]
    assert s.counters["processing_timeouts"] == 1


def test_the_timer_heap_holds_about_one_entry_per_key_not_one_per_event():
    # Rule 7: a busy key costs no heap entry per event.
    s = Sequencer(SequencerConfig(hold_ttl=5.0, processing_ttl=10.0, key_ttl=300.0))
    keys = [f"k{i}" for i in range(50)]
    now = 0.0
    for _ in range(200):
        now += 0.01
        for k in keys:
            s.arrive(k, None, k, now)
            s.arrive(k, None, k, now)
        for k in keys:
            while s.context(k)[0] is SeqStatus.PROCESSING:
                s.complete(k, s.context(k)[1], now)
        s.expire(now)
    assert len(s._timers) <= 2 * len(keys)
    assert s.counters["released"] == 2 * 200 * len(keys)


# -- properties ------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from("abc"), st.one_of(st.none(), st.integers(1, 12))),
        st.tuples(st.just("complete"), st.sampled_from("abc"), st.just(None)),
        st.tuples(st.just("time"), st.just(""), st.floats(0.0, 3.0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.sampled_from(list(ExpiryPolicy)))
def test_any_interleaving_keeps_order_and_accounts_for_every_event(steps, policy):
    s = Sequencer(SequencerConfig(policy=policy, hold_ttl=1.0, processing_ttl=2.0, key_ttl=5.0))
    now = 0.0
    released: dict[str, list[int]] = {}
    in_flight: dict[str, int] = {}
    accepted = 0
    seen_events: set[object] = set()

    def take(out):
        for r in [out] if isinstance(out, Release) else out or []:
            assert r.event not in seen_events, "released twice"
            seen_events.add(r.event)
            assert r.key not in in_flight, "two events of one key in flight"
            in_flight[r.key] = r.rank
            prev = released.setdefault(r.key, [])
            assert not prev or r.rank > prev[-1], "ranks out of order"
            prev.append(r.rank)

    for n, (op, key, arg) in enumerate(steps):
        for ctx in s._keys.values():  # what makes an assigned rank fresh (class invariant)
            assert all(ctx.seq <= r <= ctx.last_assigned for r in ctx.held)
            assert ctx.in_flight is None or ctx.in_flight <= ctx.last_assigned
            assert ctx.seq <= ctx.last_assigned + 1
        if op == "arrive":
            try:
                take(s.arrive(key, arg, (key, n), now))
                accepted += 1
            except DuplicateRank:
                pass
        elif op == "complete":
            if key in in_flight:
                take(s.complete(key, in_flight.pop(key), now))
        else:
            now += arg
            for r in s.expire(now):
                in_flight.pop(r.key, None)  # a timeout completed the previous one
                take([r])
            # An idle key forgotten after key_ttl starts a new sequence.
            for k in list(released):
                if s.context(k) is None:
                    del released[k]
            # a processing timeout may also have ended an in-flight event silently
            for k in list(in_flight):
                ctx = s.context(k)
                if ctx is None or ctx[0] is not SeqStatus.PROCESSING:
                    del in_flight[k]
    # Drain: complete what is in flight and let time pass until nothing is held.
    for _ in range(200):
        for k, r in list(in_flight.items()):
            del in_flight[k]
            take(s.complete(k, r, now))
        now += 1.0
        for r in s.expire(now):
            in_flight.pop(r.key, None)
            take([r])
        if s.held == 0 and not in_flight:
            break
    assert s.held == 0, "an event held forever"
    c = s.counters
    assert len(seen_events) + c["expired_dropped"] == accepted


# -- moving a key (rule 8) -----------------------------------------------------------------------


def test_a_state_carries_the_held_events_and_the_one_in_flight_and_adopt_resumes_there():
    s = Sequencer()
    for r in (1, 2, 4):
        s.arrive("k", r, f"e{r}", 0.0)
    st = s.state("k")
    assert (st.seq, st.last_assigned, st.events) == (1, 4, {1: "e1", 2: "e2", 4: "e4"})
    t = Sequencer()
    assert ranks(t.adopt(st, 1.0)) == [1]  # not complete: released again
    assert t.context("k") == (SeqStatus.PROCESSING, 1, 2)
    assert ranks(t.complete("k", 1, 1.1)) == [2]
    assert ranks(t.arrive("k", None, "e5", 1.2)) == []  # ranks continue past the last assigned
    assert t.state("k").last_assigned == 5
    assert t.complete("k", 2, 1.3) is None  # rank 3 missing: rank 4 waits
    assert t.context("k") == (SeqStatus.PENDING, 3, 2)


def test_adopt_leaves_complete_ranks_out_and_a_state_without_the_next_rank_waits():
    t = Sequencer(SequencerConfig(hold_ttl=1.0))
    assert t.adopt(KeyState("k", 3, 6, {2: "old", 5: "e5"}), 0.0) is None
    assert t.context("k") == (SeqStatus.PENDING, 3, 1)
    assert ranks(t.expire(1.5)) == [5]  # the gap expires as any other (skip)


def test_adopt_into_a_key_that_has_a_context_unites_them():
    t = Sequencer()
    t.arrive("k", 1, "e1", 0.0)
    assert t.adopt(KeyState("k", 1, 3, {1: "e1", 2: "e2", 3: "e3"}), 0.1) is None  # rank 1 is in flight here
    assert t.context("k") == (SeqStatus.PROCESSING, 1, 2)
    assert ranks(t.complete("k", 1, 0.2)) == [2]


def test_expiry_names_the_keys_it_changed_and_forget_drops_a_key():
    s = Sequencer(SequencerConfig(hold_ttl=1.0, processing_ttl=2.0, key_ttl=5.0))
    s.arrive("a", 2, "a2", 0.0)  # a gap: skipped at 1.0
    s.arrive("b", 1, "b1", 0.0)  # in flight: timed out at 2.0
    s.expire(3.0)
    assert sorted(s.expired_keys) == ["a", "b"]
    assert s.forget("a") is not None and "a" not in s and s.forget("a") is None
