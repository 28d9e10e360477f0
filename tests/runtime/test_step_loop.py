"""Invariants of the loop under every policy: nothing lost, KV within capacity, T_max bound."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import request, small_profile
from tokenpace.core.request import FinishReason, RequestStatus
from tokenpace.core.step import Rejection, StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.engine.sim import SimEngine
from tokenpace.policy import POLICIES, build_policy
from tokenpace.policy.base import Policy
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.policy import TwpPolicy
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.runtime.step_loop import StepLoop
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec

workloads = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=5.0),
        st.integers(min_value=1, max_value=600),
        st.integers(min_value=1, max_value=120),
    ),
    min_size=1,
    max_size=60,
).map(lambda rows: [RequestSpec(a, p, o) for a, p, o in sorted(rows)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=workloads,
    name=st.sampled_from(sorted(POLICIES.names())),
    blocks=st.sampled_from([48, 80, 400]),
)
def test_no_request_lost_and_kv_never_exceeds_capacity(
    paper_profile: EngineProfile, specs: list[RequestSpec], name: str, blocks: int
) -> None:
    # 48 blocks x 16 = 768 tokens: a few long requests fill it and force preemption.
    profile = small_profile(paper_profile, num_gpu_blocks=blocks, noise_cv=0.02)
    outcome = simulate(specs, build_policy(name, profile), profile, np.random.default_rng(0))
    assert len(outcome.requests) == len(specs)
    for r in outcome.requests:
        if r.status is RequestStatus.REJECTED:  # only by a policy that rejects, never served
            assert name.endswith("early_reject") and r.finish_reason is FinishReason.REJECT
            assert r.admitted_s is None and r.num_computed_tokens == 0 and not r.token_times_s
            continue
        assert r.status is RequestStatus.FINISHED and r.finish_reason is FinishReason.LENGTH
        assert r.num_output_tokens == r.max_tokens
        assert r.token_times_s == sorted(r.token_times_s)
        assert r.token_times_s[0] > r.arrival_s
    assert all(step.num_used_blocks <= blocks for step in outcome.steps)
    # Each record carries the step's shape as the engine ran it.
    for step in outcome.steps:
        assert step.shape is not None
        assert len(step.shape.decode_contexts) == step.num_decode_tokens
        assert sum(c.num_tokens for c in step.shape.prefill_chunks) == step.num_prefill_tokens


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=workloads, t_max=st.integers(min_value=1, max_value=30))
def test_twp_admits_every_request_within_t_max_plus_one_steps(
    paper_profile: EngineProfile, specs: list[RequestSpec], t_max: int
) -> None:
    policy = TwpPolicy(TwpConfig.from_profile(paper_profile, t_max_steps=t_max))
    outcome = simulate(specs, policy, paper_profile, np.random.default_rng(0))
    for r in outcome.requests:
        assert r.admitted_step is not None
        assert r.num_preemptions == 0  # plenty of KV: the bound is about the gate alone
        assert r.admitted_step - r.enqueued_step <= t_max + 1


def test_preemption_returns_request_to_front_and_recomputes(paper_profile: EngineProfile) -> None:
    profile = replace(small_profile(paper_profile, num_gpu_blocks=6), b0=8)
    loop = StepLoop(build_policy("fcfs", profile), SimEngine(profile, np.random.default_rng(0)))
    first, second = request(0, prompt=31, max_tokens=40), request(1, prompt=31, max_tokens=40)
    loop.add_request(first, 0.0)
    loop.add_request(second, 0.0)
    now = 0.0
    while loop.has_work:
        step = loop.begin_step(now)
        assert step is not None
        now += step.result.latency_s
        loop.complete_step(step, now)
        assert loop.engine.num_free_blocks >= 0
    assert second.num_preemptions >= 1
    assert first.num_output_tokens == second.num_output_tokens == 40
    assert loop.engine.num_free_blocks == loop.engine.num_total_blocks


def test_request_larger_than_the_kv_cache_is_refused(paper_profile: EngineProfile) -> None:
    profile = small_profile(paper_profile, num_gpu_blocks=2)
    loop = StepLoop(build_policy("twp", profile), SimEngine(profile, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="exceeds the KV cache capacity of 32 tokens"):
        loop.add_request(request(0, prompt=30, max_tokens=3), 0.0)


def test_abort_frees_blocks_of_running_and_waiting(paper_profile: EngineProfile) -> None:
    loop = StepLoop(build_policy("fcfs", paper_profile),
                    SimEngine(paper_profile, np.random.default_rng(0)))  # fmt: skip
    loop.add_request(request(0, prompt=100, max_tokens=10), 0.0)
    step = loop.begin_step(0.0)
    assert step is not None
    loop.complete_step(step, 0.1)
    loop.add_request(request(1), 0.1)
    assert loop.abort(0, 0.2) is not None and loop.abort(1, 0.2) is not None
    assert loop.abort(7, 0.2) is None
    assert loop.engine.num_free_blocks == loop.engine.num_total_blocks
    assert not loop.has_work


class LimitChecked:
    """A registry policy whose every plan is checked against the engine's ``max_running``
    (what it planned, before the loop could drop anything)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.most_held = 0

    def plan(self, state: StepState) -> StepPlan:
        plan = self.inner.plan(state)
        held = len(state.running) + len(plan.admit_ids)
        assert state.max_running is not None and held <= state.max_running, self.name
        self.most_held = max(self.most_held, held)
        return plan

    def telemetry(self) -> Mapping[str, float]:
        return self.inner.telemetry()


