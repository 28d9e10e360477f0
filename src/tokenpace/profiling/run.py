"""``run_profile``: sweep an engine through its serving backend's timing probe, fit the
latency model, write the profile and a PNG. ``fit_profile`` is the one fit, shared with a
worker's start-up calibration."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.profiling.fit import (
    Eq2Fit,
    IdleWakeFit,
    PrefillFit,
    decode_residuals,
    fit_decode_attention,
    fit_eq2,
    fit_idle_wake,
    fit_prefill,
    pass_spread,
    prefill_pass_spread,
    without_context,
)
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.probe import EngineFacts, TimingProbe
from tokenpace.profiling.sweep import (
    IDLE_PROBE_CHUNK,
    PROFILE_IDLE_GAPS_S,
    Sweep,
    SweepConfig,
    run_sweep,
)

if TYPE_CHECKING:
    from tokenpace.server.worker.backend import ServingBackend

Clock = Callable[[], float]
Log = Callable[[str], None]
ENGINES = ("native", "vllm")
# A sweep whose repeated points moved more than this between passes ran while the machine's
# speed moved (``steadiness``).
UNSTEADY_SPREAD = 0.10
# Sweeps a benchmark's profiling runs at most while they are unsteady (``steady_sweep``): a
# profile fitted in a slow phase of the machine would misjudge every run that follows.
BENCH_PROFILE_SWEEPS = 2
# The profile a backend is opened with before it is profiled (its policy is never used).
PLACEHOLDER_PROFILE = "v100-llama-3.2-3b"


def fitted_terms(eq2: Eq2Fit, prefill: PrefillFit, decode_attention_ms: float) -> dict[str, Any]:
    """The latency fields of an EngineProfile, from the fits."""
    return {
        "l_min_ms": eq2.l_min_ms,
        "b0": eq2.b0,
        "alpha_ms": eq2.alpha_ms,
        "r2": eq2.r2,
        "prefill_ms_per_token": prefill.ms_per_token,
        "prefill_attention_ms_per_kctx": prefill.attention_ms_per_kctx,
        "mixed_prefill_overhead_ms": prefill.mixed_overhead_ms,
        "prefill_chunk_overhead_ms": prefill.chunk_overhead_ms,
        "prefill_floor_ms": prefill.floor_ms,
        "decode_attention_ms_per_kctx": decode_attention_ms,
    }


def fit_profile(
    sweep: Sweep,
    facts: EngineFacts,
    source: str,
    *,
    b0: int | None = None,
    mean_output_tokens: float = 50.0,
    engine_init_s: float = 0.0,
) -> tuple[EngineProfile, Eq2Fit, PrefillFit]:
    """The profile of one sweep: the decode attention term per 1,000 context tokens first,
    Eq. 2 on the decode points with it removed (knee fixed at ``b0`` when given), then the
    prefill terms and the mixing overhead, and the decode and prefill residuals (what each
    swept batch measured beyond Eq. 2, and each chunk beyond the prefill line, where that
    exceeds the sweep's pass-to-pass spread: ``fit.decode_residuals``, ``fit.fit_prefill``);
    the fits are returned for the figure."""
    decode_attention = fit_decode_attention(sweep.context)
    decode = without_context(sweep.decode, decode_attention)
    eq2 = fit_eq2(decode, b0)
    residual = decode_residuals(eq2, decode, sweep.decode_passes)
    # A prefill-only step pays at least the latency model's decode floor: l_min plus the
    # residual at the smallest swept batch.
    floor_ms = eq2.l_min_ms + (residual[0][1] if residual else 0.0)
    spread = pass_spread(sweep.decode_passes)
    prefill_fit = fit_prefill(sweep.prefill, floor_ms, sweep.mixed, residuals=True)
    prefill_floor = (
        f"A prefill-only step pays {prefill_fit.floor_ms:.2f} ms before its tokens (fitted), "
        f"above the decode floor of {floor_ms:.2f} ms."
        if prefill_fit.floor_ms
        else f"A prefill-only step pays the decode floor, {floor_ms:.2f} ms, before its tokens."
    )
    wake = fit_idle_wake(sweep.idle)
    notes = {
        "source": source,
        **point_notes(eq2, sweep.decode, sweep.context, sweep.prefill, sweep.mixed),
        "decode_pass_spread": f"Decode passes differed by {spread:.1%} "
        "(median over batch sizes of the range of passes over the median pass); a residual "
        "within that spread is written as 0.",
        "step_latency": "A step's wall time from its start to the delivery of its tokens, "
        "as the policy sees it (profiling.probe).",
        "prefill_floor": prefill_floor,
        "prefill_residual": _prefill_residual_note(sweep, prefill_fit),
        **({"idle_wake": _idle_note(sweep, wake)} if sweep.idle else {}),
        **facts.notes,
    }
    profile = EngineProfile(
        name=facts.name,
        **fitted_terms(eq2, prefill_fit, decode_attention),
        decode_residual_ms=residual,
        prefill_residual_ms=prefill_fit.residual_ms,
        idle_wake_ms=wake.wake_ms,
        idle_wake_after_s=wake.after_s,
        decode_attention_padded=facts.decode_attention_padded,
        decode_attention_peeled=facts.decode_attention_peeled,
        decode_attention_call_tokens=facts.decode_attention_call_tokens,
        noise_cv=float(np.median([p.cv for p in sweep.decode])),
        block_size=sweep.kv.block_size,
        num_gpu_blocks=sweep.kv.num_gpu_blocks,
        checkpoint_bytes=facts.checkpoint_bytes,
        engine_init_s=engine_init_s,
        checkpoint_tiers=facts.checkpoint_tiers,
        mean_output_tokens=mean_output_tokens,
        notes=notes,
    )
    return profile, eq2, prefill_fit


def _prefill_residual_note(sweep: Sweep, fit: PrefillFit) -> str:
    """The profile note on the prefill residual: its values and the spread that gates it."""
    noise = prefill_pass_spread(sweep.prefill)
    kept = ", ".join(f"C={tokens}: {ms:+.2f} ms" for tokens, ms in fit.residual_ms)
    return (
        f"Lone chunks beyond the prefill line: {kept or 'none'} (prefill passes differed by "
        f"{noise:.1%}; a chunk within that spread of its step is written as 0)."
    )


def _idle_note(sweep: Sweep, wake: IdleWakeFit) -> str:
    """The profile note on the first step after idle: the fit and every point."""
    points = "; ".join(
        f"{p.gap_s:g} s: {p.after_idle_ms:.1f} then {p.warm_ms:.1f} ms" for p in sweep.idle
    )
    fitted = (
        f"The first step after {wake.after_s:g} s idle pays {wake.wake_ms:.1f} ms more."
        if wake.wake_ms
        else "No cost of a first step after idle above the step noise."
    )
    chunk = IDLE_PROBE_CHUNK
    return f"{fitted} Lone {chunk}-token prefill steps after a gap, then at once: {points}."


def default_sweep(engine_name: str) -> SweepConfig:
    """The sweep ``tokenpace profile`` runs on ``engine_name`` (each with the idle gaps)."""
    if engine_name == "vllm":
        from tokenpace.engine.vllm.probe import VLLM_SWEEP

        return replace(VLLM_SWEEP, idle_gaps_s=PROFILE_IDLE_GAPS_S)
    return SweepConfig(idle_gaps_s=PROFILE_IDLE_GAPS_S)


def sweep_spread(sweep: Sweep) -> float:
    """The larger of the sweep's decode and prefill pass-to-pass spreads."""
    return max(pass_spread(sweep.decode_passes), prefill_pass_spread(sweep.prefill))


def steadiness(sweep: Sweep) -> str:
    """How much the sweep's repeated points moved between passes (decode and prefill), with
    a warning above ``UNSTEADY_SPREAD``: the machine's speed moved during the sweep, and a
    profile fitted through such points need not hold (on a 2-core CPU a
    sweep timed in a slow phase put a 128-token chunk under a 64-token one and a mixing
    overhead of 42 ms where quiet sweeps fitted 7-14)."""
    decode, prefill = pass_spread(sweep.decode_passes), prefill_pass_spread(sweep.prefill)
    line = f"decode passes differed by {decode:.1%}, prefill passes by {prefill:.1%}"
    if max(decode, prefill) > UNSTEADY_SPREAD:
        line += (
            f"; above {UNSTEADY_SPREAD:.0%} the machine's speed moved during the sweep and the "
            "profile may not hold: profile again on a quiet machine"
        )
    return line


def steady_sweep(
    probe: TimingProbe, config: SweepConfig, log: Log = lambda _m: None, max_sweeps: int = 1
) -> Sweep:
    """``run_sweep`` again, up to ``max_sweeps`` sweeps in all, while a sweep is unsteady
    (``sweep_spread`` above ``UNSTEADY_SPREAD``); returns the steadiest, and logs each
    one's ``steadiness``. Raises ValueError for ``max_sweeps`` < 1."""
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps must be at least 1, got {max_sweeps}")
    sweeps: list[tuple[float, Sweep]] = []
    for attempt in range(max_sweeps):
        measured = run_sweep(probe, config, log)
        log(steadiness(measured))
        sweeps.append((sweep_spread(measured), measured))
        if sweeps[-1][0] <= UNSTEADY_SPREAD:
            break
        if attempt + 1 < max_sweeps:
            log("sweeping again")
    return min(sweeps, key=lambda spread_sweep: spread_sweep[0])[1]


def run_profile(
    engine_name: str,
    out_path: Path,
    *,
    engine_config: object | None = None,
    backend: ServingBackend | None = None,
    sweep: SweepConfig | None = None,
    plot_path: Path | None = None,
    measure_checkpoints: bool = True,
    clock: Clock = time.perf_counter,
    log: Log = lambda _message: None,
    max_sweeps: int = 1,
) -> EngineProfile:
    """Profile ``engine_name`` (``"native"`` or ``"vllm"``) and write the profile JSON to
    ``out_path`` (loadable by ``load_profile``) and the fit figure to ``plot_path``
    (default: ``out_path`` with suffix ``.png``). The engine is loaded as a worker loads it
    (``engine_config``: a ``NativeEngineConfig`` or ``VllmEngineConfig``, default the
    benchmarks' one), unless ``backend`` is one already loaded (left open). ``sweep``
    defaults to ``default_sweep``, swept up to ``max_sweeps`` times while unsteady
    (``steady_sweep``); ``measure_checkpoints`` times a load from every
    checkpoint tier. Raises ValueError for an unknown engine name or a sweep point the
    engine cannot run, TypeError for a config of another engine."""
    if engine_name not in ENGINES:
        raise ValueError(f"cannot profile engine {engine_name!r}; valid: {', '.join(ENGINES)}")
    plot_path = plot_path if plot_path is not None else out_path.with_suffix(".png")
    sweep = sweep if sweep is not None else default_sweep(engine_name)
    engine_init_s = 0.0
    opened = backend is None
    if backend is None:
        from tokenpace.bench.engine_runner import open_backend

        log(f"loading the {engine_name} engine")
        start = clock()
        placeholder = load_profile(PLACEHOLDER_PROFILE)
        backend = open_backend(engine_name, placeholder, "fcfs", clock, engine_config)
        engine_init_s = clock() - start if engine_name == "vllm" else 0.0
    try:
        probe = backend.timing_probe()
        measured = steady_sweep(probe, sweep, log, max_sweeps)
        facts = probe.facts(measure_checkpoints)
        dtype = backend.dtype_choice.dtype
    finally:
        if opened:
            backend.shutdown()
    source = f"Measured by run_profile on {probe.description}."
    profile, _, _ = fit_profile(measured, facts, source, engine_init_s=engine_init_s)
    profile = replace(profile, dtype=dtype)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(profile.to_json() + "\n")
    from tokenpace.profiling.plot import plot_fit

    decode = without_context(measured.decode, profile.decode_attention_ms_per_kctx)
    plot_fit(plot_path, profile, decode, measured.context, measured.prefill)
    return profile


def point_notes(
    eq2: Eq2Fit,
    decode: Sequence[DecodePoint],
    context: Sequence[DecodePoint],
    prefill: Sequence[PrefillPoint],
    mixed: Sequence[MixedPoint],
) -> dict[str, str]:
    """The profile notes that record the fit's flat region and every measured point."""
    notes = {
        "b0": "No flat region when b0 = 1: every extra request adds alpha_ms."
        if eq2.b0 == 1
        else f"Step time is flat up to B0 = {eq2.b0}.",
        "decode": "; ".join(f"B={p.batch_size}: {p.step_ms:.2f} ms" for p in decode),
        "context": "; ".join(
            f"B={p.batch_size} ctx={p.context}: {p.step_ms:.2f} ms" for p in context
        ),
        "prefill": "; ".join(
            f"C={p.num_tokens} start={p.context_start}: {p.step_ms:.2f} ms" for p in prefill
        ),
    }
    if mixed:
        notes["mixed"] = "; ".join(_mixed_note(point) for point in mixed)
    return notes


def _mixed_note(point: MixedPoint) -> str:
    note = (
        f"B={point.batch_size}: {point.decode_ms:.2f} ms alone, {point.mixed_ms:.2f} ms "
        f"with a {point.chunk}-token chunk"
    )
    if point.split_chunks > 1:
        note += (
            f", {point.split_ms:.2f} ms with {point.split_chunks} chunks of "
            f"{point.split_chunk} tokens"
        )
    return note
