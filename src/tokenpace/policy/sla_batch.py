"""SLA-constrained, memory-aware dynamic batching (Pang, Li and Wang, "Optimizing LLM
Inference Throughput via Memory-aware and SLA-constrained Dynamic Batching", arXiv
2503.05248): a decode batch bound that moves with measured ITL, under a memory guardrail."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from tokenpace.core.config import option, require_positive
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.chunked import BudgetBounds, plan_with_budget
from tokenpace.policy.vllm_default import VllmDefaultConfig


@dataclass(frozen=True, slots=True)
class SlaBatchConfig:
    """The controller's constants. The method runs on vLLM, so the token budget and the
    ceiling on the bound are vLLM's defaults (``VllmDefaultConfig``). The target is the
    SLA on decode latency (here the TPOT objective); the band below it, the smoothing and the
    memory margin are ours: the paper states the mechanism, not these constants."""

    itl_target_ms: float = option(100.0, "SLA on the per-token decode latency (ms).")
    band_low: float = option(
        0.85, "Lower edge of the target band as a fraction of the target: below it the bound grows."
    )
    smoothing: float = option(0.3, "Weight of the newest step in the smoothed ITL.")
    growth: float = option(0.1, "Fractional growth of the bound per step below the band.")
    memory_margin: float = option(
        0.1, "Fraction of the KV cache the memory guardrail keeps free for growth."
    )
    min_batch: int = option(1, "Floor of the batch bound (requests).")
    max_num_batched_tokens: int = option(2048, "Token budget per step (vLLM's default).")
    max_num_seqs: int = option(256, "Ceiling of the batch bound (vLLM's max_num_seqs).")

    def __post_init__(self) -> None:
        require_positive(
            self, "itl_target_ms", "smoothing", "growth", "min_batch",
            "max_num_batched_tokens", "max_num_seqs",
        )  # fmt: skip
        for name in ("band_low", "memory_margin"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"SlaBatchConfig.{name} must be in [0, 1), got {value}")
        if self.smoothing > 1:
            raise ValueError(f"SlaBatchConfig.smoothing must be in (0, 1], got {self.smoothing}")


class SlaBatchPolicy:
    """Two bounds on the running batch, recomputed every step; admission is FCFS with
    vLLM's chunked prefill under the smaller of them.

    - **SLA feedback**: the smoothed step latency l^ is compared with a target band
      ``[band_low * target, target]``. Above the target the bound is cut in proportion,
      to ``B * target / l^`` (B = current batch); below the band it grows by ``growth``
      (at least one request); inside the band it holds.
    - **Memory guardrail**: at most ``(1 - memory_margin) * total_blocks`` divided by the
      blocks a running request holds on average, so growing contexts do not run the cache
      out and force preemptions.
    """

    name = "sla_batch"

    def __init__(self, config: SlaBatchConfig) -> None:
        self.config = config
        self._smoothed_ms: float | None = None
        self._sla_bound = float(config.max_num_seqs)
        self._memory_bound = config.max_num_seqs
        self._bound = config.max_num_seqs

    def plan(self, state: StepState) -> StepPlan:
        cfg = self.config
        num_running = len(state.running)
        if state.last_step_latency_s is not None:
            latency_ms = state.last_step_latency_s * 1000
            previous = self._smoothed_ms
            self._smoothed_ms = (
                latency_ms
                if previous is None
                else cfg.smoothing * latency_ms + (1 - cfg.smoothing) * previous
            )
            if self._smoothed_ms > cfg.itl_target_ms:
                cut = max(num_running, 1) * cfg.itl_target_ms / self._smoothed_ms
                self._sla_bound = max(cfg.min_batch, min(self._sla_bound, cut))
            elif self._smoothed_ms < cfg.band_low * cfg.itl_target_ms:
                step = max(1.0, cfg.growth * self._sla_bound)
                self._sla_bound = min(float(cfg.max_num_seqs), self._sla_bound + step)
        self._memory_bound = self._memory_cap(state)
        self._bound = max(cfg.min_batch, min(math.floor(self._sla_bound), self._memory_bound))
        bounds = BudgetBounds(cfg.max_num_batched_tokens, self._bound)
        return plan_with_budget(state, range(len(state.waiting)), bounds)

    def _memory_cap(self, state: StepState) -> int:
        if not state.running:
            return self.config.max_num_seqs
        used = state.num_total_blocks - state.num_free_blocks
        per_request = max(1.0, used / len(state.running))
        usable = (1 - self.config.memory_margin) * state.num_total_blocks
        return max(self.config.min_batch, min(self.config.max_num_seqs, int(usable / per_request)))

    def telemetry(self) -> Mapping[str, float]:
        return {
            "batch_bound": float(self._bound),
            "sla_bound": self._sla_bound,
            "memory_bound": float(self._memory_bound),
            "smoothed_itl_ms": self._smoothed_ms if self._smoothed_ms is not None else 0.0,
        }


@POLICIES.register("sla_batch")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    target = slo.tpot_ms if slo.tpot_ms is not None else 2 * profile.l_min_ms
    vllm = VllmDefaultConfig()
    return SlaBatchPolicy(
        SlaBatchConfig(
            itl_target_ms=target,
            max_num_batched_tokens=vllm.max_num_batched_tokens,
            max_num_seqs=vllm.max_num_seqs,
        )
    )
