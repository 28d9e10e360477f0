from __future__ import annotations

import itertools

import numpy as np
import pytest

from tokenpace.core.lifecycle import ContainerState
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.checkpoint import load_time_s
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import PoolSimulation
from tokenpace.workload.spec import RequestSpec, to_requests


def assert_tokens_conserved(requests: list[Request]) -> None:
    for request in requests:
        assert request.is_done
        assert request.num_output_tokens == request.max_tokens
        assert len(request.output_token_ids) == request.max_tokens
        times = request.token_times_s
        assert all(a <= b for a, b in itertools.pairwise(times))
        assert times[0] >= request.arrival_s


def test_live_migration_moves_a_running_request_without_losing_tokens(
    profile: EngineProfile,
) -> None:
    config = PoolConfig(num_containers=2, initial_warm=1, migration_batch_threshold=2)
    sim = PoolSimulation("serverlessllm", profile, config, np.random.default_rng(0))
    source, target = sim.containers
    requests = to_requests([RequestSpec(0.0, 100 + 50 * i, 200) for i in range(4)])
    for request in requests:
        source.submit(request, 0.0)
    sim.requests.extend(requests)
    target.start_load(0.0)  # becomes warm and idle at the load time: a better container
    sim.run()
    outcome = sim.outcome()
    live = [m for m in outcome.migrations if m.kind == "live"]
    assert live, "the idle target should take a request off the over-full source"
    assert_tokens_conserved(requests)
    ready = load_time_s(profile, "local_ssd")
    first = live[0]
    moved = requests[first.request_id]
    assert moved.container_id == target.container_id
    assert first.start_s == pytest.approx(ready)
    # The re-prefill covered every token the source held when the migration began.
    tokens_at_start = sum(t <= first.start_s for t in moved.token_times_s)
    assert first.num_reprefill_tokens == moved.num_prompt_tokens + tokens_at_start - 1
    # The source kept decoding during the re-prefill and stopped at the hand-off: no step
    # after the hand-off gave the request a token there, and the stream never stalled long.
    assert any(first.start_s < t <= first.end_s for t in moved.token_times_s)
    gaps = np.diff(moved.token_times_s)
    assert gaps.max() < 0.2
    assert outcome.num_cancelled_migrations == 0


def test_waiting_requests_move_off_a_loading_container(profile: EngineProfile) -> None:
    config = PoolConfig(num_containers=2, initial_warm=0, initial_tier="remote")
    sim = PoolSimulation("serverlessllm", profile, config, np.random.default_rng(0))
    slow, fast = sim.containers
    fast.store.place(profile.name, profile.checkpoint_bytes, "host_memory")
    requests = to_requests([RequestSpec(0.0, 80, 10) for _ in range(3)])
    for request in requests:
        slow.submit(request, 0.0)
    sim.requests.extend(requests)
    fast.start_load(0.0)
    sim.run(until_s=load_time_s(profile, "host_memory"))
    assert fast.state is ContainerState.WARM and slow.state is ContainerState.LOADING
    sim.run()
    outcome = sim.outcome()
    assert {m.kind for m in outcome.migrations} == {"queued"}
    assert all(r.container_id == fast.container_id for r in requests)
    host = load_time_s(profile, "host_memory")
    for request in requests:
        assert request.cold_start_s == pytest.approx(host)
        assert request.token_times_s[0] < load_time_s(profile, "remote")
    assert_tokens_conserved(requests)


def test_no_migration_behind_other_routers(profile: EngineProfile) -> None:
    config = PoolConfig(num_containers=2, initial_warm=1, migration_batch_threshold=1)
    sim = PoolSimulation("fcfs", profile, config, np.random.default_rng(0))
    assert sim.pool.migrator is None
