"""The ``vllm`` bench runner: tiny requests through the engine it opens, two runs on it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.vllm.model import embedded_model, set_vllm_environment
from tokenpace.core.request import RequestStatus
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.workload.spec import RequestSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_runner_serves_every_request_under_twp_then_fcfs() -> None:
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    embedded_model()
    from tokenpace.bench.runners import RunnerSet, RunRequest

    specs = [RequestSpec(0.0, 16, 4), RequestSpec(0.05, 16, 4), RequestSpec(0.1, 16, 4)]
    profile = load_profile("v100-llama-3.2-3b")
    with pytest.MonkeyPatch.context() as patch:
        set_vllm_environment(patch, "twp")
        with RunnerSet() as runners:
            runner = runners.get("vllm")
            outputs = [
                runner(RunRequest(name, specs, profile, np.random.default_rng(0), Slo()))
                for name in ("twp", "fcfs")
            ]
            assert runners.get("vllm") is runner  # one engine for both runs

    for output in outputs:
        assert len(output.requests) == len(specs)
        for request in output.requests:
            assert request.status is RequestStatus.FINISHED
            assert request.num_output_tokens == 4
            assert len(request.token_times_s) == 4
        steps = output.steps[0]
        assert steps and sum(s.num_admitted for s in steps) == len(specs)
        assert sum(r.num_preemptions for r in output.requests) == 0
