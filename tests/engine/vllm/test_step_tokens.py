"""The limits that make vLLM's own token pass follow a policy's planned token counts."""

from __future__ import annotations

import pytest

from tokenpace.engine.profile import load_profile
from tokenpace.engine.vllm.step_tokens import PlansStepTokens, step_token_limits
from tokenpace.policy import build_policy


def greedy_pass(
    needed: list[int],
    order: tuple[int, ...],
    budget: int,
    cap: int | None,
    admitted_needed: list[int],
) -> tuple[dict[int, int], list[int]]:
    """vLLM's assignment: running requests in order, then new ones, each taking what it
    needs capped by the threshold and the budget left."""
    given: dict[int, int] = {}
    for i in order:
        take = min(needed[i], cap or needed[i], budget)
        if take:
            given[i] = take
        budget -= take
    new = []
    for n in admitted_needed:
        take = min(n, cap or n, budget)
        new.append(take)
        budget -= take
    return given, new


def test_decodes_go_first_and_the_step_carries_only_the_planned_prefill() -> None:
    # A prefilling request ahead of three decoding ones in vLLM's running order, a second
    # prefilling request that sits this step out, and one new admission.
    needed = [500, 1, 300, 1, 1]
    planned: list[int | None] = [96, 1, 0, 1, 1]
    limits = step_token_limits(needed, planned, admitted_planned=[32], max_budget=1024)
    assert limits.running_order == (1, 3, 4, 0)
    assert limits.token_budget == 96 + 3 + 32
    assert limits.long_prefill_threshold == 96
    given, new = greedy_pass(
        needed,
        limits.running_order,
        limits.token_budget,
        limits.long_prefill_threshold,
        admitted_needed=[400],
    )
    assert given == {1: 1, 3: 1, 4: 1, 0: 96}
    assert new == [32]


def test_equal_fixed_chunks_are_reproduced_and_vllms_budget_is_never_exceeded() -> None:
    needed = [200, 200, 1]
    limits = step_token_limits(needed, [64, 64, 1], admitted_planned=[], max_budget=1024)
    given, _ = greedy_pass(
        needed, limits.running_order, limits.token_budget, limits.long_prefill_threshold, []
    )
    assert given == {2: 1, 0: 64, 1: 64}
    capped = step_token_limits(needed, [200, 200, 1], admitted_planned=[], max_budget=256)
    assert capped.token_budget == 256


def test_a_prefill_the_plan_served_after_a_new_request_sits_the_step_out() -> None:
    # twp_slo gave the new request 100 tokens first and the late running prefill the 46 left;
    # vLLM would visit the running one first and give it 100.
    needed = [900, 1, 1]
    limits = step_token_limits(needed, [46, 1, 1], admitted_planned=[100], max_budget=1024)
    assert limits.running_order == (1, 2)
    given, new = greedy_pass(
        needed, limits.running_order, limits.token_budget, limits.long_prefill_threshold, [400]
    )
    assert given == {1: 1, 2: 1} and new == [100]
    # Behind another running prefill the plan's order is vLLM's: both keep their chunks.
    needed = [500, 900, 1]
    limits = step_token_limits(needed, [100, 46, 1], admitted_planned=[], max_budget=1024)
    given, _ = greedy_pass(
        needed, limits.running_order, limits.token_budget, limits.long_prefill_threshold, []
    )
    assert given == {2: 1, 0: 100, 1: 46}
    # Served after a running prefill that vLLM visits later: it sits out.
    needed = [900, 500, 1]
    limits = step_token_limits(needed, [46, 100, 1], admitted_planned=[], max_budget=1024)
    given, _ = greedy_pass(
        needed, limits.running_order, limits.token_budget, limits.long_prefill_threshold, []
    )
    assert given == {2: 1, 1: 100}


def test_requests_the_policy_does_not_see_get_what_they_need() -> None:
    limits = step_token_limits([1, 40], [1, None], admitted_planned=[], max_budget=1024)
    assert limits.token_budget == 41
    with pytest.raises(ValueError, match="planned counts"):
        step_token_limits([1, 2], [1], admitted_planned=[], max_budget=10)


def test_only_twp_slo_binds_vllm_to_its_planned_tokens() -> None:
    profile = load_profile("v100-llama-3.2-3b")
    assert isinstance(build_policy("twp_slo", profile), PlansStepTokens)
    for name in ("twp", "fcfs", "vllm_default", "sarathi", "sla_batch"):
        assert not isinstance(build_policy(name, profile), PlansStepTokens)
