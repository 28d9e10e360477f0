"""Poisson arrivals whose lengths are drawn from observed (prompt, output) pairs, e.g. a
trace's: how the capacity of a trace's mixture is measured without its arrival times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenpace.core.config import option, require_positive
from tokenpace.workload.arrivals import poisson_arrivals
from tokenpace.workload.spec import RequestSpec


@dataclass(frozen=True, slots=True)
class EmpiricalWorkload:
    """Poisson arrivals at ``rate_per_s`` over ``duration_s`` (or, with ``num_requests``,
    exactly that many arrivals, however long they take: a replay's size); each request
    takes a (prompt tokens, true output tokens) pair drawn uniformly with replacement from
    ``lengths`` and asks for ``max_tokens`` (at least its true length)."""

    name: str = option("empirical", "Workload name used in results.")
    rate_per_s: float = option(1.0, "Mean arrival rate (requests/s).")
    duration_s: float = option(20.0, "Arrival window (s).")
    lengths: tuple[tuple[int, int], ...] = option((), "Observed (prompt, output) token pairs.")
    max_tokens: int = option(1, "Client max_tokens of every request.")
    max_requests: int = option(100_000, "Cap on the number of requests.")
    num_requests: int | None = option(
        None, "Draw exactly this many arrivals instead of filling duration_s."
    )

    def __post_init__(self) -> None:
        require_positive(self, "rate_per_s", "duration_s", "max_tokens", "max_requests")
        if self.num_requests is not None and self.num_requests <= 0:
            raise ValueError(f"num_requests must be positive, got {self.num_requests}")
        if not self.lengths:
            raise ValueError("EmpiricalWorkload.lengths must not be empty")
        longest = max(output for _, output in self.lengths)
        if longest > self.max_tokens:
            raise ValueError(
                f"EmpiricalWorkload.max_tokens={self.max_tokens} is below the longest "
                f"output {longest}"
            )

    def generate(
        self, rng: np.random.Generator, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]:
        """Draw the request list (``prompts`` is ignored: traces carry no text)."""
        if self.num_requests is not None:
            # Generous window: the cap, not the window, ends the draw.
            window = 2 * self.num_requests / self.rate_per_s + 60
            arrivals = poisson_arrivals(rng, self.rate_per_s, window, self.num_requests)
        else:
            arrivals = poisson_arrivals(rng, self.rate_per_s, self.duration_s, self.max_requests)
        picks = rng.integers(len(self.lengths), size=len(arrivals))
        return [
            RequestSpec(
                arrival_s=float(arrivals[i]),
                num_prompt_tokens=self.lengths[int(picks[i])][0],
                max_tokens=self.max_tokens,
                output_tokens=self.lengths[int(picks[i])][1],
            )
            for i in range(len(arrivals))
        ]
