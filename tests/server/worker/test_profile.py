"""The profile a worker measures at start, from step timings."""

from __future__ import annotations

import pytest

from tokenpace.server.worker.profile import measure_profile
from tokenpace.server.worker.wire import Calibration


def test_l_min_alpha_and_prefill_come_from_the_timed_batches() -> None:
    calls: list[tuple[int, int, int]] = []

    def run_batch(num_requests: int, num_prompt: int, num_output: int) -> list[float]:
        calls.append((num_requests, num_prompt, num_output))
        first_pass = len(calls) in (1, 3)
        if num_requests == 1:
            steps = [0.064, 0.021, 0.020, 0.022, 0.020, 0.025]
        else:  # B0 = 8 requests: decode steps around 34 ms
            steps = [0.300, 0.034, 0.033, 0.034, 0.035, 0.034]
        return [s * 3 for s in steps] if first_pass else steps

    profile = measure_profile(run_batch, Calibration("m", 8, 50.0, 2048), 2048, 16, 100, "x")
    assert calls == [(1, 32, 6), (1, 32, 6), (8, 32, 6), (8, 32, 6)]
    assert profile.l_min_ms == pytest.approx(20.0)
    assert profile.alpha_ms == pytest.approx((34.0 - 20.0) / 7)
    assert profile.prefill_ms_per_token == pytest.approx(64.0 / 32)
    assert (profile.b0, profile.block_size, profile.num_gpu_blocks) == (8, 16, 100)


def test_short_contexts_shrink_the_synthetic_requests_and_b0_of_one_has_no_slope() -> None:
    sizes: list[tuple[int, int, int]] = []

    def run_batch(num_requests: int, num_prompt: int, num_output: int) -> list[float]:
        sizes.append((num_requests, num_prompt, num_output))
        return [0.01, 0.005, 0.004]

    profile = measure_profile(run_batch, Calibration("m", 1, 8.0, 16), 16, 16, 1, "x")
    assert sizes == [(1, 8, 6), (1, 8, 6)]
    assert profile.alpha_ms == 0.0 and profile.l_min_ms == pytest.approx(4.0)
