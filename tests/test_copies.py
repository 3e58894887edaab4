"""overlay.seq.copies: what a key's backup keeps of its home's sequencer."""

from __future__ import annotations

from overlay.seq import KeyCopies, KeyState


def test_arrivals_and_advances_keep_exactly_what_is_not_complete() -> None:
    c = KeyCopies(max_keys=10, max_held=10)
    for r in (1, 2, 3):
        c.arrived("k", r, f"e{r}")
    c.advanced("k", 3)  # ranks 1 and 2 complete
    assert c.state("k") == KeyState("k", 3, 3, {3: "e3"})
    c.advanced("k", 2)  # never backwards
    c.arrived("k", 1, "late")  # below the sequence rank: complete already
    assert c.state("k") == KeyState("k", 3, 3, {3: "e3"})


def test_put_replaces_merge_unites_and_take_removes() -> None:
    c = KeyCopies(max_keys=10, max_held=10)
    c.arrived("k", 5, "e5")
    c.put(KeyState("k", 2, 3, {2: "e2", 3: "e3"}))
    assert c.state("k") == KeyState("k", 2, 3, {2: "e2", 3: "e3"})
    c.merge(KeyState("k", 3, 6, {3: "e3", 6: "e6"}))
    assert c.state("k") == KeyState("k", 3, 6, {3: "e3", 6: "e6"})
    assert c.take("k") == KeyState("k", 3, 6, {3: "e3", 6: "e6"})
    assert "k" not in c and c.take("k") is None


def test_the_bounds_refuse_and_count() -> None:
    c = KeyCopies(max_keys=2, max_held=1)
    c.arrived("a", 1, "a1")
    c.arrived("a", 2, "a2")  # one held and one in flight: the home's most
    c.arrived("a", 3, "a3")
    c.arrived("b", 1, "b1")
    c.arrived("c", 1, "c1")
    assert sorted(c.key_list()) == ["a", "b"]
    assert c.state("a").events == {1: "a1", 2: "a2"}
    assert c.counters["copies_refused"] == 2


def test_a_released_state_stays_released_until_its_rank_completes() -> None:
    c = KeyCopies(max_keys=10, max_held=10)
    c.merge(KeyState("k", 4, 5, {4: "e4", 5: "e5"}, released=True))  # a live home's handover
    c.merge(KeyState("k", 4, 5, {4: "e4", 5: "e5"}))  # the backup's copy of the same
    assert c.state("k") == KeyState("k", 4, 5, {4: "e4", 5: "e5"}, released=True)
    c.advanced("k", 5)  # its completion, passed on
    assert c.state("k") == KeyState("k", 5, 5, {5: "e5"}, released=False)
