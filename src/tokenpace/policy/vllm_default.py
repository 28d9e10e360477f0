"""vLLM's default V1 scheduler: FCFS with chunked prefill under a per-step token budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tokenpace.core.config import option, require_positive
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.chunked import BudgetBounds, plan_with_budget


@dataclass(frozen=True, slots=True)
class VllmDefaultConfig:
    """vLLM's defaults for an OpenAI-compatible server (``vllm serve``) on a GPU with less
    than 70 GiB of memory: ``EngineArgs`` sets ``max_num_batched_tokens`` 2048 and
    ``max_num_seqs`` 256 for that usage context (vllm/engine/arg_utils.py, the V1 default
    arguments; 8192 and 1024 on larger GPUs)."""

    max_num_batched_tokens: int = option(2048, "Token budget per step (decode + prefill).")
    max_num_seqs: int = option(256, "Maximum number of running requests.")

    def __post_init__(self) -> None:
        require_positive(self, "max_num_batched_tokens", "max_num_seqs")

    @property
    def bounds(self) -> BudgetBounds:
        return BudgetBounds(self.max_num_batched_tokens, self.max_num_seqs)


class VllmDefaultPolicy:
    """Mirrors vLLM V1's ``Scheduler.schedule`` with the FCFS queue: running requests first,
    in admission order, each taking what it needs from the token budget (1 for decode, the
    rest of its prompt for a prefill, cut to the budget); then waiting requests in FCFS order
    while the budget, ``max_num_seqs`` and free KV blocks allow, the last one possibly with a
    partial chunk. The first waiting request that does not fit stops admission. When KV runs
    out the most recently admitted running request is preempted and recomputed later (the
    step loop does it, as V1 does), and no waiting request joins that step."""

    name = "vllm_default"

    def __init__(self, config: VllmDefaultConfig) -> None:
        self.config = config
        self._bounds = config.bounds

    def plan(self, state: StepState) -> StepPlan:
        return plan_with_budget(state, range(len(state.waiting)), self._bounds)

    def telemetry(self) -> Mapping[str, float]:
        return {}


@POLICIES.register("vllm_default")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return VllmDefaultPolicy(VllmDefaultConfig())
