"""TokenpaceScheduler inside a real vLLM engine: the per-step record shows that vLLM admitted
exactly what the policy chose, in its order, and every request completes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.vllm.policy_setup import engine_profile
from tokenpace.engine.vllm.step_log import SchedulerStepRecord
from tokenpace.policy import Policy
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.policy import TwpPolicy

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


class NeverAdmit:
    """Breaks the policy contract on purpose: never admits anything."""

    name = "never_admit"

    def plan(self, state: StepState) -> StepPlan:
        return StepPlan.make_empty()

    def telemetry(self) -> Mapping[str, float]:
        return {}


def _prompts(lengths: Sequence[int]) -> list[Any]:
    from vllm.inputs import TokensPrompt

    return [
        TokensPrompt(prompt_token_ids=[100 + (7 * i + j) % 5000 for j in range(n)])
        for i, n in enumerate(lengths)
    ]


def _run(
    llm: Any, policy: Policy | str, lengths: Sequence[int], max_tokens: int
) -> tuple[Any, list[Any], list[SchedulerStepRecord]]:
    from vllm import SamplingParams

    from tokenpace.engine.vllm.scheduler import records_since, scheduler_of

    scheduler = scheduler_of(llm)
    scheduler.use_policy(policy)
    start = scheduler.step_index
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(_prompts(lengths), params, use_tqdm=False)
    records = records_since(scheduler, start)
    # Nothing leaks: vLLM's queues and the mirror are empty once every request finished.
    assert len(scheduler.waiting) == 0 and not scheduler.running
    assert len(scheduler.mirror) == 0 and len(scheduler.mirror.waiting) == 0
    return scheduler, outputs, records


def _assert_admissions_followed_plan(records: Sequence[SchedulerStepRecord]) -> None:
    for record in records:
        chosen = (*record.planned_ids, *record.liveness_ids)
        assert record.admitted_ids == chosen[: len(record.admitted_ids)], record


def _assert_window_held(records: Sequence[SchedulerStepRecord]) -> None:
    """TWP's gate: the load after admission stays within the window, except force-admits
    and the one request an idle server may start whatever its size."""
    for record in records:
        assert record.token_window is not None
        non_forced = [i for i in record.admitted_ids if i not in record.forced_ids]
        if not non_forced:
            continue
        idle_start = record.token_load_before + record.forced_load == 0 and len(non_forced) == 1
        assert record.token_load_after <= record.token_window + 1e-9 or idle_start, record


def test_twp_admissions_follow_the_policy_and_the_window_holds(vllm_llm: Any) -> None:
    from tokenpace.engine.vllm.scheduler import scheduler_of

    scheduler = scheduler_of(vllm_llm)
    profile = engine_profile("v100-llama-3.2-3b", scheduler.block_size, scheduler.num_total_blocks)
    # A window of 64-128 tokens against 10 requests x 24 tokens: the gate must bind.
    config = TwpConfig.from_profile(
        profile, h0_tokens=96, h_min_tokens=64, h_max_tokens=128, chunk_tokens=32
    )
    lengths = [40 + 9 * i for i in range(10)]
    scheduler, outputs, records = _run(vllm_llm, TwpPolicy(config), lengths, max_tokens=24)

    assert [len(o.outputs[0].token_ids) for o in outputs] == [24] * 10
    assert scheduler.scheduler_config.long_prefill_token_threshold == 32
    _assert_admissions_followed_plan(records)
    _assert_window_held(records)
    assert all(not r.liveness_ids for r in records)
    assert all(r.num_scheduled_tokens > 0 for r in records)
    # The gate really withheld requests while others ran, and every request got in.
    assert any(r.num_running > 0 and r.num_waiting > len(r.planned_ids) for r in records)
    admitted = [i for r in records for i in r.admitted_ids]
    assert sorted(admitted) == sorted(set(admitted)) and len(admitted) == 10
    # Chunked prefill at C = 32: a step computes at most 32 prompt tokens per new request.
    first = records[0]
    assert first.num_scheduled_tokens <= 32 * len(first.admitted_ids)
    # Measured step latencies reach the policy from the second step on.
    assert records[0].last_step_latency_s is None or records[0].step_index > 0
    assert all(r.last_step_latency_s is not None and r.last_step_latency_s > 0 for r in records[1:])


def test_twp_slo_steps_carry_no_more_prefill_than_its_plan(vllm_llm: Any) -> None:
    # Long prompts arriving together: vLLM alone would prefill them in 512-token steps
    # beside the decodes; twp_slo's plan pays for what its ITL target leaves per step.
    lengths = [400, 460, 430, 410, 450, 420]
    scheduler, outputs, records = _run(vllm_llm, "twp_slo", lengths, max_tokens=12)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [12] * len(lengths)
    _assert_admissions_followed_plan(records)
    bound = [r for r in records if r.planned_tokens is not None]
    assert len(bound) >= len(records) - 1
    for record in bound:
        assert record.planned_tokens is not None
        assert record.num_scheduled_tokens <= record.planned_tokens, record
    # Each record's shape: its decodes over contexts past the prompt (the computed tokens
    # before the step), its prefill chunks within a prompt.
    for record in records:
        shape = record.shape
        assert shape is not None
        assert len(shape.decode_contexts) == record.num_decode_tokens
        prefill = sum(chunk.num_tokens for chunk in shape.prefill_chunks)
        assert prefill == record.num_scheduled_tokens - record.num_decode_tokens
        assert all(min(lengths) <= c < max(lengths) + 12 for c in shape.decode_contexts)
        assert all(c.context_start + c.num_tokens <= max(lengths) for c in shape.prefill_chunks)
    # vLLM carries prefill beside decodes exactly where the plan grants it. How much the
    # budget grants follows the machine's measured steps through the policy's calibration:
    # on one machine the largest shares were 342 and 410 tokens in two runs; on one whose
    # 512-token prefill took 8 s and decode steps 65 ms, decodes alone used the ITL target
    # up and no step mixed.
    granted = [
        r for r in bound if r.num_decode_tokens and (r.planned_tokens or 0) > r.num_decode_tokens
    ]
    mixed = [
        r for r in bound if r.num_decode_tokens and r.num_scheduled_tokens > r.num_decode_tokens
    ]
    assert mixed == granted
    # The budget, not vLLM's token limit, sets a decode step's prefill share: vLLM alone
    # fills each step to max_num_batched_tokens with these prompts, so the bound is vLLM's
    # limit, not a prompt's length.
    limit = scheduler.scheduler_config.max_num_batched_tokens
    assert all(r.num_scheduled_tokens < limit for r in mixed), (limit, mixed)
    # The scheduler's own limits are restored after every pass.
    assert scheduler.max_num_scheduled_tokens == scheduler.scheduler_config.max_num_batched_tokens


@pytest.mark.parametrize("policy", ["twp", "fcfs"])
def test_outputs_complete(vllm_llm: Any, policy: str) -> None:
    lengths = [12, 30, 55, 80, 21, 64]
    scheduler, outputs, records = _run(vllm_llm, policy, lengths, max_tokens=16)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [16] * len(lengths)
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    _assert_admissions_followed_plan(records)
    if policy == "fcfs":
        # No concurrency bound: everything is admitted on the first step, prompts unchunked.
        assert len(records[0].admitted_ids) == len(lengths)
        assert scheduler.scheduler_config.long_prefill_token_threshold == 0
        assert all(r.planned_tokens is None for r in records)
    else:
        _assert_window_held(records)


def test_withholding_policy_does_not_spin(vllm_llm: Any) -> None:
    scheduler, outputs, records = _run(vllm_llm, NeverAdmit(), [20, 20, 20], max_tokens=8)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [8, 8, 8]
    # Every step computed tokens: no empty schedule() calls, hence no busy loop.
    assert all(r.num_scheduled_tokens > 0 for r in records)
    # The head of the queue started whenever the engine went idle, one request at a time.
    assert sum(len(r.liveness_ids) for r in records) == 3
    assert len(records) == 3 * 8
    scheduler.use_policy("twp")


def test_preempted_requests_return_to_the_queue_and_complete(vllm_llm: Any) -> None:
    from tokenpace.engine.vllm.scheduler import scheduler_of

    scheduler = scheduler_of(vllm_llm)
    block_size, total = scheduler.block_size, scheduler.num_total_blocks
    # Prompts that fit the cache together, outputs that do not: vLLM must preempt.
    num_requests = 6
    prompt_blocks = max(1, (total - num_requests) // num_requests)
    prompt_len = prompt_blocks * block_size - block_size // 2
    max_tokens = 3 * block_size
    assert num_requests * (prompt_blocks + 3) > total
    _, outputs, records = _run(vllm_llm, "fcfs", [prompt_len] * num_requests, max_tokens)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [max_tokens] * num_requests
    assert sum(r.num_preempted for r in records) > 0
    _assert_admissions_followed_plan(records)
    admitted = [i for r in records for i in r.admitted_ids]
    assert len(admitted) > len(set(admitted)) == num_requests
    scheduler.use_policy("twp")
