"""A two-state Markov-modulated Poisson process: quiet periods and short bursts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.config import option, require_positive


@dataclass(frozen=True, slots=True)
class MmppArrivals:
    """Arrivals that switch between a base rate and ``burst_factor`` x the base rate.

    Sojourn times are exponential with means ``mean_base_s`` and ``mean_burst_s``; the
    process starts in the base state. The long-run mean rate is ``mean_rate_per_s``; the
    base rate follows: ``base = mean / (1 + (burst_factor - 1) * burst_fraction)`` with
    ``burst_fraction = mean_burst_s / (mean_base_s + mean_burst_s)``.
    """

    mean_rate_per_s: float = option(1.0, "Long-run mean arrival rate (requests/s).")
    burst_factor: float = option(3.0, "Burst rate as a multiple of the base rate.")
    mean_base_s: float = option(8.0, "Mean length of a quiet period (s).")
    mean_burst_s: float = option(2.0, "Mean length of a burst (s).")

    def __post_init__(self) -> None:
        require_positive(self, "mean_rate_per_s", "burst_factor", "mean_base_s", "mean_burst_s")

    @property
    def burst_fraction(self) -> float:
        return self.mean_burst_s / (self.mean_base_s + self.mean_burst_s)

    @property
    def base_rate_per_s(self) -> float:
        return self.mean_rate_per_s / (1 + (self.burst_factor - 1) * self.burst_fraction)

    def sample(
        self, rng: np.random.Generator, duration_s: float, max_requests: int
    ) -> npt.NDArray[np.float64]:
        """Arrival times in ``[0, duration_s)``, at most ``max_requests``, ascending."""
        times: list[float] = []
        start = 0.0
        in_burst = False
        while start < duration_s and len(times) < max_requests:
            mean_sojourn = self.mean_burst_s if in_burst else self.mean_base_s
            end = min(duration_s, start + float(rng.exponential(mean_sojourn)))
            rate = self.base_rate_per_s * (self.burst_factor if in_burst else 1.0)
            count = int(rng.poisson(rate * (end - start)))
            times.extend(np.sort(rng.uniform(start, end, size=count)).tolist())
            start = end
            in_burst = not in_burst
        return np.asarray(times[:max_requests], dtype=np.float64)
