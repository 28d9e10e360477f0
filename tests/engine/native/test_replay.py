"""A small open-loop workload on the native engine's serving backend in wall-clock time."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tokenpace.core.request import RequestStatus
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.native import NativeEngine
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.runtime.replay import replay
from tokenpace.server.worker.native_backend import StepLoopBackend
from tokenpace.workload.spec import RequestSpec

pytestmark = [pytest.mark.native, pytest.mark.slow]


def test_replay_finishes_every_request(make_engine: Callable[..., NativeEngine]) -> None:
    engine = make_engine()
    profile = load_profile("v100-llama-3.2-3b")
    backend = StepLoopBackend.over(engine, profile, "fcfs", Slo(), time.perf_counter)
    specs = [
        RequestSpec(0.0, 20, 4, prompt="Tell me a joke about cats and dogs, please."),
        RequestSpec(0.05, 40, 6),
        RequestSpec(0.3, 12, 3, prompt="Hi"),
    ]
    backend.use_policy("twp", profile, Slo(), record_steps=True)
    outcome = replay(specs, backend, SamplingParams(ignore_eos=True))
    assert [r.status for r in outcome.requests] == [RequestStatus.FINISHED] * 3
    assert all(r.num_output_tokens == r.max_tokens for r in outcome.requests)
    for request in outcome.requests:
        assert request.queued_s is not None and request.queued_s >= request.arrival_s
        assert request.admitted_s is not None and request.admitted_s >= request.queued_s
        assert request.token_times_s[0] >= request.admitted_s
        assert request.finished_s == request.token_times_s[-1]
        assert request.prompt_token_ids is not None
        assert len(request.prompt_token_ids) == request.num_prompt_tokens
    assert engine.num_free_blocks == engine.num_total_blocks
    assert outcome.end_s >= 0.3
    # Step records on the run's timeline: every admission and every token is in one.
    assert outcome.steps and outcome.steps[0].start_s >= 0
    assert sum(s.num_admitted for s in outcome.steps) == len(specs)
    # A second run on the same backend under another policy starts from a clean record.
    backend.use_policy("fcfs", profile, Slo(), record_steps=False)
    again = replay(specs[:1], backend, SamplingParams(ignore_eos=True))
    assert again.steps == [] and again.requests[0].num_output_tokens == 4
