"""The TWP policy: Algorithm 1 of the paper, one call of ``plan`` per decode step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.core.running import RunningColumns
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.common import schedule_tokens
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.expected import ExpectedOutput
from tokenpace.policy.twp.gate import GateOutcome, may_admit_any, run_gate
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard
from tokenpace.policy.twp.kv_reservation import KvReservation, compiled_tests
from tokenpace.policy.twp.ranking import compiled_head, ranked, starving_positions
from tokenpace.policy.twp.window import WindowController
from tokenpace.policy.window_state import WindowState, token_window_state


class TwpPolicy:
    """Token Window Pacing.

    Per step, in the paper's strict order: (1) monitor: smooth the last step latency,
    update the KV consumption rate; (2) window update (Eq. 3-4, clamped); (3) rank waiting
    requests; (4) force-admit every request that waited T_max steps or more (queue order,
    exempt from the window and d_kv, needing physical KV room and, when on, the KV
    reservation), then scan the ranking through
    the gate, which closes at the first failure; (5) chunked prefill: every request still
    prefilling computes up to C tokens this step; (6) decoding requests compute one token.

    Output lengths: ``max_tokens`` is a loose cap, so K_t, the gate's r and the ranking's
    L^(r) use the expected output learned from finished requests (``ExpectedOutput``,
    ``tokenpace.policy.output_length``; the budget before anything finished). KV: besides
    the paper's d_kv guard, a candidate is admitted only while the batch's predicted
    footprint (prompt + expected output, with a margin from the estimate's error) fits the
    cache (``KvReservation``), so running requests are not preempted and recomputed. Each
    can be switched off (``use_output_estimate``, ``use_kv_reservation``).

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
        self.expected = ExpectedOutput(config.output_lengths, config.use_output_estimate)
        self.reservation = KvReservation(
            config.kv_margin_sigmas,
            self.expected.still_running,
            self.expected.still_running_row,
            compiled_tests() if config.output_lengths.compiled else None,
        )
        self._ranked_head = compiled_head() if config.compiled_ranking else None
        self._token_load = 0.0
        self._num_forced = 0

    def plan(self, state: StepState) -> StepPlan:
        cfg = self.config
        # (1)-(2) monitor (step latency, KV consumption, finished requests' output lengths)
        # and window update.
        num_used = state.num_total_blocks - state.num_free_blocks
        self.kv_guard.update(num_used, state.num_total_blocks)
        window = self.window.update(state.last_step_latency_s, len(state.waiting))
        running = state.running
        columns = state.running_columns
        if columns is None:
            columns = RunningColumns.of(running)
        self.expected.observe(
            running, state.step_index, columns.request_ids, columns.produced, columns.prompts
        )

        # The token load K_t (expected remaining outputs) and the running requests' tokens
        # this step: one for each decoding request, up to C for each one still prefilling.
        chunk = cfg.chunk_tokens
        prefilling_at = columns.prefilling_positions()
        scheduled: dict[int, int] = columns.decoding_tokens(prefilling_at)
        if len(prefilling_at):
            uncomputed = columns.uncomputed[prefilling_at].tolist()
            ids = columns.request_ids
            for position, left in zip(prefilling_at.tolist(), uncomputed, strict=True):
                scheduled[ids[position]] = left if left <= 1 else min(left, chunk)
        prompt_col, output_col = columns.prompts, columns.produced
        remaining = self.expected.remaining_for(prompt_col, output_col, columns.caps)
        token_load = float(remaining.sum())
        reservation = self._begin_reservation(columns, state)
        outcome = GateOutcome(token_load=token_load, num_free_blocks=state.num_free_blocks)
        forced_ids: list[int] = []
        waiting = state.waiting
        limit = state.running_limit()
        # The engine's free request slots, which bind forced admissions too.
        room = None if limit is None else max(0, limit - len(running))
        if len(waiting) and room != 0:
            # (4a) force-admit starving requests (queue order), bypassing the window and d_kv.
            forced = starving_positions(waiting, state.step_index, cfg.t_max_steps)
            for request in waiting.iter_at(forced):
                if room is not None and len(outcome.admitted) >= room:
                    break
                need = state.blocks_for(request.num_tokens)
                expected = self.expected.remaining_of(request)
                if need > outcome.num_free_blocks or not _reserves(
                    reservation, request, outcome.idle
                ):
                    break
                outcome.admitted.append(request)
                outcome.token_load += expected
                outcome.num_free_blocks -= need
                if reservation is not None:
                    reservation.add(request)
                forced_ids.append(request.request_id)
            # (3)-(4b) the gate, in rank order, over the rest; ranking is skipped when no
            # candidate could pass, which leaves the decision unchanged.
            if len(forced) < len(waiting) and may_admit_any(
                waiting, outcome, window, self.kv_guard, state.block_size,
                self.expected.queue_minima(waiting), reservation,
            ):  # fmt: skip
                mean_remaining = token_load / len(running) if running else 0.0
                candidates = ranked(
                    waiting, state.now_s, state.step_index, mean_remaining, cfg, forced,
                    self.expected.queue_totals(waiting), self._ranked_head,
                )  # fmt: skip
                run_gate(
                    candidates, outcome, window, self.kv_guard, state.block_size,
                    self.expected.remaining_of, reservation, room,
                )  # fmt: skip
        self.expected.admitted(outcome.admitted)
        self._token_load = outcome.token_load
        self._num_forced = len(forced_ids)
        # (5)-(6) chunked prefill and decode.
        scheduled.update(schedule_tokens(outcome.admitted, chunk))
        return StepPlan(
            admit_ids=tuple(r.request_id for r in outcome.admitted),
            num_scheduled_tokens=scheduled,
            forced_ids=frozenset(forced_ids),
        )

    def _begin_reservation(self, columns: RunningColumns, state: StepState) -> KvReservation | None:
        """The KV reservation for this step over the running requests; None when switched
        off."""
        if not self.config.use_kv_reservation:
            return None
        self.reservation.begin(
            columns.prompts, columns.produced, columns.caps,
            state.num_total_blocks, state.block_size,
            state.waiting.max_max_tokens if len(state.waiting) else 0,
        )  # fmt: skip
        return self.reservation

    def use_profile(self, profile: EngineProfile) -> None:
        """Measure slowdown against ``profile``'s l_min from the next step on (the window
        and the smoothed ITL carry over)."""
        self.config = replace(self.config, l_min_ms=profile.l_min_ms)
        self.window.config = self.config

    def expected_output(self, request: Request) -> float | None:
        """Read-only: the output tokens this policy expects ``request`` to generate (its
        learned estimate), or None before it has seen a request finish."""
        if not self.expected.estimator.num_observed:
            return None
        return self.expected.remaining_of(request)

    def window_state(
        self, running: Sequence[Request], waiting: WaitingQueue, now_s: float | None = None
    ) -> WindowState:
        """Read-only: H_t, and K_t and the queue in expected output tokens (the learned
        estimate, as the gate uses them), for the pool's router and autoscaler. TWP's
        ranking has no deadline, so a fresh request waits behind the whole queue whatever
        ``now_s``."""
        reserved = self.reservation.reserved_blocks + self.reservation.margin_blocks
        return token_window_state(
            self.window.window, self.window.smoothed_itl_ms, self.expected, running, waiting,
            reserved if self.config.use_kv_reservation else 0.0,
        )  # fmt: skip

    def telemetry(self) -> Mapping[str, float]:
        return {
            "token_window": self.window.window,
            "target_window": self.window.target_window,
            "smoothed_itl_ms": self.window.smoothed_itl_ms,
            "slowdown": self.window.slowdown,
            "kv_threshold_blocks": self.kv_guard.threshold_blocks,
            "token_load": self._token_load,
            "num_forced": float(self._num_forced),
            **self.reservation.telemetry(),
            **self.expected.telemetry(),
        }


def _reserves(reservation: KvReservation | None, request: Request, idle: bool) -> bool:
    """The KV reservation test (passed when switched off, or by the liveness rule)."""
    return reservation is None or idle or reservation.admits(request)


@POLICIES.register("twp")
def _make(profile: EngineProfile, slo: Slo) -> Policy:
    return TwpPolicy(TwpConfig.from_profile(profile))
