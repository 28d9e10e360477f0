"""FCFS: the paper's conventional continuous batching, whole-prompt prefill in queue order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tokenpace.core.config import option, require_positive
from tokenpace.core.request import Request
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.common import UNCHUNKED, schedule_tokens


@dataclass(frozen=True, slots=True)
class FcfsConfig:
    """The same bound on running requests as ``vllm_default`` (vLLM's ``max_num_seqs``
    default for an OpenAI server on a GPU under 70 GiB)."""

    max_num_seqs: int = option(256, "Maximum number of running requests.")

    def __post_init__(self) -> None:
        require_positive(self, "max_num_seqs")


class FcfsPolicy:
    """Admits waiting requests in arrival order while fewer than ``max_num_seqs`` run and
    the KV cache can hold each one's prompt; the first that does not fit blocks the rest
    (strict FCFS). Prompts prefill whole in one step, as in the paper's runtime (no
    chunking)."""

    name = "fcfs"

    def __init__(self, config: FcfsConfig | None = None) -> None:
        self.config = config or FcfsConfig()

    def plan(self, state: StepState) -> StepPlan:
        return plan_in_order(state, range(len(state.waiting)), self.config.max_num_seqs)

    def telemetry(self) -> Mapping[str, float]:
        return {}


def plan_in_order(
    state: StepState, positions: range | list[int], max_num_seqs: int | None = None
) -> StepPlan:
    """Admit waiting requests at ``positions`` in that order while their prompts fit in the
    free KV blocks and (when given) fewer than ``max_num_seqs`` requests run; stop at the
    first that does not fit."""
    free = state.num_free_blocks
    admitted: list[Request] = []
    limit = state.running_limit(max_num_seqs)
    room = len(state.waiting) if limit is None else limit - len(state.running)
    for position in positions:
        if len(admitted) >= room:
            break
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
    return FcfsPolicy(FcfsConfig())
