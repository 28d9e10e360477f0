"""The SLO-targeted TWP policy and its ablations."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.core.running import RunningColumns
from tokenpace.core.step import Rejection, StepPlan, StepState
from tokenpace.engine.latency_model import LatencyModel, carried_prefill_ms
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import POLICIES, Policy
from tokenpace.policy.twp.expected import ExpectedOutput
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard
from tokenpace.policy.twp.kv_reservation import KvReservation, compiled_tests
from tokenpace.policy.twp.ranking import compiled_head, ranked, starving_positions
from tokenpace.policy.twp_slo.config import MIN_ITL_TARGET_FRACTION, TwpSloConfig
from tokenpace.policy.twp_slo.deadline import compiled_deferrals, deadline_order, ttft_slack_s
from tokenpace.policy.twp_slo.prefill_budget import PrefillBudget
from tokenpace.policy.twp_slo.rejection import ServiceOutlook, early_rejections
from tokenpace.policy.twp_slo.tail_margin import TailMargin
from tokenpace.policy.twp_slo.window import RequestWindow, balanced_batch
from tokenpace.policy.window_state import WindowState, request_window_state

# The share of full steps' gaps the tail margin lets pass the TPOT objective: half the 1%
# that p99 ITL allows, the rest left to the host's time between steps. Its step: a full
# step over the objective widens the margin by 2%; 200 within it narrow it by as much.
# Its credit: about five slow steps in a row before the margin widens at all.
TAIL_SHARE = 0.005
TAIL_GAIN = 0.02
TAIL_CREDIT = 0.1
# The tail margin retargets the window when its fraction has moved this much (relative).
RETARGET_STEP = 0.002


class TwpSloPolicy:
    """TWP aimed at latency objectives instead of the smoothest stream.

    Per step: (1) monitor ITL and KV consumption; (2) move the request window toward the
    batch at which ITL meets the target (``window.py``); (3) rank waiting requests by TTFT
    feasibility (``deadline.py``); (4) force-admit requests that waited ``max_wait_steps``
    (queue order) while force-admitted requests hold fewer than ``max_forced_share`` of the
    window's slots, then admit the rest in rank order (a request past ``max_wait_steps``
    ranks as the late one it is) while the batch is below the window, the KV guard passes
    and prefill budget remains, closing at the first failure; (5) spend the step's prefill budget
    (``PrefillBudget``: the ITL target minus the decode batch's predicted latency, paid at the
    profile's per-token and attention costs; ``max_prefill_tokens`` when nothing decodes) on
    the prefilling requests in admission order, then on the admitted ones in rank order, so
    the step's predicted latency never exceeds the target; a prefilling request that can no
    longer meet the TTFT objective waits until every request that still can has had its
    share (``use_late_yield``); (6) one token per decoding request. The running requests'
    counters come as columns (``StepState.running_columns``), so none of this loops over the
    batch in Python.

    Cost with a long queue: when the window is full, the budget spent or the smallest
    request fails the KV guard, nobody can be admitted and the ranking is skipped; otherwise
    only requests that can still meet the TTFT objective are keyed (``deadline_order``).
    Both give exactly the decisions of keying and sorting the whole queue.
    """

    def __init__(self, config: TwpSloConfig, profile: EngineProfile, name: str = "twp_slo") -> None:
        self.name = name
        self.config = config
        self.window = RequestWindow(config)
        self.kv_guard = KvHeadroomGuard(config.base)
        self.expected = ExpectedOutput(config.base.output_lengths, config.use_output_estimate)
        self.reservation = KvReservation(
            config.base.kv_margin_sigmas,
            self.expected.still_running,
            self.expected.still_running_row,
            compiled_tests() if config.base.output_lengths.compiled else None,
        )
        self._latency = LatencyModel(profile)
        self._deferrals = compiled_deferrals() if config.compiled_deferrals else None
        # TWP's score order ranks only where the deadline order is switched off.
        use_head = config.base.compiled_ranking and not config.use_deadline_ranking
        self._ranked_head = compiled_head() if use_head else None
        self.budget = PrefillBudget(self._latency, config.max_prefill_tokens)
        self._budget = float(config.min_prefill_tokens)
        # EMA of measured / predicted step latency (1 = the profile is exact).
        self._calibration = 1.0
        self._predicted_ms: float | None = None
        self._predicted_decoding = 0  # decoding requests in the step predicted
        self.tail = TailMargin(
            config.itl_target_fraction, min(MIN_ITL_TARGET_FRACTION, config.itl_target_fraction),
            TAIL_SHARE, TAIL_GAIN, TAIL_CREDIT,
        )  # fmt: skip
        # The fraction the window was last sized for (``_follow_tail``).
        self._window_fraction = config.itl_target_fraction
        self._num_forced = 0
        # Requests force-admitted and running ever since (pruned to the running ones at every
        # step).
        self._forced_running: set[int] = set()
        # Means of the admitted requests' prompt tokens and max_tokens (None before any).
        self._mean_prompt: float | None = None
        self._mean_cap = 0.0

    def prefill_budget(self, num_decoding: int) -> int:
        """Tokens of prefill (at the flat per-token rate) a step with ``num_decoding``
        decoding requests may carry without its predicted latency exceeding the ITL target
        (``PrefillBudget``); the fixed chunk C when the budget is switched off."""
        cfg = self.config
        if not cfg.use_prefill_budget:
            return cfg.min_prefill_tokens
        probe = PrefillBudget(self._latency, cfg.max_prefill_tokens)
        return probe.open(num_decoding, self._budget_target_ms(), self._calibration)

    def plan(self, state: StepState) -> StepPlan:
        cfg = self.config
        self.kv_guard.update(state.num_total_blocks - state.num_free_blocks, state.num_total_blocks)
        running = state.running
        columns = state.running_columns
        if columns is None:
            columns = RunningColumns.of(running)
        if cfg.use_balance_floor:
            self.window.set_floor(self._balance_floor(columns.produced))
        self._calibrate(state.last_step_latency_s)
        self.window.update(state.last_step_latency_s)
        self.expected.observe(
            running, state.step_index, columns.request_ids, columns.produced, columns.prompts
        )
        capacity = self.window.capacity()
        # The engine's own bound on requests held binds forced admissions too.
        limit = state.running_limit()
        if limit is not None:
            capacity = min(capacity, limit)

        # Decoding requests compute one token; the prefilling ones share the budget.
        prefilling_at = columns.prefilling_positions()
        scheduled: dict[int, int] = columns.decoding_tokens(prefilling_at)
        num_decoding = len(scheduled)
        attention_ms = self._decode_attention_ms(columns, prefilling_at, num_decoding)
        budget = self.budget
        if cfg.use_prefill_budget:
            self._budget = float(
                budget.open(num_decoding, self._budget_target_ms(), self._calibration, attention_ms)
            )
        else:
            self._budget = float(cfg.min_prefill_tokens)
        prefilling = [running[i] for i in prefilling_at.tolist()]
        late = self._late_prefills(prefilling, state)
        late_ids = {r.request_id for r in late}
        prefill_ms = self._grant([r for r in prefilling if r.request_id not in late_ids], scheduled)
        reservation = self._begin_reservation(columns, state)

        admitted: list[Request] = []
        forced: list[int] = []
        free = state.num_free_blocks
        waiting = state.waiting
        held_forced = self._held_forced(columns.request_ids)
        rejections: tuple[Rejection, ...] = ()
        if cfg.early_reject and len(waiting):
            remaining = self.expected.remaining_for(columns.prompts, columns.produced, columns.caps)
            rejections = self._rejections(state, remaining, capacity)
        if len(waiting):
            forced_positions = starving_positions(waiting, state.step_index, cfg.max_wait_steps)
            gone = np.empty(0, dtype=np.intp)
            if rejections:
                # Rejected requests are neither forced nor candidates.
                gone = np.flatnonzero(
                    np.isin(waiting.request_ids, [r.request_id for r in rejections])
                )
                forced_positions = forced_positions[~np.isin(forced_positions, gone)]
            forced_room = len(waiting)  # a share of 1: no bound, past the window too
            if cfg.max_forced_share < 1:
                forced_slots = max(1, math.floor(cfg.max_forced_share * capacity))
                forced_room = forced_slots - held_forced
            for request in waiting.iter_at(forced_positions):
                need = state.blocks_for(request.num_tokens)
                idle = not running and not admitted
                if (
                    len(forced) >= forced_room
                    or (limit is not None and len(running) + len(admitted) >= limit)
                    or need > free
                    or not (reservation is None or idle or reservation.admits(request))
                ):
                    break
                # Granted only once every other test has passed: a request left waiting
                # spends none of the step's budget.
                tokens = self._chunk(request)
                if tokens == 0:
                    break
                free -= need
                admitted.append(request)
                forced.append(request.request_id)
                if reservation is not None:
                    reservation.add(request)
                scheduled[request.request_id] = tokens
                prefill_ms += budget.cost_ms(tokens, request.num_computed_tokens)
            self._forced_running.update(forced)
            # The force-admitted ones are a prefix of forced_positions.
            excluded = np.union1d(forced_positions[: len(forced)], gone)
            # The gate's room and budget tests do not depend on the candidate (a fresh
            # request's first chunk starts at context 0), and its KV test is monotone in the
            # footprint: when the first candidate fails whoever it is, nothing is admitted
            # and the ranking is skipped.
            may_admit = (
                len(excluded) < len(waiting)
                and len(running) + len(admitted) < capacity
                and self._has_budget()
                and self._may_fit_kv(state, free, reservation, not running and not admitted)
            )
            if may_admit:
                backlog = float(columns.uncomputed[prefilling_at].sum())
                backlog -= sum(r.num_uncomputed_tokens for r in late)
                candidates = self._candidates(state, int(self._budget), excluded, backlog)
                for request in candidates:
                    if late and self._is_late(request, request.num_prompt_tokens, state):
                        # The rest of the ranking cannot meet the objective either: the
                        # running ones that cannot go first, then these.
                        prefill_ms += self._grant(late, scheduled)
                        late = []
                    has_room = len(running) + len(admitted) < capacity
                    idle = not running and not admitted
                    need = state.blocks_for(request.num_tokens)
                    if not (
                        has_room and self._fits_kv(request, state, need, free, reservation, idle)
                    ):
                        break
                    tokens = self._chunk(request)
                    if tokens == 0:
                        break
                    free -= need
                    admitted.append(request)
                    if reservation is not None:
                        reservation.add(request)
                    scheduled[request.request_id] = tokens
                    prefill_ms += budget.cost_ms(tokens, request.num_computed_tokens)
        prefill_ms += self._grant(late, scheduled)
        self.expected.admitted(admitted)
        self._observe_mix(admitted)
        self._num_forced = len(forced)
        prefill_ms += self._latency.chunks_overhead_ms(len(scheduled) - num_decoding)
        prefill_ms += self._latency.step_residual_ms(
            num_decoding, sum(scheduled.values()) - num_decoding
        )
        carries_prefill = len(scheduled) > num_decoding
        mixing_ms = cfg.mixed_prefill_overhead_ms
        prefill_ms = (
            carried_prefill_ms(prefill_ms, num_decoding, mixing_ms) if carries_prefill else 0.0
        )
        self._predicted_ms = self._latency.decode_ms(num_decoding) + attention_ms + prefill_ms
        self._predicted_decoding = num_decoding
        return StepPlan(
            admit_ids=tuple(r.request_id for r in admitted),
            num_scheduled_tokens=scheduled,
            forced_ids=frozenset(forced),
            rejections=rejections,
        )

    def _rejections(
        self, state: StepState, running_remaining: npt.NDArray[np.float64], capacity: int
    ) -> tuple[Rejection, ...]:
        """Early rejection (``rejection.py``), decided before admission so that no slot or
        prefill goes to a request predicted to miss: the waiting requests whose predicted
        TTFT, from the prefill budget, the window, the running requests' expected remaining
        output and the smoothed ITL, exceeds the objective."""
        cfg = self.config
        waiting = state.waiting
        totals = self.expected.queue_totals(waiting)
        fresh = float(np.mean(totals if totals is not None else waiting.max_tokens))
        backlog = sum(r.num_uncomputed_tokens for r in state.running if r.is_prefilling)
        per_step = self._budget if cfg.use_prefill_budget else cfg.min_prefill_tokens
        outlook = ServiceOutlook(
            step_s=cfg.itl_target_ms / 1000,
            itl_s=(self.window.smoothed_itl_ms or self.window.reference_ms) / 1000,
            prefill_tokens_per_step=max(float(per_step), float(cfg.min_prefill_tokens)),
            free_slots=max(0, capacity - len(state.running)),
            running_remaining=running_remaining,
            fresh_output=fresh,
            num_slots=capacity,
            backlog_tokens=float(backlog),
        )
        none = np.zeros(0, dtype=np.intp)
        return tuple(early_rejections(waiting, state.now_s, cfg.ttft_slo_ms / 1000, outlook, none))

    def _grant(self, prefilling: Sequence[Request], scheduled: dict[int, int]) -> float:
        """Spend the budget on ``prefilling`` in order (``_chunk``), recording each chunk in
        ``scheduled``; returns the chunks' predicted cost (ms)."""
        cost_ms = 0.0
        for request in prefilling:
            tokens = self._chunk(request)
            if tokens:
                scheduled[request.request_id] = tokens
                cost_ms += self.budget.cost_ms(tokens, request.num_computed_tokens)
        return cost_ms

    def _held_forced(self, running_ids: Sequence[int]) -> int:
        """How many running requests were force-admitted (the record pruned to them)."""
        if self._forced_running:
            self._forced_running.intersection_update(running_ids)
        return len(self._forced_running)

    def _late_prefills(self, prefilling: Sequence[Request], state: StepState) -> list[Request]:
        """The prefilling requests that yield the budget this step (``use_late_yield``, with
        the deadline ranking): those without a first token that can no longer meet the TTFT
        objective (``_is_late`` on their uncomputed prompt) and have been in the system
        fewer than ``max_wait_steps`` steps, the force-admission bound. Their first token is
        late whatever happens; the budget they leave goes to requests still on time."""
        cfg = self.config
        if not (cfg.use_late_yield and cfg.use_deadline_ranking):
            return []
        return [
            r
            for r in prefilling
            if not r.token_times_s
            and state.step_index - r.enqueued_step < cfg.max_wait_steps
            and self._is_late(r, r.num_uncomputed_tokens, state)
        ]

    def _is_late(self, request: Request, prefill_tokens: int, state: StepState) -> bool:
        """Whether ``request`` can no longer meet the TTFT objective with ``prefill_tokens``
        still to prefill, at this step's budget per step of the ITL target (the deadline
        ranking's feasibility test, ``deadline.ttft_slack_s``)."""
        return bool(self._ttft_slack(request.arrival_s, prefill_tokens, state.now_s) < 0)

    def _ttft_slack(
        self, arrival_s: npt.ArrayLike, prefill_tokens: npt.ArrayLike, now_s: float
    ) -> npt.NDArray[np.float64]:
        """``deadline.ttft_slack_s`` at ``now_s`` with the last step's budget per step of the
        ITL target (the fixed chunk C when the budget is switched off)."""
        cfg = self.config
        per_step = int(self._budget) if cfg.use_prefill_budget else cfg.min_prefill_tokens
        return ttft_slack_s(
            arrival_s, prefill_tokens, now_s, cfg.ttft_slo_ms / 1000, cfg.itl_target_ms / 1000,
            per_step,
        )  # fmt: skip

    def _chunk(self, request: Request) -> int:
        """Tokens ``request`` computes this step: what the budget left pays for, or the fixed
        chunk C when the budget is switched off (0: it sits this step out)."""
        uncomputed = request.num_uncomputed_tokens
        if not self.config.use_prefill_budget:
            return min(uncomputed, self.config.min_prefill_tokens)
        return self.budget.grant(uncomputed, request.num_computed_tokens)

    def _has_budget(self) -> bool:
        """Whether the budget left pays for a fresh request's first token."""
        return not self.config.use_prefill_budget or self.budget.affordable(1, 0) > 0

    def _begin_reservation(self, columns: RunningColumns, state: StepState) -> KvReservation | None:
        """This step's KV reservation over the running requests; None when switched off
        (the d_kv guard decides instead)."""
        if not self.config.use_kv_reservation:
            return None
        self.reservation.begin(
            columns.prompts, columns.produced, columns.caps,
            state.num_total_blocks, state.block_size,
            state.waiting.max_max_tokens if len(state.waiting) else 0,
        )  # fmt: skip
        return self.reservation

    def _footprint(self, request: Request, state: StepState) -> int:
        """Blocks ``request`` is predicted to hold when it finishes."""
        return math.ceil(
            (request.num_tokens + self.expected.remaining_of(request)) / state.block_size
        )

    def _fits_kv(
        self,
        request: Request,
        state: StepState,
        need: int,
        free: int,
        reservation: KvReservation | None,
        idle: bool,
    ) -> bool:
        """KV test of a candidate needing ``need`` blocks now: the reservation (any
        request on an idle server) and physical room, or the d_kv guard on its predicted
        final size when the reservation is off."""
        if reservation is None:
            return self.kv_guard.admits(free, self._footprint(request, state))
        return need <= free and (idle or reservation.admits(request))

    def _may_fit_kv(
        self, state: StepState, free: int, reservation: KvReservation | None, idle: bool
    ) -> bool:
        """False only when no waiting request could pass ``_fits_kv``: both tests are
        monotone in the request's size, so the queue's lower bounds decide them."""
        if reservation is None:
            minima = self.expected.queue_minima(state.waiting)
            return self.kv_guard.admits(free, math.ceil(minima.final_tokens / state.block_size))
        smallest = state.waiting.min_prompt_tokens / state.block_size
        return idle or reservation.admits_any(smallest)

    def _decode_attention_ms(
        self, columns: RunningColumns, prefilling_at: npt.NDArray[np.intp], num_decoding: int
    ) -> float:
        """The profile's decode attention term (ms) over the decoding requests' contexts; 0
        without one (no array is touched then)."""
        if not num_decoding or self._latency.profile.decode_attention_ms_per_kctx <= 0:
            return 0.0
        contexts = columns.computed
        if len(prefilling_at):
            contexts = np.delete(contexts, prefilling_at)
        # The contexts one by one only where the profile splits a padded batch by them.
        each = contexts.tolist() if self._latency.profile.decode_attention_peeled else None
        return self._latency.decode_attention_ms(
            num_decoding, int(contexts.sum()), int(contexts.max()), each
        )

    def _balance_floor(self, produced: npt.NDArray[np.int64]) -> float:
        """``window.balanced_batch`` for the admitted requests' mean prompt and the learned
        mean output. Before any request has finished, the running requests' mean output so
        far (``produced``) stands in for the mean output: each will produce at least that
        much, so the floor errs low. 0 before a request is admitted or a token produced."""
        if self._mean_prompt is None:
            return 0.0
        mean_output = self.expected.mean_output(self._mean_cap)
        if mean_output is None:
            # The sum of integers over their count: np.mean's value, at a fraction of its cost.
            mean_output = int(produced.sum()) / len(produced) if len(produced) else 0.0
            if mean_output < 1:
                return 0.0
        attention = self._latency.profile.decode_attention_ms_per_kctx
        return balanced_batch(self.config, attention, self._mean_prompt, mean_output)

    def _observe_mix(self, admitted: Sequence[Request]) -> None:
        weight = self.config.mix_ema
        for request in admitted:
            prompt, cap = float(request.num_prompt_tokens), float(request.max_tokens)
            if self._mean_prompt is None:
                self._mean_prompt, self._mean_cap = prompt, cap
            else:
                self._mean_prompt += weight * (prompt - self._mean_prompt)
                self._mean_cap += weight * (cap - self._mean_cap)

    def _calibrate(self, step_latency_s: float | None) -> None:
        if step_latency_s is None or not self._predicted_ms:
            return
        ratio = step_latency_s * 1000 / self._predicted_ms
        if ratio > 0 and self.config.use_tail_margin:
            # The prediction the plan made (at the calibration before this update) against
            # the target it was filled to.
            predicted_share = self._predicted_ms * self._calibration / self.window.reference_ms
            over = step_latency_s * 1000 > self.config.tpot_slo_ms
            self.tail.observe(over, self._predicted_decoding, predicted_share)
            self._follow_tail()
        self._calibration += self.config.base.ema_factor * (ratio - self._calibration)

    def _follow_tail(self) -> None:
        """Size the window (and so the budget's target) for the tail margin's fraction once
        it has moved ``RETARGET_STEP`` from the fraction the window was sized for."""
        fraction = self.tail.fraction
        if abs(fraction - self._window_fraction) > RETARGET_STEP * self._window_fraction:
            self._window_fraction = fraction
            self.window.retarget(replace(self.config, itl_target_fraction=fraction))

    def _budget_target_ms(self) -> float:
        """The latency the prefill budget fills a step to: the window's reference, the ITL
        target less the tail margin (``tail_margin``)."""
        return self.window.reference_ms

    def _candidates(
        self, state: StepState, budget: int, excluded: npt.NDArray[np.intp], backlog: float
    ) -> Iterator[Request]:
        """Waiting requests but ``excluded`` in rank order: TTFT-feasible ones by least slack
        then the rest in queue order (deadline ranking), or TWP's score order. ``backlog``:
        tokens the running requests still have to prefill."""
        cfg = self.config
        if cfg.use_deadline_ranking:
            per_step = budget if cfg.use_prefill_budget else cfg.min_prefill_tokens
            return deadline_order(
                state.waiting, state.now_s, cfg.ttft_slo_ms / 1000, cfg.itl_target_ms / 1000,
                per_step, excluded, backlog if cfg.use_deferral else None, self._deferrals,
                cfg.ttft_aim_s,
            )  # fmt: skip
        running = state.running
        mean_remaining = (
            float(self.expected.running_remaining(running).sum()) / len(running) if running else 0.0
        )
        return ranked(
            state.waiting, state.now_s, state.step_index, mean_remaining, cfg.base, excluded,
            self.expected.queue_totals(state.waiting), self._ranked_head,
        )  # fmt: skip

    def use_profile(self, profile: EngineProfile) -> None:
        """Plan from ``profile``'s l_min, alpha and prefill costs from the next step on: the
        window's nominal size, the prefill budget and the step predictions follow them."""
        cfg = self.config
        self.config = replace(
            cfg,
            base=replace(cfg.base, l_min_ms=profile.l_min_ms),
            alpha_ms=profile.alpha_ms,
            prefill_ms_per_token=profile.prefill_ms_per_token,
            mixed_prefill_overhead_ms=profile.mixed_prefill_overhead_ms,
        )
        self.window.retarget(replace(self.config, itl_target_fraction=self._window_fraction))
        self._latency.profile = replace(
            self._latency.profile,
            l_min_ms=profile.l_min_ms,
            alpha_ms=profile.alpha_ms,
            prefill_ms_per_token=profile.prefill_ms_per_token,
            mixed_prefill_overhead_ms=profile.mixed_prefill_overhead_ms,
        )

    def expected_output(self, request: Request) -> float | None:
        """Read-only: the output tokens this policy expects ``request`` to generate (its
        learned estimate), or None before it has seen a request finish."""
        if not self.expected.estimator.num_observed:
            return None
        return self.expected.remaining_of(request)

    def window_state(
        self, running: Sequence[Request], waiting: WaitingQueue, now_s: float | None = None
    ) -> WindowState:
        """Read-only: the request window W_t (its admission capacity), the running and
        waiting counts and the prefill backlog at the profile's per-token cost, for the
        pool's router and autoscaler. With ``now_s`` and the deadline ranking, the waiting
        requests ahead of a fresh arrival are those the ranking still finds able to meet
        the TTFT objective (``deadline.ttft_slack_s`` at the last step's budget): the rest
        are served after it."""
        cfg = self.config
        reserved = self.reservation.reserved_blocks + self.reservation.margin_blocks
        ahead = None
        if now_s is not None and cfg.use_deadline_ranking and len(waiting):
            ahead = self._ttft_slack(waiting.arrival_s, waiting.num_prompt_tokens, now_s) >= 0
        return request_window_state(
            float(self.window.capacity()), self.window.smoothed_itl_ms or self.window.reference_ms,
            self.expected, running, waiting,
            reserved if cfg.use_kv_reservation else 0.0,
            self._latency.profile.prefill_ms_per_token, ahead,
        )  # fmt: skip

    @property
    def plans_step_tokens(self) -> bool:
        """Each plan's token counts are binding: the step's prefill is what the budget (or,
        with it off, the fixed chunk) paid for (``engine.vllm.step_tokens``)."""
        return True

    def telemetry(self) -> Mapping[str, float]:
        return {
            "request_window": self.window.window,
            "target_window": self.window.target,
            "balance_floor": self.window.floor,
            "smoothed_itl_ms": self.window.smoothed_itl_ms or 0.0,
            "slowdown": self.window.slowdown,
            "prefill_budget": self._budget,
            "latency_calibration": self._calibration,
            "itl_target_fraction": self._window_fraction,
            "budget_target_ms": self._budget_target_ms(),
            "kv_threshold_blocks": self.kv_guard.threshold_blocks,
            "num_forced": float(self._num_forced),
            **self.reservation.telemetry(),
            **self.expected.telemetry(),
        }


ABLATIONS: dict[str, dict[str, Any]] = {
    "twp_slo": {},
    "twp_slo-no_itl_target": {"use_itl_target": False},
    "twp_slo-no_deadline": {"use_deadline_ranking": False},
    "twp_slo-no_prefill_budget": {"use_prefill_budget": False},
    "twp_slo-no_profile_window": {"use_profile_window": False},
    "twp_slo-no_output_estimate": {"use_output_estimate": False},
    "twp_slo-no_kv_reservation": {"use_kv_reservation": False},
    "twp_slo-no_deferral": {"use_deferral": False},
    "twp_slo-no_late_yield": {"use_late_yield": False},
    "twp_slo-no_balance_floor": {"use_balance_floor": False},
    "twp_slo-unbounded_forced": {"max_forced_share": 1.0},
    "twp_slo-no_tail_margin": {"use_tail_margin": False},
}
# The aim ``twp_slo-ttft_aim`` runs: 0.7 of the TTFT objective (docs/architecture.md has
# the trade-off over 0.5-0.9).
TTFT_AIM_FRACTION = 0.7
# Opt-in changes, off in ``twp_slo`` itself: each variant switches one on.
OPT_INS: dict[str, dict[str, Any]] = {
    "twp_slo-early_reject": {"early_reject": True},
    "twp_slo-ttft_aim": {"ttft_aim_fraction": TTFT_AIM_FRACTION},
}


def _register(name: str, switches: dict[str, Any]) -> None:
    @POLICIES.register(name)
    def _make(profile: EngineProfile, slo: Slo) -> Policy:
        config = replace(TwpSloConfig.from_profile(profile, slo), **switches)
        return TwpSloPolicy(config, profile, name)


for _name, _switches in {**ABLATIONS, **OPT_INS}.items():
    _register(_name, _switches)
