from __future__ import annotations

import numpy as np
import pytest

from tokenpace.core.lifecycle import ContainerState
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.checkpoint import load_time_s
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import PoolSimulation, simulate_pool
from tokenpace.workload.spec import RequestSpec


def test_warm_container_goes_cold_exactly_after_keep_alive(profile: EngineProfile) -> None:
    config = PoolConfig(num_containers=1, initial_warm=1, keep_alive_s=5.0)
    sim = PoolSimulation("fcfs", profile, config, np.random.default_rng(0))
    (request,) = sim.add_arrivals([RequestSpec(1.0, 100, 10)])
    container = sim.containers[0]
    # Idle from t = 0, but work arrives at t = 1 (before the first deadline at t = 5).
    sim.run(until_s=4.999)
    assert container.state is ContainerState.WARM
    sim.run(until_s=5.0)
    assert container.state is ContainerState.WARM
    sim.run(until_s=request.finished_s or 1.5)
    assert request.is_done and request.finished_s is not None
    deadline = request.finished_s + 5.0
    assert container.keep_alive_deadline_s == pytest.approx(deadline)
    sim.run(until_s=np.nextafter(deadline, 0.0))
    assert container.state is ContainerState.WARM
    sim.run(until_s=deadline)
    assert container.state.value == ContainerState.COLD.value


def test_work_at_the_deadline_keeps_container_warm(profile: EngineProfile) -> None:
    config = PoolConfig(num_containers=1, initial_warm=1, keep_alive_s=5.0)
    sim = PoolSimulation("fcfs", profile, config, np.random.default_rng(0))
    sim.add_arrivals([RequestSpec(5.0, 100, 10)])
    sim.run(until_s=5.0)
    assert sim.containers[0].state is ContainerState.WARM
    sim.run()
    assert sim.outcome().num_cold_starts == 0


def test_min_instances_keeps_a_container_warm(profile: EngineProfile) -> None:
    config = PoolConfig(num_containers=2, initial_warm=2, keep_alive_s=1.0, min_instances=1)
    sim = PoolSimulation("fcfs", profile, config, np.random.default_rng(0))
    sim.run(until_s=10.0)
    states = [c.state for c in sim.containers]
    assert states.count(ContainerState.WARM) == 1


@pytest.mark.parametrize("tier", ["host_memory", "local_ssd", "remote"])
def test_cold_start_adds_tier_load_time_to_ttft(profile: EngineProfile, tier: str) -> None:
    specs = [RequestSpec(0.5, 200, 5), RequestSpec(0.6, 50, 5)]
    warm = simulate_pool(
        specs,
        "fcfs",
        profile,
        PoolConfig(num_containers=1, initial_warm=1),
        np.random.default_rng(0),
    )
    cold = simulate_pool(
        specs,
        "fcfs",
        profile,
        PoolConfig(num_containers=1, initial_warm=0, initial_tier=tier),
        np.random.default_rng(0),
    )
    load = load_time_s(profile, tier)
    assert cold.num_cold_starts == 1 and warm.num_cold_starts == 0
    assert cold.cold_starts[0].tier == tier
    ready = 0.5 + load
    for w, c in zip(warm.requests, cold.requests, strict=True):
        assert c.cold_start_s == pytest.approx(ready - c.arrival_s)
        assert w.cold_start_s == 0.0
    # Both requests wait for the load, then run together in the first step.
    first_step = cold.steps[0][0]
    assert first_step.start_s == pytest.approx(ready)
    assert cold.requests[0].token_times_s[0] == pytest.approx(ready + first_step.latency_s)
    # The first request alone sees exactly the load time added to its TTFT when the warm
    # run also served both requests in its first two steps from arrival.
    ttft_warm = warm.requests[0].token_times_s[0] - 0.5
    ttft_cold = cold.requests[0].token_times_s[0] - 0.5
    assert ttft_cold >= ttft_warm + load - 1e-9


def test_second_cold_start_loads_from_host_memory(profile: EngineProfile) -> None:
    config = PoolConfig(num_containers=1, initial_warm=0, keep_alive_s=1.0)
    specs = [RequestSpec(0.0, 50, 2), RequestSpec(30.0, 50, 2)]
    outcome = simulate_pool(specs, "fcfs", profile, config, np.random.default_rng(0))
    assert [s.tier for s in outcome.cold_starts] == ["local_ssd", "host_memory"]
    second = outcome.requests[1]
    assert second.cold_start_s == pytest.approx(load_time_s(profile, "host_memory"))


def test_pool_config_names_the_bad_field() -> None:
    with pytest.raises(ValueError, match="initial_warm"):
        PoolConfig(num_containers=2, initial_warm=3)
    with pytest.raises(ValueError, match="keep_alive_s"):
        PoolConfig(keep_alive_s=0)
    with pytest.raises(ValueError, match="initial_tier"):
        PoolConfig(initial_tier="gpu")
