"""The simulated server's steps: the first step after idle pays the profile's wake cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tokenpace.engine.profile import load_profile
from tokenpace.policy.base import build_policy
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec

# Two requests far apart (each finds the server idle) and one arriving while the first runs.
SPECS = [RequestSpec(1.0, 100, 4), RequestSpec(1.001, 60, 4), RequestSpec(10.0, 100, 4)]


def _token_times(idle_wake_ms: float, idle_wake_after_s: float) -> list[list[float]]:
    profile = replace(
        load_profile("v100-llama-3.2-3b"), noise_cv=0.0, idle_wake_ms=idle_wake_ms,
        idle_wake_after_s=idle_wake_after_s,
    )  # fmt: skip
    outcome = simulate(SPECS, build_policy("fcfs", profile), profile, np.random.default_rng(0))
    return [r.token_times_s for r in sorted(outcome.requests, key=lambda r: r.request_id)]


def test_only_the_first_step_after_an_idle_gap_pays_the_wake_cost() -> None:
    plain = _token_times(0.0, 0.0)
    woken = _token_times(20.0, 0.1)
    # Every token of each busy period moves by the one charged step: 20 ms.
    for times, base in zip(woken, plain, strict=True):
        assert np.allclose(np.array(times) - np.array(base), 0.020)
    # The gaps between a request's tokens are unchanged: later steps are not charged.
    assert np.allclose(np.diff(woken[0]), np.diff(plain[0]))


@pytest.mark.parametrize("after_s", [100.0, 0.1])
def test_gaps_shorter_than_the_wake_threshold_or_no_cost_change_nothing(after_s: float) -> None:
    wake_ms = 0.0 if after_s == 0.1 else 20.0
    assert _token_times(wake_ms, after_s) == _token_times(0.0, 0.0)
