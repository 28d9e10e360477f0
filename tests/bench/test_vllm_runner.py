"""The ``vllm`` bench runner: tiny requests through its process-wide vLLM engine."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.vllm.model import embedded_model
from tokenpace.core.request import RequestStatus
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.workload.spec import RequestSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_runner_serves_every_request_under_twp() -> None:
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    embedded_model()
    from tokenpace.bench.runners import RUNNERS, RunRequest

    specs = [RequestSpec(0.0, 16, 4), RequestSpec(0.05, 16, 4), RequestSpec(0.1, 16, 4)]
    run = RunRequest(
        "twp", specs, load_profile("v100-llama-3.2-3b"), np.random.default_rng(0), Slo()
    )
    output = RUNNERS.get("vllm")(run)

    assert len(output.requests) == len(specs)
    for request in output.requests:
        assert request.status is RequestStatus.FINISHED
        assert request.num_output_tokens == 4
        assert len(request.token_times_s) == 4
    steps = output.steps[0]
    assert steps and sum(s.num_admitted for s in steps) == len(specs)
    assert sum(r.num_preemptions for r in output.requests) == 0
