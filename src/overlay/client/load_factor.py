"""The load factor a subscriber reports on every ack (SPEC §11, seed 000).

    LF   = clamp(Wq·LFq + Wet·LFet, 0, 1)
    LFq  = QUP / HLFM        QUP: queue use (queued / capacity), HLFM: high-load watermark
    LFet = (ATT − TTT) / TTS ATT: mean processing time over the last ``window`` s,
                             TTT: threshold, TTS: scale; 0 when ATT < TTT

Rules (seed 000): LFq below ``min_pct`` counts as 0; once QUP reaches HLFM,
LFq is 1 and stays 1 while LFq stays above ``max_pct``.  Computed from the
client's real queue and real processing times; no clock is read here.

One rule of ours: when the node says how long it waits for an answer (its
``ack_timeout``, the *budget*), a backlog that would take longer than
``BACKLOG_SHARE`` of it to work through (queued × mean processing time)
makes LF 1 — the instance is ineligible — so a slow group instance stops
being chosen before its copies time out, however large its queue.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import msgspec

__all__ = ["LoadFactor", "LoadFactorConfig"]

WINDOW_SECONDS: Final = 2.0
# The share of the node's ack window a backlog may take before LF is 1: half,
# so the instance stops getting events well before the first of them would
# be revoked.
BACKLOG_SHARE: Final = 0.5


class LoadFactorConfig(msgspec.Struct, frozen=True):
    wq: float = 0.5
    wet: float = 0.5
    hlfm: float = 0.8  # high-load watermark, as a fraction of the queue capacity
    min_pct: float = 0.1
    max_pct: float = 0.95
    ttt: float = 0.005  # seconds
    tts: float = 0.050  # seconds
    window: float = WINDOW_SECONDS


class LoadFactor:
    """Invariant: ``value`` is in [0, 1]; ``_times`` only holds samples of the last window."""

    def __init__(self, config: LoadFactorConfig | None = None) -> None:
        self.config = config or LoadFactorConfig()
        self._times: deque[tuple[float, float]] = deque()  # (finished at, duration)
        self._sum = 0.0
        self._saturated = False
        self.value = 0.0

    def processed(self, duration: float, now: float) -> None:
        self._times.append((now, duration))
        self._sum += duration
        self._trim(now)

    def _trim(self, now: float) -> None:
        horizon = now - self.config.window
        times = self._times
        while times and times[0][0] < horizon:
            self._sum -= times.popleft()[1]

    def lf_queue(self, queued: int, capacity: int) -> float:
        cfg = self.config
        qup = queued / capacity if capacity > 0 else 0.0
        lfq = qup / cfg.hlfm
        if lfq >= 1.0:
            self._saturated = True
        elif self._saturated and lfq < cfg.max_pct:
            self._saturated = False
        if self._saturated:
            return 1.0
        return 0.0 if lfq < cfg.min_pct else lfq

    def mean_time(self, now: float) -> float:
        """ATT: the mean processing time over the window (0 without samples)."""
        self._trim(now)
        return self._sum / len(self._times) if self._times else 0.0

    def lf_time(self, now: float) -> float:
        att = self.mean_time(now)
        cfg = self.config
        return 0.0 if att < cfg.ttt else (att - cfg.ttt) / cfg.tts

    def update(self, queued: int, capacity: int, now: float, budget: float = 0.0) -> float:
        """The LF to report now; ``budget``: the node's ack window in seconds (0: unknown)."""
        cfg = self.config
        lf = cfg.wq * self.lf_queue(queued, capacity) + cfg.wet * self.lf_time(now)
        if budget > 0 and queued * self.mean_time(now) >= BACKLOG_SHARE * budget:
            lf = 1.0  # the backlog outlasts the budget (module docstring)
        self.value = min(1.0, max(0.0, lf))
        return self.value
