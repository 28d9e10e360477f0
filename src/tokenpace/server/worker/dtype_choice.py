"""``--dtype auto`` in a serving worker: load the model in each candidate precision, time
decode steps at the batch the policy expects, keep the faster engine.

Which precision is faster depends on the hardware and on the batch: without native
bfloat16 instructions a CPU converts every bfloat16 operand, which costs more than the
halved memory traffic saves once the batch grows, while at batch 1 the memory saved can
win. So the choice is measured on the machine at hand, at the expected batch (the policy's
saturation batch B0, and at least a few requests: ``native_backend.DTYPE_MIN_BATCH``),
never assumed.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

CANDIDATES = ("float32", "bfloat16")

E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """The precision kept and, per candidate, the median decode step (milliseconds) at
    ``batch`` requests; ``step_ms`` is empty when the dtype was given, not measured."""

    dtype: str
    batch: int
    step_ms: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        if not self.step_ms:
            return f"dtype {self.dtype}"
        times = ", ".join(f"{d} {ms:.1f} ms" for d, ms in self.step_ms)
        return f"dtype auto chose {self.dtype} (decode step at batch {self.batch}: {times})"


@dataclass(frozen=True, slots=True)
class Chosen(Generic[E]):
    engine: E
    choice: DtypeChoice


def choose_dtype(
    load: Callable[[str], E],
    warm_up: Callable[[E], object],
    decode_steps_s: Callable[[E, int], list[float]],
    batch: int,
    candidates: tuple[str, ...] = CANDIDATES,
) -> Chosen[E]:
    """Load an engine per candidate (one at a time; a slower one is dropped before the
    next loads), run ``warm_up(engine)`` (first-call costs), time it with
    ``decode_steps_s(engine, batch)`` (decode step latencies, seconds) and return the
    engine with the lowest median step. Ties keep the earlier candidate."""
    best: tuple[float, str, E] | None = None
    times: list[tuple[str, float]] = []
    for dtype in candidates:
        engine = load(dtype)
        warm_up(engine)
        steps = decode_steps_s(engine, batch)
        median_s = statistics.median(steps) if steps else float("inf")
        times.append((dtype, median_s * 1000.0))
        if best is None or median_s < best[0]:
            best = (median_s, dtype, engine)
        del engine
        gc.collect()
    assert best is not None, "no dtype candidates"
    return Chosen(best[2], DtypeChoice(best[1], batch, tuple(times)))
