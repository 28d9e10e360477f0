"""Simulator fidelity: one workload and seed on a real engine and on the simulator with
that engine's profile; relative errors of mean ITL, p50/p99 TTFT and throughput, at loads
set relative to the engine's knee."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from tokenpace.bench.capacity import KneeSearch
from tokenpace.bench.cpu_scale import simulated_knee
from tokenpace.bench.runners import RunnerSet, RunRequest
from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.run_metrics import RunKey, summarize_run
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.workload.main_experiment import (
    PAPER_OUTPUT_LENGTHS,
    PAPER_PROMPT_LENGTHS,
    PoissonWorkload,
)
from tokenpace.workload.spec import Workload, with_known_lengths

COMPARED = {
    "itl_mean": ("itl_ms", "mean"),
    "ttft_p50": ("ttft_ms", "p50"),
    "ttft_p99": ("ttft_ms", "p99"),
    "throughput_tok_s": ("throughput_tok_s",),
}


@dataclass(frozen=True, slots=True)
class SpeedDrift:
    """How the engine's speed moved during a run: per window of ``window_s`` seconds, the
    median of its steps' measured latency over the profile's (``step_over_profile``'s
    prediction, step by step); ``lowest`` and ``highest`` of those medians over the windows
    with at least ``min_steps`` steps (``num_windows`` of them). A simulator replaying the
    run with one profile cannot follow an engine whose windows differ by more than its
    error goals."""

    window_s: float
    num_windows: int
    lowest: float
    highest: float

    @property
    def spread(self) -> float:
        """highest / lowest - 1 (NaN without a window)."""
        return self.highest / self.lowest - 1 if self.num_windows else float("nan")


@dataclass(frozen=True, slots=True)
class FidelityResult:
    """The real and simulated runs' results.json entries (one per repeat) and, per compared
    metric, the relative error (simulated - real) / real of their means over the repeats;
    ``eq2_relative_error`` is the same for a simulator on Eq. 2 alone (the profile without
    its decode residual; equal to ``relative_error`` when the profile has none);
    ``no_wake_relative_error`` the same for a simulator without the profile's cost of a first
    step after idle (``EngineProfile.idle_wake_ms``; equal to ``relative_error`` when it
    has none);
    ``real_spread``: per compared metric, how far the real engine's repeats of the same
    workload and seed lay apart ((highest - lowest) / mean; 0 for one repeat), the error a
    perfect simulator would still show against any one of them; ``real_speed_drift``: how
    the real engine's speed against the profile moved during its runs (``speed_drift``;
    the lowest and highest window over all repeats); ``real_speed``: how slow the real
    engine ran against the profile over all its repeats, decode and prefill apart
    (``run_speed``); and
    ``at_speed_relative_error``: the errors of a simulator whose engine runs at that speed
    (``at_speed``; its policy plans with ``profile``, as the real engine's did; empty
    without a measured speed), which leaves the latency model's and the scheduling's error
    once the machine's speed at the time of the run is known."""

    real_runs: tuple[Mapping[str, Any], ...]
    simulated_runs: tuple[Mapping[str, Any], ...]
    relative_error: Mapping[str, float]
    real_step_overhead_ms: float = float("nan")
    eq2_relative_error: Mapping[str, float] = field(default_factory=dict)
    real_step_over_profile: Mapping[str, float] = field(default_factory=dict)
    real_speed_drift: SpeedDrift | None = None
    real_spread: Mapping[str, float] = field(default_factory=dict)
    no_wake_relative_error: Mapping[str, float] = field(default_factory=dict)
    real_speed: RunSpeed | None = None
    at_speed_relative_error: Mapping[str, float] = field(default_factory=dict)

    @property
    def real(self) -> dict[str, float]:
        """The compared metrics' means over the real repeats."""
        return mean_compared(self.real_runs)

    @property
    def simulated(self) -> dict[str, float]:
        """The compared metrics' means over the simulated repeats."""
        return mean_compared(self.simulated_runs)


