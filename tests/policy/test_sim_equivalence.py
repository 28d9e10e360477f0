"""Whole simulated runs under overload and KV pressure (queues of hundreds, preemptions)
give every request the same admission step, preemptions and token times with the fast
ranking as with the reference that scores and sorts the whole queue every step."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import numpy as np
import pytest

from tests.policy.twp.test_ranking_equivalence import ReferenceTwp
from tests.policy.twp_slo.test_gate_equivalence import ReferenceTwpSlo
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import Policy
from tokenpace.policy.twp import prompt_scan, ranking
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.policy import TwpPolicy
from tokenpace.policy.twp_slo.config import TwpSloConfig
from tokenpace.policy.twp_slo.policy import TwpSloPolicy
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec


def overload(num_requests: int, rate: float) -> list[RequestSpec]:
    rng = np.random.default_rng(5)
    arrivals = np.sort(rng.uniform(0.0, num_requests / rate, num_requests))
    return [
        RequestSpec(float(a), int(rng.integers(20, 900)), int(rng.choice([8, 20, 50, 200, 400])))
        for a in arrivals
    ]


def history(specs: list[RequestSpec], policy: Policy, profile: EngineProfile) -> list[object]:
    outcome = simulate(specs, policy, profile, np.random.default_rng(1))
    assert max(step.num_waiting for step in outcome.steps) > 100
    return [
        (r.request_id, r.admitted_step, r.num_preemptions, tuple(r.token_times_s))
        for r in outcome.requests
    ]


@pytest.mark.slow
def test_overloaded_runs_match_the_reference(paper_profile: EngineProfile) -> None:
    profile = replace(paper_profile, num_gpu_blocks=600)  # preemptions happen
    specs = overload(150, rate=60.0)
    twp = TwpConfig.from_profile(profile)
    assert history(specs, TwpPolicy(twp), profile) == history(specs, ReferenceTwp(twp), profile)
    slo = TwpSloConfig.from_profile(profile, Slo())
    assert history(specs, TwpSloPolicy(slo, profile), profile) == history(
        specs, ReferenceTwpSlo(slo, profile), profile
    )


@pytest.mark.slow
def test_overloaded_twp_runs_match_the_reference_read_in_size_order(
    paper_profile: EngineProfile,
) -> None:
    # The size-order scan serves queues of thousands; forced on here, in small slices.
    profile = replace(paper_profile, num_gpu_blocks=600)
    specs = overload(150, rate=60.0)
    twp = TwpConfig.from_profile(profile)
    reference = history(specs, ReferenceTwp(twp), profile)
    with (
        mock.patch.object(ranking, "_PROMPT_SCAN_MIN", 0),
        mock.patch.object(prompt_scan, "SLICE", 4),
    ):
        assert history(specs, TwpPolicy(twp), profile) == reference


@pytest.mark.slow
def test_compiled_loops_give_the_runs_of_numpy(paper_profile: EngineProfile) -> None:
    # Loose caps (outputs end well before max_tokens) and a small cache, so that lengths are
    # learned, the KV reservation binds and candidates are tested against the forecast.
    profile = replace(paper_profile, num_gpu_blocks=600)
    rng = np.random.default_rng(9)
    arrivals = np.sort(rng.uniform(0.0, 4.0, 200))
    specs = [
        RequestSpec(float(a), int(rng.integers(20, 600)), 400, None, int(rng.integers(5, 300)))
        for a in arrivals
    ]
    twp = TwpConfig.from_profile(profile)
    numpy_twp = replace(twp, output_lengths=replace(twp.output_lengths, compiled=False))
    assert TwpPolicy(twp).reservation._compiled is not None
    assert history(specs, TwpPolicy(twp), profile) == history(specs, TwpPolicy(numpy_twp), profile)
    slo = TwpSloConfig.from_profile(profile, Slo())
    numpy_slo = TwpSloConfig.from_profile(profile, Slo(), base=numpy_twp, compiled_deferrals=False)
    assert history(specs, TwpSloPolicy(slo, profile), profile) == history(
        specs, TwpSloPolicy(numpy_slo, profile), profile
    )
