"""What a serverless pool bills (container-seconds) and when requests pay cold starts."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpace.core.lifecycle import ContainerState
from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.autoscaler import LoadWindow
from tokenpace.pool.checkpoint import load_time_s
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import PoolSimulation, simulate_pool
from tokenpace.workload.spec import RequestSpec


def test_container_seconds_are_the_sum_of_container_lifetimes(profile: EngineProfile) -> None:
    # One container, warm at 0, keep-alive 2 s. Request A (t=0, 16 prompt tokens, 1 output
    # token) takes one prefill step; the container idles, goes cold 2 s later. Request B at
    # t=10 cold-starts it from host memory (the unloaded checkpoint stays there), then one
    # step; the run ends when B's token is delivered.
    config = PoolConfig(num_containers=1, initial_warm=1, keep_alive_s=2.0)
    specs = [RequestSpec(0.0, 16, 1), RequestSpec(10.0, 16, 1)]
    outcome = simulate_pool(specs, "fcfs", profile, config, np.random.default_rng(0))
    step_s = LatencyModel(profile).step_s(0, [PrefillChunk(16, 0)])
    load_s = load_time_s(profile, "host_memory")
    a, b = outcome.requests
    assert a.finished_s == pytest.approx(step_s)
    assert b.cold_start_s == pytest.approx(load_s)
    assert b.finished_s == pytest.approx(10.0 + load_s + step_s)
    first_life = step_s + 2.0  # warm from 0 until the keep-alive expired
    second_life = load_s + step_s  # loading + warm until the end of the run
    assert outcome.container_seconds == pytest.approx(first_life + second_life)
    assert outcome.num_cold_starts == 1


def test_a_burst_is_sent_to_a_starting_container_and_pays_its_cold_start(
    profile: EngineProfile,
) -> None:
    # Two containers, one warm; the autoscaler wants one per 2 outstanding requests. Three
    # long prompts at once: the third would wait behind two prompts' prefill (6 s) on the
    # warm container, longer than the other one takes to load from SSD (4.1 s), so it goes
    # there and its TTFT includes the cold start.
    config = PoolConfig(num_containers=2, initial_warm=1, target_per_instance=2.0)
    specs = [RequestSpec(0.0, 20_000, 4) for _ in range(3)]
    outcome = simulate_pool(specs, "vllm_default", profile, config, np.random.default_rng(0))
    assert outcome.num_cold_starts == 1
    paid = [r for r in outcome.requests if r.cold_start_s > 0]
    assert len(paid) == 1 and paid[0].container_id == 1
    assert paid[0].cold_start_s == pytest.approx(load_time_s(profile, "local_ssd"))


def test_surplus_containers_drain_and_go_cold_once_load_falls(profile: EngineProfile) -> None:
    config = PoolConfig(
        num_containers=2, initial_warm=2, target_per_instance=1.0, keep_alive_s=1.0,
        scale_down_window_s=0.5,
    )  # fmt: skip
    sim = PoolSimulation("fcfs", profile, config, np.random.default_rng(0))
    # A trickle of one request at a time: one container is enough.
    sim.add_arrivals([RequestSpec(0.2 * i, 50, 2) for i in range(40)])
    sim.run(until_s=6.0)
    used = {r.container_id for r in sim.requests[10:30]}
    assert len(used) == 1  # after the window, every request goes to the kept container
    assert [c.state for c in sim.containers].count(ContainerState.COLD) == 1
    sim.run()
    outcome = sim.outcome()
    # The bill stops at the last token: the drained container's lifetime ended early.
    assert outcome.container_seconds < 2 * outcome.end_s


def test_load_window_is_a_sliding_maximum() -> None:
    window = LoadWindow(2.0)
    assert window.peak(0.0) == 0
    window.record(0.0, 5)
    window.record(1.0, 3)
    window.record(1.5, 4)
    assert window.peak(1.9) == 5
    assert window.peak(3.2) == 4  # the 5 ended at 1.0 < 3.2 - 2
    assert window.peak(10.0) == 4  # still the load in effect
