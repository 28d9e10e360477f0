"""Run every (scheduler, workload, seed) cell, in parallel processes, deterministically.

Seeds: the workload of seed s is drawn from ``default_rng([s, 0])`` and is the same for
every scheduler; the engine noise of that run from ``default_rng([s, 1])``. A bench is one or
more parts (``MatrixConfig``), e.g. the main experiment on one server and the scenarios on
the pool; their cells share one process pool and keep a fixed result order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenpace.bench.runners import Runner, RunnerSet, RunRequest
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.qoe import QoeConfig
from tokenpace.metrics.run_metrics import RunKey, summarize_run
from tokenpace.metrics.slo import Slo
from tokenpace.pool.config import PoolConfig
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.workload.spec import Workload


@dataclass(frozen=True, slots=True)
class MatrixConfig:
    """One part of a bench: schedulers x workloads x seeds on one runner."""

    schedulers: tuple[str, ...]
    workloads: tuple[Workload, ...]
    seeds: tuple[int, ...]
    profile: EngineProfile
    slo: Slo
    runner: str = "sim"
    engine: str = "sim"
    prompts: tuple[str, ...] | None = None
    pool: PoolConfig | None = None
    router: str | None = None
    per_workload_figures: bool = True
    qoe: QoeConfig = QoeConfig()
    # Workload name -> {"knee_rps", "ceiling_rps", "rate_rps", ...}: results.json "capacity".
    capacity: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # A real engine's KV cache for this part's runs (tokens); None: the engine's own size.
    # The simulators read the profile's cache, so when set the two must agree.
    kv_cache_tokens: int | None = None
    # The objectives the policies and the pool's autoscaler are given; None: ``slo``, which
    # the runs are always judged by (goodput, attainment). Set to pace a policy to other
    # objectives than the ones it is measured against (``bench/pacing_frontier.py``).
    policy_slo: Slo | None = None
    # A real engine (or the single-server simulator) refits the policy's profile from the
    # steps it runs, as ``serve`` does by default (None: the policy keeps ``profile``). The
    # pool ignores it.
    online_calibration: OnlineCalibrationConfig | None = None

    def __post_init__(self) -> None:
        if self.kv_cache_tokens is not None and (
            self.kv_cache_tokens != self.profile.kv_capacity_tokens
        ):
            raise ValueError(
                f"MatrixConfig.kv_cache_tokens must equal the profile's KV capacity "
                f"({self.profile.kv_capacity_tokens} tokens), got {self.kv_cache_tokens}"
            )


@dataclass(frozen=True, slots=True)
class CellSpec:
    part: MatrixConfig
    scheduler: str
    workload: Workload
    seed: int
    keep_detail: bool


@dataclass(frozen=True, slots=True)
class CellResult:
    """One run's results.json entry, its requests and (for detail cells) step records."""

    run: dict[str, Any]
    requests: list[Request]
    steps: dict[int, list[StepRecord]]


def _run_cell_alone(cell: CellSpec) -> CellResult:
    """One cell in a process of its own: its runner opened for it alone."""
    with RunnerSet() as runners:
        return _run_cell(cell, runners.get(cell.part.runner))


def _run_cell(cell: CellSpec, runner: Runner) -> CellResult:
    part = cell.part
    specs = cell.workload.generate(np.random.default_rng([cell.seed, 0]), part.prompts)
    output = runner(
        RunRequest(
            scheduler=cell.scheduler,
            specs=specs,
            profile=part.profile,
            rng=np.random.default_rng([cell.seed, 1]),
            slo=part.policy_slo if part.policy_slo is not None else part.slo,
            pool=part.pool,
            router=part.router,
            record_steps=cell.keep_detail,
            kv_cache_tokens=part.kv_cache_tokens,
            online_calibration=part.online_calibration,
        )
    )
    key = RunKey(cell.scheduler, cell.workload.name, part.engine, cell.seed)
    run = summarize_run(key, output.requests, start_s=0.0, slo=part.slo, qoe=part.qoe)
    run.update({name: float(value) for name, value in sorted(output.counters.items())})
    if "computed_tokens" in run:
        computed = run["computed_tokens"]
        run["recomputed_share"] = run["recomputed_tokens"] / computed if computed else 0.0
    if "container_seconds" in run:
        seconds = run["container_seconds"]
        good = run["goodput_rps"] * run["duration_s"]
        run["goodput_per_container_s"] = good / seconds if seconds else 0.0
    steps = {k: v for k, v in output.steps.items() if v} if cell.keep_detail else {}
    return CellResult(run, output.requests, steps)


def cells(parts: Sequence[MatrixConfig]) -> list[CellSpec]:
    """All cells in result order: part, workload, scheduler, seed. The first seed of each
    (scheduler, workload) keeps its step records for the figures."""
    return [
        CellSpec(part, scheduler, workload, seed, keep_detail=seed == part.seeds[0])
        for part in parts
        for workload in part.workloads
        for scheduler in part.schedulers
        for seed in part.seeds
    ]


def run_order(parts: Sequence[MatrixConfig]) -> list[int]:
    """The order (indices into ``cells(parts)``) in which one process runs the cells: per
    part and workload, seed by seed, the schedulers of a seed back to back, in reverse order
    on every other seed (A B C, C B A, ...). A real engine's speed drifts during a bench (on
    a 2-core CPU one scheduler's run of a seed lasted 63.5 s where the same cell took
    51.9-59.6 s in three later runs): run scheduler by scheduler, a slow phase lands on the
    seeds of one of them; interleaved, on neighbouring runs of several, and counterbalanced,
    a drift that is steady over two seeds' runs weighs on every scheduler alike."""
    order = []
    first = 0
    for part in parts:
        num_schedulers, num_seeds = len(part.schedulers), len(part.seeds)
        for workload in range(len(part.workloads)):
            for seed in range(num_seeds):
                schedulers = range(num_schedulers)
                for scheduler in schedulers if seed % 2 == 0 else reversed(schedulers):
                    order.append(first + (workload * num_schedulers + scheduler) * num_seeds + seed)
        first += len(part.workloads) * num_schedulers * num_seeds
    return order


def run_matrix(
    parts: Sequence[MatrixConfig],
    workers: int = 2,
    on_done: Callable[[CellSpec], None] | None = None,
) -> list[CellResult]:
    """Results in ``cells`` order, whatever order the cells ran in. With one worker every
    cell runs in this process, in ``run_order`` (``on_done`` is called in that order), and
    a real engine is loaded once for all."""
    todo = cells(parts)
    if workers <= 1:
        results: dict[int, CellResult] = {}
        with RunnerSet() as runners:
            for index in run_order(parts):
                cell = todo[index]
                results[index] = _run_cell(cell, runners.get(cell.part.runner))
                if on_done:
                    on_done(cell)
        return [results[index] for index in range(len(todo))]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_cell_alone, cell) for cell in todo]
        ordered = []
        for cell, future in zip(todo, futures, strict=True):
            ordered.append(future.result())
            if on_done:
                on_done(cell)
        return ordered