class AdmitsAll:
    """Admits every waiting request whole, whatever the engine holds."""

    name = "admits_all"

    def plan(self, state: StepState) -> StepPlan:
        scheduled = {r.request_id: 1 for r in state.running}
        scheduled.update({r.request_id: r.num_uncomputed_tokens for r in state.waiting})
        return StepPlan(tuple(r.request_id for r in state.waiting), scheduled)

    def telemetry(self) -> Mapping[str, float]:
        return {}


def _run_to_the_end(loop: StepLoop, specs: list[int]) -> int:
    """Add one request per prompt length at time 0, run until done; the most requests
    running after any step's admissions."""
    for i, prompt in enumerate(specs):
        loop.add_request(request(i, prompt=prompt, max_tokens=6), 0.0)
    now, most = 0.0, 0
    while loop.has_work:
        step = loop.begin_step(now)
        assert step is not None
        most = max(most, len(loop.running))
        now += step.result.latency_s
        loop.complete_step(step, now)
    return most


@pytest.mark.parametrize("name", sorted(POLICIES.names()))
def test_every_policy_keeps_within_the_engines_request_limit(
    paper_profile: EngineProfile, name: str
) -> None:
    profile = replace(paper_profile, b0=16)
    policy = LimitChecked(build_policy(name, profile))
    engine = SimEngine(profile, np.random.default_rng(0), max_running=3)
    most = _run_to_the_end(StepLoop(policy, engine), [20 + 3 * i for i in range(12)])
    assert most <= 3
    assert policy.most_held == 3  # the limit binds, and the policy fills it


def test_the_loop_drops_admissions_beyond_the_engines_limit(paper_profile: EngineProfile) -> None:
    engine = SimEngine(paper_profile, np.random.default_rng(0), max_running=4)
    loop = StepLoop(AdmitsAll(), engine)
    assert _run_to_the_end(loop, [10] * 9) == 4
    assert sorted(r.request_id for r in loop.finished) == list(range(9))
    assert all(r.num_output_tokens == 6 for r in loop.finished)


def test_a_request_limit_must_be_positive(paper_profile: EngineProfile) -> None:
    with pytest.raises(ValueError, match="max_running must be positive, got 0"):
        SimEngine(paper_profile, np.random.default_rng(0), max_running=0)


