"""``python -m overlay`` runs the CLI."""

import sys

from overlay.cli import main

sys.exit(main())
