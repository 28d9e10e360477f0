"""A small open-loop workload on the real engine in wall-clock time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.native import NativeEngine
from tokenpace.engine.native.realtime import run_realtime
from tokenpace.engine.profile import load_profile
from tokenpace.policy import build_policy
from tokenpace.workload.spec import RequestSpec

pytestmark = [pytest.mark.native, pytest.mark.slow]


def test_realtime_run_finishes_every_request(make_engine: Callable[..., NativeEngine]) -> None:
    engine = make_engine()
    specs = [
        RequestSpec(0.0, 20, 4, prompt="Tell me a joke about cats and dogs, please."),
        RequestSpec(0.05, 40, 6),
        RequestSpec(0.3, 12, 3, prompt="Hi"),
    ]
    policy = build_policy("twp", load_profile("v100-llama-3.2-3b"))
    outcome = run_realtime(specs, policy, engine, sampling=SamplingParams(ignore_eos=True))
    assert all(r.is_done for r in outcome.requests)
    assert all(r.num_output_tokens == r.max_tokens for r in outcome.requests)
    for request in outcome.requests:
        assert request.token_times_s[0] >= request.arrival_s
        assert request.prompt_token_ids is not None
        assert len(request.prompt_token_ids) == request.num_prompt_tokens
    assert engine.num_free_blocks == engine.num_total_blocks
    assert outcome.end_s >= 0.3
