"""DynamicBatch: cap the batch size when ITL exceeds a static target (paper baseline)."""

from __future__ import annotations

import math
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
class DynamicBatchConfig:
    itl_target_ms: float = option(64.5, "Static ITL target (ms); default 1.5 x l_min.")
    max_batch: int = option(256, "Upper bound on the batch-size cap (requests).")
    decrease_factor: float = option(0.8, "Cap multiplier when the measured ITL exceeds target.")

    def __post_init__(self) -> None:
        require_positive(self, "itl_target_ms", "max_batch", "decrease_factor")
        if self.decrease_factor >= 1:
            raise ValueError(f"decrease_factor must be < 1, got {self.decrease_factor}")


class DynamicBatchPolicy:
    """FCFS admission under a request-count cap. The cap moves by AIMD on one signal, the
    last step's ITL against a fixed target: above target it shrinks to ``decrease_factor``
    times the current batch, at or below it grows by one. No queue, token-load or KV-rate
    feedback; prompts prefill whole, like FCFS."""

    name = "dynamic_batch"

    def __init__(self, config: DynamicBatchConfig) -> None:
        self.config = config
        self._cap = config.max_batch

    def plan(self, state: StepState) -> StepPlan:
        cfg = self.config
        if state.last_step_latency_s is not None:
            if state.last_step_latency_s * 1000 > cfg.itl_target_ms:
                shrunk = math.floor(len(state.running) * cfg.decrease_factor)
                self._cap = max(1, min(self._cap, shrunk))
            else:
                self._cap = min(cfg.max_batch, self._cap + 1)
        free = state.num_free_blocks
        admitted: list[Request] = []
        cap = state.running_limit(self._cap)
        for request in state.waiting:
            if len(state.running) + len(admitted) >= cap:
                break
            need = state.blocks_for(request.num_tokens)
            if need > free:
                break
            free -= need
            admitted.append(request)
        scheduled = schedule_tokens([*state.running, *admitted], UNCHUNKED)
        return StepPlan(tuple(r.request_id for r in admitted), scheduled)

    def telemetry(self) -> Mapping[str, float]:
        return {"batch_cap": float(self._cap)}


@POLICIES.register("dynamic_batch")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return DynamicBatchPolicy(DynamicBatchConfig(itl_target_ms=1.5 * profile.l_min_ms))
