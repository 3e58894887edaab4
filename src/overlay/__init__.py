"""overlay: a content-based publish/subscribe overlay with dynamic load balancing."""

# First, before any module of the hot path is imported: a compiled build whose
# sources were edited since runs as pure Python (overlay.build rule 2).
from overlay import build as build

__version__ = "0.1.0"
