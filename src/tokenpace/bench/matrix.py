"""Run every (scheduler, workload, seed) cell, in parallel processes, deterministically.

Seeds: the workload of seed s is drawn from ``default_rng([s, 0])`` and is the same for
every scheduler; the engine noise of that run from ``default_rng([s, 1])``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tokenpace.bench.runners import RUNNERS
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.run_metrics import RunKey, summarize_run
from tokenpace.metrics.slo import Slo
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.workload.spec import RequestSpec


class WorkloadGenerator(Protocol):
    """Anything with a name that draws a request list from an RNG."""

    @property
    def name(self) -> str: ...

    def generate(
        self, rng: np.random.Generator, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]: ...


@dataclass(frozen=True, slots=True)
class CellSpec:
    scheduler: str
    workload: WorkloadGenerator
    seed: int
    keep_detail: bool


@dataclass(frozen=True, slots=True)
class CellResult:
    """One run's results.json entry, its requests and (for detail cells) step records."""

    run: dict[str, Any]
    requests: list[Request]
    steps: dict[int, list[StepRecord]]


@dataclass(frozen=True, slots=True)
class MatrixConfig:
    schedulers: tuple[str, ...]
    workloads: tuple[WorkloadGenerator, ...]
    seeds: tuple[int, ...]
    profile: EngineProfile
    slo: Slo
    runner: str = "sim"
    engine: str = "sim"
    prompts: tuple[str, ...] | None = None
    workers: int = 2


def _run_cell(config: MatrixConfig, cell: CellSpec) -> CellResult:
    specs = cell.workload.generate(np.random.default_rng([cell.seed, 0]), config.prompts)
    runner = RUNNERS.get(config.runner)
    engine_rng = np.random.default_rng([cell.seed, 1])
    output = runner(cell.scheduler, specs, config.profile, engine_rng, config.slo)
    key = RunKey(cell.scheduler, cell.workload.name, config.engine, cell.seed)
    run = summarize_run(key, output.requests, start_s=0.0, slo=config.slo)
    run.update({name: float(value) for name, value in sorted(output.counters.items())})
    steps = dict(output.steps) if cell.keep_detail else {}
    return CellResult(run, output.requests, steps)


def cells(config: MatrixConfig) -> list[CellSpec]:
    """All cells in result order: workload, then scheduler, then seed."""
    return [
        CellSpec(scheduler, workload, seed, keep_detail=seed == config.seeds[0])
        for workload in config.workloads
        for scheduler in config.schedulers
        for seed in config.seeds
    ]


def run_matrix(
    config: MatrixConfig, on_done: Callable[[CellSpec], None] | None = None
) -> list[CellResult]:
    """Results in ``cells`` order, whatever order the worker processes finish in."""
    todo = cells(config)
    if config.workers <= 1:
        results = []
        for cell in todo:
            results.append(_run_cell(config, cell))
            if on_done:
                on_done(cell)
        return results
    with ProcessPoolExecutor(max_workers=config.workers) as pool:
        futures = [pool.submit(_run_cell, config, cell) for cell in todo]
        ordered = []
        for cell, future in zip(todo, futures, strict=True):
            ordered.append(future.result())
            if on_done:
                on_done(cell)
        return ordered
