"""Policies that size decisions from the profile follow a refitted one (online calibration)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.helpers import running, state
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES, build_policy
from tokenpace.policy.base import ProfileAware
from tokenpace.policy.twp.policy import TwpPolicy
from tokenpace.policy.twp_slo.policy import TwpSloPolicy


def test_profile_aware_policies(paper_profile: EngineProfile) -> None:
    policies = {name: build_policy(name, paper_profile) for name in POLICIES.names()}
    aware = {name for name, policy in policies.items() if isinstance(policy, ProfileAware)}
    assert {"twp", "twp_slo", "twp_slo-no_itl_target"} <= aware
    assert not {"fcfs", "vllm_default", "dynamic_batch"} & aware


def test_twp_slowdown_is_measured_against_the_live_l_min(paper_profile: EngineProfile) -> None:
    """The engine became twice as slow (86 ms steps against l_min 43): with the offline
    profile TWP reads it as congestion and keeps the window at its floor; with the live
    l_min the slowdown is 1 again and the window returns to H0."""
    policy = build_policy("twp", paper_profile)
    assert isinstance(policy, TwpPolicy)
    batch = [running(i, 10, 500, 5) for i in range(4)]
    for step in range(60):
        policy.plan(state([], batch, step_index=step, latency_s=0.086))
    assert policy.window.slowdown == pytest.approx(2.0)
    assert policy.window.window == pytest.approx(policy.config.h_min_tokens, rel=0.01)
    policy.use_profile(replace(paper_profile, l_min_ms=86.0))
    for step in range(60, 120):
        policy.plan(state([], batch, step_index=step, latency_s=0.086))
    assert policy.window.slowdown == pytest.approx(1.0)
    assert policy.window.window == pytest.approx(policy.config.h0_tokens, rel=0.01)
    assert policy.config.b0 == paper_profile.b0


def test_twp_slo_window_and_budget_follow_the_live_terms(paper_profile: EngineProfile) -> None:
    """ITL target 95 ms: B* = 8 + (95 - 43 - 12.6) / 1 = 47.4 with the offline profile;
    with l_min 60 and alpha 2 it is 8 + (95 - 60 - 12.6) / 2 = 19.2."""
    policy = build_policy("twp_slo", paper_profile, Slo(2000, 100))
    assert isinstance(policy, TwpSloPolicy)
    assert policy.window.nominal == pytest.approx(47.4)
    budget_before = policy.prefill_budget(16)
    policy.use_profile(replace(paper_profile, l_min_ms=60.0, alpha_ms=2.0))
    assert policy.window.nominal == pytest.approx(19.2)
    for step in range(80):
        policy.plan(state([], [running(0, 10, 500, 5)], step_index=step, latency_s=0.095))
    assert policy.window.capacity() == 19
    # Decode at 16 requests now costs 60 + 2 * 8 = 76 ms of the 95 ms target, not 51 ms.
    assert policy.prefill_budget(16) < budget_before
    assert policy.config.alpha_ms == 2.0 and policy.config.base.l_min_ms == 60.0
