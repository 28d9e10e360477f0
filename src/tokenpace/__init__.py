"""tokenpace: Token Window Pacing, closed-loop step-level admission control for LLM serving.

The public API (``docs/api.md``)::

    from tokenpace import PoissonWorkload, simulate_server, simulate_pool, load_profile

Names are imported on first use, so ``import tokenpace`` stays cheap for the command line
and the engine worker processes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "simulate_server": "tokenpace.api.simulate",
    "simulate_pool": "tokenpace.api.simulate",
    "bench_plan": "tokenpace.api.simulate",
    "run_plan": "tokenpace.api.simulate",
    "policy_names": "tokenpace.api.simulate",
    "scheduler_names": "tokenpace.api.simulate",
    "preset_names": "tokenpace.api.simulate",
    "RunResult": "tokenpace.api.results",
    "Distribution": "tokenpace.api.results",
    "SummaryRow": "tokenpace.api.results",
    "MeanCI": "tokenpace.api.results",
    "BenchResult": "tokenpace.api.results",
    "build_policy": "tokenpace.policy",
    "Policy": "tokenpace.policy",
    "EngineProfile": "tokenpace.engine.profile",
    "load_profile": "tokenpace.engine.profile",
    "shipped_profiles": "tokenpace.engine.profile",
    "Slo": "tokenpace.metrics.slo",
    "QoeConfig": "tokenpace.metrics.qoe",
    "PoolConfig": "tokenpace.pool.config",
    "PlanOptions": "tokenpace.bench.presets",
    "MatrixConfig": "tokenpace.bench.matrix",
    "PoissonWorkload": "tokenpace.workload.main_experiment",
    "ReplayWorkload": "tokenpace.workload.spec",
    "RequestSpec": "tokenpace.workload.spec",
    "Workload": "tokenpace.workload.spec",
}

__all__ = [
    "BenchResult",
    "Distribution",
    "EngineProfile",
    "MatrixConfig",
    "MeanCI",
    "PlanOptions",
    "PoissonWorkload",
    "Policy",
    "PoolConfig",
    "QoeConfig",
    "ReplayWorkload",
    "RequestSpec",
    "RunResult",
    "Slo",
    "SummaryRow",
    "Workload",
    "__version__",
    "bench_plan",
    "build_policy",
    "load_profile",
    "policy_names",
    "preset_names",
    "run_plan",
    "scheduler_names",
    "shipped_profiles",
    "simulate_pool",
    "simulate_server",
]

if TYPE_CHECKING:
    from tokenpace.api.results import BenchResult as BenchResult
    from tokenpace.api.results import Distribution as Distribution
    from tokenpace.api.results import MeanCI as MeanCI
    from tokenpace.api.results import RunResult as RunResult
    from tokenpace.api.results import SummaryRow as SummaryRow
    from tokenpace.api.simulate import bench_plan as bench_plan
    from tokenpace.api.simulate import policy_names as policy_names
    from tokenpace.api.simulate import preset_names as preset_names
    from tokenpace.api.simulate import run_plan as run_plan
    from tokenpace.api.simulate import scheduler_names as scheduler_names
    from tokenpace.api.simulate import simulate_pool as simulate_pool
    from tokenpace.api.simulate import simulate_server as simulate_server
    from tokenpace.bench.matrix import MatrixConfig as MatrixConfig
    from tokenpace.bench.presets import PlanOptions as PlanOptions
    from tokenpace.engine.profile import EngineProfile as EngineProfile
    from tokenpace.engine.profile import load_profile as load_profile
    from tokenpace.engine.profile import shipped_profiles as shipped_profiles
    from tokenpace.metrics.qoe import QoeConfig as QoeConfig
    from tokenpace.metrics.slo import Slo as Slo
    from tokenpace.policy import Policy as Policy
    from tokenpace.policy import build_policy as build_policy
    from tokenpace.pool.config import PoolConfig as PoolConfig
    from tokenpace.workload.main_experiment import PoissonWorkload as PoissonWorkload
    from tokenpace.workload.spec import ReplayWorkload as ReplayWorkload
    from tokenpace.workload.spec import RequestSpec as RequestSpec
    from tokenpace.workload.spec import Workload as Workload


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenpace' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
