"""Workloads sized for a real engine on a CPU: the paper's main experiment and the `high`
scenario with their rates scaled to the engine's measured capacity, about 60 requests each."""

from __future__ import annotations

from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.capacity import pool_capacity_rps
from tokenpace.workload.main_experiment import (
    PAPER_OUTPUT_LENGTHS,
    PAPER_PROMPT_LENGTHS,
    PoissonWorkload,
)
from tokenpace.workload.scenarios import (
    SCENARIO_OUTPUT_LENGTHS,
    SCENARIO_PROMPT_LENGTHS,
    load_factor,
)

REFERENCE_PROFILE_RATE_PER_S = 18.0
NUM_REQUESTS = 60


def main_load_factor(reference: EngineProfile) -> float:
    """The paper's 18 req/s as a multiple of one reference server's capacity."""
    capacity = pool_capacity_rps(reference, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS, 1)
    return REFERENCE_PROFILE_RATE_PER_S / capacity


def cpu_workloads(engine: EngineProfile, reference: EngineProfile) -> tuple[PoissonWorkload, ...]:
    """``main``: the paper's mixtures at the same multiple of capacity as 18 req/s is for the
    reference profile (the paper's platform); ``high``: 1.2x capacity with the scenario
    mixtures. Both stop at 60 requests."""
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
