"""Named bench plans: which parts (runner x schedulers x workloads) a preset runs.

The ``main``, ``scenarios`` and ``all`` presets measure capacity first
(``tokenpace.bench.capacity``): every pool workload runs at a fraction of its own SLO knee,
and the pool autoscales with the knee's concurrency per container as its target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from tokenpace.bench.capacity import (
    Capacity,
    CapacityJob,
    KneeProblem,
    KneeSearch,
    measure_capacities,
)
from tokenpace.bench.matrix import MatrixConfig
from tokenpace.core.registry import Registry
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.qoe import QoeConfig
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES
from tokenpace.policy.twp_slo.policy import ABLATIONS, OPT_INS
from tokenpace.pool.capacity import pool_capacity_rps
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import NO_POOL_SIGNAL
from tokenpace.workload.main_experiment import PoissonWorkload
from tokenpace.workload.scenarios import (
    KV_PRESSURE_BLOCKS,
    SCENARIO_NAMES,
    ScenarioConfig,
    build_scenario,
    knee_workload,
    load_factor,
)
from tokenpace.workload.spec import Workload

# The single-server comparison (the paper's main experiment) and the pool comparison, which
# adds the two routing baselines.
MAIN_SCHEDULERS = (
    "twp", "twp_slo", "fcfs", "priority", "dynamic_batch", "vllm_default", "sarathi",
    "sla_batch",
)  # fmt: skip
POOL_SCHEDULERS = (
    "twp", "twp_slo", "fcfs", "round_robin", "priority", "dynamic_batch", "serverlessllm",
    "vllm_default", "sarathi", "sla_batch",
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
    qoe: QoeConfig = QoeConfig()
    cache_dir: Path | None = None
    workers: int = 1
    search: KneeSearch = KneeSearch()


Preset = Callable[[PlanOptions], list[MatrixConfig]]
PRESETS: Registry[Preset] = Registry("preset")


def main_part(options: PlanOptions, capacity: Capacity | None = None) -> MatrixConfig:
    """The main experiment on one server; routing baselines need a pool, so they are left
    out of this part. ``capacity``: the server's measured knee for the report."""
    names = options.schedulers or MAIN_SCHEDULERS
    workload = PoissonWorkload()
    return MatrixConfig(
        schedulers=tuple(n for n in names if n in POLICIES),
        workloads=(workload,),
        seeds=options.seeds,
        profile=options.profile,
        slo=options.slo,
        runner="sim",
        prompts=options.prompts,
        qoe=options.qoe,
        capacity={workload.name: capacity_entry(capacity, workload.rate_per_s)} if capacity else {},
    )


def pool_part(
    options: PlanOptions,
    workloads: tuple[Workload, ...],
    pool: PoolConfig | None = None,
    profile: EngineProfile | None = None,
    capacity: Mapping[str, Mapping[str, float]] | None = None,
) -> MatrixConfig:
    """``workloads`` on the simulated pool, for the pool's schedulers unless given."""
    return MatrixConfig(
        schedulers=options.schedulers or POOL_SCHEDULERS,
        workloads=workloads,
        seeds=options.seeds,
        profile=profile or options.profile,
        slo=options.slo,
        runner="pool",
        prompts=options.prompts,
        pool=pool or options.pool,
        router=options.router,
        qoe=options.qoe,
        capacity=capacity or {},
    )


def capacity_entry(capacity: Capacity, rate_rps: float) -> dict[str, float]:
    """A workload's ``capacity`` entry in results.json."""
    return {
        "knee_rps": capacity.knee_rps,
        "ceiling_rps": capacity.ceiling_rps,
        "paced_ceiling_rps": capacity.paced_ceiling_rps,
        "paced_ceiling_tok_s": capacity.paced_ceiling_tok_s,
        "rate_rps": rate_rps,
        "concurrency_per_container": capacity.concurrency_per_container,
        "attainment_at_knee": capacity.attainment_at_knee,
    }


def scenario_profile(options: PlanOptions, name: str) -> EngineProfile:
    """The profile a scenario runs on: ``kv_pressure`` shrinks the KV cache."""
    if name == "kv_pressure":
        return replace(options.profile, num_gpu_blocks=KV_PRESSURE_BLOCKS)
    return options.profile


# Scenarios that share a knee: the paper's four loads share their mixture.
_KNEE_OF = {"low": "paper", "medium": "paper", "high": "paper", "burst": "paper",
            "kv_pressure": "kv_pressure", "prefill_heavy": "prefill_heavy"}  # fmt: skip


def capacity_jobs(options: PlanOptions, with_main: bool, scenarios: bool) -> dict[str, CapacityJob]:
    """The knees a plan needs: ``main`` (one server, the paper's main mixtures) and one per
    scenario mixture on the pool, every container warm."""
    jobs: dict[str, CapacityJob] = {}
    if with_main:
        main = PoissonWorkload()
        problem = KneeProblem(options.profile, 1, replace(main, max_requests=100_000),
                              options.slo, options.search)  # fmt: skip
        estimate = pool_capacity_rps(options.profile, main.prompt_lengths, main.output_lengths, 1)
        jobs["main"] = CapacityJob(problem, estimate)
    if scenarios:
        n = options.pool.num_containers
        for knee in dict.fromkeys(_KNEE_OF.values()):
            name = "high" if knee == "paper" else knee
            workload = knee_workload(name, options.scenario)
            profile = scenario_profile(options, name)
            estimate = pool_capacity_rps(
                profile, workload.prompt_lengths, workload.output_lengths, n
            )
            problem = KneeProblem(profile, n, workload, options.slo, options.search)
            jobs[knee] = CapacityJob(problem, estimate)
    return jobs


