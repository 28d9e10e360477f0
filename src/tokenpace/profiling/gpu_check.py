"""The GPU check: profile the native engine on a Llama-3.2-3B-shaped model, time its batch-1
step against the memory-bandwidth roofline, and run TWP against the baselines at the paper's
scale; one JSON object on the last stdout line.

Weights are random, drawn from the config shipped in ``engine/native/configs`` (step time
depends on shapes, not values; nothing is fetched). ``--dry-run`` runs the same path on the
CPU with a tiny model of the same family and a reduced sweep and workload, in seconds.
``bench/gpu_check.sh`` is the entry point.

The workload is the paper's main experiment (its prompt and output mixtures, 250 requests)
at the same multiple of capacity as the paper's 18 req/s on the V100 reference profile, with
capacity taken from the profile just fitted (DESIGN.md section 5).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokenpace.bench.cpu_scale import cpu_high, cpu_main, simulated_knee
from tokenpace.cli.command import run_command
from tokenpace.cli.spec import UsageError
from tokenpace.core.cache import default_cache_dir
from tokenpace.core.config import option
from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.config import DECODE_GRAPHS
from tokenpace.engine.native.probe import NativeProbe
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.run_metrics import RunKey, summarize_run
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.run import run_profile
from tokenpace.profiling.sweep import SweepConfig, measure_read_bandwidth_gb_s
from tokenpace.runtime.replay import replay
from tokenpace.server.worker.native_backend import StepLoopBackend
from tokenpace.workload.main_experiment import PoissonWorkload
from tokenpace.workload.scenarios import load_factor
from tokenpace.workload.spec import with_known_lengths

REFERENCE_PROFILE = "v100-llama-3.2-3b"
SCHEDULERS = ("twp", "twp_slo", "fcfs", "priority", "dynamic_batch", "vllm_default")
HIGH_SCHEDULERS = ("twp_slo", "vllm_default", "sarathi", "sla_batch", "fcfs")
GRAPH_BATCHES = (1, 8, 64)
Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class GpuCheckConfig:
    """What the check loads, sweeps and runs."""

    engine: NativeEngineConfig = option(
        NativeEngineConfig(
            model="random:llama-3.2-3b", device="cuda", max_num_seqs=128, max_model_len=2048
        ),
        "The native engine (model, device, precision, KV limits).",
    )
    sweep: SweepConfig = option(
        SweepConfig(
            batch_sizes=(1, 2, 4, 8, 16, 32, 48, 64, 96, 128),
            prefill_chunks=(16, 64, 256, 512, 1024, 1536),
        ),
        "The profiling sweep. Batch sizes reach max_num_seqs and prefill chunks reach "
        "twp_slo's prefill budget: a GPU's flat region is wide (on an H200 a 3B model's "
        "chunks of 16-256 tokens all took about one decode step), so only long chunks show "
        "the per-token cost.",
    )
    max_requests: int = option(250, "Requests per scheduler run (the paper's 250).")
    schedulers: tuple[str, ...] = option(SCHEDULERS, "Policies compared, TWP first.")
    high_requests: int = option(
        600,
        "Requests of the `high` run (the scenario mixtures at 1.2x the engine's knee); 0 skips it.",
    )
    high_schedulers: tuple[str, ...] = option(
        HIGH_SCHEDULERS, "Policies compared on `high`: twp_slo and the strongest baselines."
    )
    graph_batches: tuple[int, ...] = option(
        GRAPH_BATCHES, "Batches at which decode steps are timed with and without decode graphs."
    )
    seed: int = option(0, "Workload seed (the same requests for every scheduler).")
    slo: Slo = option(Slo(), "SLO that defines goodput.")


def dry_run_config() -> GpuCheckConfig:
    """The same path on the CPU with a tiny Llama-shaped model: seconds, not minutes."""
    return GpuCheckConfig(
        engine=NativeEngineConfig(
            model="random:tiny-llama", device="cpu", max_num_seqs=32, max_model_len=1024
        ),
        sweep=SweepConfig(
            batch_sizes=(1, 2, 4, 8, 16),
            decode_context=32,
            context_lengths=(32, 256),
            context_batch_sizes=(1, 4),
            prefill_chunks=(16, 32, 64),
            prefill_context_starts=(0, 128),
            mixed_batch_size=4,
            mixed_chunk=16,
            mixed_split=4,
            mixed_chunks=(64,),
            steps_per_point=3,
            warmup_steps=1,
            repeats=1,
        ),
        max_requests=6,
        high_requests=12,
        graph_batches=(1, 8),
    )


def run_schedulers(
    backend: StepLoopBackend,
    profile: EngineProfile,
    workload: PoissonWorkload,
    config: GpuCheckConfig,
    log: Log,
    on_run: Callable[[str, dict[str, Any]], None] = lambda name, run: None,
    schedulers: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every scheduler (``config.schedulers`` unless given) on the same requests of
    ``workload`` (EOS ignored, as in the simulator); returns per scheduler the results.json
    ``runs`` entry, each also passed to ``on_run`` as it finishes."""
    # Real engines stop requests through max_tokens (ignore_eos), so it carries the true length.
    specs = with_known_lengths(workload.generate(np.random.default_rng(config.seed)))
    runs: dict[str, dict[str, Any]] = {}
    for name in config.schedulers if schedulers is None else schedulers:
        backend.use_policy(name, profile, config.slo)
        outcome = replay(specs, backend, SamplingParams(ignore_eos=True))
        key = RunKey(name, workload.name, "native", config.seed)
        runs[name] = summarize_run(key, outcome.requests, 0.0, config.slo)
        log(
            f"{workload.name} {name}: {runs[name]['n_completed']}/{len(specs)} done in "
            f"{runs[name]['duration_s']:.1f} s, TTFT p50 {runs[name]['ttft_ms']['p50']:.0f} ms"
        )
        on_run(name, runs[name])
    return runs


