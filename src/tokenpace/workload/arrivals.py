"""Arrival processes (times in seconds from 0)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def poisson_arrivals(
    rng: np.random.Generator, rate_per_s: float, duration_s: float, max_requests: int
) -> npt.NDArray[np.float64]:
    """Poisson process of ``rate_per_s`` over ``[0, duration_s)``, at most ``max_requests``."""
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be positive, got {rate_per_s}")
    expected = int(rate_per_s * duration_s * 1.5) + 32
    gaps = rng.exponential(1.0 / rate_per_s, size=min(max_requests, expected))
    times = np.cumsum(gaps)
    return times[times < duration_s][:max_requests]
