from __future__ import annotations

import numpy as np
import pytest

from tokenpace.engine.profile import load_profile
from tokenpace.workload.mmpp import MmppArrivals
from tokenpace.workload.scenarios import (
    PAPER_SCENARIO_NAMES,
    SCENARIO_NAMES,
    ScenarioConfig,
    build_scenario,
    scenario_capacity_rps,
    scenario_workloads,
)


def test_scenarios_use_the_paper_mixtures_and_capacity_fractions() -> None:
    profile = load_profile("v100-llama-3.2-3b")
    capacity = scenario_capacity_rps(profile, 4)
    workloads = scenario_workloads(profile, 4, ScenarioConfig(duration_s=400.0))
    assert list(workloads) == list(PAPER_SCENARIO_NAMES)
    rng = np.random.default_rng(0)
    for name, factor in {"low": 0.5, "medium": 0.8, "high": 1.2, "burst": 0.8}.items():
        specs = workloads[name].generate(rng)
        rate = len(specs) / 400.0
        assert rate == pytest.approx(factor * capacity, rel=0.15), name
        prompts = np.array([s.num_prompt_tokens for s in specs])
        outputs = np.array([s.true_output_tokens for s in specs])
        assert set(prompts) == {50, 200, 800}
        assert set(outputs) == {20, 50, 200}
        assert np.mean(prompts == 50) == pytest.approx(0.5, abs=0.05)
        assert np.mean(outputs == 200) == pytest.approx(0.2, abs=0.05)
        # Policies see only the client's loose cap, the mixture's largest length.
        assert {s.max_tokens for s in specs} == {200}
        arrivals = [s.arrival_s for s in specs]
        assert arrivals == sorted(arrivals) and arrivals[-1] < 400.0


def test_kv_pressure_and_prefill_heavy_mixtures() -> None:
    rng = np.random.default_rng(3)
    config = ScenarioConfig(duration_s=200.0)
    heavy = build_scenario("prefill_heavy", 10.0, config).generate(rng)
    assert len(heavy) / 200.0 == pytest.approx(12.0, rel=0.1)  # 1.2 x the knee given
    assert all(1000 <= s.num_prompt_tokens <= 4000 for s in heavy)
    assert all(8 <= s.true_output_tokens <= 64 and s.max_tokens == 64 for s in heavy)
    conversation = build_scenario("kv_pressure", 10.0, config).generate(rng)
    outputs = np.array([s.true_output_tokens for s in conversation])
    prompts = np.array([s.num_prompt_tokens for s in conversation])
    # The Azure conversation trace's medians (129 output, 1,020 prompt tokens) and cap.
    assert np.median(outputs) == pytest.approx(129, rel=0.1)
    assert np.median(prompts) == pytest.approx(1020, rel=0.1)
    assert {s.max_tokens for s in conversation} == {1000}
    assert SCENARIO_NAMES[-2:] == ("kv_pressure", "prefill_heavy")


def test_mmpp_bursts_run_at_three_times_the_base_rate() -> None:
    process = MmppArrivals(mean_rate_per_s=10.0, burst_factor=3.0, mean_base_s=8, mean_burst_s=2)
    assert process.base_rate_per_s * (1 + 2 * 0.2) == pytest.approx(10.0)
    times = process.sample(np.random.default_rng(1), 5000.0, 10**6)
    assert len(times) / 5000.0 == pytest.approx(10.0, rel=0.05)
    counts = np.bincount(times.astype(int), minlength=5000)
    # Modulation makes per-second counts over-dispersed compared with Poisson (var = mean).
    assert counts.var() > 1.5 * counts.mean()


def test_unknown_scenario_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="low, medium, high, burst, kv_pressure, prefill_heavy"):
        build_scenario("extreme", 10.0)
