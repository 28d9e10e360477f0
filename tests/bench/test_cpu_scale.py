"""The CPU-scale workloads of real-engine benches, kv_pressure above all."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tokenpace.bench.cpu_scale import (
    KV_PRESSURE_LENGTH_SCALE,
    KV_PRESSURE_NUM_REQUESTS,
    cpu_kv_pressure,
    kv_pressure_requests_held,
)
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.capacity import pool_capacity_rps
from tokenpace.workload.scenarios import (
    CONVERSATION_OUTPUT_LENGTHS,
    CONVERSATION_PROMPT_LENGTHS,
    KV_PRESSURE_BLOCKS,
)


@pytest.fixture
def cpu_profile(paper_profile: EngineProfile) -> EngineProfile:
    """A profile shaped like the native engine's on two cores."""
    return replace(
        paper_profile, name="cpu", l_min_ms=64.0, b0=29, alpha_ms=3.2, prefill_ms_per_token=0.93,
        num_gpu_blocks=4096,
    )  # fmt: skip


def test_kv_pressure_scales_the_conversation_lengths_by_one_factor(
    cpu_profile: EngineProfile, paper_profile: EngineProfile
) -> None:
    workload = cpu_kv_pressure(cpu_profile, paper_profile).workload
    assert KV_PRESSURE_LENGTH_SCALE == 0.25
    for scaled, full in (
        (workload.prompt_lengths, CONVERSATION_PROMPT_LENGTHS),
        (workload.output_lengths, CONVERSATION_OUTPUT_LENGTHS),
    ):
        assert scaled.weights == full.weights
        assert scaled.mean == pytest.approx(full.mean / 4, rel=0.01)
        for (low, high), (full_low, full_high) in zip(scaled.ranges, full.ranges, strict=True):
            assert low == max(1, round(full_low / 4)) and high == round(full_high / 4)
    specs = workload.generate(np.random.default_rng(0))
    assert len(specs) == KV_PRESSURE_NUM_REQUESTS == 48
    assert max(s.num_prompt_tokens for s in specs) <= 1500
    assert max(s.true_output_tokens for s in specs) <= 250


def test_kv_pressure_cache_holds_as_many_requests_as_the_scenario_does(
    cpu_profile: EngineProfile, paper_profile: EngineProfile
) -> None:
    kv = cpu_kv_pressure(cpu_profile, paper_profile)
    conversation = CONVERSATION_PROMPT_LENGTHS.mean + CONVERSATION_OUTPUT_LENGTHS.mean
    held = KV_PRESSURE_BLOCKS * paper_profile.block_size / conversation
    assert kv_pressure_requests_held(paper_profile) == pytest.approx(held)
    assert held == pytest.approx(35.1, abs=0.05)
    footprint = kv.workload.prompt_lengths.mean + kv.workload.output_lengths.mean
    assert kv.kv_cache_tokens / footprint == pytest.approx(held, abs=16 / footprint)
    # The engine's cache and the policies' profile are the same size, in whole blocks;
    # nothing else of the engine's profile changes.
    assert kv.kv_cache_tokens == kv.profile.num_gpu_blocks * cpu_profile.block_size == 13088
    assert replace(kv.profile, num_gpu_blocks=cpu_profile.num_gpu_blocks) == cpu_profile


def test_kv_pressure_arrives_at_its_load_factor_of_capacity(
    cpu_profile: EngineProfile, paper_profile: EngineProfile
) -> None:
    kv = cpu_kv_pressure(cpu_profile, paper_profile)
    workload = kv.workload
    capacity = pool_capacity_rps(kv.profile, workload.prompt_lengths, workload.output_lengths, 1)
    assert workload.rate_per_s == pytest.approx(1.2 * capacity)
    # The arrival window is long enough for every request to arrive.
    assert workload.duration_s == pytest.approx(2 * KV_PRESSURE_NUM_REQUESTS / workload.rate_per_s)
