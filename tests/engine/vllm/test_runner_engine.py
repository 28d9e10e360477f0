"""Workloads and throughput through the shared vLLM engine."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tokenpace.core.request import RequestStatus
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.request_metrics import latencies
from tokenpace.metrics.slo import Slo
from tokenpace.workload.spec import RequestSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_workload_respects_arrivals_and_stamps_every_token(vllm_llm: Any) -> None:
    from tokenpace.engine.vllm.runner import policy_for, run_workload, warm_up

    specs = [
        RequestSpec(0.0, 24, 12),
        RequestSpec(0.0, 40, 8, prompt="Name three primary colors."),
        RequestSpec(0.3, 16, 10),
        RequestSpec(0.6, 64, 12),
        RequestSpec(0.9, 8, 6),
        RequestSpec(1.2, 32, 12),
    ]
    assert warm_up(vllm_llm, specs[:2]) > 0
    policy = policy_for(vllm_llm, "twp", load_profile("v100-llama-3.2-3b"))
    run = run_workload(vllm_llm, specs, policy)
    assert run.wall_s >= 1.2 and run.steps
    for spec, request in zip(specs, run.requests, strict=True):
        assert request.status is RequestStatus.FINISHED
        assert request.num_output_tokens == spec.max_tokens
        assert request.queued_s is not None and request.queued_s >= spec.arrival_s
        assert request.admitted_s is not None and request.admitted_s >= spec.arrival_s
        assert request.token_times_s[0] >= request.admitted_s
        assert request.token_times_s == sorted(request.token_times_s)
        assert request.finished_s == request.token_times_s[-1]
    # The text prompt was tokenized; the others use their exact token counts.
    assert run.requests[1].num_prompt_tokens != 40
    assert run.requests[3].num_prompt_tokens == 64
    measured = latencies(run.requests, Slo())
    assert len(measured.ttft_ms) == len(specs) and (measured.itl_ms > 0).all()
    # Step records in the step loop's format: every output token was a decode or ended a
    # prefill, and times run from the workload's start.
    steps = run.step_records()
    assert len(steps) == len(run.steps)
    assert steps[0].start_s >= 0 and all(s.latency_s >= 0 for s in steps)
    assert sum(s.num_admitted for s in steps) == len(specs)
    num_tokens = sum(s.num_decode_tokens + s.num_prefill_tokens for s in steps)
    assert num_tokens == sum(r.num_scheduled_tokens for r in run.steps)


def test_throughput_at_two_batch_sizes(vllm_llm: Any) -> None:
    from tokenpace.engine.vllm.throughput import measure_throughput

    points = measure_throughput(vllm_llm, batch_sizes=(1, 4), prompt_tokens=16, output_tokens=12)
    assert [p.batch_size for p in points] == [1, 4]
    for point in points:
        assert point.tokens_per_s > 0 and point.wall_s > 0
        assert math.isfinite(point.decode_step_ms) and point.decode_step_ms > 0
