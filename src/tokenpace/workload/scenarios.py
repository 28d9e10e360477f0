"""The pool scenarios: the paper's four loads plus KV pressure and prefill-heavy traffic.

- ``low``, ``medium``, ``high``, ``burst``: prompts of 50/200/800 tokens and outputs of
  20/50/200 tokens, each with probabilities 0.5/0.3/0.2 (paper §VI-B.6). The paper gives no
  rates, so they are fractions of the measured SLO knee (``tokenpace.bench.capacity``):
  low 0.5, medium 0.8, high 1.2 (Poisson); burst is a Markov-modulated Poisson process
  averaging 0.8 whose bursts (mean 2 s, one every ~10 s) run at 3x the quiet rate.
- ``kv_pressure``: conversation-shaped lengths (``CONVERSATION_PROMPT_LENGTHS`` and
  ``CONVERSATION_OUTPUT_LENGTHS``, fitted to the quantiles of the Azure 2023 conversation
  trace) on GPUs whose KV cache holds ``KV_PRESSURE_BLOCKS`` blocks, at 1.2x its own knee.
- ``prefill_heavy``: code-completion / RAG-like requests, prompts of 1,000-4,000 tokens and
  outputs of 8-64, at 1.2x its own knee.

Every request stops at its drawn output length; the client sends the mixture's largest
length as ``max_tokens`` (a loose cap). Each run spans ``duration_s`` of arrivals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

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
# The Azure 2023 conversation trace's quantiles (its README: prompts p50 1,020, p90 2,735,
# p99 4,142, mean 1,155; outputs p50 129, p90 424, p99 601, max 1,000, mean 211) as uniform
# ranges between them; the mixtures' means are 1,291 and 199 tokens (uniform ranges put
# more mass at the top of each range than the trace does).
CONVERSATION_PROMPT_LENGTHS = LengthMixture(
    ((2, 1020), (1021, 1500), (1501, 2735), (2736, 4142), (4143, 6000)),
    (0.5, 0.2, 0.2, 0.09, 0.01),
)
CONVERSATION_OUTPUT_LENGTHS = LengthMixture(
    ((7, 129), (130, 424), (425, 601), (602, 1000)), (0.5, 0.4, 0.09, 0.01)
)
PREFILL_HEAVY_PROMPT_LENGTHS = LengthMixture(((1000, 4000),), (1.0,))
PREFILL_HEAVY_OUTPUT_LENGTHS = LengthMixture(((8, 64),), (1.0,))
# KV blocks per GPU in the kv_pressure scenario: the profile's model on a 16 GB GPU at 0.9
# memory utilisation: 14.4 GB - 6.4 GB weights - 2 GB activations = 6 GB of KV cache at
# 1.75 MiB per 16-token block = 3,270 blocks (52,320 tokens, ~40 conversation requests).
KV_PRESSURE_BLOCKS = 3270

PAPER_SCENARIO_NAMES = ("low", "medium", "high", "burst")
SCENARIO_NAMES = (*PAPER_SCENARIO_NAMES, "kv_pressure", "prefill_heavy")
_LOAD_FACTORS = {
    "low": 0.5, "medium": 0.8, "high": 1.2, "burst": 0.8, "kv_pressure": 1.2,
    "prefill_heavy": 1.2,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class MmppWorkload:
    """MMPP arrivals with prompt/output length mixtures."""

    name: str = option("burst", "Workload name used in results.")
    arrivals: MmppArrivals = option(MmppArrivals(), "The modulated arrival process.")
    duration_s: float = option(20.0, "Arrival window (s).")
    max_requests: int = option(100_000, "Cap on the number of requests.")
    prompt_lengths: LengthMixture = option(SCENARIO_PROMPT_LENGTHS, "Prompt token mixture.")
    output_lengths: LengthMixture = option(
        SCENARIO_OUTPUT_LENGTHS, "True output lengths (where each request stops on EOS)."
    )
    max_tokens: int | None = option(
        None, "Client max_tokens of every request; None: the output mixture's largest length."
    )

    def __post_init__(self) -> None:
        require_positive(self, "duration_s", "max_requests")

    def generate(
        self, rng: np.random.Generator, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]:
        """Draw the request list (prompt text, when given, in rotation from a random start)."""
        times = self.arrivals.sample(rng, self.duration_s, self.max_requests)
        return draw_specs(
            rng, times, self.prompt_lengths, self.output_lengths, prompts,
            self.max_tokens or self.output_lengths.largest,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    """How long each scenario run is."""

    duration_s: float = option(20.0, "Arrival window of each scenario run (s).")

    def __post_init__(self) -> None:
        require_positive(self, "duration_s")


def scenario_capacity_rps(profile: EngineProfile, num_containers: int) -> float:
    """An analytical capacity estimate for the paper's mixtures (requests/s, see
    ``tokenpace.pool.capacity``); the measured knee replaces it in the bench."""
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


def scenario_mixture(name: str) -> tuple[LengthMixture, LengthMixture]:
    """(prompt, output) length mixtures of scenario ``name``."""
    load_factor(name)  # validates the name
    if name == "kv_pressure":
        return CONVERSATION_PROMPT_LENGTHS, CONVERSATION_OUTPUT_LENGTHS
    if name == "prefill_heavy":
        return PREFILL_HEAVY_PROMPT_LENGTHS, PREFILL_HEAVY_OUTPUT_LENGTHS
    return SCENARIO_PROMPT_LENGTHS, SCENARIO_OUTPUT_LENGTHS


def knee_workload(name: str, config: ScenarioConfig | None = None) -> PoissonWorkload:
    """The Poisson workload whose rate the capacity search varies for scenario ``name``:
    its mixtures, its client cap and its arrival window (rate 1 req/s as a placeholder)."""
    config = config or ScenarioConfig()
    prompts, outputs = scenario_mixture(name)
    return PoissonWorkload(
        name=name, rate_per_s=1.0, duration_s=config.duration_s, max_requests=100_000,
        prompt_lengths=prompts, output_lengths=outputs,
    )  # fmt: skip


def build_scenario(
    name: str, capacity_rps: float, config: ScenarioConfig | None = None
) -> Workload:
    """The workload of scenario ``name`` for a pool whose knee is ``capacity_rps``
    requests/s."""
    config = config or ScenarioConfig()
    rate = load_factor(name) * capacity_rps
    if name == "burst":
        return MmppWorkload(
            name=name, arrivals=MmppArrivals(mean_rate_per_s=rate), duration_s=config.duration_s
        )
    return replace(knee_workload(name, config), rate_per_s=rate)


def scenario_workloads(
    profile: EngineProfile, num_containers: int, config: ScenarioConfig | None = None
) -> dict[str, Workload]:
    """The paper's four scenarios, by name, at fractions of the analytical capacity
    estimate (``scenario_capacity_rps``): what real-engine runs and sensitivity presets use
    where a measured knee is not available."""
    capacity = scenario_capacity_rps(profile, num_containers)
    return {name: build_scenario(name, capacity, config) for name in PAPER_SCENARIO_NAMES}
