"""The TWP policy: Algorithm 1 of the paper, one call of ``plan`` per decode step."""

from __future__ import annotations

from collections.abc import Mapping

from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.common import schedule_tokens
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.gate import GateOutcome, may_admit_any, run_gate
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard
from tokenpace.policy.twp.ranking import ranked, starving_positions
from tokenpace.policy.twp.window import WindowController


class TwpPolicy:
    """Token Window Pacing.

    Per step, in the paper's strict order: (1) monitor: smooth the last step latency,
    update the KV consumption rate; (2) window update (Eq. 3-4, clamped); (3) rank waiting
    requests; (4) force-admit every request that waited T_max steps or more (queue order,
    exempt from both guards, needing only physical KV room), then scan the ranking through
    the gate, which closes at the first failure; (5) chunked prefill: every request still
    prefilling computes up to C tokens this step; (6) decoding requests compute one token.

    Cost with a long queue: when no waiting request could pass the gate (the window is full,
    the usual step under overload) the ranking is skipped, and otherwise ``ranked`` scores
    only the requests that can still be next. Both give exactly the decisions of scoring and
    sorting the whole queue (``bench/scheduler_overhead.py`` times it).
    """

    name = "twp"

    def __init__(self, config: TwpConfig) -> None:
        self.config = config
        self.window = WindowController(config)
        self.kv_guard = KvHeadroomGuard(config)
        self._token_load = 0.0
        self._num_forced = 0

    def plan(self, state: StepState) -> StepPlan:
        cfg = self.config
        # (1)-(2) monitor and window update.
        num_used = state.num_total_blocks - state.num_free_blocks
        self.kv_guard.update(num_used, state.num_total_blocks)
        window = self.window.update(state.last_step_latency_s, len(state.waiting))

        # One pass over the running requests: the token load K_t and their tokens this step
        # (schedule_tokens inlined: this runs for every running request every step).
        scheduled: dict[int, int] = {}
        load = 0
        chunk = cfg.chunk_tokens
        for r in state.running:
            num_output = len(r.token_times_s)
            load += r.max_tokens - num_output
            uncomputed = r.num_prompt_tokens + num_output - r.num_computed_tokens
            scheduled[r.request_id] = uncomputed if uncomputed <= 1 else min(uncomputed, chunk)
        token_load = float(load)
        outcome = GateOutcome(token_load=token_load, num_free_blocks=state.num_free_blocks)
        forced_ids: list[int] = []
        waiting = state.waiting
        if len(waiting):
            # (4a) force-admit starving requests (queue order), bypassing the window and d_kv.
            forced = starving_positions(waiting, state.step_index, cfg.t_max_steps)
            for request in waiting.request_at(forced):
                need = state.blocks_for(request.num_tokens)
                if need > outcome.num_free_blocks:
                    break
                outcome.admitted.append(request)
                outcome.token_load += request.remaining_output_tokens
                outcome.num_free_blocks -= need
                forced_ids.append(request.request_id)
            # (3)-(4b) the gate, in rank order, over the rest; ranking is skipped when no
            # candidate could pass, which leaves the decision unchanged.
            if len(forced) < len(waiting) and may_admit_any(
                waiting, outcome, window, self.kv_guard, state.block_size
            ):
                mean_remaining = token_load / len(state.running) if state.running else 0.0
                candidates = ranked(
                    waiting, state.now_s, state.step_index, mean_remaining, cfg, forced
                )
                run_gate(candidates, outcome, window, self.kv_guard, state.block_size)
        self._token_load = outcome.token_load
        self._num_forced = len(forced_ids)
        # (5)-(6) chunked prefill and decode.
        scheduled.update(schedule_tokens(outcome.admitted, chunk))
        return StepPlan(
            admit_ids=tuple(r.request_id for r in outcome.admitted),
            num_scheduled_tokens=scheduled,
            forced_ids=frozenset(forced_ids),
        )

    def telemetry(self) -> Mapping[str, float]:
        return {
            "token_window": self.window.window,
            "target_window": self.window.target_window,
            "smoothed_itl_ms": self.window.smoothed_itl_ms,
            "slowdown": self.window.slowdown,
            "kv_threshold_blocks": self.kv_guard.threshold_blocks,
            "token_load": self._token_load,
            "num_forced": float(self._num_forced),
        }


@POLICIES.register("twp")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return TwpPolicy(TwpConfig.from_profile(profile))
