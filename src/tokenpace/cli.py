"""The `tokenpace` command line."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tokenpace.bench.capacity import CapacityJob, KneeProblem, measure_capacities
from tokenpace.bench.cpu_scale import cpu_workloads, main_load_factor
from tokenpace.bench.fidelity import measure_fidelity
from tokenpace.bench.matrix import MatrixConfig
from tokenpace.bench.presets import (
    MAIN_SCHEDULERS,
    PRESETS,
    ROUTING_BASELINES,
    PlanOptions,
    capacity_entry,
    pool_part,
)
from tokenpace.bench.runners import RunnerSet
from tokenpace.bench.suite import num_cells, run_bench
from tokenpace.core.cache import default_cache_dir
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.qoe import QoeConfig
from tokenpace.metrics.slo import Slo
from tokenpace.pool.capacity import pool_capacity_rps_for_specs
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.router import ROUTERS
from tokenpace.pool.simulate import scheduler_names
from tokenpace.workload.empirical import EmpiricalWorkload
from tokenpace.workload.gsm8k import load_prompts
from tokenpace.workload.main_experiment import PoissonWorkload
from tokenpace.workload.scenarios import ScenarioConfig
from tokenpace.workload.spec import ReplayWorkload
from tokenpace.workload.traces import TRACE_FORMATS, TraceOptions, load_trace, time_scale_for_rate

DEFAULT_PROFILE = "v100-llama-3.2-3b"
ENGINES = ("sim", "native", "vllm")
MIN_KNEE_REQUESTS = 500
NATIVE_PROFILE_PATH = Path("build/profiles/native-smollm2-bfloat16-cpu.json")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="tokenpace: Token Window Pacing for stable LLM serving.",
)


def fail(message: str) -> NoReturn:
    """One-line error on stderr, exit status 2 (a usage error)."""
    print(f"tokenpace: error: {message}", file=sys.stderr)
    raise typer.Exit(2)


def parse_schedulers(text: str) -> tuple[str, ...]:
    valid = scheduler_names()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        fail("--schedulers is empty; valid choices: " + ", ".join(valid))
    for name in names:
        if name not in valid:
            fail(f"unknown scheduler {name!r}; valid choices: {', '.join(valid)}")
    return names


def require_positive(flag: str, value: float | None) -> None:
    """Fail (exit 2) unless ``value`` is None or > 0."""
    if value is not None and not value > 0:
        fail(f"{flag} must be positive, got {value}")


def resolve_profile(value: str) -> EngineProfile:
    try:
        return load_profile(value)
    except (FileNotFoundError, ValueError) as error:
        fail(f"--profile {value!r}: {error}")


def print_summary(console: Console, summary: list[dict[str, Any]]) -> None:
    for workload in dict.fromkeys(e["workload"] for e in summary):
        table = Table(title=f"workload {workload}: mean over seeds (± 95% CI)")
        columns = (
            ("req/s", ("throughput_rps",), 3), ("tok/s", ("throughput_tok_s",), 0),
            ("goodput", ("goodput_rps",), 3), ("TTFT p50", ("ttft_ms", "p50"), 0),
            ("TTFT p99", ("ttft_ms", "p99"), 0), ("ITL mean", ("itl_ms", "mean"), 1),
            ("ITL p99", ("itl_ms", "p99"), 1), ("ITL CV", ("itl_ms", "cv"), 3),
        )  # fmt: skip
        table.add_column("scheduler")
        for label, _, _ in columns:
            table.add_column(label, justify="right")
        for entry in (e for e in summary if e["workload"] == workload):
            cells = []
            for _, path, digits in columns:
                stat: Any = entry
                for key in path:
                    stat = stat[key]
                mean, ci = stat["mean"], stat["ci95"]
                text = f"{mean:.{digits}f}"
                cells.append(f"{text} ± {ci:.{digits}f}" if ci == ci else text)
            table.add_row(entry["scheduler"], *cells)
        console.print(table)


def pool_config(containers: int, keep_alive: float, initial_warm: int) -> PoolConfig:
    require_positive("--containers", containers)
    require_positive("--keep-alive", keep_alive)
    if not 0 <= initial_warm <= containers:
        fail(f"--initial-warm must be in [0, {containers}], got {initial_warm}")
    return PoolConfig(num_containers=containers, initial_warm=initial_warm, keep_alive_s=keep_alive)


def trace_part(
    path: Path,
    trace_format: str,
    options: TraceOptions,
    load: float | None,
    plan: PlanOptions,
) -> tuple[MatrixConfig, str]:
    """A pool part replaying the trace with its output lengths as true lengths and the
    trace's largest output as every client's ``max_tokens``. With ``load`` set, the time
    scale is chosen so the mean arrival rate is ``load`` x the pool's knee for the trace's
    own lengths (measured like the scenarios' knees, on as many Poisson arrivals as the
    replay holds, resampling the trace's (prompt, output) pairs)."""
    if trace_format not in TRACE_FORMATS:
        fail(
            f"unknown --trace-format {trace_format!r}; valid choices: "
            f"{', '.join(TRACE_FORMATS.names())}"
        )
    try:
        trace = load_trace(path, trace_format, options)
        if not trace.specs:
            raise ValueError(f"{path}: no request left in the replay window")
        cap = max(s.max_tokens for s in trace.specs)
        lengths = tuple((s.num_prompt_tokens, s.max_tokens) for s in trace.specs)
        knee = None
        if load is not None:
            # The knee of a replay of this size: as many Poisson arrivals as the replay
            # (at least MIN_KNEE_REQUESTS, so that a short replay can still be overloaded).
            workload = EmpiricalWorkload(
                name="trace", rate_per_s=1.0, lengths=lengths, max_tokens=cap,
                num_requests=max(MIN_KNEE_REQUESTS, len(trace.specs)),
            )  # fmt: skip
            estimate = pool_capacity_rps_for_specs(
                plan.profile, trace.specs, plan.pool.num_containers
            )
            job = CapacityJob(
                KneeProblem(plan.profile, plan.pool.num_containers, workload, plan.slo,
                            plan.search), estimate,
            )  # fmt: skip
            knee = measure_capacities({"trace": job}, plan.cache_dir)["trace"]
            scale = time_scale_for_rate(trace, load * knee.knee_rps)
            trace = load_trace(path, trace_format, replace(options, time_scale=scale))
    except (FileNotFoundError, ValueError) as error:
        fail(f"--trace: {error}")
    report = trace.report
    note = (
        f"Trace `{report.path}` ({report.trace_format}): {report.num_rows} rows, "
        f"{report.num_failed} failed requests skipped, {report.num_outside_window} outside the "
        f"window, {report.num_kept} replayed over {report.span_s:.0f} s "
        f"({trace.mean_rate_per_s:.2f} req/s); every request stops at its traced output "
        f"length and asks for max_tokens {cap}."
    )
    name = f"trace:{path.stem}"
    specs = tuple(replace(s, max_tokens=cap, output_tokens=s.max_tokens) for s in trace.specs)
    capacity = {name: capacity_entry(knee, trace.mean_rate_per_s)} if knee is not None else None
    pool = plan.pool
    if knee is not None:
        pool = replace(pool, target_per_instance=max(1.0, knee.concurrency_per_container))
    return pool_part(plan, (ReplayWorkload(name=name, specs=specs),), pool, None, capacity), note


@app.command()
def bench(
    preset: Annotated[
        str,
        typer.Option(
            help="main (the paper's main experiment on one server), scenarios (low, medium, "
            "high, burst, kv_pressure, prefill_heavy on the pool), all (both), ablations, "
            "goodput_curve or alpha."
        ),
    ] = "main",
    schedulers: Annotated[
        str | None,
        typer.Option(help="Comma-separated scheduler names (default: the preset's own)."),
    ] = None,
    seeds: Annotated[
        int | None, typer.Option(help="Number of seeds per cell (default 10; 1 for --trace).")
    ] = None,
    seed: Annotated[int, typer.Option(help="First seed; seeds are seed..seed+N-1.")] = 0,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Shipped profile name or profile JSON (default: v100-llama-3.2-3b; with "
            "--engine native the engine's fitted profile, profiled once and cached)."
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="sim (simulator), native or vllm (real model, CPU-sized workloads; vllm "
            "uses --profile, default v100-llama-3.2-3b, for the policy's latency terms)."
        ),
    ] = "sim",
    fidelity: Annotated[
        bool,
        typer.Option(help="With --engine native: same workload on engine and simulator, errors."),
    ] = False,
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO for goodput (ms).")] = 2000.0,
    slo_tpot_ms: Annotated[float, typer.Option(help="TPOT SLO for goodput (ms).")] = 100.0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("results/main"),
    prompts: Annotated[
        Path | None, typer.Option(help="GSM8K-style JSONL with prompt text (optional).")
    ] = None,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    router: Annotated[
        str | None,
        typer.Option(help="Router for policies on the pool (default least_loaded)."),
    ] = None,
    containers: Annotated[int, typer.Option(help="Containers in the simulated pool.")] = 4,
    keep_alive: Annotated[
        float, typer.Option(help="Idle seconds before a warm container goes cold.")
    ] = 2.0,
    initial_warm: Annotated[int, typer.Option(help="Containers warm at time 0.")] = 1,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where measured capacities are cached (default $TOKENPACE_CACHE_DIR, else "
            "~/.cache/tokenpace)."
        ),
    ] = None,
    qoe_pace: Annotated[
        float, typer.Option(help="Reading pace of the QoE score (tokens/s).")
    ] = 10.0,
    qoe_ttft_s: Annotated[
        float, typer.Option(help="Expected time to first token of the QoE score (s).")
    ] = 1.0,
    scenario_duration: Annotated[
        float, typer.Option(help="Arrival window of each scenario run (s).")
    ] = 20.0,
    trace: Annotated[
        Path | None, typer.Option(help="Replay this trace on the pool instead of a preset.")
    ] = None,
    trace_format: Annotated[str, typer.Option(help="Trace format: azure or burstgpt.")] = "azure",
    trace_speedup: Annotated[
        float | None,
        typer.Option(help="Divide arrival gaps by this (default: scale to --trace-load)."),
    ] = None,
    trace_load: Annotated[
        float,
        typer.Option(help="Without --trace-speedup: mean rate as a multiple of the trace's knee."),
    ] = 1.2,
    trace_start: Annotated[float, typer.Option(help="Window start (s after first row).")] = 0.0,
    trace_end: Annotated[float | None, typer.Option(help="Window end (s after first row).")] = None,
    trace_max_requests: Annotated[
        int | None, typer.Option(help="Replay at most this many requests.")
    ] = None,
) -> None:
    """Compare schedulers on the simulator. Default: the paper's main experiment (Poisson
    18 req/s, 60 s, <= 250 requests) for five schedulers over 10 seeds. Prints the table;
    writes results.json, requests.csv, report.md and figures into --out."""
    for flag, value in (
        ("--seeds", seeds), ("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms),
        ("--workers", workers), ("--scenario-duration", scenario_duration),
        ("--trace-speedup", trace_speedup), ("--trace-load", trace_load),
        ("--trace-max-requests", trace_max_requests), ("--qoe-pace", qoe_pace),
    ):  # fmt: skip
        require_positive(flag, value)
    if seed < 0:
        fail(f"--seed must be >= 0, got {seed}")
    if qoe_ttft_s < 0:
        fail(f"--qoe-ttft-s must be >= 0, got {qoe_ttft_s}")
    if preset not in PRESETS:
        fail(f"unknown preset {preset!r}; valid choices: {', '.join(PRESETS.names())}")
    if router is not None and router not in ROUTERS:
        fail(f"unknown router {router!r}; valid choices: {', '.join(ROUTERS.names())}")
    names = parse_schedulers(schedulers) if schedulers is not None else None
    if engine not in ENGINES:
        fail(f"unknown engine {engine!r}; valid choices: {', '.join(ENGINES)}")
    if fidelity and engine == "sim":
        fail("--fidelity compares a real engine with the simulator: add --engine native")
    if fidelity and engine == "vllm" and profile is None:
        fail("--fidelity --engine vllm needs --profile FILE (the engine's fitted profile)")
    if profile is not None:
        engine_profile = resolve_profile(profile)
    elif engine == "native":
        engine_profile = cached_native_profile()
    else:
        engine_profile = resolve_profile(DEFAULT_PROFILE)
    prompt_texts = None
    if prompts is not None:
        try:
            prompt_texts = tuple(load_prompts(prompts))
        except (FileNotFoundError, ValueError) as error:
            fail(f"--prompts: {error}")
    num_seeds = seeds if seeds is not None else (10 if trace is None and engine == "sim" else 1)
    plan = PlanOptions(
        schedulers=names,
        seeds=tuple(range(seed, seed + num_seeds)),
        profile=engine_profile,
        slo=Slo(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms),
        pool=pool_config(containers, keep_alive, initial_warm),
        router=router,
        prompts=prompt_texts,
        scenario=ScenarioConfig(duration_s=scenario_duration),
        qoe=QoeConfig(pace_tok_s=qoe_pace, expected_ttft_s=qoe_ttft_s),
        cache_dir=cache_dir if cache_dir is not None else default_cache_dir(),
        workers=workers,
    )
    notes: list[str] = []
    if engine != "sim":
        from tokenpace.bench.engine_runner import prepare_process

        prepare_process(engine)
        reference = resolve_profile(DEFAULT_PROFILE)
        workloads = cpu_workloads(engine_profile, reference)
        if fidelity:
            run_fidelity(engine, (names or ("twp",))[0], workloads[0], seed, engine_profile, plan)
            return
        parts = [
            MatrixConfig(
                schedulers=tuple(n for n in names or MAIN_SCHEDULERS if n not in ROUTING_BASELINES),
                workloads=workloads, seeds=plan.seeds, profile=engine_profile, slo=plan.slo,
                runner=engine, engine=engine, prompts=prompt_texts,
            )
        ]  # fmt: skip
        workers = 1  # a real engine owns the machine's cores
        notes.append(
            f"Engine `{engine}` at CPU scale: `main` runs the paper's mixtures at the same "
            f"multiple of capacity as 18 req/s on {reference.name} "
            f"({main_load_factor(reference):.2f}x), `high` at 1.2x capacity, 60 requests each."
        )
    elif trace is not None:
        try:
            options = TraceOptions(
                time_scale=trace_speedup or 1.0, start_s=trace_start, end_s=trace_end,
                max_requests=trace_max_requests,
            )  # fmt: skip
        except ValueError as error:
            fail(f"--trace options: {error}")
        part, note = trace_part(
            trace, trace_format, options, None if trace_speedup else trace_load, plan
        )
        parts = [part]
        notes.append(note)
    else:
        console = Console(stderr=True)
        console.print("measuring capacity (cached after the first run)")
        parts = PRESETS.get(preset)(plan)
    if any(not p.schedulers for p in parts):
        fail("no scheduler of --schedulers can run in this preset's single-server part")
    console = Console(stderr=True)
    started = time.monotonic()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating", total=num_cells(parts))
        outcome = run_bench(
            parts, out, str(prompts) if prompts else None, workers=workers,
            on_done=lambda _cell: progress.advance(task), notes=tuple(notes),
        )  # fmt: skip
    print_summary(Console(width=170), outcome.document["summary"])
    console.print(
        f"wrote {out}/results.json, requests.csv, report.md and {len(outcome.figures)} figures "
        f"in {time.monotonic() - started:.1f} s"
    )


def cached_native_profile() -> EngineProfile:
    """The native engine's fitted profile under build/profiles, profiled on first use."""
    path = NATIVE_PROFILE_PATH
    if not path.is_file():
        print(f"profiling the native engine once into {path} (a minute or two)", file=sys.stderr)
        try:
            from tokenpace.profiling import run_profile
        except ImportError as error:
            fail(f"the native engine needs `scripts/setup.sh native` ({error})")
        path.parent.mkdir(parents=True, exist_ok=True)
        run_profile("native", path, log=lambda message: print(message, file=sys.stderr))
    return resolve_profile(str(path))


def run_fidelity(
    engine: str, scheduler: str, workload: PoissonWorkload, seed: int,
    engine_profile: EngineProfile, plan: PlanOptions,
) -> None:  # fmt: skip
    """Print the fidelity table; the last line is one JSON object."""
    with RunnerSet() as runners:
        result = measure_fidelity(
            runners, engine, scheduler, workload, seed, engine_profile, plan.slo
        )
    for name, error in result.relative_error.items():
        print(f"{name}: {100 * error:+.1f}%", file=sys.stderr)
    print(json.dumps({
        "engine": engine, "scheduler": scheduler, "workload": workload.name, "seed": seed,
        "profile": engine_profile.name, "n_requests": result.real["n_requests"],
        "relative_error": {k: round(v, 4) for k, v in result.relative_error.items()},
    }))  # fmt: skip


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """OpenAI-compatible streaming server over real engines with TWP in charge (default:
    the native engine with the embedded SmolLM2 on 127.0.0.1:8000). `tokenpace serve --help`
    lists every flag."""
    from tokenpace.server.cli_args import parse_options
    from tokenpace.server.main import EngineStartError
    from tokenpace.server.main import serve as run_server

    try:
        run_server(parse_options(list(ctx.args)))
    except (ValueError, FileNotFoundError, EngineStartError) as error:
        fail(str(error))


@app.command()
def profile(
    engine: Annotated[str, typer.Option(help="Engine to profile: native or vllm.")] = "native",
    out: Annotated[
        Path | None,
        typer.Option(
            help="Profile JSON to write (PNG of the fit beside it); "
            "default build/profiles/<engine>.json."
        ),
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="Weights/KV precision: float32, bfloat16 or auto (bfloat16 where the device "
            "computes it natively, else float32)."
        ),
    ] = "auto",
    model: Annotated[
        str, typer.Option(help="'smollm2' (embedded) or a local Hugging Face model directory.")
    ] = "smollm2",
    skip_checkpoints: Annotated[
        bool, typer.Option(help="Do not time checkpoint loads per tier (saves ~20 s; native).")
    ] = False,
) -> None:
    """The offline profiling sweep: decode step time over batch sizes and context lengths,
    prefill over chunk sizes, mixed steps, KV capacity and (native) checkpoint load time per
    tier; fits l_min, B0 and alpha (Eq. 2) and writes a profile the simulator reads."""
    from importlib.util import find_spec

    from tokenpace.profiling.run import ENGINES as PROFILED_ENGINES

    if engine not in PROFILED_ENGINES:
        fail(f"cannot profile engine {engine!r}; valid choices: {', '.join(PROFILED_ENGINES)}")
    out = out if out is not None else Path(f"build/profiles/{engine}.json")
    config: object
    try:
        if engine == "vllm":
            if find_spec("vllm") is None:
                fail("profiling vLLM needs the vllm extra (scripts/setup.sh vllm)")
            from tokenpace.engine.vllm.probe import profile_engine_config

            config = profile_engine_config(model, dtype)
        else:
            from tokenpace.engine.native import NativeEngineConfig

            config = NativeEngineConfig(model=model, dtype=dtype)
        from tokenpace.profiling import run_profile
    except ImportError as error:
        fail(f"the {engine} engine needs `scripts/setup.sh {engine}` ({error})")
    except (ValueError, FileNotFoundError) as error:
        fail(str(error))
    try:
        from tokenpace.bench.engine_runner import prepare_process

        prepare_process(engine)
        out.parent.mkdir(parents=True, exist_ok=True)
        result = run_profile(
            engine, out, engine_config=config, measure_checkpoints=not skip_checkpoints,
            log=lambda message: print(message, file=sys.stderr),
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as error:
        fail(str(error))
    print(
        f"wrote {out}: l_min {result.l_min_ms:.1f} ms, b0 {result.b0}, "
        f"alpha {result.alpha_ms:.2f} ms, r2 {result.r2}"
    )


@app.command()
def version() -> None:
    """Print the version."""
    from tokenpace import __version__

    print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
