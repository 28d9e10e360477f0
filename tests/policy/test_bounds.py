"""Every baseline's bounds hold at every step, in random states and in whole runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import request, running, small_profile, state
from tokenpace.core.request import Request
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import build_policy
from tokenpace.policy.fcfs import FcfsConfig
from tokenpace.policy.sarathi import SarathiConfig
from tokenpace.policy.sla_batch import SlaBatchPolicy
from tokenpace.policy.vllm_default import VllmDefaultConfig
from tokenpace.sim.run import simulate
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.main_experiment import PoissonWorkload


@dataclass(frozen=True, slots=True)
class Bounds:
    max_num_batched_tokens: int | None
    max_num_seqs: int
    whole_prompt: bool


BOUNDS = {
    "vllm_default": Bounds(VllmDefaultConfig().max_num_batched_tokens,
                           VllmDefaultConfig().max_num_seqs, False),
    "priority": Bounds(VllmDefaultConfig().max_num_batched_tokens,
                       VllmDefaultConfig().max_num_seqs, False),
    "sarathi": Bounds(SarathiConfig().token_budget, SarathiConfig().max_num_seqs, True),
    "sla_batch": Bounds(VllmDefaultConfig().max_num_batched_tokens,
                        VllmDefaultConfig().max_num_seqs, False),
    "fcfs": Bounds(None, FcfsConfig().max_num_seqs, True),
}  # fmt: skip


def check_plan(name: str, state: StepState, plan: StepPlan, extra_seqs: int | None = None) -> None:
    bounds = BOUNDS[name]
    scheduled = plan.num_scheduled_tokens
    limit = bounds.max_num_seqs if extra_seqs is None else extra_seqs
    assert len(state.running) + len(plan.admit_ids) <= max(limit, len(state.running))
    if bounds.max_num_batched_tokens is not None:
        assert sum(scheduled.values()) <= bounds.max_num_batched_tokens
    waiting = {r.request_id: r for r in state.waiting}
    by_id: dict[int, Request] = {r.request_id: r for r in state.running} | waiting
    for request_id, tokens in scheduled.items():
        r = by_id[request_id]
        assert 1 <= tokens <= r.num_uncomputed_tokens
        if not r.is_prefilling:
            assert tokens == 1
    admitted_blocks = 0
    for request_id in plan.admit_ids:
        assert request_id in waiting and request_id in scheduled
        r = waiting[request_id]
        held = r.num_uncomputed_tokens if bounds.whole_prompt else scheduled[request_id]
        admitted_blocks += state.blocks_for(held)
    assert admitted_blocks <= state.num_free_blocks


requests_strategy = st.lists(
    st.tuples(st.integers(1, 3000), st.integers(1, 300), st.integers(0, 250)),
    min_size=0, max_size=300,
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(BOUNDS)),
    waiting=requests_strategy,
    active=requests_strategy,
    free_blocks=st.integers(0, 20_000),
    latency_ms=st.one_of(st.none(), st.floats(1, 500)),
)
def test_baseline_bounds_hold_in_any_state(
    paper_profile: EngineProfile,
    name: str,
    waiting: list[tuple[int, int, int]],
    active: list[tuple[int, int, int]],
    free_blocks: int,
    latency_ms: float | None,
) -> None:
    policy = build_policy(name, paper_profile, Slo())
    queue = [request(i, prompt=p, max_tokens=m) for i, (p, m, _) in enumerate(waiting)]
    runs = [
        running(10_000 + i, p, m + produced, produced + 1)
        for i, (p, m, produced) in enumerate(active)
    ]
    snapshot = state(
        queue, runs, free_blocks=free_blocks, total_blocks=20_000,
        latency_s=None if latency_ms is None else latency_ms / 1000,
    )  # fmt: skip
    plan = policy.plan(snapshot)
    bound = None
    if isinstance(policy, SlaBatchPolicy):
        bound = int(policy.telemetry()["batch_bound"])
    check_plan(name, snapshot, plan, bound)


class CheckedPolicy:
    """Wraps a policy and checks every plan it makes."""

    def __init__(self, name: str, profile: EngineProfile) -> None:
        self.inner = build_policy(name, profile, Slo())
        self.name = name
        self.num_plans = 0

    def plan(self, state: StepState) -> StepPlan:
        plan = self.inner.plan(state)
        bound = None
        if isinstance(self.inner, SlaBatchPolicy):
            bound = int(self.inner.telemetry()["batch_bound"])
        check_plan(self.name, state, plan, bound)
        self.num_plans += 1
        return plan

    def telemetry(self) -> Mapping[str, float]:
        return self.inner.telemetry()


def test_baseline_bounds_hold_at_every_step_of_an_overloaded_run(
    paper_profile: EngineProfile,
) -> None:
    profile = small_profile(paper_profile, num_gpu_blocks=600)  # KV binds: preemptions
    workload = PoissonWorkload(
        rate_per_s=40, duration_s=4, max_requests=400,
        prompt_lengths=LengthMixture(((100, 1500),), (1.0,)),
        output_lengths=LengthMixture(((10, 300),), (1.0,)),
    )  # fmt: skip
    specs = workload.generate(np.random.default_rng(5))
    for name in BOUNDS:
        policy = CheckedPolicy(name, profile)
        outcome = simulate(specs, policy, profile, np.random.default_rng(6), record_steps=True)
        assert all(r.is_done for r in outcome.requests)
        assert policy.num_plans >= len(outcome.steps)
        assert max(s.num_running for s in outcome.steps) <= BOUNDS[name].max_num_seqs
        if name == "vllm_default":  # the KV cache really binds in this run
            assert sum(r.num_preemptions for r in outcome.requests) > 0
