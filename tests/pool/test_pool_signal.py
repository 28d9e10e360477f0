"""The pool signal: the headroom router and the token-rate autoscaler read the policy's own
window and token demand."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.twp_slo.policy import TwpSloPolicy
from tokenpace.pool.autoscaler import PoolSignal, TokenCapacity, TokenRateAutoscaler
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.container import ContainerState
from tokenpace.pool.headroom import Headroom
from tokenpace.pool.router import build_router
from tokenpace.pool.simulate import PoolSimulation, resolve_scheduler
from tokenpace.pool.view import ContainerView
from tokenpace.workload.spec import RequestSpec

WARM, LOADING = ContainerState.WARM, ContainerState.LOADING


def request(request_id: int, arrival_s: float, prompt: int = 50, max_tokens: int = 20) -> Request:
    return Request(request_id, num_prompt_tokens=prompt, max_tokens=max_tokens, arrival_s=arrival_s)


def busy_pair(profile: EngineProfile, until_s: float, max_tokens: int) -> PoolSimulation:
    """Two warm twp_slo containers, each running one request (a 50-token prompt, then
    ``max_tokens`` out) from t = 0, run to ``until_s``."""
    config = PoolConfig(num_containers=2, initial_warm=2, record_steps=False)
    sim = PoolSimulation("twp_slo", profile, config, np.random.default_rng(0))
    for cid in (0, 1):
        sim.containers[cid].submit(request(cid, 0.0, prompt=50, max_tokens=max_tokens), 0.0)
    sim.run(until_s=until_s)
    return sim


def test_twp_slo_runs_behind_the_pool_signal_and_its_ablation_behind_the_baselines() -> None:
    setup = resolve_scheduler("twp_slo")
    assert (setup.policy, setup.router, setup.autoscaler) == ("twp_slo", "headroom", "token_rate")
    ablation = resolve_scheduler("twp_slo-no_pool_signal")
    assert (ablation.policy, ablation.router, ablation.autoscaler) == (
        "twp_slo", "least_loaded", "concurrency",
    )  # fmt: skip
    assert resolve_scheduler("vllm_default").autoscaler == "concurrency"


def test_headroom_router_counts_a_loading_container_by_its_startup_wait() -> None:
    def view(
        cid: int, state: ContainerState, fraction: float, wait_s: float, startup_s: float
    ) -> ContainerView:
        return ContainerView(cid, state, 0, 0, 0, startup_s, 0.0, "gpu", True,
                             Headroom(fraction, wait_s))  # fmt: skip

    router = build_router("headroom")
    roomy = [view(0, WARM, 0.2, 0.0, 0.0), view(1, WARM, 0.6, 0.0, 0.0)]
    assert router.route(request(0, 0.0), roomy) == 1
    # Both warm windows full: the loading one (1 s left) beats a 3 s wait for room, not a
    # 0.5 s one.
    full = [view(0, WARM, -0.5, 3.0, 0.0), view(1, LOADING, 1.0, 0.0, 1.0)]
    assert router.route(request(0, 0.0), full) == 1
    full[0] = view(0, WARM, -0.1, 0.5, 0.0)
    assert router.route(request(0, 0.0), full) == 0


def test_headroom_router_sends_work_to_the_emptier_window(profile: EngineProfile) -> None:
    # Two warm twp_slo containers; container 0 already runs six requests. The policy's
    # window there has less room, so the next request goes to container 1.
    config = PoolConfig(num_containers=2, initial_warm=2, record_steps=False)
    sim = PoolSimulation("twp_slo", profile, config, np.random.default_rng(0))
    for i in range(6):
        sim.containers[0].submit(request(i, 0.0, max_tokens=200), 0.0)
    sim.run(until_s=0.5)
    views = sim.pool.views(0.5)
    assert views[0].headroom is not None and views[1].headroom is not None
    assert views[0].headroom.fraction < views[1].headroom.fraction
    assert sim.pool.router.route(request(9, 0.5), views) == 1


def test_headroom_router_prices_the_prefill_queued_ahead(profile: EngineProfile) -> None:
    # Two warm twp_slo containers with the same single running request; container 0 also
    # holds two long prompts in its queue. Both windows have room, so only the prefill
    # backlog (prompt tokens at the profile's cost) tells them apart.
    sim = busy_pair(profile, until_s=0.2, max_tokens=200)
    for i in (2, 3):
        sim.containers[0].submit(request(i, 0.2, prompt=3000, max_tokens=20), 0.2)
    views = sim.pool.views(0.2)
    rooms = [v.headroom for v in views]
    assert rooms[0] is not None and rooms[1] is not None
    assert rooms[0].fraction > 0 and rooms[1].fraction > 0
    backlog_s = 6000 * profile.prefill_ms_per_token / 1000
    assert rooms[0].wait_s == pytest.approx(rooms[1].wait_s + backlog_s, rel=0.05)
    assert sim.pool.router.route(request(9, 0.2), views) == 1


def test_token_rate_scales_out_on_demand_before_any_queue(profile: EngineProfile) -> None:
    capacity = TokenCapacity.from_profile(profile, Slo())
    per_request_s = capacity.work_s(50, 20)
    rate = 1.5 / per_request_s  # arrivals bringing 1.5 instances' worth of work per second
    scaler = TokenRateAutoscaler(capacity, 0, 4, utilization=1.0, prior_output_tokens=20)
    wanted = [
        scaler.wanted(PoolSignal(i / rate, num_outstanding=1, arrival=request(i, i / rate)))
        for i in range(int(5 * rate))
    ]
    # One request outstanding at a time (no queue): the concurrency rule would want one.
    assert wanted[0] == 1 and wanted[-1] == 2
    assert scaler.work_rate(5.0) == pytest.approx(1.5, rel=0.1)


def test_token_rate_pool_starts_a_container_while_nothing_waits(profile: EngineProfile) -> None:
    # One warm container; short requests arriving at 1.5x one instance's token capacity.
    # The first cold start begins while no request is queued anywhere.
    capacity = TokenCapacity.from_profile(profile, Slo())
    gap_s = capacity.work_s(50, 20) / 1.5
    config = PoolConfig(num_containers=3, initial_warm=1, record_steps=False)
    sim = PoolSimulation("twp_slo", profile, config, np.random.default_rng(0))
    sim.add_arrivals([RequestSpec(i * gap_s, 50, 20) for i in range(400)])
    sim.run()
    scale_outs = sim.pool.scale_outs
    assert scale_outs and scale_outs[0].num_waiting == 0
    assert scale_outs[0].time_s < 2.0


def test_token_rate_pool_scales_to_zero_after_keep_alive(profile: EngineProfile) -> None:
    # A short burst makes the autoscaler start the second container; once the work is done
    # every container goes cold one keep-alive after it last had work (a started one after
    # its load completes), and the bill stops there.
    config = PoolConfig(num_containers=2, initial_warm=1, keep_alive_s=1.0,
                        scale_down_window_s=0.5, record_steps=False)  # fmt: skip
    sim = PoolSimulation("twp_slo", profile, config, np.random.default_rng(0))
    sim.add_arrivals([RequestSpec(0.01 * i, 50, 20) for i in range(40)])
    sim.run()
    assert len(sim.pool.scale_outs) == 1
    last_s = max(r.finished_s or 0.0 for r in sim.requests)
    ready_s = max(s.ready_s for c in sim.containers for s in c.cold_starts)
    assert all(c.state is ContainerState.COLD for c in sim.containers)
    assert sim.containers[0].container_seconds(1e6) == pytest.approx(last_s + 1.0)
    started_s = sim.containers[1].cold_starts[0].start_s
    assert sim.containers[1].container_seconds(1e6) == pytest.approx(ready_s + 1.0 - started_s)


def test_requests_waiting_on_a_loading_container_move_to_a_window_with_room(
    profile: EngineProfile,
) -> None:
    config = PoolConfig(num_containers=2, initial_warm=1, record_steps=False)
    sim = PoolSimulation("twp_slo", profile, config, np.random.default_rng(0))
    warm, loading = sim.containers
    for i in range(3):
        loading.submit(request(i, 0.0), 0.0)  # starts its cold start; they wait there
    assert loading.state is ContainerState.LOADING
    assert sim.pool.balancer is not None
    assert sim.pool.balancer.on_room(warm, 0.1) == 3
    assert len(loading.loop.waiting) == 0 and warm.num_outstanding == 3
    sim.run()
    assert all(r.container_id == 0 and r.is_done for r in (warm.loop.finished))
    assert all(r.cold_start_s > 0 for r in warm.loop.finished)  # the 0.1 s they waited there


def test_headroom_router_ignores_requests_past_the_ttft_objective(
    profile: EngineProfile,
) -> None:
    # Container 0 also holds five long prompts that arrived at t = 0, past the 2 s TTFT
    # objective at 2.5 s: twp_slo serves them after any request that can still meet it.
    # Container 1 holds one fresh short prompt, which does go before a new arrival.
    sim = busy_pair(profile, until_s=2.5, max_tokens=400)
    for i in range(2, 7):
        sim.containers[0].submit(request(i, 0.0, prompt=3000), 2.5)
    sim.containers[1].submit(request(7, 2.4, prompt=50), 2.5)
    views = sim.pool.views(2.5)
    rooms = [v.headroom for v in views]
    assert rooms[0] is not None and rooms[1] is not None
    assert rooms[0].wait_s == pytest.approx(0.0)
    assert rooms[1].wait_s == pytest.approx(50 * profile.prefill_ms_per_token / 1000)
    assert sim.pool.router.route(request(9, 2.5), views) == 0
    # The whole queue would have sent it to container 1: 15,000 prompt tokens wait on 0.
    policy = sim.containers[0].loop.policy
    assert isinstance(policy, TwpSloPolicy)
    whole = policy.window_state(sim.containers[0].loop.running, sim.containers[0].loop.waiting)
    assert whole.prefill_backlog_s == pytest.approx(15_000 * profile.prefill_ms_per_token / 1000)


def test_an_idle_window_takes_requests_queued_behind_late_ones(profile: EngineProfile) -> None:
    # Container 0's window has room (its queue does not overflow it), but the five requests
    # waiting there are past the TTFT objective, so new work keeps going there ahead of
    # them; container 1 has nothing waiting and takes them.
    sim = busy_pair(profile, until_s=2.5, max_tokens=400)
    source, target = sim.containers
    for i in range(2, 7):
        source.submit(request(i, 0.0, prompt=3000), 2.5)
    policy = source.loop.policy
    assert isinstance(policy, TwpSloPolicy)
    state = policy.window_state(source.loop.running, source.loop.waiting, 2.5)
    assert state.free > 0 and state.num_behind == 5
    assert sim.pool.balancer is not None
    assert sim.pool.balancer.on_room(target, 2.5) == 5
    assert len(source.loop.waiting) == 0 and len(target.loop.waiting) == 5
