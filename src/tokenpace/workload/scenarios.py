"""The paper's four load scenarios: low, medium, high and burst.

Prompts of 50/200/800 tokens and outputs of 20/50/200 tokens, each with probabilities
0.5/0.3/0.2 (paper §VI-B.6). The paper gives no rates, so they are fractions of the pool's
capacity (``tokenpace.pool.capacity``): low 0.5, medium 0.8, high 1.2 (Poisson); burst is a
Markov-modulated Poisson process averaging 0.8 whose bursts (mean 2 s, one every ~10 s)
run at 3x the quiet rate. Each run spans ``duration_s`` of arrivals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.capacity import pool_capacity_rps
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.main_experiment import PoissonWorkload
from tokenpace.workload.mmpp import MmppArrivals
from tokenpace.workload.spec import RequestSpec, Workload, draw_specs

SCENARIO_PROMPT_LENGTHS = LengthMixture.fixed((50, 200, 800), (0.5, 0.3, 0.2))
SCENARIO_OUTPUT_LENGTHS = LengthMixture.fixed((20, 50, 200), (0.5, 0.3, 0.2))
SCENARIO_NAMES = ("low", "medium", "high", "burst")
_LOAD_FACTORS = {"low": 0.5, "medium": 0.8, "high": 1.2, "burst": 0.8}


@dataclass(frozen=True, slots=True)
class MmppWorkload:
    """MMPP arrivals with prompt/output length mixtures."""

    name: str = option("burst", "Workload name used in results.")
    arrivals: MmppArrivals = option(MmppArrivals(), "The modulated arrival process.")
    duration_s: float = option(20.0, "Arrival window (s).")
    max_requests: int = option(100_000, "Cap on the number of requests.")
    prompt_lengths: LengthMixture = option(SCENARIO_PROMPT_LENGTHS, "Prompt token mixture.")
    output_lengths: LengthMixture = option(SCENARIO_OUTPUT_LENGTHS, "Output token mixture.")

    def __post_init__(self) -> None:
        require_positive(self, "duration_s", "max_requests")

    def generate(
        self, rng: np.random.Generator, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]:
        """Draw the request list (prompt text, when given, in rotation from a random start)."""
        times = self.arrivals.sample(rng, self.duration_s, self.max_requests)
        return draw_specs(rng, times, self.prompt_lengths, self.output_lengths, prompts)


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    """How long each scenario run is."""

    duration_s: float = option(20.0, "Arrival window of each scenario run (s).")

    def __post_init__(self) -> None:
        require_positive(self, "duration_s")


def scenario_capacity_rps(profile: EngineProfile, num_containers: int) -> float:
    """The pool capacity the scenario rates are fractions of (requests/s)."""
    return pool_capacity_rps(
        profile, SCENARIO_PROMPT_LENGTHS, SCENARIO_OUTPUT_LENGTHS, num_containers
    )


def load_factor(name: str) -> float:
    """Mean arrival rate of scenario ``name`` as a fraction of pool capacity."""
    try:
        return _LOAD_FACTORS[name]
    except KeyError:
        raise ValueError(
            f"unknown scenario {name!r}; valid choices: {', '.join(SCENARIO_NAMES)}"
        ) from None


def build_scenario(
    name: str, capacity_rps: float, config: ScenarioConfig | None = None
) -> Workload:
    """The workload of scenario ``name`` for a pool of ``capacity_rps`` requests/s."""
    config = config or ScenarioConfig()
    rate = load_factor(name) * capacity_rps
    if name == "burst":
        return MmppWorkload(
            name=name, arrivals=MmppArrivals(mean_rate_per_s=rate), duration_s=config.duration_s
        )
    return PoissonWorkload(
        name=name,
        rate_per_s=rate,
        duration_s=config.duration_s,
        max_requests=100_000,
        prompt_lengths=SCENARIO_PROMPT_LENGTHS,
        output_lengths=SCENARIO_OUTPUT_LENGTHS,
    )


def scenario_workloads(
    profile: EngineProfile, num_containers: int, config: ScenarioConfig | None = None
) -> dict[str, Workload]:
    """All four scenarios, by name, in the paper's order, for a pool of that size."""
    capacity = scenario_capacity_rps(profile, num_containers)
    return {name: build_scenario(name, capacity, config) for name in SCENARIO_NAMES}
