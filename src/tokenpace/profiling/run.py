"""``run_profile``: sweep a live engine, fit the latency model, write the profile and a PNG."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenpace.core.cache import default_cache_dir
from tokenpace.engine.profile import CheckpointTier, EngineProfile
from tokenpace.profiling.fit import (
    Eq2Fit,
    PrefillFit,
    fit_decode_attention,
    fit_eq2,
    fit_prefill,
    without_context,
)
from tokenpace.profiling.plot import plot_fit
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint

if TYPE_CHECKING:
    from tokenpace.profiling.sweep import SweepConfig
    from tokenpace.profiling.vllm_sweep import VllmSweepConfig

Clock = Callable[[], float]
Log = Callable[[str], None]
ENGINES = ("native", "vllm")


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
        "decode_attention_ms_per_kctx": decode_attention_ms,
    }


def run_profile(
    engine_name: str,
    out_path: Path,
    *,
    engine_config: object | None = None,
    engine: object | None = None,
    sweep: SweepConfig | VllmSweepConfig | None = None,
    plot_path: Path | None = None,
    cache_dir: Path | None = None,
    measure_checkpoints: bool = True,
    clock: Clock = time.perf_counter,
    log: Log = lambda _message: None,
) -> EngineProfile:
    """Profile ``engine_name`` (``"native"`` or ``"vllm"``) and write the profile JSON to
    ``out_path`` (loadable by ``load_profile``) and the fit figure to ``plot_path``
    (default: ``out_path`` with suffix ``.png``). ``engine_config`` is a
    ``NativeEngineConfig`` (default: the embedded SmolLM2, dtype auto, 2 threads) or a
    ``VllmEngineConfig`` (default: ``vllm_sweep.profile_engine_config(cache_dir)``); ``engine`` an
    already loaded ``NativeEngine`` to profile instead of loading one (native only; its own
    config applies), ``sweep`` a ``SweepConfig`` or a ``VllmSweepConfig`` to match.
    ``measure_checkpoints`` times a load from every checkpoint tier (the GGUF
    dequantisation takes tens of seconds; native only). ``cache_dir`` holds the default
    configs' converted checkpoint and vLLM's runtime files (None: ``default_cache_dir()``).
    Raises ValueError for an unknown engine name, TypeError for a config of another engine."""
    if engine_name not in ENGINES:
        raise ValueError(f"cannot profile engine {engine_name!r}; valid: {', '.join(ENGINES)}")
    plot_path = plot_path if plot_path is not None else out_path.with_suffix(".png")
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    if engine_name == "vllm":
        return _start_and_profile_vllm(
            out_path, plot_path, cache_dir, engine_config, sweep, clock, log
        )
    from tokenpace.engine.native import NativeEngine, NativeEngineConfig
    from tokenpace.engine.native.loading import gguf_source, load_gguf, load_model
    from tokenpace.profiling.sweep import (
        SweepConfig,
        measure_read_bandwidth_gb_s,
        time_decode,
        time_mixed,
        time_prefill,
    )

    if engine is not None and not isinstance(engine, NativeEngine):
        raise TypeError(f"engine must be a NativeEngine, got {type(engine).__name__}")
    config = (
        engine.config
        if engine is not None
        else engine_config or NativeEngineConfig(cache_dir=cache_dir)
    )
    if not isinstance(config, NativeEngineConfig):
        raise TypeError(f"engine_config must be a NativeEngineConfig, got {type(config).__name__}")
    sweep = sweep if sweep is not None else SweepConfig()
    if not isinstance(sweep, SweepConfig):
        raise TypeError(f"sweep must be a SweepConfig, got {type(sweep).__name__}")

    if engine is None:
        log(f"loading {config.model} ({config.dtype})")
        engine = NativeEngine.load(config, clock=clock, rng=np.random.default_rng(0))
    loaded = engine.loaded
    checkpoint_bytes = sum(f.stat().st_size for f in loaded.checkpoint_dir.glob("*.safetensors"))
    bandwidth = measure_read_bandwidth_gb_s(loaded.device, clock)
    log(f"memory read bandwidth {bandwidth:.1f} GB/s")

    decode = []
    for size in sweep.batch_sizes:
        decode.append(time_decode(engine, sweep, size, sweep.decode_context))
        log(f"decode B={size}: {decode[-1].step_ms:.1f} ms")
    context = [
        time_decode(engine, sweep, size, length)
        for size in sweep.context_batch_sizes
        for length in sweep.context_lengths
    ]
    prefill = [time_prefill(engine, sweep, chunk, 0) for chunk in sweep.prefill_chunks]
    prefill += [
        time_prefill(engine, sweep, 64, start)
        for start in sweep.prefill_context_starts
        if start > 0
    ]
    mixed = time_mixed(engine, sweep)
    log(
        f"mixed: decode {mixed.decode_ms:.1f} ms, with a {mixed.chunk}-token chunk "
        f"{mixed.mixed_ms:.1f} ms"
    )
    decode_attention = fit_decode_attention(context)
    eq2 = fit_eq2(without_context(decode, decode_attention))
    prefill_fit = fit_prefill(prefill, eq2.l_min_ms, mixed)

    tiers = [CheckpointTier("gpu", 0.0)]
    dtype = str(loaded.dtype).removeprefix("torch.")  # what ``auto`` resolved to
    notes = {
        "source": f"Measured by run_profile on {loaded.device} with {config.num_threads} "
        f"threads, {dtype}, model {config.model}.",
        **point_notes(eq2, decode, context, prefill, mixed),
        "memory_read_gb_s": f"{bandwidth:.1f}",
        "roofline_ms": f"{loaded.weight_bytes / bandwidth / 1e6:.2f} (weight bytes / bandwidth)",
        "num_gpu_blocks": f"The engine's configured KV budget: {config.kv_cache_tokens} tokens "
        f"of {engine.kv_bytes_per_token} bytes each.",
    }
    if measure_checkpoints:
        start = clock()
        load_model(config, clock)
        safetensors_s = clock() - start
        tiers.append(CheckpointTier("host_memory", checkpoint_bytes / safetensors_s / 1e9))
        tiers.append(CheckpointTier("local_ssd", checkpoint_bytes / safetensors_s / 1e9))
        notes["checkpoint_safetensors_s"] = f"{safetensors_s:.2f}"
        gguf = gguf_source(config)
        if gguf is not None:
            start = clock()
            load_gguf(gguf, loaded.dtype)
            gguf_s = clock() - start
            tiers.append(CheckpointTier("remote", checkpoint_bytes / gguf_s / 1e9))
            notes["checkpoint_gguf_s"] = f"{gguf_s:.2f}"
            notes["checkpoint_ratio"] = f"{gguf_s / safetensors_s:.2f} (GGUF / safetensors)"
        notes["checkpoint_tiers"] = (
            "host_memory and local_ssd: load of the cached safetensors directory (page cache "
            "warm; both tiers measure the same path here); remote: dequantising the GGUF. "
            "Bandwidth = checkpoint_bytes / load seconds (engine_init_s = 0)."
        )
        log(
            f"checkpoint load: {notes.get('checkpoint_safetensors_s')} s safetensors, "
            f"{notes.get('checkpoint_gguf_s', '-')} s GGUF"
        )

    profile = EngineProfile(
        name=f"native-{Path(config.model).name}-{dtype}-{loaded.device.type}",
        **fitted_terms(eq2, prefill_fit, decode_attention),
        noise_cv=float(np.median([p.cv for p in decode])),
        block_size=config.block_size,
        num_gpu_blocks=config.num_blocks,
        checkpoint_bytes=checkpoint_bytes,
        engine_init_s=0.0,
        checkpoint_tiers=tuple(tiers),
        notes=notes,
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(profile.to_json() + "\n")
    plot_fit(plot_path, profile.name, decode, context, prefill, eq2, prefill_fit)
    return profile


def point_notes(
    eq2: Eq2Fit,
    decode: Sequence[DecodePoint],
    context: Sequence[DecodePoint],
    prefill: Sequence[PrefillPoint],
    mixed: MixedPoint,
) -> dict[str, str]:
    """The profile notes that record the fit's flat region and every measured point."""
    return {
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
        "mixed": f"B={mixed.batch_size}: {mixed.decode_ms:.2f} ms alone, {mixed.mixed_ms:.2f} "
        f"ms with a {mixed.chunk}-token chunk",
    }


