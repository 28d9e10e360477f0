"""How one (scheduler, workload, seed) cell is executed: a registry of run back ends."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenpace.core.registry import Registry
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import build_policy
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec


@dataclass(frozen=True, slots=True)
class RunOutput:
    """Requests of one run (all done), the per-step records of its servers (keyed by
    server index) and numeric counters (cold starts, migrations, preemptions)."""

    requests: list[Request]
    steps: Mapping[int, list[StepRecord]]
    counters: Mapping[str, float] = field(default_factory=dict)


Runner = Callable[[str, Sequence[RequestSpec], EngineProfile, np.random.Generator, Slo], RunOutput]

RUNNERS: Registry[Runner] = Registry("runner")


@RUNNERS.register("sim")
def run_single_server(
    scheduler: str,
    specs: Sequence[RequestSpec],
    profile: EngineProfile,
    rng: np.random.Generator,
    slo: Slo,
) -> RunOutput:
    """One simulated server running ``scheduler`` (the paper's main experiment)."""
    outcome = simulate(specs, build_policy(scheduler, profile, slo), profile, rng)
    preemptions = sum(r.num_preemptions for r in outcome.requests)
    return RunOutput(outcome.requests, {0: outcome.steps}, {"num_preemptions": preemptions})
