"""Each baseline behaves as the paper (and vLLM) describe it."""

from __future__ import annotations

import pytest

from tests.helpers import request, running, state
from tokenpace.engine.profile import load_profile
from tokenpace.policy import POLICIES, build_policy
from tokenpace.policy.dynamic_batch import DynamicBatchConfig, DynamicBatchPolicy
from tokenpace.policy.fcfs import FcfsConfig, FcfsPolicy
from tokenpace.policy.sarathi import SarathiConfig, SarathiPolicy
from tokenpace.policy.sla_batch import SlaBatchConfig, SlaBatchPolicy
from tokenpace.policy.vllm_default import VllmDefaultConfig, VllmDefaultPolicy


def test_registry_has_the_paper_schedulers(paper_profile) -> None:  # type: ignore[no-untyped-def]
    for name in ("twp", "fcfs", "priority", "dynamic_batch", "vllm_default", "sarathi",
                 "sla_batch"):  # fmt: skip
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


def test_vllm_default_admits_nobody_when_running_requests_need_every_block() -> None:
    policy = VllmDefaultPolicy(VllmDefaultConfig())
    # Two decoding requests each about to open a new 16-token block; one block is free.
    active = [running(100, 16, 50, 1), running(101, 16, 50, 1)]
    plan = policy.plan(state([request(0, prompt=8)], active, free_blocks=1))
    assert plan.admit_ids == ()  # the step loop will preempt; nobody joins this step
    assert plan.num_scheduled_tokens == {100: 1, 101: 1}


def test_priority_is_shortest_prompt_first_under_the_token_budget() -> None:
    policy = build_policy("priority", load_profile("v100-llama-3.2-3b"))
    waiting = [request(0, prompt=1500), request(1, prompt=900), request(2, prompt=1200)]
    plan = policy.plan(state(waiting))
    # Budget 2048: 900 whole, then 1148 of the 1,200-token prompt; the longest waits.
    assert plan.admit_ids == (1, 2)
    assert plan.num_scheduled_tokens == {1: 900, 2: 1148}
    fcfs = build_policy("vllm_default", load_profile("v100-llama-3.2-3b")).plan(state(waiting))
    assert fcfs.admit_ids == (0, 1)


def test_sarathi_serves_decodes_first_then_fills_the_budget_with_chunks() -> None:
    policy = SarathiPolicy(SarathiConfig(token_budget=64, max_num_seqs=128))
    prefilling = request(50, prompt=500)
    prefilling.num_computed_tokens = 100  # admitted earlier, mid-prompt
    active = [prefilling, *(running(100 + i, 10, 50, 1) for i in range(10))]
    plan = policy.plan(state([request(0, prompt=40)], active))
    # 10 decode tokens first, then the running prefill takes the other 54; no room is left.
    assert plan.num_scheduled_tokens[50] == 54
    assert all(plan.num_scheduled_tokens[100 + i] == 1 for i in range(10))
    assert plan.admit_ids == ()
    # Admission needs KV room for the whole prompt, not just the chunk.
    small = policy.plan(state([request(1, prompt=200)], [], free_blocks=12))  # 13 needed
    assert small.admit_ids == ()
    assert policy.plan(state([request(1, prompt=200)], [], free_blocks=13)).admit_ids == (1,)


def test_sla_batch_bound_follows_the_itl_band_and_the_memory_guardrail() -> None:
    policy = SlaBatchPolicy(SlaBatchConfig(itl_target_ms=100, smoothing=1.0, max_num_seqs=256))
    active = [running(100 + i, 10, 50, 1) for i in range(40)]
    waiting = [request(i) for i in range(50)]
    # 125 ms > 100 ms target: the bound drops to 40 * 100 / 125 = 32 < 40 running.
    assert policy.plan(state(waiting, active, latency_s=0.125)).admit_ids == ()
    assert policy.telemetry()["sla_bound"] == 32
    # Inside the band (85-100 ms): the bound holds.
    policy.plan(state(waiting, active[:30], latency_s=0.090))
    assert policy.telemetry()["sla_bound"] == 32
    # Below the band: it grows by 10% (at least one request).
    plan = policy.plan(state(waiting, active[:30], latency_s=0.050))
    assert policy.telemetry()["sla_bound"] == pytest.approx(35.2)
    assert len(plan.admit_ids) == 5
    # The memory guardrail: 30 running requests hold 900 of 1,000 blocks (30 each), so
    # 0.9 * 1000 / 30 = 30 fit and nobody is admitted, whatever the latency says.
    plan = policy.plan(state(waiting, active[:30], latency_s=0.050, free_blocks=100,
                             total_blocks=1000))  # fmt: skip
    assert policy.telemetry()["memory_bound"] == 30
    assert plan.admit_ids == ()


def test_fcfs_holds_max_num_seqs() -> None:
    policy = FcfsPolicy(FcfsConfig(max_num_seqs=5))
    active = [running(100 + i, 10, 50, 1) for i in range(3)]
    assert policy.plan(state([request(i) for i in range(10)], active)).admit_ids == (0, 1)
