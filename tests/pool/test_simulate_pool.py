from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.pool.capacity import pool_capacity_rps
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import resolve_scheduler, scheduler_names, simulate_pool
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.scenarios import build_scenario, scenario_capacity_rps
from tokenpace.workload.spec import RequestSpec

SEVEN = [
    "dynamic_batch",
    "fcfs",
    "priority",
    "round_robin",
    "serverlessllm",
    "twp",
    "vllm_default",
]


def test_scheduler_names_resolve_to_policy_and_router() -> None:
    assert set(SEVEN) <= set(scheduler_names())
    assert resolve_scheduler("round_robin").policy == "fcfs"
    assert resolve_scheduler("serverlessllm").router == "serverlessllm"
    twp = resolve_scheduler("twp")
    assert (twp.policy, twp.router) == ("twp", "least_loaded")
    assert resolve_scheduler("twp", router="round_robin").router == "round_robin"
    with pytest.raises(ValueError, match="valid choices"):
        resolve_scheduler("lifo")
    with pytest.raises(ValueError, match="own router"):
        resolve_scheduler("serverlessllm", router="least_loaded")


def test_capacity_follows_its_documented_definition(profile: EngineProfile) -> None:
    prompts = LengthMixture.fixed((100,), (1.0,))
    outputs = LengthMixture.fixed((80,), (1.0,))
    prefill_ms = 100 * (0.15 + 0.009 * 50.5 / 1000)
    per_request_s = (80 * 43.0 / 8 + prefill_ms + 3.0) / 1000
    assert pool_capacity_rps(profile, prompts, outputs, 3) == pytest.approx(3 / per_request_s)


@pytest.mark.parametrize("scheduler", SEVEN)
def test_pool_run_is_deterministic_for_a_seed(scheduler: str) -> None:
    profile = load_profile("v100-llama-3.2-3b")
    config = PoolConfig(num_containers=3, initial_warm=1, keep_alive_s=2.0)
    capacity = scenario_capacity_rps(profile, config.num_containers)
    workload = build_scenario("burst", capacity)

    def run(seed: int) -> list[tuple[float, ...]]:
        rng = np.random.default_rng(seed)
        specs = workload.generate(rng)
        outcome = simulate_pool(specs, scheduler, profile, config, rng)
        return [(r.container_id or 0, *r.token_times_s) for r in outcome.requests]

    assert run(7) == run(7)
    assert run(7) != run(8)


@st.composite
def pool_runs(draw: st.DrawFn) -> tuple[list[RequestSpec], str, PoolConfig]:
    n = draw(st.integers(1, 12))
    arrivals = sorted(draw(st.lists(st.floats(0, 6), min_size=n, max_size=n)))
    specs = [RequestSpec(t, draw(st.integers(1, 600)), draw(st.integers(1, 40))) for t in arrivals]
    num_containers = draw(st.integers(1, 3))
    config = PoolConfig(
        num_containers=num_containers,
        initial_warm=draw(st.integers(0, num_containers)),
        keep_alive_s=draw(st.floats(0.05, 3.0)),
        initial_tier=draw(st.sampled_from(["host_memory", "local_ssd", "remote"])),
        min_instances=draw(st.integers(0, num_containers)),
        target_per_instance=draw(st.floats(1.0, 8.0)),
        migration_batch_threshold=draw(st.integers(1, 3)),
        record_steps=False,
    )
    return specs, draw(st.sampled_from(SEVEN)), config


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_runs(), st.integers(0, 2**31))
def test_no_request_is_lost_across_the_pool(
    run: tuple[list[RequestSpec], str, PoolConfig], seed: int
) -> None:
    specs, scheduler, config = run
    profile = load_profile("v100-llama-3.2-3b")
    outcome = simulate_pool(specs, scheduler, profile, config, np.random.default_rng(seed))
    assert len(outcome.requests) == len(specs)
    for request, spec in zip(outcome.requests, specs, strict=True):
        assert request.is_done
        assert request.num_output_tokens == spec.max_tokens
        assert len(request.output_token_ids) == spec.max_tokens
        times = request.token_times_s
        assert times[0] >= spec.arrival_s + request.cold_start_s - 1e-9
        assert all(a <= b for a, b in itertools.pairwise(times))
        assert request.container_id is not None
    assert outcome.end_s == max(r.finished_s or 0.0 for r in outcome.requests)