def profile_vllm(
    llm: Any,
    out_path: Path,
    *,
    sweep: VllmSweepConfig | None = None,
    plot_path: Path | None = None,
    engine_init_s: float = 0.0,
    log: Log = lambda _message: None,
) -> EngineProfile:
    """Sweep a running vLLM engine (``runner.start_engine``: tokenpace scheduler, engine core
    in this process), fit it as the native profile is fitted, and write the profile JSON to
    ``out_path`` and the figure to ``plot_path`` (default: ``out_path`` with suffix
    ``.png``). The profile is named ``vllm-<model directory>-<device>``; ``engine_init_s``
    is the engine's measured start time (s), if known. The sweep leaves no request behind."""
    from vllm.platforms import current_platform

    from tokenpace.profiling.vllm_sweep import VllmSweepConfig, run_sweep

    plot_path = plot_path if plot_path is not None else out_path.with_suffix(".png")
    measured = run_sweep(llm, sweep if sweep is not None else VllmSweepConfig(), log)
    decode_attention = fit_decode_attention(measured.context)
    eq2 = fit_eq2(without_context(measured.decode, decode_attention))
    prefill_fit = fit_prefill(measured.prefill, eq2.l_min_ms, measured.mixed)
    model_config = llm.llm_engine.vllm_config.model_config
    model_dir = Path(model_config.model)
    device = str(current_platform.device_type)
    notes = {
        "source": f"Measured by run_profile on vLLM ({device}), {model_config.dtype}, model "
        f"{model_dir}.",
        **point_notes(eq2, measured.decode, measured.context, measured.prefill, measured.mixed),
        "step_latency": "The tokenpace scheduler's step latency: from one step's completion "
        "to the next while busy (output processing included), from schedule to completion "
        "after idle (prefill points).",
        "num_gpu_blocks": "vLLM's KV block pool as configured (kv_cache_memory_bytes).",
        "engine_init_s": "Wall time of starting vllm.LLM (weights load included); 0 when "
        "the engine was started elsewhere.",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (libgomp: active)")
        + " (importing tokenpace.engine.native sets PASSIVE before torch loads; passive "
        "OpenMP waits make vLLM's steps slower on an idle CPU)",
    }
    profile = EngineProfile(
        name=f"vllm-{model_dir.name}-{device}",
        **fitted_terms(eq2, prefill_fit, decode_attention),
        noise_cv=float(np.median([p.cv for p in measured.decode])),
        block_size=measured.block_size,
        num_gpu_blocks=measured.num_gpu_blocks,
        checkpoint_bytes=sum(f.stat().st_size for f in model_dir.glob("*.safetensors")),
        engine_init_s=engine_init_s,
        checkpoint_tiers=(CheckpointTier("gpu", 0.0),),
        notes=notes,
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(profile.to_json() + "\n")
    plot_fit(
        plot_path, profile.name, measured.decode, measured.context, measured.prefill, eq2,
        prefill_fit,
    )  # fmt: skip
    return profile


def _start_and_profile_vllm(
    out_path: Path,
    plot_path: Path,
    cache_dir: Path,
    engine_config: object | None,
    sweep: object | None,
    clock: Clock,
    log: Log,
) -> EngineProfile:
    from tokenpace.engine.vllm.config import VllmEngineConfig
    from tokenpace.engine.vllm.runner import start_engine
    from tokenpace.profiling.vllm_sweep import VllmSweepConfig, profile_engine_config

    config = engine_config if engine_config is not None else profile_engine_config(cache_dir)
    if not isinstance(config, VllmEngineConfig):
        raise TypeError(f"engine_config must be a VllmEngineConfig, got {type(config).__name__}")
    if sweep is not None and not isinstance(sweep, VllmSweepConfig):
        raise TypeError(f"sweep must be a VllmSweepConfig, got {type(sweep).__name__}")
    log(f"starting vLLM on {config.model} ({config.dtype})")
    start = clock()
    llm = start_engine(config, "fcfs", cache_dir / "vllm-runtime")
    engine_init_s = clock() - start
    log(f"engine started in {engine_init_s:.1f} s")
    try:
        return profile_vllm(
            llm, out_path, sweep=sweep, plot_path=plot_path, engine_init_s=engine_init_s, log=log
        )
    finally:
        llm.llm_engine.engine_core.shutdown()
