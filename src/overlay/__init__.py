"""overlay: a content-based publish/subscribe overlay with dynamic load balancing."""

__version__ = "0.1.0"
