"""No policy can read a request's true output length: two runs that differ only in one
request's true length make identical decisions until that request stops."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES, build_policy
from tokenpace.sim.run import simulate
from tokenpace.workload.main_experiment import PoissonWorkload


class Recorder:
    """Records every plan, with the step at which it was made."""

    def __init__(self, name: str, profile: EngineProfile) -> None:
        self.inner = build_policy(name, profile, Slo())
        self.name = name
        self.plans: list[tuple[int, tuple[int, ...], tuple[tuple[int, int], ...]]] = []

    def plan(self, state: StepState) -> StepPlan:
        plan = self.inner.plan(state)
        scheduled = tuple(sorted(plan.num_scheduled_tokens.items()))
        self.plans.append((state.step_index, plan.admit_ids, scheduled))
        return plan

    def telemetry(self) -> Mapping[str, float]:
        return self.inner.telemetry()


@pytest.mark.parametrize("name", POLICIES.names())
def test_decisions_do_not_depend_on_the_true_output_length(
    name: str, paper_profile: EngineProfile
) -> None:
    profile = replace(paper_profile, noise_cv=0.0)
    specs = PoissonWorkload(rate_per_s=30, duration_s=3, max_requests=60).generate(
        np.random.default_rng(11)
    )
    probe = 5
    assert specs[probe].max_tokens == 200
    short = [replace(s, output_tokens=20) if i == probe else s for i, s in enumerate(specs)]
    long = [replace(s, output_tokens=150) if i == probe else s for i, s in enumerate(specs)]
    runs = []
    for variant in (short, long):
        recorder = Recorder(name, profile)
        outcome = simulate(variant, recorder, profile, np.random.default_rng(2))
        runs.append((recorder.plans, outcome))
    (plans_short, out_short), (plans_long, out_long) = runs
    assert out_short.requests[probe].num_output_tokens == 20
    assert out_long.requests[probe].num_output_tokens == 150
    # The step after the one that delivered the probe's 20th token is the first whose
    # state differs; every plan before it must be the same in both runs.
    stop = out_short.requests[probe].token_times_s[-1]
    divergence = next(i for i, s in enumerate(out_short.steps) if s.start_s >= stop)
    assert divergence > 0
    assert plans_short[:divergence] == plans_long[:divergence]
    assert plans_short != plans_long  # the runs do differ afterwards
