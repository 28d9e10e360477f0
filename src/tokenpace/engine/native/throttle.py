"""A native engine that can be slowed on purpose, to test what follows the engine's speed.

Online calibration and pacing must follow an engine that becomes slower while it serves
(fewer threads, a lower clock, a noisy neighbour). Taking threads away only slows a step
measurably on an idle machine; a sleep inside the step slows it by a known amount however
loaded the machine is. This is a diagnostic for tests and benchmarks; ``tokenpace serve``
never builds one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from tokenpace.core.step import ScheduledChunk, StepResult
from tokenpace.engine.native.config import NativeEngineConfig
from tokenpace.engine.native.engine import Clock, NativeEngine
from tokenpace.engine.native.loading import LoadedModel


class ThrottledEngine(NativeEngine):
    """A ``NativeEngine`` whose every step also sleeps ``delay_s`` seconds (0: none).

    The sleep runs after the forward pass and counts in the step's ``latency_s`` as
    measured on the engine's clock, so a step reports the wall time it really took.
    ``delay_s`` may change between steps."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: NativeEngineConfig,
        clock: Clock,
        rng: np.random.Generator,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(loaded, config, clock, rng)
        self._sleep = sleep
        self.delay_s = 0.0

    def execute(self, chunks: Sequence[ScheduledChunk]) -> StepResult:
        result = super().execute(chunks)
        if self.delay_s <= 0:
            return result
        start = self._clock()
        self._sleep(self.delay_s)
        return replace(result, latency_s=result.latency_s + self._clock() - start)
