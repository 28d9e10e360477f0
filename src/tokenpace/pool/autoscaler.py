"""Autoscaling rule: instances = ceil(load / target per instance), within [min, max]."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """Concurrency-based scaling, as Knative-style serverless platforms do it.

    ``load`` is the number of outstanding requests in the pool (waiting or running);
    ``target_per_instance`` how many one instance should carry. Zero load with
    ``min_instances = 0`` gives zero instances: the pool scales to zero once idle
    containers pass their keep-alive.
    """

    target_per_instance: float
    min_instances: int
    max_instances: int

    def desired(self, load: int) -> int:
        """Instances wanted for ``load`` outstanding requests."""
        wanted = math.ceil(load / self.target_per_instance) if load > 0 else 0
        return max(self.min_instances, min(self.max_instances, wanted))


class LoadWindow:
    """The highest load seen over the last ``window_s`` seconds (a sliding maximum), so
    the pool scales down only after load has stayed low for a while (Knative's stable
    window) while it scales up on the load of the moment."""

    def __init__(self, window_s: float) -> None:
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s}")
        self.window_s = window_s
        # [load, time it stopped being in effect (None: still is)], loads decreasing.
        self._entries: deque[list[float | None]] = deque()

    def record(self, now_s: float, load: int) -> None:
        """The load is ``load`` from ``now_s`` on."""
        entries = self._entries
        if entries and entries[-1][1] is None:
            entries[-1][1] = now_s
        while entries and (entries[-1][0] or 0) <= load:
            entries.pop()
        entries.append([float(load), None])

    def peak(self, now_s: float) -> int:
        """The largest load in effect during ``[now_s - window_s, now_s]`` (0 before any
        record)."""
        horizon = now_s - self.window_s
        entries = self._entries
        while entries and entries[0][1] is not None and entries[0][1] <= horizon:
            entries.popleft()
        return int(entries[0][0] or 0) if entries else 0
