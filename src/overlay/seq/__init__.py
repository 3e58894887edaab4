"""Ordered delivery per sequence key (SPEC §10)."""

from overlay.seq.sequencer import (
    DuplicateRank,
    ExpiryPolicy,
    InvalidRank,
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
    "Release",
    "SeqStatus",
    "Sequencer",
    "SequencerConfig",
    "SequencerFull",
]
