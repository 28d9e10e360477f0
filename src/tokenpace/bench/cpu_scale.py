"""Workloads sized for a real engine on a CPU: the paper's main experiment, the ``high``
scenario and the ``kv_pressure`` scenario, their rates scaled to the engine's profile.

- ``main``: the paper's mixtures at the same multiple of capacity as 18 req/s is for the
  reference profile (the paper's platform); 60 requests.
- ``high``: the scenario mixtures at 1.2x capacity; 60 requests.
- ``kv_pressure``: the simulator scenario's conversation lengths
  (``CONVERSATION_PROMPT_LENGTHS``, ``CONVERSATION_OUTPUT_LENGTHS``, means 1,291 and 199
  tokens) with every range bound scaled by ``KV_PRESSURE_LENGTH_SCALE`` (a 135M model on two
  cores prefills about 1 ms per token), on a KV cache that holds as many mean-footprint
  requests (prompt + output) as the scenario's ``KV_PRESSURE_BLOCKS`` do at the scenario's
  lengths (about 35), so the cache, not the batch cap, binds; 1.2x capacity (the scenario's
  load factor) on the engine's profile with that cache; 48 requests.

Capacity is ``pool_capacity_rps`` for one server (the analytical estimate: the engine's
measured knee is not searched on a real engine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tokenpace.engine.profile import EngineProfile
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


def main_load_factor(reference: EngineProfile) -> float:
    """The paper's 18 req/s as a multiple of one reference server's capacity."""
    capacity = pool_capacity_rps(reference, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS, 1)
    return REFERENCE_PROFILE_RATE_PER_S / capacity


def cpu_workloads(engine: EngineProfile, reference: EngineProfile) -> tuple[PoissonWorkload, ...]:
    """``main`` and ``high`` (see the module docstring): both stop at 60 requests and run on
    ``engine`` as it is."""
    main_capacity = pool_capacity_rps(engine, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS, 1)
    main_rate = main_load_factor(reference) * main_capacity
    high_capacity = pool_capacity_rps(engine, SCENARIO_PROMPT_LENGTHS, SCENARIO_OUTPUT_LENGTHS, 1)
    high_rate = load_factor("high") * high_capacity
    return (
        PoissonWorkload(
            name="main", rate_per_s=main_rate, duration_s=NUM_REQUESTS / main_rate * 2,
            max_requests=NUM_REQUESTS,
        ),
        PoissonWorkload(
            name="high", rate_per_s=high_rate, duration_s=NUM_REQUESTS / high_rate * 2,
            max_requests=NUM_REQUESTS, prompt_lengths=SCENARIO_PROMPT_LENGTHS,
            output_lengths=SCENARIO_OUTPUT_LENGTHS,
        ),
    )  # fmt: skip


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


def cpu_kv_pressure(engine: EngineProfile, reference: EngineProfile) -> CpuKvPressure:
    """``kv_pressure`` at CPU scale (see the module docstring): the cache holds
    ``kv_pressure_requests_held(reference)`` requests of the scaled mean footprint, rounded
    up to whole blocks of ``engine.block_size``; the rate is the scenario's load factor times
    one server's capacity on the engine's profile with that cache."""
    footprint = _mean_footprint(KV_PRESSURE_PROMPT_LENGTHS, KV_PRESSURE_OUTPUT_LENGTHS)
    tokens = kv_pressure_requests_held(reference) * footprint
    profile = replace(engine, num_gpu_blocks=math.ceil(tokens / engine.block_size))
    capacity = pool_capacity_rps(profile, KV_PRESSURE_PROMPT_LENGTHS, KV_PRESSURE_OUTPUT_LENGTHS, 1)
    rate = load_factor("kv_pressure") * capacity
    workload = PoissonWorkload(
        name="kv_pressure", rate_per_s=rate,
        duration_s=KV_PRESSURE_NUM_REQUESTS / rate * 2, max_requests=KV_PRESSURE_NUM_REQUESTS,
        prompt_lengths=KV_PRESSURE_PROMPT_LENGTHS, output_lengths=KV_PRESSURE_OUTPUT_LENGTHS,
    )  # fmt: skip
    return CpuKvPressure(workload, profile)
