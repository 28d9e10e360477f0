"""The native engine's bench runner: a run's KV cache size and online calibration reach the
real engine, which is loaded again, in the precision first chosen, when they change (as a
bench's kv_pressure part follows main and high)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from tokenpace.bench.engine_runner import EngineRunner, vllm_engine_config
from tokenpace.bench.runners import RunnerSet, RunRequest
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.workload.spec import RequestSpec

# Threads that sleep at barriers: a spinning two-thread step can run many times slower under
# a competing busy process. Read when torch loads its OpenMP, so before the engine loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.mark.native
@pytest.mark.slow
def test_a_run_with_its_own_kv_cache_or_calibration_runs_on_an_engine_loaded_for_it() -> None:
    # Three requests of 3 blocks each arriving together: a 4-block cache holds one at a time.
    # The first run, on the engine's own cache, refits from 4 staggered requests' steps a
    # profile whose 1 s decode step is slower than any step of this model on any CPU we run.
    pytest.importorskip("torch", reason="the native engine needs the native extra")
    specs = [RequestSpec(0.0, 40, 8) for _ in range(3)]
    staggered = [RequestSpec(0.1 * i, 40, 32) for i in range(4)]
    profile = load_profile("v100-llama-3.2-3b")
    too_slow = replace(profile, l_min_ms=1000.0)
    small = replace(profile, num_gpu_blocks=4)
    calibration = OnlineCalibrationConfig()
    with RunnerSet() as runners:
        runner = runners.get("native")
        assert isinstance(runner, EngineRunner)
        runs = {}
        dtypes = []
        for kv_cache_tokens, run_profile, online in (
            (None, too_slow, calibration),
            (64, small, None),
        ):
            request = RunRequest(
                "vllm_default", staggered if online else specs, run_profile,
                np.random.default_rng(0), Slo(), kv_cache_tokens=kv_cache_tokens,
                online_calibration=online,
            )  # fmt: skip
            runs[kv_cache_tokens] = runner(request)
            dtypes.append(runner.dtype)
    calibrated, small_run = runs[None], runs[64]
    assert [r.num_output_tokens for r in small_run.requests] == [8, 8, 8]
    assert max(s.num_used_blocks for s in small_run.steps[0]) <= 4
    assert max(s.num_used_blocks for s in calibrated.steps[0]) > 4
    assert dtypes[0] is not None and dtypes[1] == dtypes[0]
    # The refit followed the engine's decode steps, not the profile it started from.
    assert small_run.counters == {}
    decode_ms = [1000 * s.latency_s for s in calibrated.steps[0] if s.num_prefill_tokens == 0]
    refitted = calibrated.counters["calibrated_l_min_ms"]
    # At least twice as close (in ratio) to the engine's median decode step as the start.
    measured = float(np.median(decode_ms))
    assert abs(np.log(refitted / measured)) < 0.5 * abs(np.log(too_slow.l_min_ms / measured))


def test_the_vllm_engine_refuses_a_kv_cache_of_its_own() -> None:
    with pytest.raises(ValueError, match="run on the native engine"):
        vllm_engine_config(4096)
