"""PySpark replay of overlay captures (SPEC §13): ``overlay replay RUN_DIR``.

Modules, in the order the replay runs them:

* ``session``  — the SparkSession (local[*] unless ``--master``) and the
  progress line printed while Spark works;
* ``records``  — reads every ``node-*.ndjson`` of a run once, parses each record
  kind with its own schema (``spark/SCHEMA.md``), checks the headers;
* ``loads``    — per-slice d, dc, S, S/dc̄; T-windows of the recomputed load with
  and without migrations (the counterfactual); S around each migration;
* ``rematch``  — independent re-matching of the captured events against the
  captured subscriptions, compared with what the owners reported;
* ``audit``    — exactly-once delivery, lost and unmatched events, rank order;
* ``report``   — report.md, CSV tables and PNG plots;
* ``replay``   — the driver tying them together, with the exit code.

Everything that touches events is a DataFrame operation; only aggregates
(per slice, per window, per migration, counts and a few examples) reach the
driver.
"""

from overlay_spark.replay import ReplayResult, run_replay

__all__ = ["ReplayResult", "run_replay"]
