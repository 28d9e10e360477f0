"""Workloads sized for a real engine on a CPU: the paper's main experiment, the ``high``
scenario and the ``kv_pressure`` scenario, their rates scaled to the engine's profile.

- ``main``: the paper's mixtures at the same multiple of capacity as 18 req/s is for the
  reference profile (the paper's platform); 60 requests.
- ``high``: the scenario mixtures at 1.2x the knee; 60 requests.
- ``kv_pressure``: the simulator scenario's conversation lengths
  (``CONVERSATION_PROMPT_LENGTHS``, ``CONVERSATION_OUTPUT_LENGTHS``, means 1,291 and 199
  tokens) with every range bound scaled by ``KV_PRESSURE_LENGTH_SCALE`` (a 135M model on two
  cores prefills about 1 ms per token), on a KV cache that holds as many mean-footprint
  requests (prompt + output) as the scenario's ``KV_PRESSURE_BLOCKS`` do at the scenario's
  lengths (about 35), so the cache, not the batch cap, binds; 1.2x the knee (the scenario's
  load factor) on the engine's profile with that cache; 48 requests.

As in the simulator's scenarios, "the knee" is measured capacity: the highest Poisson rate at
which ``vllm_default`` meets both SLOs for 90% of requests on one simulated server with the
engine's fitted profile (``simulated_knee``: ``bench.capacity``'s bisection, on
``KNEE_REQUESTS`` arrivals per rate, cached), so every load is a multiple of what the engine
serves within the SLO it is judged by. ``main`` keeps the paper's rate as a multiple of the
analytical capacity (``pool_capacity_rps``), on both profiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tokenpace.bench.capacity import (
    KneeProblem,
    KneeSearch,
    SloNeverBindsError,
    cached_capacity,
    throughput_ceiling_rps,
)
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.pool.capacity import pool_capacity_rps
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.main_experiment import (
    PAPER_OUTPUT_LENGTHS,
    PAPER_PROMPT_LENGTHS,
    PoissonWorkload,
)
from tokenpace.workload.scenarios import (
    CONVERSATION_OUTPUT_LENGTHS,
    CONVERSATION_PROMPT_LENGTHS,
    KV_PRESSURE_BLOCKS,
    SCENARIO_OUTPUT_LENGTHS,
    SCENARIO_PROMPT_LENGTHS,
    load_factor,
)

REFERENCE_PROFILE_RATE_PER_S = 18.0
NUM_REQUESTS = 60
# kv_pressure: one factor on every prompt and output range bound (means 323 and 50 tokens).
KV_PRESSURE_LENGTH_SCALE = 0.25
KV_PRESSURE_PROMPT_LENGTHS = CONVERSATION_PROMPT_LENGTHS.scaled(KV_PRESSURE_LENGTH_SCALE)
KV_PRESSURE_OUTPUT_LENGTHS = CONVERSATION_OUTPUT_LENGTHS.scaled(KV_PRESSURE_LENGTH_SCALE)
KV_PRESSURE_NUM_REQUESTS = 48
KNEE_REQUESTS = 200  # arrivals per simulated rate when a knee is searched

# The measured knee (req/s) of one server with a profile on (prompt, output) mixtures.
Knee = Callable[[EngineProfile, LengthMixture, LengthMixture], float]


def simulated_knee(slo: Slo, cache_dir: Path | None, search: KneeSearch | None = None) -> Knee:
    """The knee of one simulated server under ``slo`` (``bench.capacity``'s bisection with
    ``KNEE_REQUESTS`` Poisson arrivals per rate whatever a workload's own size: a few
    requests never queue, so they would have no knee; cached in ``cache_dir``). Where the
    SLO never binds on those arrivals (a loose SLO: they all arrive at once and still meet
    it), capacity is the throughput ceiling instead. The knee raises ValueError when no rate
    meets the SLO."""

    def knee(profile: EngineProfile, prompts: LengthMixture, outputs: LengthMixture) -> float:
        guess = pool_capacity_rps(profile, prompts, outputs, 1)
        base = PoissonWorkload(
            name="knee", rate_per_s=guess, duration_s=2 * KNEE_REQUESTS / guess,
            max_requests=KNEE_REQUESTS, prompt_lengths=prompts, output_lengths=outputs,
        )  # fmt: skip
        problem = KneeProblem(profile, 1, base, slo, search or KneeSearch())
        try:
            return cached_capacity(problem, guess, cache_dir).knee_rps
        except SloNeverBindsError:
            return throughput_ceiling_rps(problem)

    return knee


def main_load_factor(reference: EngineProfile) -> float:
    """The paper's 18 req/s as a multiple of one reference server's capacity."""
    capacity = pool_capacity_rps(reference, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS, 1)
    return REFERENCE_PROFILE_RATE_PER_S / capacity


def cpu_main(
    engine: EngineProfile, reference: EngineProfile, num_requests: int = NUM_REQUESTS
) -> PoissonWorkload:
    """``main`` (see the module docstring): ``num_requests`` on ``engine`` as it is."""
    main_capacity = pool_capacity_rps(engine, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS, 1)
    main_rate = main_load_factor(reference) * main_capacity
    return PoissonWorkload(
        name="main", rate_per_s=main_rate, duration_s=num_requests / main_rate * 2,
        max_requests=num_requests,
    )  # fmt: skip


def cpu_high(
    engine: EngineProfile, knee: Knee, num_requests: int = NUM_REQUESTS
) -> PoissonWorkload:
    """``high`` (see the module docstring): ``num_requests`` at 1.2x ``knee`` of the scenario
    mixtures on ``engine``."""
    high_rate = load_factor("high") * knee(engine, SCENARIO_PROMPT_LENGTHS, SCENARIO_OUTPUT_LENGTHS)
    return PoissonWorkload(
        name="high", rate_per_s=high_rate, duration_s=num_requests / high_rate * 2,
        max_requests=num_requests, prompt_lengths=SCENARIO_PROMPT_LENGTHS,
        output_lengths=SCENARIO_OUTPUT_LENGTHS,
    )  # fmt: skip


def cpu_workloads(
    engine: EngineProfile, reference: EngineProfile, knee: Knee
) -> tuple[PoissonWorkload, ...]:
    """``main`` and ``high`` (see the module docstring): both stop at 60 requests and run on
    ``engine`` as it is; ``high`` at 1.2x ``knee`` of its mixtures."""
    return cpu_main(engine, reference), cpu_high(engine, knee)


def _mean_footprint(prompts: LengthMixture, outputs: LengthMixture) -> float:
    return prompts.mean + outputs.mean


def kv_pressure_requests_held(reference: EngineProfile) -> float:
    """Mean-footprint conversation requests (prompt + output tokens) the simulator
    scenario's cache of ``KV_PRESSURE_BLOCKS`` blocks of ``reference.block_size`` holds."""
    footprint = _mean_footprint(CONVERSATION_PROMPT_LENGTHS, CONVERSATION_OUTPUT_LENGTHS)
    return KV_PRESSURE_BLOCKS * reference.block_size / footprint


