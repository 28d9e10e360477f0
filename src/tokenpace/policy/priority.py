"""Priority: shortest prompt first, under the same bounds as vLLM's default scheduler."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.chunked import plan_with_budget
from tokenpace.policy.vllm_default import VllmDefaultConfig


class ShortestPromptFirstPolicy:
    """The paper's Priority baseline (shortest prompt first, ties by queue order) inside
    vLLM V1's mechanism: chunked prefill under ``max_num_batched_tokens``, at most
    ``max_num_seqs`` running, recompute preemption (``VllmDefaultConfig``'s defaults). Its
    order matters whenever the token budget, the request bound or KV memory binds."""

    name = "priority"

    def __init__(self, config: VllmDefaultConfig) -> None:
        self.config = config
        self._bounds = config.bounds

    def plan(self, state: StepState) -> StepPlan:
        order = np.argsort(state.waiting.num_prompt_tokens, kind="stable")
        return plan_with_budget(state, order.tolist(), self._bounds)

    def telemetry(self) -> Mapping[str, float]:
        return {}


@POLICIES.register("priority")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return ShortestPromptFirstPolicy(VllmDefaultConfig())
