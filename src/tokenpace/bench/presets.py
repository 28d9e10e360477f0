"""Named bench plans: which parts (runner x schedulers x workloads) a preset runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from tokenpace.bench.matrix import MatrixConfig
from tokenpace.core.registry import Registry
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES
from tokenpace.policy.twp_slo.policy import ABLATIONS
from tokenpace.pool.config import PoolConfig
from tokenpace.workload.main_experiment import PoissonWorkload
from tokenpace.workload.scenarios import (
    SCENARIO_OUTPUT_LENGTHS,
    SCENARIO_PROMPT_LENGTHS,
    ScenarioConfig,
    scenario_capacity_rps,
    scenario_workloads,
)
from tokenpace.workload.spec import Workload

# The paper's single-server comparison (issue: main experiment) and the pool comparison,
# which adds the two routing baselines.
MAIN_SCHEDULERS = ("twp", "fcfs", "priority", "dynamic_batch", "vllm_default")
POOL_SCHEDULERS = (
    "twp", "fcfs", "round_robin", "priority", "dynamic_batch", "serverlessllm", "vllm_default",
)  # fmt: skip
ROUTING_BASELINES = ("round_robin", "serverlessllm")


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What the CLI resolved: schedulers (None = the preset's own), seeds, profile, SLO,
    pool, router and prompt text."""

    schedulers: tuple[str, ...] | None
    seeds: tuple[int, ...]
    profile: EngineProfile
    slo: Slo
    pool: PoolConfig
    router: str | None = None
    prompts: tuple[str, ...] | None = None
    scenario: ScenarioConfig = ScenarioConfig()


Preset = Callable[[PlanOptions], list[MatrixConfig]]
PRESETS: Registry[Preset] = Registry("preset")


def main_part(options: PlanOptions) -> MatrixConfig:
    """The main experiment on one server; routing baselines need a pool, so they are left
    out of this part."""
    names = options.schedulers or MAIN_SCHEDULERS
    return MatrixConfig(
        schedulers=tuple(n for n in names if n in POLICIES),
        workloads=(PoissonWorkload(),),
        seeds=options.seeds,
        profile=options.profile,
        slo=options.slo,
        runner="sim",
        prompts=options.prompts,
    )


def pool_part(options: PlanOptions, workloads: tuple[Workload, ...]) -> MatrixConfig:
    """``workloads`` on the simulated pool, for the pool's schedulers unless given."""
    return MatrixConfig(
        schedulers=options.schedulers or POOL_SCHEDULERS,
        workloads=workloads,
        seeds=options.seeds,
        profile=options.profile,
        slo=options.slo,
        runner="pool",
        prompts=options.prompts,
        pool=options.pool,
        router=options.router,
    )


def scenarios_part(options: PlanOptions) -> MatrixConfig:
    workloads = scenario_workloads(options.profile, options.pool.num_containers, options.scenario)
    return pool_part(options, tuple(workloads.values()))


@PRESETS.register("main")
def _main(options: PlanOptions) -> list[MatrixConfig]:
    return [main_part(options)]


@PRESETS.register("scenarios")
def _scenarios(options: PlanOptions) -> list[MatrixConfig]:
    return [scenarios_part(options)]


@PRESETS.register("all")
def _all(options: PlanOptions) -> list[MatrixConfig]:
    return [main_part(options), scenarios_part(options)]


SLO_SCHEDULERS = (*POOL_SCHEDULERS, "twp_slo")
ABLATION_SCHEDULERS = ("twp", *ABLATIONS)
LOAD_CURVE_FACTORS = (0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5)
ALPHA_FACTORS = (0.4, 1.0, 2.0)


def _renamed(workload: Workload, name: str) -> Workload:
    renamed: Workload = replace(cast(Any, workload), name=name)
    return renamed


def _with_schedulers(part: MatrixConfig, names: tuple[str, ...]) -> MatrixConfig:
    if part.runner == "sim":
        names = tuple(n for n in names if n in POLICIES)
    return replace(part, schedulers=names)


@PRESETS.register("slo")
def _slo(options: PlanOptions) -> list[MatrixConfig]:
    """Every baseline, twp and twp_slo on the main experiment and the four scenarios."""
    names = options.schedulers or SLO_SCHEDULERS
    return [_with_schedulers(p, names) for p in (main_part(options), scenarios_part(options))]


@PRESETS.register("ablations")
def _ablations(options: PlanOptions) -> list[MatrixConfig]:
    """twp_slo with each of its four changes switched off on its own, beside twp."""
    names = options.schedulers or ABLATION_SCHEDULERS
    return [_with_schedulers(p, names) for p in (main_part(options), scenarios_part(options))]


@PRESETS.register("goodput_curve")
def _goodput_curve(options: PlanOptions) -> list[MatrixConfig]:
    """Poisson load from 0.3x to 1.5x of the pool's capacity (scenario length mixtures)."""
    capacity = scenario_capacity_rps(options.profile, options.pool.num_containers)
    workloads = tuple(
        PoissonWorkload(
            name=f"load{factor:g}",
            rate_per_s=factor * capacity,
            duration_s=options.scenario.duration_s,
            max_requests=100_000,
            prompt_lengths=SCENARIO_PROMPT_LENGTHS,
            output_lengths=SCENARIO_OUTPUT_LENGTHS,
        )
        for factor in LOAD_CURVE_FACTORS
    )
    part = replace(
        pool_part(options, workloads),
        schedulers=options.schedulers or SLO_SCHEDULERS,
        per_workload_figures=False,
    )
    return [part]


@PRESETS.register("alpha")
def _alpha(options: PlanOptions) -> list[MatrixConfig]:
    """Sensitivity to alpha: the high and burst scenarios with alpha x 0.4, 1 and 2."""
    parts = []
    for factor in ALPHA_FACTORS:
        profile = replace(options.profile, alpha_ms=options.profile.alpha_ms * factor)
        scenarios = scenario_workloads(profile, options.pool.num_containers, options.scenario)
        workloads = tuple(
            _renamed(scenarios[name], f"{name}@alpha{factor:g}x") for name in ("high", "burst")
        )
        parts.append(
            replace(
                pool_part(replace(options, profile=profile), workloads),
                schedulers=options.schedulers or SLO_SCHEDULERS,
                per_workload_figures=False,
            )
        )
    return parts
