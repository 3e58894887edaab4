"""``python -m overlay`` runs the CLI."""

import sys

# 130: the exit status of a command ended by SIGINT (overlay.cli rule 2).
INTERRUPTED = 130

try:
    from overlay.cli import main
except KeyboardInterrupt:  # Ctrl-C while the interpreter imports: no traceback either
    sys.exit(INTERRUPTED)

sys.exit(main())