def compare_decode_graphs(
    engine: NativeEngine, sweep: SweepConfig, batches: Sequence[int], log: Log
) -> dict[str, Any] | None:
    """Steps with the engine's decode graphs against the same engine without them
    (``decode_graphs_paused``): both step times per decode batch (context 128), for a
    64-token prefill chunk and for the sweep's mixed step (decode plus one prompt); and
    whether greedy decoding gives the same tokens both ways (12 requests prefilled in one
    step, 16 tokens each, a step of 7 among them); None when the engine runs no decode
    graphs."""
    if engine.decode_graphs == "off":
        return None
    probe = NativeProbe(engine)

    def both(label: str, measure: Callable[[], float]) -> dict[str, float]:
        graphs = measure()
        with engine.decode_graphs_paused():
            without = measure()
        log(f"{label}: {graphs:.2f} ms with decode graphs, {without:.2f} ms without")
        return {
            "graphs_ms": round(graphs, 3),
            "without_ms": round(without, 3),
            "without_over_graphs": round(without / graphs, 2),
        }

    def decode_at(batch: int) -> Callable[[], float]:
        return lambda: probe.decode(sweep, batch, 128).step_ms

    steps = {str(batch): both(f"decode B={batch}", decode_at(batch)) for batch in batches}
    prefill = both("prefill C=64", lambda: probe.prefill(sweep, 64, 0).step_ms)
    mixed_label = f"decode B={sweep.mixed_batch_size} with a {sweep.mixed_chunk}-token prompt"
    mixed = both(mixed_label, lambda: probe.mixed(sweep).mixed_ms)
    with_graphs = _greedy_tokens(engine)
    with engine.decode_graphs_paused():
        without_graphs = _greedy_tokens(engine)
    same = sum(a == b for a, b in zip(with_graphs, without_graphs, strict=True))
    log(f"greedy tokens equal with and without decode graphs: {same} of {len(with_graphs)}")
    return {
        "steps": steps,
        "prefill_64": prefill,
        "mixed": mixed,
        "greedy_equal_requests": same,
        "greedy_requests": len(with_graphs),
        "mode_after": engine.decode_graphs,
    }


