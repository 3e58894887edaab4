"""The node core, one SPEC concept per module (see the README's table).

``overlay.node.core.NodeCore`` is the thin dispatcher the shell and the
simulator drive; each component it composes owns its state:

* ``context``  — what every component shares: config, tables, stats, clock, ids;
* ``ordering`` — ordered delivery per sequence key (SPEC §10).
"""
