"""``overlay.node.journal.latest``: what ``/balancing`` answers, by time.

A state change is stamped with the close of its slice but recorded when the
slice's loads are in, an abort with the start of its session: entries
recorded after others can be older.  test_admin's check that ``/balancing``
lists its entries oldest first failed on a busy machine for that reason, and
``since`` stopped at the first older entry, hiding the newer ones behind it.
"""

from __future__ import annotations

from collections import Counter

from overlay.node.journal import Journal, latest

MOVES = ("decision", "migration", "abort", "state")


def journal_with_a_late_state_change() -> Journal:
    j = Journal(0, Counter())
    j.record("decision", 10.0, phase="receivers", candidates=[{"node": 1}])
    j.record("migration", 10.4, session=1)
    j.record("state", 10.2, old="overloaded", new="normal")  # its slice closed at 10.2
    j.record("abort", 10.3, session=2)  # its session started at 10.3
    j.record("decision", 10.5, phase="receivers", candidates=[])
    return j


def times(entries: list[dict[str, object]]) -> list[object]:
    return [e["time"] for e in entries]


def test_entries_come_oldest_first_by_time_whatever_order_they_were_recorded_in() -> None:
    j = journal_with_a_late_state_change()
    assert times(latest(j.entries, 10, MOVES)) == [10.0, 10.2, 10.3, 10.4, 10.5]
    assert times(latest(j.entries, 2, MOVES)) == [10.4, 10.5]  # the latest two by time


def test_since_finds_every_newer_entry_behind_an_older_one() -> None:
    j = journal_with_a_late_state_change()
    # Recorded last-but-one and last: the abort (10.3) and the idle ranking (10.5);
    # the migration (10.4) sits before them and is newer than since too.
    assert times(latest(j.entries, 10, MOVES, since=10.35)) == [10.4, 10.5]


def test_kinds_and_idle_rankings_are_left_out_as_asked() -> None:
    j = journal_with_a_late_state_change()
    assert times(latest(j.entries, 10, ("state", "abort"))) == [10.2, 10.3]
    assert times(latest(j.entries, 10, MOVES, idle=False)) == [10.0, 10.2, 10.3, 10.4]


def test_entries_of_one_time_keep_their_recorded_order() -> None:
    j = Journal(0, Counter())
    for session in range(4):
        j.record("migration", 5.0, session=session)
    assert [e["session"] for e in latest(j.entries, 3, MOVES)] == [1, 2, 3]