def _greedy_tokens(engine: NativeEngine) -> list[list[int]]:
    """Twelve requests with fixed prompts decoded greedily to 16 tokens each (a step of
    seven among them, so two step sizes run); their tokens."""
    vocab = int(engine.loaded.model.config.vocab_size)
    prompts = np.random.default_rng(1).integers(0, vocab, size=(12, 24))
    params = SamplingParams(ignore_eos=True)
    requests = [
        Request(
            -1 - i, 8 + i, 16, 0.0, prompt_token_ids=prompts[i, : 8 + i].tolist(), sampling=params
        )
        for i in range(12)
    ]
    for step in range(17):
        live = [r for r in requests if r.num_output_tokens < r.max_tokens]
        live = live[:7] if step == 2 else live
        if not live:
            break
        chunks = [
            ScheduledChunk(r, r.num_uncomputed_tokens if r.is_prefilling else 1) for r in live
        ]
        result = engine.execute(chunks)
        for request in live:
            request.output_token_ids.append(result.sampled_token_ids[request.request_id])
            request.token_times_s.append(0.0)
    for request in requests:
        engine.free(request.request_id)
    return [r.output_token_ids for r in requests]


def _brief(run: dict[str, Any]) -> dict[str, float]:
    return {
        "n_completed": run["n_completed"],
        "ttft_p50_ms": round(run["ttft_ms"]["p50"], 1),
        "ttft_p99_ms": round(run["ttft_ms"]["p99"], 1),
        "itl_mean_ms": round(run["itl_ms"]["mean"], 2),
        "itl_p99_ms": round(run["itl_ms"]["p99"], 2),
        "throughput_tok_s": round(run["throughput_tok_s"], 1),
        "goodput_rps": round(run["goodput_rps"], 3),
    }


