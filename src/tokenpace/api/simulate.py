"""Entry points of the public API: simulate one server or a pool, build a bench plan from
a preset, run a plan.

Each simulation is one cell of a bench, run the way ``tokenpace bench`` runs it: the
workload of seed ``s`` is drawn from ``numpy.random.default_rng([s, 0])`` and the engine
noise from ``default_rng([s, 1])``, so the same arguments give the same result, equal to
the matching ``runs`` entry of a bench.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenpace.api.results import BenchResult, RunResult, SummaryRow
from tokenpace.bench.matrix import MatrixConfig, run_matrix
from tokenpace.bench.presets import PRESETS, PlanOptions
from tokenpace.bench.suite import run_bench
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.qoe import QoeConfig
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import resolve_scheduler
from tokenpace.workload.spec import Workload

DEFAULT_PROFILE = "v100-llama-3.2-3b"


def _profile(profile: EngineProfile | str) -> EngineProfile:
    return profile if isinstance(profile, EngineProfile) else load_profile(profile)


def _prompts(prompts: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(prompts) if prompts is not None else None


def _run_one(part: MatrixConfig) -> RunResult:
    (cell,) = run_matrix([part], workers=1)
    return RunResult.from_dict(cell.run, tuple(cell.requests))


def simulate_server(
    scheduler: str,
    workload: Workload,
    profile: EngineProfile | str = DEFAULT_PROFILE,
    *,
    seed: int = 0,
    slo: Slo | None = None,
    prompts: Sequence[str] | None = None,
    qoe: QoeConfig | None = None,
) -> RunResult:
    """Run ``workload`` (drawn with ``seed``) through one simulated server whose admission
    policy is ``scheduler`` (a name in ``policy_names()``) on ``profile`` (an
    ``EngineProfile``, a shipped profile's name or a profile JSON path), in virtual time.
    ``slo`` (default ``Slo()``) decides goodput. Raises ValueError for an unknown
    scheduler, FileNotFoundError for an unknown profile."""
    if scheduler not in POLICIES:
        raise ValueError(
            f"unknown scheduler {scheduler!r} for one server; valid choices: "
            f"{', '.join(POLICIES.names())}"
        )
    part = MatrixConfig(
        schedulers=(scheduler,), workloads=(workload,), seeds=(seed,), profile=_profile(profile),
        slo=slo or Slo(), runner="sim", engine="sim", prompts=_prompts(prompts),
        qoe=qoe or QoeConfig(),
    )  # fmt: skip
    return _run_one(part)


def simulate_pool(
    scheduler: str,
    workload: Workload,
    profile: EngineProfile | str = DEFAULT_PROFILE,
    pool: PoolConfig | None = None,
    *,
    router: str | None = None,
    seed: int = 0,
    slo: Slo | None = None,
    prompts: Sequence[str] | None = None,
    qoe: QoeConfig | None = None,
) -> RunResult:
    """Run ``workload`` (drawn with ``seed``) on a simulated serverless pool: ``scheduler``
    is a policy name (run in every container, behind ``router``, default
    ``least_loaded``) or a routing baseline (``round_robin``, ``serverlessllm``: FCFS
    behind that router); containers start cold or warm, keep alive and autoscale as
    ``pool`` says (default ``PoolConfig()``). ``counters`` of the result carry cold starts,
    migrations and container-seconds. Raises ValueError for an unknown scheduler or router."""
    resolve_scheduler(scheduler, router)
    part = MatrixConfig(
        schedulers=(scheduler,), workloads=(workload,), seeds=(seed,), profile=_profile(profile),
        slo=slo or Slo(), runner="pool", engine="sim", prompts=_prompts(prompts),
        pool=pool or PoolConfig(), router=router, qoe=qoe or QoeConfig(),
    )  # fmt: skip
    return _run_one(part)


def bench_plan(preset: str, options: PlanOptions) -> tuple[MatrixConfig, ...]:
    """The parts a preset (a name in ``preset_names()``) runs for ``options``. Presets that
    load the system relative to its capacity (``main``, ``scenarios``, ``all``, ...)
    measure the SLO knee here first, cached in ``options.cache_dir`` (None: not cached).
    Raises ValueError for an unknown preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid choices: {', '.join(PRESETS.names())}")
    return tuple(PRESETS.get(preset)(options))


def run_plan(parts: Sequence[MatrixConfig], out_dir: Path, *, workers: int = 1) -> BenchResult:
    """Run every cell of ``parts`` on ``workers`` processes and write ``results.json``,
    ``requests.csv``, ``report.md`` and the figures into ``out_dir`` (created)."""
    outcome = run_bench(list(parts), out_dir, workers=workers)
    document = outcome.document
    return BenchResult(
        runs=tuple(RunResult.from_dict(run) for run in document["runs"]),
        summary=tuple(SummaryRow.from_dict(entry) for entry in document["summary"]),
        out_dir=out_dir,
        figures=tuple(outcome.figures),
    )


def policy_names() -> list[str]:
    """Every admission policy in the registry (what ``build_policy`` and
    ``simulate_server`` accept)."""
    return POLICIES.names()


def scheduler_names() -> list[str]:
    """Every scheduler ``simulate_pool`` accepts: the policies and the routing baselines."""
    from tokenpace.pool.simulate import scheduler_names as names

    return names()


def preset_names() -> list[str]:
    """Every bench preset in the registry (what ``bench_plan`` accepts)."""
    return PRESETS.names()
