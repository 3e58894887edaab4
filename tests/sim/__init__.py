"""The recorded simulator traces (``golden``); the simulator itself is ``overlay.testing.sim``."""
