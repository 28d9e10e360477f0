"""Workloads and throughput through the shared vLLM engine."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tokenpace.core.request import RequestStatus
from tokenpace.metrics.request_metrics import latencies
from tokenpace.metrics.slo import Slo
from tokenpace.workload.spec import RequestSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_workload_respects_arrivals_and_stamps_every_token(vllm_llm: Any) -> None:
    from tokenpace.engine.vllm.runner import run_workload

    specs = [
        RequestSpec(0.0, 24, 12),
        RequestSpec(0.0, 40, 8, prompt="Name three primary colors."),
        RequestSpec(0.3, 16, 10),
        RequestSpec(0.6, 64, 12),
        RequestSpec(0.9, 8, 6),
        RequestSpec(1.2, 32, 12),
    ]
    run = run_workload(vllm_llm, specs, "twp")
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


def test_throughput_at_two_batch_sizes(vllm_llm: Any) -> None:
    from tokenpace.engine.vllm.throughput import measure_throughput

    points = measure_throughput(vllm_llm, batch_sizes=(1, 4), prompt_tokens=16, output_tokens=12)
    assert [p.batch_size for p in points] == [1, 4]
    for point in points:
        assert point.tokens_per_s > 0 and point.wall_s > 0
        assert math.isfinite(point.decode_step_ms) and point.decode_step_ms > 0
