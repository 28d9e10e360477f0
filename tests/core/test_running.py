"""The running batch's columns, kept across steps by the step loop, always equal the
columns read afresh from the running requests."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import running, small_profile
from tokenpace.core.running import RunningBatch, RunningColumns
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.policy.base import Policy, build_policy
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec


def same(a: RunningColumns, b: RunningColumns) -> bool:
    ones_in_order = list(a.ones.items()) == list(b.ones.items()) == [(i, 1) for i in a.request_ids]
    return (
        a.request_ids == b.request_ids
        and ones_in_order
        and all(
            np.array_equal(getattr(a, k), getattr(b, k))
            for k in ("prompts", "produced", "computed", "caps")
        )
    )


class Checking:
    """Wraps a policy; asserts at every step that the snapshot's columns are current."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.num_checked = 0

    def plan(self, state: StepState) -> StepPlan:
        assert state.running_columns is not None
        assert same(state.running_columns, RunningColumns.of(state.running))
        self.num_checked += 1
        return self.inner.plan(state)

    def telemetry(self) -> Mapping[str, float]:
        return self.inner.telemetry()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 2), st.integers(1, 600), st.integers(1, 120)),
        min_size=1,
        max_size=60,
    ),
    name=st.sampled_from(["twp_slo", "twp", "vllm_default"]),
    blocks=st.sampled_from([60, 400]),
)
def test_columns_follow_admissions_tokens_finishes_and_preemptions(
    paper_profile: EngineProfile, rows: list[tuple[float, int, int]], name: str, blocks: int
) -> None:
    # 60 blocks (960 tokens) forces preemptions with the larger requests.
    profile = small_profile(paper_profile, blocks)
    specs = [
        RequestSpec(a, p, o) for a, p, o in sorted(rows) if p + o <= blocks * profile.block_size
    ]
    if not specs:
        return
    policy = Checking(build_policy(name, profile))
    simulate(specs, policy, profile, np.random.default_rng(0))
    assert policy.num_checked > 0


def test_a_list_changed_behind_its_back_is_read_afresh() -> None:
    batch = RunningBatch()
    a, b, c = running(1, 10, 50, 3), running(2, 20, 50, 4), running(3, 30, 50, 5)
    for r in (a, b):
        batch.append(r)
    assert same(batch.columns([a, b, c]), RunningColumns.of([a, b, c]))
    assert same(batch.columns([b, c]), RunningColumns.of([b, c]))
