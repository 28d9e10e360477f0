"""The paper's main experiment: Poisson 18 req/s for 60 s, at most 250 requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenpace.core.config import option, require_positive
from tokenpace.workload.arrivals import poisson_arrivals
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.spec import RequestSpec, draw_specs

PAPER_PROMPT_LENGTHS = LengthMixture(((30, 80), (120, 250), (350, 512)), (0.6, 0.3, 0.1))
PAPER_OUTPUT_LENGTHS = LengthMixture.fixed((20, 50, 200), (0.5, 0.3, 0.2))


@dataclass(frozen=True, slots=True)
class PoissonWorkload:
    """Poisson arrivals with prompt/output length mixtures (defaults: the paper's)."""

    name: str = option("main", "Workload name used in results.")
    rate_per_s: float = option(18.0, "Mean arrival rate (requests/s).")
    duration_s: float = option(60.0, "Arrival window (s).")
    max_requests: int = option(250, "Cap on the number of requests.")
    prompt_lengths: LengthMixture = option(PAPER_PROMPT_LENGTHS, "Prompt token mixture.")
    output_lengths: LengthMixture = option(
        PAPER_OUTPUT_LENGTHS, "True output lengths (where each request stops on EOS)."
    )
    max_tokens: int | None = option(
        None,
        "Client max_tokens sent with every request (the only length a scheduler sees); "
        "None: the output mixture's largest length.",
    )

    def __post_init__(self) -> None:
        require_positive(self, "rate_per_s", "duration_s", "max_requests")

    def generate(
        self, rng: np.random.Generator, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]:
        """Draw the request list. Prompt text, when given, is taken in rotation from a
        random start; token counts always come from the mixtures."""
        arrivals = poisson_arrivals(rng, self.rate_per_s, self.duration_s, self.max_requests)
        return draw_specs(
            rng, arrivals, self.prompt_lengths, self.output_lengths, prompts,
            self.max_tokens or self.output_lengths.largest,
        )  # fmt: skip
