"""Step latency as a vLLM scheduler can measure it: from its own schedule/update calls."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepTimer:
    """Measures the latency of each step that computed tokens (seconds).

    vLLM calls ``schedule()`` then, once the step ran, ``update_from_output()``; with async
    scheduling the next ``schedule()`` comes before the previous update. While work runs
    back to back, a step's latency is the time between consecutive updates: the cadence at
    which every running request receives a token (the ITL). After an idle period it is the
    time from the step's own schedule call to its update.
    """

    last_latency_s: float | None = None
    _pending_starts: deque[float] = field(default_factory=deque)
    _last_end_s: float | None = None
    _busy_after_last_end: bool = False

    def scheduled(self, now_s: float, num_tokens: int) -> None:
        """Record a schedule call at ``now_s`` that scheduled ``num_tokens`` tokens."""
        if num_tokens > 0:
            self._pending_starts.append(now_s)

    def completed(self, now_s: float, num_tokens: int, still_busy: bool) -> float | None:
        """Record the update of the oldest outstanding step at ``now_s``; ``still_busy`` says
        whether requests remain. Returns the step's latency, or None for an empty step."""
        if num_tokens <= 0 or not self._pending_starts:
            return None
        start = self._pending_starts.popleft()
        if self._busy_after_last_end and self._last_end_s is not None:
            start = self._last_end_s
        latency = max(0.0, now_s - start)
        self._last_end_s = now_s
        self._busy_after_last_end = still_busy
        self.last_latency_s = latency
        return latency
