"""``bench/fuzz.py``'s node under coverage: ``fuzz_node.py DATA_FILE PYTHON -m overlay ARGS…``.

The ``NodeProcesses`` prefix of a fuzz run: runs ``overlay`` (``ARGS``) in
this process with ``coverage`` measuring the branch arcs of ``overlay``,
saved to ``DATA_FILE`` when the node stops (SIGTERM ends ``overlay node``
cleanly).  Nothing of ``overlay`` is imported before the measurement
starts, so its modules' own lines count too.
"""

from __future__ import annotations

import runpy
import sys

import coverage


def main(argv: list[str]) -> int:
    data_file, rest = argv[0], argv[1:]
    args = rest[rest.index("overlay") + 1 :]
    cov = coverage.Coverage(data_file=data_file, branch=True, source=["overlay"])
    cov.start()
    sys.argv = ["overlay", *args]
    try:
        runpy.run_module("overlay", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    finally:
        cov.stop()
        cov.save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
