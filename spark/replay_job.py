"""``spark-submit spark/replay_job.py RUN_DIR [--out DIR] …``: ``overlay replay``
as a plain Spark application, for clusters where jobs are submitted rather
than driven from a laptop.  The same command line, checks and exit codes as
``overlay replay`` (0 passed, 1 a validation failed, 2 a bad argument or an
unreadable capture); the submitting Python needs ``overlay[replay]`` installed.
"""

import sys

from overlay.cli import main

if __name__ == "__main__":
    sys.exit(main(["replay", *sys.argv[1:]]))
