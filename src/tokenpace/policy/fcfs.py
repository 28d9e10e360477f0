"""FCFS: admit in queue order with no concurrency bound but KV memory (paper baseline)."""

from __future__ import annotations

from collections.abc import Mapping

from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.common import UNCHUNKED, schedule_tokens


class FcfsPolicy:
    """Admits waiting requests in arrival order while the KV cache can hold each one's
    prompt; the first that does not fit blocks the rest (strict FCFS). Prompts prefill whole
    in one step, as in the paper's runtime (no chunking)."""

    name = "fcfs"

    def plan(self, state: StepState) -> StepPlan:
        return plan_in_order(state, range(len(state.waiting)))

    def telemetry(self) -> Mapping[str, float]:
        return {}


def plan_in_order(state: StepState, positions: range | list[int]) -> StepPlan:
    """Admit waiting requests at ``positions`` in that order while their prompts fit in the
    free KV blocks; stop at the first that does not."""
    free = state.num_free_blocks
    admitted = []
    for position in positions:
        request = state.waiting[position]
        need = state.blocks_for(request.num_tokens)
        if need > free:
            break
        free -= need
        admitted.append(request)
    scheduled = schedule_tokens([*state.running, *admitted], UNCHUNKED)
    return StepPlan(admit_ids=tuple(r.request_id for r in admitted), num_scheduled_tokens=scheduled)


@POLICIES.register("fcfs")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return FcfsPolicy()
