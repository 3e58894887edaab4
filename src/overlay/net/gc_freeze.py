"""When a node process freezes what its full collections keep (``gc.freeze``; ``overlay.net.node`` rule 16).

A full (generation 2) pass of the cyclic GC visits every tracked object that
is not frozen, and every reference each one holds, while the node's loop
waits: 1.4 s at 15,000 subscriptions per node and 10.9 s at 160,000
(measured, issue 18 item 4) — past ``suspect_timeout``, so the node's peers
took it for dead.  Stored subscriptions are not tracked at all
(``overlay.channels.predicates`` rule 8), but the dicts and lists holding
them are, and so is whatever else a node keeps.

Rules:

1. A node process freezes everything once it has started (``gc.collect()``
   then ``gc.freeze()``): modules, classes, its config and tables live as
   long as it does.
2. After a full pass that took at least ``FREEZE_AFTER`` of CPU (the
   thread's: on a busy machine a small pass can wait long for a core, and
   its wall time says nothing of the heap), what survived it is frozen, from the collection's own ``stop`` callback: the
   pass has just found everything unreachable, so nothing frozen then is
   garbage.  The next full passes visit only what was made since, so a full
   pass costs about what the node gained since the last freeze, not what it
   holds.
3. Frozen objects are still freed by reference counting, as ever: the
   subscriptions, filters and exact tests (acyclic: predicates rule 8) and
   the containers of a channel dropped.  What a freeze keeps from the
   collector is a reference cycle that was alive at the freeze and dies
   later (a client connection's transport and protocol, a task): it stays
   until the run ends (rule 4).  Only objects alive at a freeze can stay so,
   each at most once, and a freeze needs a slow pass — the unfrozen heap has
   grown since the last one (a node under churn at a steady size keeps its
   passes short and freezes nothing).  At most ``MAX_FREEZES`` per run: the
   cycles kept are at most that many times what the node held in cycles at
   once (its connections and tasks, bounded by ``[limits]``).  Past it, full
   passes grow again, and every freeze is counted (``gc_freezes``) and
   logged.
4. A run that ends unfreezes (``gc.unfreeze``): a new run in the same
   process (a rejoin, ``net.node`` rule 14) collects what the old one left,
   then freezes afresh (rule 1).
5. ``FreezePolicy`` is the decision alone: the pass's CPU time comes with
   the call; the shell measures it and calls ``gc.freeze``.
6. A node process collects its young generation after ``YOUNG_THRESHOLD``
   new tracked objects, not CPython's 700 (``gc.set_threshold``; the older
   generations' thresholds unchanged), and a run that ends puts the
   process's thresholds back.  A young pass visits the young objects still
   alive — on a busy node the events in flight (kept in the outbox, waiting
   for receipts), a few thousand — so its cost is that working set, not
   what was allocated since: at 700 a node passed over it every few dozen
   events, and every tenth pass over the middle generation too.  Garbage
   in cycles waits at most that many objects more (a few MB).
"""

from __future__ import annotations

from typing import Final

__all__ = ["FREEZE_AFTER", "MAX_FREEZES", "YOUNG_THRESHOLD", "FreezePolicy"]

# Rule 2: a full pass taking this much CPU (s) freezes what survived it.
# Well below any sensible ``suspect_timeout`` (1.5 s by default), above what
# the passes of a node holding little take (a few ms once rule 1 froze the
# start-up state).
FREEZE_AFTER: Final = 0.05
# Rule 3: freezes per run.  Loading a million subscriptions on five nodes
# froze 67-71 times per node when the trigger was the pass's wall time on a
# machine busy with other work (fewer on CPU time); four times that leaves
# room for a node to keep growing.
MAX_FREEZES: Final = 256
# Rule 6: new tracked objects between two young passes (CPython: 700).
YOUNG_THRESHOLD: Final = 10_000


class FreezePolicy:
    """Rules 2 and 3 for one run: ``after_full_pass`` says whether to freeze now.

    Invariant: ``freezes <= limit``.
    """

    def __init__(self, after: float = FREEZE_AFTER, limit: int = MAX_FREEZES) -> None:
        self.after = after
        self.limit = limit
        self.freezes = 0

    def after_full_pass(self, cpu: float) -> bool:
        """A full pass took ``cpu`` seconds of CPU: True to freeze what survived it (counted)."""
        if cpu < self.after or self.freezes >= self.limit:
            return False
        self.freezes += 1
        return True

    @property
    def exhausted(self) -> bool:
        """Rule 3: no more freezes this run."""
        return self.freezes >= self.limit
