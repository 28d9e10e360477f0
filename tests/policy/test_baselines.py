"""Each baseline behaves as the paper (and vLLM) describe it."""

from __future__ import annotations

from tests.helpers import request, running, state
from tokenpace.policy import POLICIES, build_policy
from tokenpace.policy.dynamic_batch import DynamicBatchConfig, DynamicBatchPolicy
from tokenpace.policy.vllm_default import VllmDefaultConfig, VllmDefaultPolicy


def test_registry_has_the_paper_schedulers(paper_profile) -> None:  # type: ignore[no-untyped-def]
    for name in ("twp", "fcfs", "priority", "dynamic_batch", "vllm_default"):
        assert name in POLICIES
        assert build_policy(name, paper_profile).name == name


def test_fcfs_admits_everything_that_fits_in_arrival_order(paper_profile) -> None:  # type: ignore[no-untyped-def]
    policy = build_policy("fcfs", paper_profile)
    waiting = [request(i, prompt=100) for i in range(50)]
    plan = policy.plan(state(waiting))
    assert plan.admit_ids == tuple(range(50))  # no concurrency bound
    assert all(n == 100 for n in plan.num_scheduled_tokens.values())  # whole prompt


def test_fcfs_stops_at_first_request_that_does_not_fit(paper_profile) -> None:  # type: ignore[no-untyped-def]
    policy = build_policy("fcfs", paper_profile)
    waiting = [request(0, prompt=32), request(1, prompt=64), request(2, prompt=16)]
    plan = policy.plan(state(waiting, free_blocks=5))  # 2 + 4 > 5
    assert plan.admit_ids == (0,)


def test_priority_admits_shortest_prompt_first(paper_profile) -> None:  # type: ignore[no-untyped-def]
    policy = build_policy("priority", paper_profile)
    waiting = [request(0, prompt=300), request(1, prompt=40), request(2, prompt=40),
               request(3, prompt=100)]  # fmt: skip
    plan = policy.plan(state(waiting, free_blocks=10))  # 3 + 3 + 7 > 10
    assert plan.admit_ids == (1, 2)


def test_dynamic_batch_cap_follows_the_static_itl_target() -> None:
    policy = DynamicBatchPolicy(DynamicBatchConfig(itl_target_ms=60, max_batch=256))
    active = [running(100 + i, 10, 50, 1) for i in range(20)]
    waiting = [request(i) for i in range(10)]
    # ITL above target: cap = floor(20 * 0.8) = 16 < 20 running: admit nothing.
    plan = policy.plan(state(waiting, active, latency_s=0.070))
    assert plan.admit_ids == ()
    assert policy.telemetry()["batch_cap"] == 16
    # Below target: the cap grows by one per step.
    policy.plan(state(waiting, active[:15], latency_s=0.050))
    assert policy.telemetry()["batch_cap"] == 17
    plan = policy.plan(state(waiting, active[:15], latency_s=0.050))
    assert plan.admit_ids == (0, 1, 2)  # cap 18 - 15 running


def test_vllm_default_token_budget_and_max_num_seqs() -> None:
    policy = VllmDefaultPolicy(VllmDefaultConfig(max_num_batched_tokens=100, max_num_seqs=4))
    active = [running(100, 10, 50, 1), running(101, 10, 50, 1)]
    waiting = [request(0, prompt=60), request(1, prompt=60), request(2, prompt=5)]
    plan = policy.plan(state(waiting, active))
    # Budget 100: 2 decode tokens, then request 0 takes 60, request 1 the last 38 (a
    # partial chunk); request 2 is not reached (budget spent).
    assert plan.admit_ids == (0, 1)
    assert plan.num_scheduled_tokens == {100: 1, 101: 1, 0: 60, 1: 38}
    policy_small = VllmDefaultPolicy(VllmDefaultConfig(max_num_batched_tokens=2048, max_num_seqs=3))
    assert policy_small.plan(state(waiting, active)).admit_ids == (0,)
