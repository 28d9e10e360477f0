"""Workloads and throughput through the serving backend over the shared vLLM engine."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from tests.engine.vllm.model import DTYPE
from tokenpace.core.request import RequestStatus
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.request_metrics import latencies
from tokenpace.metrics.slo import Slo
from tokenpace.runtime.replay import replay
from tokenpace.server.worker.dtype_choice import DtypeChoice
from tokenpace.workload.spec import RequestSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def backend_over(llm: Any) -> Any:
    from tokenpace.engine.vllm.scheduler import scheduler_of
    from tokenpace.server.worker.vllm_backend import VllmBackend

    scheduler_of(llm).clock = time.perf_counter
    profile = load_profile("v100-llama-3.2-3b")
    return VllmBackend(llm, profile, time.perf_counter, DtypeChoice(DTYPE, 1))


def test_workload_respects_arrivals_and_stamps_every_token(vllm_llm: Any) -> None:

    specs = [
        RequestSpec(0.0, 24, 12),
        RequestSpec(0.0, 40, 8, prompt="Name three primary colors."),
        RequestSpec(0.3, 16, 10),
        RequestSpec(0.6, 64, 12),
        RequestSpec(0.9, 8, 6),
        RequestSpec(1.2, 32, 12),
    ]
    backend = backend_over(vllm_llm)
    profile = load_profile("v100-llama-3.2-3b")
    greedy = SamplingParams(ignore_eos=True)
    backend.use_policy("vllm_default", profile, Slo())
    assert replay(specs[:2], backend, greedy).end_s > 0
    backend.use_policy("twp", profile, Slo(), record_steps=True)
    run = replay(specs, backend, greedy)
    assert run.end_s >= 1.2 and run.steps
    for spec, request in zip(specs, run.requests, strict=True):
        assert request.status is RequestStatus.FINISHED
        assert request.num_output_tokens == spec.max_tokens
        assert request.queued_s is not None and request.queued_s >= spec.arrival_s
        assert request.admitted_s is not None and request.admitted_s >= spec.arrival_s
        assert request.token_times_s[0] >= request.admitted_s
        assert request.token_times_s == sorted(request.token_times_s)
        assert request.finished_s == request.token_times_s[-1]
    # The text prompt was tokenized and fitted to its token count, as on every engine.
    prompt = run.requests[1].prompt_token_ids
    assert prompt is not None and len(prompt) == 40
    assert prompt[:3] == backend.encode("Name three primary colors.")[:3]
    measured = latencies(run.requests, Slo())
    assert len(measured.ttft_ms) == len(specs) and (measured.itl_ms > 0).all()
    # Step records in the step loop's format: every prompt and output token was computed
    # in one (the last token is sampled, not computed), and times run from the start.
    steps = run.steps
    assert steps[0].start_s >= 0 and all(s.latency_s >= 0 for s in steps)
    assert sum(s.num_admitted for s in steps) == len(specs)
    num_tokens = sum(s.num_decode_tokens + s.num_prefill_tokens for s in steps)
    assert num_tokens == sum(len(p.prompt_token_ids or ()) + p.max_tokens - 1 for p in run.requests)


def test_throughput_at_two_batch_sizes(vllm_llm: Any) -> None:
    from tokenpace.bench.throughput import measure_throughput

    profile = load_profile("v100-llama-3.2-3b")
    points = measure_throughput(
        backend_over(vllm_llm), profile, batch_sizes=(1, 4), prompt_tokens=16, output_tokens=12
    )
    assert [p.batch_size for p in points] == [1, 4]
    for point in points:
        assert point.tokens_per_s > 0 and point.wall_s > 0
        assert math.isfinite(point.decode_step_ms) and point.decode_step_ms > 0
        assert 0 < point.prefill_s < point.wall_s
        assert 0 <= point.outside_steps_s < point.wall_s - point.prefill_s
