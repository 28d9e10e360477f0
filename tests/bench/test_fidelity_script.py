"""bench/fidelity.py --quick on the native engine: the whole path, one small run per load."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the native engine needs the native extra")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "fidelity.py"


@pytest.mark.native
@pytest.mark.slow
def test_quick_run_reports_every_error_per_load(tmp_path: Path) -> None:
    done = subprocess.run(
        # Loose SLOs put the knee near the engine's ceiling, so the few requests of each load
        # arrive seconds apart rather than a minute; seed 8 draws three 20-token outputs (seed
        # 0 drew two of 200, which took 20 s a load at a CPU's 100 ms a token).
        [sys.executable, str(SCRIPT), "--quick", "--engines", "native", "--requests", "3",
         "--seed", "8", "--slo-ttft-ms", "30000", "--slo-tpot-ms", "2000",
         "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(result) == ["native"]
    assert list(result["native"]) == ["0.5", "1.0", "1.5"]
    for errors in result["native"].values():
        assert set(errors) == {"itl_mean", "ttft_p50", "ttft_p99", "throughput"}
        assert all(math.isfinite(e) and e > -1 for e in errors.values())
    assert (tmp_path / "profiles" / "native-quick.json").is_file()


def test_an_unknown_engine_is_refused_by_name() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--engines", "tpu"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "--engines 'tpu' is not a valid choice" in done.stderr


def test_step_overhead_is_the_median_busy_gap() -> None:
    from tokenpace.bench.fidelity import step_overhead_ms
    from tokenpace.runtime.step_loop import StepRecord

    def step(start_s: float, latency_s: float) -> StepRecord:
        return StepRecord(0, start_s, latency_s, 1, 0, 1, 0, 0, 0, 0, 0, {})

    # Gaps after each step: 2 ms, 4 ms, 3 ms, then an idle second (not counted).
    steps = [step(0.0, 0.010), step(0.012, 0.010), step(0.026, 0.010), step(0.039, 0.01),
             step(1.049, 0.01)]  # fmt: skip
    assert step_overhead_ms(steps) == pytest.approx(3.0)
    assert math.isnan(step_overhead_ms(steps[:1]))


def test_step_time_over_the_profile_is_per_kind_of_step() -> None:
    from tokenpace.bench.fidelity import step_over_profile
    from tokenpace.engine.profile import load_profile
    from tokenpace.runtime.step_loop import StepRecord

    profile = load_profile("v100-llama-3.2-3b")

    def step(latency_ms: float, decode: int, prefill: int) -> StepRecord:
        return StepRecord(0, 0.0, latency_ms / 1000, decode, 0, decode, prefill, 0, 0, 0, 0, {})

    decode_ms = profile.l_min_ms  # a batch of one decodes at l_min
    prefill_ms = 64 * profile.prefill_ms_per_token + profile.prefill_attention_ms_per_kctx * (
        64 * 32.5 / 1000
    )
    mixed_ms = decode_ms + prefill_ms + profile.mixed_prefill_overhead_ms
    steps = [
        step(decode_ms, 1, 0), step(3 * decode_ms, 1, 0),  # twice the profile on average
        step(mixed_ms, 1, 64),  # as profiled
        step(0.0, 0, 0),  # an empty step is no kind
    ]  # fmt: skip
    ratios = step_over_profile(steps, profile)
    assert ratios == pytest.approx({"decode": 2.0, "mixed": 1.0})


def test_a_first_step_after_idle_is_predicted_with_the_profiles_wake_cost() -> None:
    from dataclasses import replace

    from tokenpace.bench.fidelity import speed_drift, step_over_profile
    from tokenpace.engine.latency_model import LatencyModel
    from tokenpace.engine.profile import load_profile
    from tokenpace.runtime.step_loop import StepRecord

    profile = replace(load_profile("v100-llama-3.2-3b"), idle_wake_ms=20.0, idle_wake_after_s=0.1)
    step_s = LatencyModel(profile).step_s(4, [])

    def step(start_s: float, latency_s: float) -> StepRecord:
        return StepRecord(0, start_s, latency_s, 4, 0, 4, 0, 0, 0, 0, 0, {})

    # The first step and the one after a 1 s gap pay the wake cost; back-to-back steps and
    # one after a gap shorter than the threshold do not.
    woken = step_s + 0.020
    steps = [step(0.0, woken)]
    steps += [step(woken + i * step_s, step_s) for i in range(4)]
    end_s = woken + 4 * step_s
    steps += [step(end_s + 0.05, step_s), step(end_s + 0.05 + step_s + 1.0, woken)]
    assert step_over_profile(steps, profile) == pytest.approx({"decode": 1.0})
    drift = speed_drift(steps, profile, min_steps=1)
    assert drift.lowest == pytest.approx(1.0) and drift.highest == pytest.approx(1.0)


def test_speed_drift_is_the_range_of_per_window_medians() -> None:
    from tokenpace.bench.fidelity import speed_drift
    from tokenpace.engine.latency_model import LatencyModel
    from tokenpace.engine.profile import load_profile
    from tokenpace.runtime.step_loop import StepRecord

    profile = load_profile("v100-llama-3.2-3b")
    predicted_s = LatencyModel(profile).step_s(4, [])

    def step(start_s: float, over: float) -> StepRecord:
        return StepRecord(0, start_s, over * predicted_s, 4, 0, 4, 0, 0, 0, 0, 0, {})

    # 0-5 s as profiled (one stall among them), 5-10 s 30% slower, 10-15 s too few steps.
    steps = [step(0.5 * i, 3.0 if i == 4 else 1.0) for i in range(10)]
    steps += [step(5.0 + 0.5 * i, 1.3) for i in range(10)]
    steps += [step(10.0 + 0.5 * i, 0.5) for i in range(3)]
    drift = speed_drift(steps, profile, window_s=5.0, min_steps=5)
    assert drift.num_windows == 2
    assert drift.lowest == pytest.approx(1.0)
    assert drift.highest == pytest.approx(1.3)
    assert drift.spread == pytest.approx(0.3)
    steady = speed_drift(steps[:10], profile)
    assert steady.num_windows == 1 and steady.spread == pytest.approx(0.0)
    assert speed_drift([], profile).num_windows == 0
    with pytest.raises(ValueError, match="window_s"):
        speed_drift(steps, profile, window_s=0)
