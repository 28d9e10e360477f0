"""Simulator fidelity: one workload and seed on a real engine and on the simulator with
that engine's profile; relative errors of mean ITL, p50/p99 TTFT and throughput."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpace.bench.runners import RunnerSet, RunRequest
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.run_metrics import RunKey, summarize_run
from tokenpace.metrics.slo import Slo
from tokenpace.workload.spec import Workload, with_known_lengths

COMPARED = {
    "itl_mean": ("itl_ms", "mean"),
    "ttft_p50": ("ttft_ms", "p50"),
    "ttft_p99": ("ttft_ms", "p99"),
    "throughput_tok_s": ("throughput_tok_s",),
}


@dataclass(frozen=True, slots=True)
class FidelityResult:
    real: Mapping[str, Any]
    simulated: Mapping[str, Any]
    relative_error: Mapping[str, float]


def _value(run: Mapping[str, Any], path: tuple[str, ...]) -> float:
    value: Any = run
    for key in path:
        value = value[key]
    return float(value)


def measure_fidelity(
    engine: str, scheduler: str, workload: Workload, seed: int,
    profile: EngineProfile, slo: Slo,
) -> FidelityResult:  # fmt: skip
    """Relative error = (simulated - real) / real for each compared metric."""
    # Real engines stop requests through max_tokens: the simulator gets the same caps.
    specs = with_known_lengths(workload.generate(np.random.default_rng([seed, 0])))
    runs = {}
    with RunnerSet() as runners:
        for runner in (engine, "sim"):
            output = runners.get(runner)(
                RunRequest(scheduler, specs, profile, np.random.default_rng([seed, 1]), slo)
            )
            key = RunKey(scheduler, workload.name, runner, seed)
            runs[runner] = summarize_run(key, output.requests, 0.0, slo)
    errors = {
        name: (_value(runs["sim"], path) - _value(runs[engine], path)) / _value(runs[engine], path)
        for name, path in COMPARED.items()
    }
    return FidelityResult(runs[engine], runs["sim"], errors)
