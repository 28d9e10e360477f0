"""Early rejection: the predicted TTFT worked by hand, and the policy's switch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import request, running, state
from tokenpace.core.request import RequestStatus
from tokenpace.core.step import StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.run_metrics import RunKey, summarize_run
from tokenpace.metrics.slo import Slo
from tokenpace.policy.twp_slo.config import TwpSloConfig
from tokenpace.policy.twp_slo.policy import TwpSloPolicy
from tokenpace.policy.twp_slo.rejection import ServiceOutlook, early_rejections
from tokenpace.sim.run import simulate
from tokenpace.workload.main_experiment import PoissonWorkload


def outlook(**overrides: object) -> ServiceOutlook:
    """Prefill: 200 tokens per 80 ms step; one free slot; two running requests 20 tokens
    from the end at 100 ms per token: one leaves every 20 x 0.1 / 2 = 1 s."""
    base = ServiceOutlook(
        step_s=0.08,
        itl_s=0.1,
        prefill_tokens_per_step=200.0,
        free_slots=1,
        running_remaining=np.array([20.0, 20.0]),
        fresh_output=50.0,
        num_slots=5,
        backlog_tokens=0.0,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def test_departures_follow_the_drain_rate() -> None:
    assert outlook().departure_s(0) == 0.0
    assert outlook().departure_s(3) == pytest.approx(3.0)
    # Nothing running: slots recycle every 50 x 0.1 / 5 = 1 s.
    assert outlook(running_remaining=np.zeros(0)).departure_s(2) == pytest.approx(2.0)


def test_predicted_ttft_worked_by_hand() -> None:
    # Arrivals at 10.0 s, now 10.0 s; 100-token prompts take one 80 ms prefill step.
    # #0 takes the free slot: 0.08 s. #1 waits 1 departure: 1.08 s. #2 waits 2: 2.08 s.
    # #3 arrived at 8.5 s: waited 1.5 s + 0.08 s > 1.5 s even alone.
    waiting = [request(i, prompt=100, arrival_s=10.0) for i in range(3)]
    waiting.append(request(3, prompt=100, arrival_s=8.5))
    queue = state(waiting).waiting
    found = early_rejections(queue, 10.0, 1.5, outlook(), np.zeros(0, dtype=np.intp))
    assert [(r.request_id, round(r.predicted_ttft_s, 2)) for r in found] == [(2, 2.08), (3, 1.58)]
    assert all(r.ttft_objective_s == 1.5 for r in found)
    # The prefill machine binds when the running requests still owe prefill: 500 backlog
    # tokens + 100 -> 3 steps = 0.24 s for #0.
    found = early_rejections(
        queue, 10.0, 0.2, outlook(backlog_tokens=500.0), np.zeros(0, dtype=np.intp)
    )
    assert round(found[0].predicted_ttft_s, 2) == 0.24


def test_a_rejected_request_does_not_delay_the_next_but_an_unrejectable_one_does() -> None:
    waiting = [request(i, prompt=100, arrival_s=10.0) for i in range(3)]
    # #0 was admitted once and preempted: never rejected, still ahead of #1 and #2.
    waiting[0].admitted_s = 9.0
    queue = state(waiting).waiting
    view = outlook(free_slots=0)
    found = early_rejections(queue, 10.0, 1.5, view, np.zeros(0, dtype=np.intp))
    # #0: 1.08 s (kept anyway); #1: 2.08 s rejected; #2 not delayed by #1: 2.08 s rejected.
    assert [(r.request_id, round(r.predicted_ttft_s, 2)) for r in found] == [(1, 2.08), (2, 2.08)]
    # Excluded positions (admitted this step) are never judged.
    assert early_rejections(queue, 10.0, 1.5, view, np.array([1, 2], dtype=np.intp)) == []


def overloaded(profile: EngineProfile, early_reject: bool) -> tuple[TwpSloPolicy, StepState]:
    cfg = TwpSloConfig.from_profile(profile, Slo(2000, 100), early_reject=early_reject)
    policy = TwpSloPolicy(cfg, profile)
    full = [running(100 + i, 64, 200, 5) for i in range(policy.window.capacity())]
    # Waited 3 s: past the 2 s objective whatever happens next.
    late = [request(i, prompt=64, max_tokens=200, arrival_s=7.0) for i in range(4)]
    return policy, state(late, full, now_s=10.0, latency_s=0.08)


def test_off_by_default_and_rejects_only_when_switched_on(paper_profile: EngineProfile) -> None:
    assert not TwpSloConfig().early_reject
    policy, snapshot = overloaded(paper_profile, early_reject=False)
    assert policy.plan(snapshot).rejections == ()
    policy, snapshot = overloaded(paper_profile, early_reject=True)
    plan = policy.plan(snapshot)
    assert plan.admit_ids == ()
    assert sorted(r.request_id for r in plan.rejections) == [0, 1, 2, 3]
    assert all(r.predicted_ttft_s > 2.0 for r in plan.rejections)
    assert "over the objective of 2.00 s" in plan.rejections[0].describe()


def test_on_overload_rejection_cuts_the_tail_of_served_requests(
    paper_profile: EngineProfile,
) -> None:
    specs = PoissonWorkload(rate_per_s=18, duration_s=6, max_requests=100).generate(
        np.random.default_rng(3)
    )
    slo = Slo(2000, 100)
    runs = {}
    for switch in (False, True):
        cfg = TwpSloConfig.from_profile(paper_profile, slo, early_reject=switch)
        out = simulate(specs, TwpSloPolicy(cfg, paper_profile), paper_profile,
                       np.random.default_rng(4))  # fmt: skip
        runs[switch] = summarize_run(RunKey("x", "w", "sim", 0), out.requests, 0.0, slo)
        rejected = [r for r in out.requests if r.status is RequestStatus.REJECTED]
        assert (len(rejected) > 0) == switch
        assert all(not r.token_times_s and r.num_computed_tokens == 0 for r in rejected)
    assert runs[False]["num_rejected"] == 0
    assert runs[True]["num_rejected"] > 0
    assert runs[True]["n_requests"] == runs[False]["n_requests"] == len(specs)
    assert runs[True]["n_completed"] + runs[True]["num_rejected"] == len(specs)
    assert runs[True]["ttft_ms"]["p99"] < runs[False]["ttft_ms"]["p99"]