@dataclass(frozen=True, slots=True)
class CpuKvPressure:
    """The CPU-scale ``kv_pressure`` scenario: its workload and the profile it runs on,
    the engine's with ``num_gpu_blocks`` shrunk to the scenario's cache (the real engine's
    KV cache is sized to ``kv_cache_tokens``, so the policies plan on the cache there is)."""

    workload: PoissonWorkload
    profile: EngineProfile

    @property
    def kv_cache_tokens(self) -> int:
        """The KV cache the engine runs with (tokens, whole blocks)."""
        return self.profile.kv_capacity_tokens


def cpu_kv_pressure(engine: EngineProfile, reference: EngineProfile, knee: Knee) -> CpuKvPressure:
    """``kv_pressure`` at CPU scale (see the module docstring): the cache holds
    ``kv_pressure_requests_held(reference)`` requests of the scaled mean footprint, rounded
    up to whole blocks of ``engine.block_size``; the rate is the scenario's load factor times
    ``knee`` of one server with the engine's profile and that cache."""
    footprint = _mean_footprint(KV_PRESSURE_PROMPT_LENGTHS, KV_PRESSURE_OUTPUT_LENGTHS)
    tokens = kv_pressure_requests_held(reference) * footprint
    profile = replace(engine, num_gpu_blocks=math.ceil(tokens / engine.block_size))
    capacity = knee(profile, KV_PRESSURE_PROMPT_LENGTHS, KV_PRESSURE_OUTPUT_LENGTHS)
    rate = load_factor("kv_pressure") * capacity
    workload = PoissonWorkload(
        name="kv_pressure", rate_per_s=rate,
        duration_s=KV_PRESSURE_NUM_REQUESTS / rate * 2, max_requests=KV_PRESSURE_NUM_REQUESTS,
        prompt_lengths=KV_PRESSURE_PROMPT_LENGTHS, output_lengths=KV_PRESSURE_OUTPUT_LENGTHS,
    )  # fmt: skip
    return CpuKvPressure(workload, profile)
