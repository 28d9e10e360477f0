"""Priority: shortest prompt first (paper baseline)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.fcfs import plan_in_order


class ShortestPromptFirstPolicy:
    """Admits waiting requests in order of prompt length (ties by queue order) while their
    prompts fit in KV memory; no concurrency bound, whole-prompt prefill, like FCFS."""

    name = "priority"

    def plan(self, state: StepState) -> StepPlan:
        order = np.argsort(state.waiting.num_prompt_tokens, kind="stable")
        return plan_in_order(state, order.tolist())

    def telemetry(self) -> Mapping[str, float]:
        return {}


@POLICIES.register("priority")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return ShortestPromptFirstPolicy()