class Rejecting:
    """FCFS that, at step ``at_step``, rejects the waiting requests ``ids``."""

    name = "rejecting"

    def __init__(self, profile: EngineProfile, ids: tuple[int, ...], at_step: int) -> None:
        self.inner = build_policy("fcfs", profile)
        self.ids = ids
        self.at_step = at_step

    def plan(self, state: StepState) -> StepPlan:
        plan = self.inner.plan(state)
        if state.step_index != self.at_step:
            return plan
        rejections = tuple(Rejection(i, 3.0, 2.0) for i in self.ids)
        keep = tuple(i for i in plan.admit_ids if i not in self.ids)
        scheduled = {k: v for k, v in plan.num_scheduled_tokens.items() if k not in self.ids}
        return replace(plan, admit_ids=keep, num_scheduled_tokens=scheduled, rejections=rejections)

    def telemetry(self) -> Mapping[str, float]:
        return {}


def test_rejected_requests_leave_the_queue_unserved(paper_profile: EngineProfile) -> None:
    engine = SimEngine(paper_profile, np.random.default_rng(0))
    loop = StepLoop(Rejecting(paper_profile, (1,), at_step=0), engine)
    for i in range(2):
        loop.add_request(request(i, prompt=20, max_tokens=2), 0.0)
    step = loop.begin_step(0.5)
    assert step is not None and [c.request.request_id for c in step.chunks] == [0]
    (rejected,) = [r for r in loop.finished if r.request_id == 1]
    assert rejected.status is RequestStatus.REJECTED
    assert rejected.finish_reason is FinishReason.REJECT
    assert rejected.finished_s == 0.5 and rejected.is_done
    assert [r.request_id for r in loop.rejections] == [1]
    assert len(loop.waiting) == 0


def test_a_policy_may_not_reject_a_request_it_served(paper_profile: EngineProfile) -> None:
    profile = replace(small_profile(paper_profile, num_gpu_blocks=6), b0=8)
    policy = Rejecting(profile, (1,), at_step=-1)
    loop = StepLoop(policy, SimEngine(profile, np.random.default_rng(0)))
    loop.add_request(request(0, prompt=31, max_tokens=40), 0.0)
    loop.add_request(request(1, prompt=31, max_tokens=40), 0.0)
    # Run until the KV cache cannot hold both: #1, admitted, is preempted back to the
    # queue (its computed tokens thrown away). Rejecting it then breaks the contract.
    now = 0.0
    while not any(r.admitted_s is not None for r in loop.waiting):
        step = loop.begin_step(now)
        assert step is not None
        now += step.result.latency_s
        loop.complete_step(step, now)
    (preempted,) = list(loop.waiting)
    assert preempted.request_id == 1 and not preempted.can_be_rejected
    policy.at_step = loop.step_index
    with pytest.raises(RuntimeError, match="rejected request 1, which it admits or which was"):
        loop.begin_step(now)


def test_online_calibration_hands_the_refitted_profile_to_the_policy(
    paper_profile: EngineProfile,
) -> None:
    """The policy was built for l_min 43 ms; the engine runs at 70 ms. Asked for online
    calibration, the loop refits the profile from the steps and the policy plans from it;
    by default the policy keeps the profile it was built with."""
    engine_profile = replace(paper_profile, l_min_ms=70.0, decode_attention_ms_per_kctx=0.0)
    specs = [RequestSpec(0.05 * i, 40, 30) for i in range(20)]
    static = TwpPolicy(TwpConfig.from_profile(paper_profile))
    simulate(specs, static, engine_profile, np.random.default_rng(0))
    assert static.config.l_min_ms == 43.0
    live = TwpPolicy(TwpConfig.from_profile(paper_profile))
    calibration = OnlineCalibrationConfig()
    simulate(
        specs, live, engine_profile, np.random.default_rng(0), calibration=calibration,
        policy_profile=paper_profile,
    )  # fmt: skip
    assert live.config.l_min_ms == pytest.approx(70.0, rel=0.05)
    assert live.window.slowdown < static.window.slowdown