def gpu_check(config: GpuCheckConfig, out_dir: Path, log: Log) -> dict[str, Any]:
    """Run the whole check; writes the fitted profile (JSON + PNG) into ``out_dir``, and
    ``result.json`` there before the scheduler runs and after each (``complete`` false
    until the last);
    returns the summary printed as the last line."""
    start = time.perf_counter()
    engine = NativeEngine.load(config.engine, rng=np.random.default_rng(config.seed))
    loaded = engine.loaded
    log(f"{config.engine.model} on {loaded.device}: {loaded.weight_bytes / 1e9:.2f} GB weights")
    placeholder = load_profile(REFERENCE_PROFILE)
    backend = StepLoopBackend.over(engine, placeholder, "fcfs", config.slo, time.perf_counter)
    profile = run_profile(
        "native",
        out_dir / "profile.json",
        backend=backend,
        sweep=config.sweep,
        measure_checkpoints=False,
        log=log,
    )
    bandwidth = measure_read_bandwidth_gb_s(loaded.device)
    roofline_ms = loaded.weight_bytes / bandwidth / 1e6
    single = NativeProbe(engine).decode(replace(config.sweep, steps_per_point=16), 1, 128)
    log(f"batch-1 step {single.step_ms:.2f} ms, roofline {roofline_ms:.2f} ms")
    graph_sweep = replace(config.sweep, steps_per_point=8)
    graphs = compare_decode_graphs(engine, graph_sweep, config.graph_batches, log)
    # The paper's main experiment at the same multiple of the profile's capacity as the
    # paper's 18 req/s on the reference profile.
    workload = cpu_main(profile, load_profile(REFERENCE_PROFILE), config.max_requests)
    summary: dict[str, Any] = {
        "check": "gpu_check",
        "complete": False,
        "device": str(loaded.device),
        "device_name": _device_name(loaded.device.type),
        "model": config.engine.model,
        "dtype": config.engine.dtype,
        "forward_path": engine.forward_path,
        "decode_graphs": engine.decode_graphs,
        "sdpa_backends": engine.sdpa_backends,
        "upcast_min_rows": engine.upcast_min_rows,
        "linear_kernel": engine.linear_kernel,
        "weight_bytes": loaded.weight_bytes,
        "read_bandwidth_gb_s": round(bandwidth, 1),
        "roofline_ms": round(roofline_ms, 3),
        "b1_step_ms": round(single.step_ms, 3),
        "b1_step_over_roofline": round(single.step_ms / roofline_ms, 2),
        "profile": {
            "l_min_ms": round(profile.l_min_ms, 3),
            "b0": profile.b0,
            "alpha_ms": round(profile.alpha_ms, 4),
            "r2": profile.r2,
            "prefill_ms_per_token": round(profile.prefill_ms_per_token, 5),
        },
        "workload": {
            "rate_per_s": round(workload.rate_per_s, 2),
            "n_requests": config.max_requests,
            "seed": config.seed,
        },
        "decode_graphs_check": graphs,
        "schedulers": {},
    }

    def save() -> None:
        # Before the runs and after each, so a check stopped by its time limit keeps what
        # it has.
        summary["wall_s"] = round(time.perf_counter() - start, 1)
        (out_dir / "result.json").write_text(json.dumps(summary, indent=2) + "\n")

    def recorder(runs: dict[str, Any]) -> Callable[[str, dict[str, Any]], None]:
        def record(name: str, run: dict[str, Any]) -> None:
            runs[name] = _brief(run)
            save()

        return record

    save()
    run_schedulers(backend, profile, workload, config, log, recorder(summary["schedulers"]))
    if config.high_requests > 0:
        # As ``bench --engine native`` sizes it: 1.2x the knee simulated on the profile.
        high = cpu_high(profile, simulated_knee(config.slo, None), config.high_requests)
        high_runs: dict[str, Any] = {}
        summary["high"] = {
            "knee_rps": round(high.rate_per_s / load_factor("high"), 2),
            "rate_per_s": round(high.rate_per_s, 2),
            "n_requests": config.high_requests,
            "schedulers": high_runs,
        }
        run_schedulers(
            backend, profile, high, config, log, recorder(high_runs), config.high_schedulers
        )
    summary["complete"] = True
    summary["decode_graphs"] = engine.decode_graphs
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    return summary


def _device_name(kind: str) -> str:
    import torch

    return torch.cuda.get_device_name() if kind == "cuda" else "cpu"


@dataclass(frozen=True, slots=True)
class GpuCheckSettings:
    """The flags of ``python -m tokenpace.profiling.gpu_check``."""

    dry_run: bool = option(False, "Tiny model on the CPU, reduced sweep.")
    out: Path | None = option(None, "Output directory (default: the cache directory's gpu_check).")
    decode_graphs: str = option(
        "auto",
        "The native engine's decode_graphs (auto: CUDA graphs on CUDA).",
        choices=DECODE_GRAPHS,
    )
    cudnn_attention: bool = option(False, "Let SDPA use cuDNN's attention (the engine's option).")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the GPU check with ``argv`` (default: the process's arguments)."""
    run_command(
        GpuCheckSettings, run, sys.argv[1:] if argv is None else argv,
        prog="gpu_check", description=__doc__,
    )  # fmt: skip


def run(args: GpuCheckSettings) -> None:
    """Profile, time and compare; write result.json into ``args.out`` and print it."""
    out = args.out if args.out is not None else default_cache_dir() / "gpu_check"
    config = dry_run_config() if args.dry_run else GpuCheckConfig()
    engine = replace(
        config.engine, decode_graphs=args.decode_graphs, cudnn_attention=args.cudnn_attention
    )
    config = replace(config, engine=engine)
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("no CUDA device; use --dry-run to check the path on CPU")
    out.mkdir(parents=True, exist_ok=True)
    result = gpu_check(config, out, log=lambda message: print(message, flush=True))
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
