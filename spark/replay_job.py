"""``spark-submit spark/replay_job.py RUN_DIR [--out DIR]``: the replay as a plain
Spark application (the same job ``overlay replay`` runs), for clusters where
jobs are submitted rather than driven from a laptop."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overlay_spark.replay import main

if __name__ == "__main__":
    sys.exit(main())
