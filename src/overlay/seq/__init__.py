"""Ordered delivery per sequence key (SPEC §10)."""

from overlay.seq.copies import KeyCopies
from overlay.seq.sequencer import (
    DuplicateRank,
    ExpiryPolicy,
    InvalidRank,
    KeyState,
    Release,
    SeqStatus,
    Sequencer,
    SequencerConfig,
    SequencerFull,
)

__all__ = [
    "DuplicateRank",
    "ExpiryPolicy",
    "InvalidRank",
    "KeyCopies",
    "KeyState",
    "Release",
    "SeqStatus",
    "Sequencer",
    "SequencerConfig",
    "SequencerFull",
]