def mean_compared(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per compared metric (``COMPARED``), its mean over ``runs`` (results.json entries)."""
    return {
        name: float(np.mean([_value(run, path) for run in runs])) for name, path in COMPARED.items()
    }


def spread_compared(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per compared metric, (highest - lowest) / mean over ``runs``."""
    spread = {}
    for name, path in COMPARED.items():
        values = [_value(run, path) for run in runs]
        spread[name] = (max(values) - min(values)) / float(np.mean(values))
    return spread


def step_overhead_ms(steps: Sequence[StepRecord], idle_gap_s: float = 0.05) -> float:
    """Median time (ms) between the end of one step's measured latency and the start of the
    next, over back-to-back steps (gap under ``idle_gap_s``): the per-step cost outside
    what the profile's step latency measures (planning, bookkeeping, delivery). NaN when no
    two steps ran back to back."""
    gaps = [
        after.start_s - (before.start_s + before.latency_s) for before, after in pairwise(steps)
    ]
    busy = [1000 * g for g in gaps if -idle_gap_s < g < idle_gap_s]
    return float(np.median(busy)) if busy else float("nan")


def speed_drift(
    steps: Sequence[StepRecord], profile: EngineProfile, window_s: float = 5.0, min_steps: int = 5
) -> SpeedDrift:
    """``SpeedDrift`` of ``steps`` against ``profile``; windows start at the first step."""
    if not window_s > 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    ratios: dict[int, list[float]] = {}
    first_s = steps[0].start_s if steps else 0.0
    for step, predicted in zip(steps, _predictions(steps, profile), strict=True):
        if predicted > 0:
            window = int((step.start_s - first_s) // window_s)
            ratios.setdefault(window, []).append(step.latency_s / predicted)
    medians = [float(np.median(r)) for r in ratios.values() if len(r) >= min_steps]
    if not medians:
        return SpeedDrift(window_s, 0, float("nan"), float("nan"))
    return SpeedDrift(window_s, len(medians), min(medians), max(medians))


def _kind(step: StepRecord) -> str | None:
    """``decode``, ``mixed`` (decode with prefill), ``prefill`` or None (an empty step)."""
    if not step.num_decode_tokens:
        return "prefill" if step.num_prefill_tokens else None
    return "mixed" if step.num_prefill_tokens else "decode"


def _predicted_s(model: LatencyModel, step: StepRecord) -> float:
    """The profile's latency of ``step``: of its shape as run where the record has one
    (``StepRecord.shape``: decode contexts and prefill chunks); else of its decode batch and
    its prefill as one chunk from context 0, with no decode attention term."""
    if step.shape is not None:
        return model.shape_s(step.shape)
    prefill = step.num_prefill_tokens
    chunks = [PrefillChunk(prefill, 0)] if prefill else []
    return model.step_s(step.num_decode_tokens, chunks)


def _predictions(steps: Sequence[StepRecord], profile: EngineProfile) -> list[float]:
    """``_predicted_s`` of each of ``steps`` (in the order run), plus the profile's cost of a
    first step after idle (``idle_wake_ms``) for a nonempty step that started at least
    ``idle_wake_after_s`` after the previous one ended, and for the first: what the
    simulated server charges (``EngineProfile.idle_wake_s``)."""
    model = LatencyModel(profile)
    predicted = []
    previous_end_s = -math.inf
    for step in steps:
        value = _predicted_s(model, step)
        if value > 0:
            value += profile.idle_wake_s(step.start_s - previous_end_s)
        predicted.append(value)
        previous_end_s = step.start_s + step.latency_s
    return predicted


def step_over_profile(steps: Sequence[StepRecord], profile: EngineProfile) -> dict[str, float]:
    """Per kind of step (``decode``, ``mixed``: decode with a prefill chunk, ``prefill``):
    the steps' mean measured latency over the mean ``profile`` gives the same steps
    (``_predicted_s``: their shape as run, where the records carry it; a first step after
    idle with the profile's cost of it, ``_predictions``). Near 1 when the engine ran
    as it was profiled; far from it when it did not (another precision, a slower phase of
    the machine). Kinds with no step are left out."""
    sums: dict[str, list[float]] = {}
    for step, predicted in zip(steps, _predictions(steps, profile), strict=True):
        kind = _kind(step)
        if kind is None:
            continue
        measured_predicted = sums.setdefault(kind, [0.0, 0.0])
        measured_predicted[0] += step.latency_s
        measured_predicted[1] += predicted
    return {kind: measured / predicted for kind, (measured, predicted) in sums.items()}


@dataclass(frozen=True, slots=True)
class RunSpeed:
    """How slow an engine ran against its profile, by the two parts a step's time is made
    of: ``decode``, the decode batch's terms (floor, residual, decode attention), from the
    steps that only decode; ``prefill``, what prefill adds (chunk costs, mixing and chunk
    overheads, a prefill-only step's floor, a first step after idle), from the other steps
    net of their decode part at the ``decode`` speed. A real engine need not slow both
    alike (on a shared CPU its decode steps, bound by memory, and its prefill, bound by
    compute, drift apart)."""

    decode: float
    prefill: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.decode) and math.isfinite(self.prefill)


def _decode_part_s(model: LatencyModel, step: StepRecord) -> float:
    """``_predicted_s`` of ``step``'s decode batch alone (0 for a step that does not
    decode)."""
    if step.shape is not None:
        return model.shape_s(replace(step.shape, prefill_chunks=()))
    return model.step_s(step.num_decode_tokens, [])


def run_speed(runs: Sequence[Sequence[StepRecord]], profile: EngineProfile) -> RunSpeed:
    """``RunSpeed`` of the steps of ``runs`` (each run's steps in the order run) against
    ``profile``: ``decode`` is the summed measured latency of the steps with nothing but
    decode over the summed latency ``profile`` gives them (``_predictions``); ``prefill`` is
    the other steps' summed measured latency, less their decode parts at that speed, over
    the summed rest of their predicted latency. A part no step measured takes the other's
    speed; both are NaN without a nonempty step."""
    model = LatencyModel(profile)
    decode_sums = [0.0, 0.0]
    mixed: list[tuple[float, float, float]] = []  # measured, decode part, the rest
    for steps in runs:
        for step, value in zip(steps, _predictions(steps, profile), strict=True):
            if value <= 0:
                continue
            decode_part = _decode_part_s(model, step)
            rest = value - decode_part
            if rest <= 1e-12:
                decode_sums[0] += step.latency_s
                decode_sums[1] += value
            else:
                mixed.append((step.latency_s, decode_part, rest))
    rest_total = sum(rest for _, _, rest in mixed)
    decode = decode_sums[0] / decode_sums[1] if decode_sums[1] > 0 else float("nan")
    if not math.isfinite(decode):
        measured = sum(m for m, _, _ in mixed)
        predicted = sum(d + r for _, d, r in mixed)
        decode = measured / predicted if predicted > 0 else float("nan")
    if not (rest_total > 0 and math.isfinite(decode)):
        return RunSpeed(decode, decode)
    prefill = sum(m - decode * d for m, d, _ in mixed) / rest_total
    # A prefill part faster than a tenth of the profile is a misfit, not a speed.
    return RunSpeed(decode, max(prefill, 0.1 * decode))


def at_speed(profile: EngineProfile, decode: float, prefill: float | None = None) -> EngineProfile:
    """``profile`` with its decode terms (l_min, alpha, decode attention, the residual)
    multiplied by ``decode`` and its prefill terms (per token, prefill attention, mixing
    and per-chunk overheads, the prefill residual, the prefill-only floor, the first step
    after idle) by
    ``prefill`` (``decode`` when None): the same engine on a machine that many times as
    slow, in each part (``RunSpeed``)."""
    prefill = decode if prefill is None else prefill
    for name, factor in (("decode", decode), ("prefill", prefill)):
        if not factor > 0:
            raise ValueError(f"{name} factor must be positive, got {factor}")
    return replace(
        profile,
        l_min_ms=profile.l_min_ms * decode,
        alpha_ms=profile.alpha_ms * decode,
        decode_attention_ms_per_kctx=profile.decode_attention_ms_per_kctx * decode,
        decode_residual_ms=tuple((b, ms * decode) for b, ms in profile.decode_residual_ms),
        prefill_residual_ms=tuple((t, ms * prefill) for t, ms in profile.prefill_residual_ms),
        prefill_ms_per_token=profile.prefill_ms_per_token * prefill,
        prefill_attention_ms_per_kctx=profile.prefill_attention_ms_per_kctx * prefill,
        mixed_prefill_overhead_ms=profile.mixed_prefill_overhead_ms * prefill,
        prefill_chunk_overhead_ms=profile.prefill_chunk_overhead_ms * prefill,
        # A step with prefill alone pays the floor at the prefill speed, also where the
        # profile has no floor of its own (its floor is then decode_ms at batch 0).
        prefill_floor_ms=LatencyModel(profile).floor_ms(0) * prefill,
        idle_wake_ms=profile.idle_wake_ms * prefill,
    )


def _median_finite(values: Sequence[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.median(finite)) if finite else float("nan")


def _value(run: Mapping[str, Any], path: tuple[str, ...]) -> float:
    value: Any = run
    for key in path:
        value = value[key]
    return float(value)


def measure_fidelity(
    runners: RunnerSet, engine: str, scheduler: str, workload: Workload, seed: int,
    profile: EngineProfile, slo: Slo, repeats: int = 1,
    online_calibration: OnlineCalibrationConfig | None = None,
) -> FidelityResult:  # fmt: skip
    """Run ``workload`` (seed ``seed``) under ``scheduler`` ``repeats`` times on ``engine``
    and as often on the simulator with ``profile`` (and with ``profile`` on Eq. 2 alone;
    without its idle wake cost; and at the real runs' speed, ``at_speed``; simulated repeat
    r draws its step noise from ``[seed, 1 + r]``), all from ``runners``
    (the engine stays loaded for the next call); relative error = (simulated - real) / real
    of each compared metric's mean over the repeats. Under ``online_calibration`` every
    run, real and simulated, refits the policy's profile from its own steps, starting from
    ``profile`` (as ``tokenpace serve`` runs an engine); None: every policy keeps
    ``profile``. Raises ValueError for ``repeats`` < 1."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    # Real engines stop requests through max_tokens: the simulator gets the same caps.
    specs = with_known_lengths(workload.generate(np.random.default_rng([seed, 0])))
    compared = [("real", engine, profile), ("sim", "sim", profile)]
    if profile.decode_residual_ms:  # else Eq. 2 alone is the simulator already run
        compared.append(("eq2", "sim", replace(profile, decode_residual_ms=())))
    if profile.idle_wake_ms:  # else the simulator already run has no wake cost
        compared.append(("no_wake", "sim", replace(profile, idle_wake_ms=0.0)))
    runs: dict[str, list[Mapping[str, Any]]] = {}
    real_steps: list[list[StepRecord]] = []

    def run(
        label: str, runner: str, run_profile: EngineProfile, engine: EngineProfile | None = None
    ) -> None:
        for repeat in range(repeats):
            rng = np.random.default_rng([seed, 1 + repeat])
            output = runners.get(runner)(
                RunRequest(
                    scheduler,
                    specs,
                    run_profile,
                    rng,
                    slo,
                    engine_profile=engine,
                    online_calibration=online_calibration,
                )
            )
            key = RunKey(scheduler, workload.name, runner, seed)
            runs.setdefault(label, []).append(summarize_run(key, output.requests, 0.0, slo))
            if label == "real":
                real_steps.append(output.steps.get(0, []))

    for label, runner, run_profile in compared:
        run(label, runner, run_profile)
    speed = run_speed(real_steps, profile)
    if speed.finite:
        # The policy plans with the profile, as it did on the real engine; the simulated
        # engine runs at the real one's speed.
        run("at_speed", "sim", profile, at_speed(profile, speed.decode, speed.prefill))

    def errors(label: str) -> dict[str, float]:
        real, simulated = mean_compared(runs["real"]), mean_compared(runs[label])
        return {name: (simulated[name] - real[name]) / real[name] for name in COMPARED}

    every_step = [step for steps in real_steps for step in steps]
    drifts = [speed_drift(steps, profile) for steps in real_steps]
    measured = [d for d in drifts if d.num_windows]
    drift = drifts[0]
    if measured:
        drift = SpeedDrift(
            measured[0].window_s, sum(d.num_windows for d in measured),
            min(d.lowest for d in measured), max(d.highest for d in measured),
        )  # fmt: skip
    eq2_label = "eq2" if "eq2" in runs else "sim"
    return FidelityResult(
        tuple(runs["real"]),
        tuple(runs["sim"]),
        errors("sim"),
        _median_finite([step_overhead_ms(steps) for steps in real_steps]),
        errors(eq2_label),
        step_over_profile(every_step, profile),
        drift,
        spread_compared(runs["real"]),
        errors("no_wake" if "no_wake" in runs else "sim"),
        speed,
        errors("at_speed") if "at_speed" in runs else {},
    )


def knee_workloads(
    profile: EngineProfile,
    slo: Slo,
    loads: Sequence[float],
    num_requests: int,
    cache_dir: Path | None,
    search: KneeSearch | None = None,
) -> tuple[float, dict[float, PoissonWorkload]]:
    """The knee (req/s) of one server with ``profile`` on the paper's main-experiment
    mixtures, measured on the simulator (``cpu_scale.simulated_knee``, cached in
    ``cache_dir``), and per load factor the workload of ``num_requests`` Poisson arrivals
    at that multiple of it. Raises ValueError when no rate meets ``slo``."""
    knee_of = simulated_knee(slo, cache_dir, search)
    knee = knee_of(profile, PAPER_PROMPT_LENGTHS, PAPER_OUTPUT_LENGTHS)
    base = PoissonWorkload(name="main", max_requests=num_requests)
    workloads = {}
    for load in loads:
        rate = load * knee
        workloads[load] = replace(
            base, name=f"main@{load:g}x", rate_per_s=rate, duration_s=2 * num_requests / rate
        )
    return knee, workloads