def scenario_parts(options: PlanOptions, knees: Mapping[str, Capacity]) -> list[MatrixConfig]:
    """One pool part per profile: the paper's four loads, then kv_pressure and
    prefill_heavy, each at its load factor of its own knee, on a pool that starts with
    ``options.pool.initial_warm`` warm containers and autoscales with the knee's
    concurrency per container as its target."""
    groups: dict[str, list[str]] = {}
    for name in SCENARIO_NAMES:
        groups.setdefault(name if name == "kv_pressure" else "shared", []).append(name)
    parts = []
    for names in groups.values():
        workloads = []
        entries: dict[str, dict[str, float]] = {}
        targets = []
        for name in names:
            capacity = knees[_KNEE_OF[name]]
            workload = build_scenario(name, capacity.knee_rps, options.scenario)
            workloads.append(workload)
            entries[name] = capacity_entry(capacity, load_factor(name) * capacity.knee_rps)
            targets.append(capacity.concurrency_per_container)
        pool = replace(options.pool, target_per_instance=max(1.0, min(targets)))
        parts.append(
            pool_part(options, tuple(workloads), pool, scenario_profile(options, names[0]), entries)
        )
    return parts


def _measured(options: PlanOptions, with_main: bool, scenarios: bool) -> dict[str, Capacity]:
    jobs = capacity_jobs(options, with_main, scenarios)
    return measure_capacities(jobs, options.cache_dir, options.workers)


def _paper_knee(options: PlanOptions) -> Capacity:
    job = capacity_jobs(options, with_main=False, scenarios=True)["paper"]
    return measure_capacities({"paper": job}, options.cache_dir)["paper"]


@PRESETS.register("main")
def _main(options: PlanOptions) -> list[MatrixConfig]:
    knees = _measured(options, with_main=True, scenarios=False)
    return [main_part(options, knees["main"])]


@PRESETS.register("scenarios")
def _scenarios(options: PlanOptions) -> list[MatrixConfig]:
    return scenario_parts(options, _measured(options, with_main=False, scenarios=True))


@PRESETS.register("all")
def _all(options: PlanOptions) -> list[MatrixConfig]:
    knees = _measured(options, with_main=True, scenarios=True)
    return [main_part(options, knees["main"]), *scenario_parts(options, knees)]


# The policy's ablations and opt-ins plus the pool's: twp_slo behind least_loaded +
# concurrency scaling instead of its own window's signal (pool parts only).
ABLATION_SCHEDULERS = ("twp", *ABLATIONS, *OPT_INS, NO_POOL_SIGNAL)
LOAD_CURVE_FACTORS = (0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5)
ALPHA_FACTORS = (0.4, 1.0, 2.0)


def _renamed(workload: Workload, name: str) -> Workload:
    renamed: Workload = replace(cast(Any, workload), name=name)
    return renamed


def _with_schedulers(part: MatrixConfig, names: tuple[str, ...]) -> MatrixConfig:
    if part.runner == "sim":
        names = tuple(n for n in names if n in POLICIES)
    return replace(part, schedulers=names)


@PRESETS.register("ablations")
def _ablations(options: PlanOptions) -> list[MatrixConfig]:
    """twp_slo with each of its changes switched off on its own, beside twp, on the main
    experiment and every scenario; on the pool also without its pool signal."""
    names = options.schedulers or ABLATION_SCHEDULERS
    return [_with_schedulers(p, names) for p in _all(options)]


@PRESETS.register("goodput_curve")
def _goodput_curve(options: PlanOptions) -> list[MatrixConfig]:
    """Poisson load from 0.3x to 1.5x of the pool's measured knee (the paper's scenario
    mixtures), on the autoscaled pool of the scenarios."""
    knee = _paper_knee(options)
    workloads = tuple(
        replace(
            knee_workload("high", options.scenario),
            name=f"load{factor:g}", rate_per_s=factor * knee.knee_rps,
        )
        for factor in LOAD_CURVE_FACTORS
    )  # fmt: skip
    pool = replace(options.pool, target_per_instance=max(1.0, knee.concurrency_per_container))
    entries = {w.name: capacity_entry(knee, w.rate_per_s) for w in workloads}
    part = replace(
        pool_part(options, workloads, pool, capacity=entries),
        schedulers=options.schedulers or POOL_SCHEDULERS,
        per_workload_figures=False,
    )
    return [part]


@PRESETS.register("alpha")
def _alpha(options: PlanOptions) -> list[MatrixConfig]:
    """Sensitivity to alpha: the high and burst scenarios with alpha x 0.4, 1 and 2, each at
    its own measured knee."""
    parts = []
    for factor in ALPHA_FACTORS:
        profile = replace(options.profile, alpha_ms=options.profile.alpha_ms * factor)
        scaled = replace(options, profile=profile)
        knee = _paper_knee(scaled)
        pool = replace(options.pool, target_per_instance=max(1.0, knee.concurrency_per_container))
        workloads = tuple(
            _renamed(
                build_scenario(name, knee.knee_rps, options.scenario), f"{name}@alpha{factor:g}x"
            )
            for name in ("high", "burst")
        )
        parts.append(
            replace(
                pool_part(scaled, workloads, pool),
                schedulers=options.schedulers or POOL_SCHEDULERS,
                per_workload_figures=False,
            )
        )
    return parts
