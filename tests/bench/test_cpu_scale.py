"""The CPU-scale workloads of real-engine benches, kv_pressure above all."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tokenpace.bench.capacity import KneeSearch
from tokenpace.bench.cpu_scale import (
    KV_PRESSURE_LENGTH_SCALE,
    KV_PRESSURE_NUM_REQUESTS,
    cpu_kv_pressure,
    cpu_main,
    cpu_workloads,
    kv_pressure_requests_held,
    simulated_knee,
)
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.pool.capacity import pool_capacity_rps
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.main_experiment import PAPER_OUTPUT_LENGTHS, PAPER_PROMPT_LENGTHS
from tokenpace.workload.scenarios import (
    CONVERSATION_OUTPUT_LENGTHS,
    CONVERSATION_PROMPT_LENGTHS,
    KV_PRESSURE_BLOCKS,
    SCENARIO_OUTPUT_LENGTHS,
    SCENARIO_PROMPT_LENGTHS,
)


def fake_knee(profile: EngineProfile, prompts: LengthMixture, outputs: LengthMixture) -> float:
    """A stand-in for the simulated knee that depends on what it is given."""
    return profile.num_gpu_blocks / 1000 + prompts.mean / 100 + outputs.mean / 10


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
    workload = cpu_kv_pressure(cpu_profile, paper_profile, fake_knee).workload
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
    kv = cpu_kv_pressure(cpu_profile, paper_profile, fake_knee)
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


def test_kv_pressure_arrives_at_its_load_factor_of_the_knee_on_its_own_cache(
    cpu_profile: EngineProfile, paper_profile: EngineProfile
) -> None:
    kv = cpu_kv_pressure(cpu_profile, paper_profile, fake_knee)
    workload = kv.workload
    knee = fake_knee(kv.profile, workload.prompt_lengths, workload.output_lengths)
    assert workload.rate_per_s == pytest.approx(1.2 * knee)
    assert knee != fake_knee(cpu_profile, workload.prompt_lengths, workload.output_lengths)
    # The arrival window is long enough for every request to arrive.
    assert workload.duration_s == pytest.approx(2 * KV_PRESSURE_NUM_REQUESTS / workload.rate_per_s)


def test_high_arrives_at_its_load_factor_of_the_knee(
    cpu_profile: EngineProfile, paper_profile: EngineProfile
) -> None:
    main, high = cpu_workloads(cpu_profile, paper_profile, fake_knee)
    assert main == cpu_main(cpu_profile, paper_profile)
    assert high.name == "high" and high.max_requests == 60
    knee = fake_knee(cpu_profile, SCENARIO_PROMPT_LENGTHS, SCENARIO_OUTPUT_LENGTHS)
    assert high.rate_per_s == pytest.approx(1.2 * knee)


def test_the_simulated_knee_is_the_rate_where_vllm_default_stops_meeting_the_slo(
    paper_profile: EngineProfile, tmp_path: Path
) -> None:
    search = KneeSearch(seeds=(1000,), rel_tolerance=0.1)
    knee = simulated_knee(Slo(2000.0, 100.0), tmp_path, search)
    rps = knee(paper_profile, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS)
    assert rps > 0
    slower = replace(paper_profile, l_min_ms=2 * paper_profile.l_min_ms)
    assert knee(slower, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS) < rps
    assert list(tmp_path.glob("capacity-*.json"))  # cached
    assert knee(paper_profile, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS) == rps


def test_where_the_slo_never_binds_the_knee_is_the_throughput_ceiling(
    paper_profile: EngineProfile, tmp_path: Path
) -> None:
    # An SLO no rate can miss: 200 arrivals all at once still meet it.
    search = KneeSearch(seeds=(1000,), max_doublings=3)
    loose = Slo(1e9, 1e9)
    rps = simulated_knee(loose, tmp_path, search)(
        paper_profile, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS
    )
    estimate = pool_capacity_rps(paper_profile, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS, 1)
    assert 0.5 * estimate < rps < 10 * estimate
