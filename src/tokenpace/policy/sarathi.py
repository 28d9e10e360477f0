"""Sarathi-Serve's stall-free batching (Agrawal et al., OSDI 2024)."""

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
class SarathiConfig:
    """Sarathi-Serve's defaults (microsoft/sarathi-serve, sarathi/config/config.py):
    ``SarathiSchedulerConfig.chunk_size`` 512 tokens per iteration and
    ``BaseSchedulerConfig.max_num_seqs`` 128."""

    token_budget: int = option(512, "Tokens per step: decodes plus prefill chunks.")
    max_num_seqs: int = option(128, "Maximum number of running requests.")

    def __post_init__(self) -> None:
        require_positive(self, "token_budget", "max_num_seqs")


class SarathiPolicy:
    """Stall-free batching: every decoding request gets its token first, then running
    prefills and then waiting requests (FCFS) fill what is left of a fixed per-step token
    budget with prompt chunks, so a long prompt never stalls decodes for more than one
    budget's worth of compute. A request is admitted only when the KV cache can hold its
    whole prompt (Sarathi allocates it at admission); when decodes need more blocks than are
    free the most recently admitted running request is preempted and recomputed."""

    name = "sarathi"

    def __init__(self, config: SarathiConfig) -> None:
        self.config = config
        self._bounds = BudgetBounds(
            config.token_budget, config.max_num_seqs, decodes_first=True,
            reserve_whole_prompt=True,
        )  # fmt: skip

    def plan(self, state: StepState) -> StepPlan:
        return plan_with_budget(state, range(len(state.waiting)), self._bounds)

    def telemetry(self) -> Mapping[str, float]:
        return {}


@POLICIES.register("sarathi")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return SarathiPolicy(SarathiConfig())
