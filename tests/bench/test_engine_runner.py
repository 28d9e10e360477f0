"""The native engine's bench runner: a run's KV cache size reaches the real engine, which
is loaded again, in the precision first chosen, when the size changes (as a bench's
kv_pressure part follows main and high)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from tokenpace.bench.engine_runner import EngineRunner, vllm_engine_config
from tokenpace.bench.runners import RunnerSet, RunRequest
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.workload.spec import RequestSpec

# Threads that sleep at barriers: a spinning two-thread step can run many times slower under
# a competing busy process. Read when torch loads its OpenMP, so before the engine loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.mark.native
@pytest.mark.slow
def test_a_run_with_its_own_kv_cache_runs_on_an_engine_of_that_size() -> None:
    # Three requests of 3 blocks each arriving together: a 4-block cache holds one at a time.
    pytest.importorskip("torch", reason="the native engine needs the native extra")
    specs = [RequestSpec(0.0, 40, 8) for _ in range(3)]
    profile = load_profile("v100-llama-3.2-3b")
    small = replace(profile, num_gpu_blocks=4)
    with RunnerSet() as runners:
        runner = runners.get("native")
        assert isinstance(runner, EngineRunner)
        runs = {}
        dtypes = []
        for kv_cache_tokens, run_profile in ((None, profile), (64, small)):
            request = RunRequest(
                "vllm_default", specs, run_profile, np.random.default_rng(0), Slo(),
                kv_cache_tokens=kv_cache_tokens,
            )  # fmt: skip
            runs[kv_cache_tokens] = runner(request)
            dtypes.append(runner.dtype)
    for output in runs.values():
        assert [r.num_output_tokens for r in output.requests] == [8, 8, 8]
    assert max(s.num_used_blocks for s in runs[64].steps[0]) <= 4
    assert max(s.num_used_blocks for s in runs[None].steps[0]) == 9
    assert dtypes[0] is not None and dtypes[1] == dtypes[0]


def test_the_vllm_engine_refuses_a_kv_cache_of_its_own() -> None:
    with pytest.raises(ValueError, match="run on the native engine"):
        vllm_engine_config(4096)
