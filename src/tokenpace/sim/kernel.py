"""A deterministic discrete-event kernel.

Events are ordered by ``(time, priority, sequence_number)``: equal times resolve by priority
(lower first), then by scheduling order, so the same inputs always give the same log.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

EventHandler = Callable[[float], None]


@dataclass(order=True, frozen=True, slots=True)
class _Event:
    time_s: float
    priority: int
    sequence_number: int
    handler: EventHandler = field(compare=False)


class EventKernel:
    """Virtual clock plus event heap. ``now_s`` only moves forward."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s
        self._heap: list[_Event] = []
        self._next_sequence = 0
        self.num_events_handled = 0

    def schedule(self, time_s: float, priority: int, handler: EventHandler) -> None:
        """Run ``handler(time_s)`` at ``time_s``; raises ValueError for a time in the past."""
        if time_s < self.now_s:
            raise ValueError(f"cannot schedule at {time_s} s, before now ({self.now_s} s)")
        heapq.heappush(self._heap, _Event(time_s, priority, self._next_sequence, handler))
        self._next_sequence += 1

    def run(self, until_s: float = float("inf")) -> None:
        """Handle events in order until the heap is empty or the next event is after
        ``until_s``."""
        while self._heap and self._heap[0].time_s <= until_s:
            event = heapq.heappop(self._heap)
            self.now_s = event.time_s
            event.handler(event.time_s)
            self.num_events_handled += 1

    def __len__(self) -> int:
        return len(self._heap)
