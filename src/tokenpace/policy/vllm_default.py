"""vLLM's default V1 scheduler: FCFS with chunked prefill under a per-step token budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tokenpace.core.config import option, require_positive
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy


@dataclass(frozen=True, slots=True)
class VllmDefaultConfig:
    max_num_batched_tokens: int = option(2048, "Token budget per step (decode + prefill).")
    max_num_seqs: int = option(128, "Maximum number of running requests.")

    def __post_init__(self) -> None:
        require_positive(self, "max_num_batched_tokens", "max_num_seqs")


class VllmDefaultPolicy:
    """Mirrors vLLM V1's ``Scheduler.schedule`` with the FCFS queue: running requests first,
    in admission order, each taking what it needs from the token budget (1 for decode, the
    rest of its prompt for a prefill, cut to the budget); then waiting requests in FCFS order
    while the budget, ``max_num_seqs`` and free KV blocks allow, the last one possibly with a
    partial chunk. The first waiting request that does not fit stops admission."""

    name = "vllm_default"

    def __init__(self, config: VllmDefaultConfig) -> None:
        self.config = config

    def plan(self, state: StepState) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        scheduled: dict[int, int] = {}
        free = state.num_free_blocks
        for request in state.running:
            if budget == 0:
                break
            tokens = min(request.num_uncomputed_tokens, budget)
            scheduled[request.request_id] = tokens
            budget -= tokens
        admitted: list[int] = []
        num_running = len(state.running)
        for request in state.waiting:
            if budget == 0 or num_running + len(admitted) >= self.config.max_num_seqs:
                break
            tokens = min(request.num_tokens, budget)
            need = state.blocks_for(tokens)
            if need > free:
                break
            free -= need
            admitted.append(request.request_id)
            scheduled[request.request_id] = tokens
            budget -= tokens
        return StepPlan(tuple(admitted), scheduled)

    def telemetry(self) -> Mapping[str, float]:
        return {}


@POLICIES.register("vllm_default")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return VllmDefaultPolicy(VllmDefaultConfig())
