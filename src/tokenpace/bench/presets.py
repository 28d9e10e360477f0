"""Named bench plans: which parts (runner x schedulers x workloads) a preset runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tokenpace.bench.matrix import MatrixConfig
from tokenpace.core.registry import Registry
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES
from tokenpace.pool.config import PoolConfig
from tokenpace.workload.main_experiment import PoissonWorkload
from tokenpace.workload.scenarios import ScenarioConfig, scenario_workloads

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


def scenarios_part(options: PlanOptions) -> MatrixConfig:
    workloads = scenario_workloads(options.profile, options.pool.num_containers, options.scenario)
    return MatrixConfig(
        schedulers=options.schedulers or POOL_SCHEDULERS,
        workloads=tuple(workloads.values()),
        seeds=options.seeds,
        profile=options.profile,
        slo=options.slo,
        runner="pool",
        prompts=options.prompts,
        pool=options.pool,
        router=options.router,
    )


@PRESETS.register("main")
def _main(options: PlanOptions) -> list[MatrixConfig]:
    return [main_part(options)]


@PRESETS.register("scenarios")
def _scenarios(options: PlanOptions) -> list[MatrixConfig]:
    return [scenarios_part(options)]


@PRESETS.register("all")
def _all(options: PlanOptions) -> list[MatrixConfig]:
    return [main_part(options), scenarios_part(options)]
