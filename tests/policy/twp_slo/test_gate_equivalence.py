"""twp_slo decides exactly as keying and sorting the whole queue every step does, also when
it skips the ranking because the gate cannot admit anyone: the straightforward reference is
kept here and compared, for the policy and each ablation, on snapshots full of ties."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import request, state
from tests.policy.snapshots import Snapshot, build, snapshots, telemetry_with_forecast
from tests.policy.twp.test_ranking_equivalence import reference_scores
from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.core.running import RunningColumns
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.twp_slo.config import TwpSloConfig
from tokenpace.policy.twp_slo.deadline import DeferralLoop, compiled_deferrals, deadline_order
from tokenpace.policy.twp_slo.policy import ABLATIONS, OPT_INS, TwpSloPolicy

# The ablations and the opt-ins the reference carries out (not early rejection).
VARIANTS = {**ABLATIONS, "twp_slo-ttft_aim": OPT_INS["twp_slo-ttft_aim"]}


def reference_keys(
    waiting: WaitingQueue, now_s: float, ttft_s: float, step_s: float, per_step: float
) -> npt.NDArray[np.float64]:
    """Feasible (slack >= 0): 1e12 - slack - max_tokens 1e-9; infeasible: -position."""
    steps = np.ceil(waiting.num_prompt_tokens / max(1.0, per_step))
    slack = ttft_s - (now_s - waiting.arrival_s) - steps * step_s
    feasible = 1e12 - slack - waiting.max_tokens * 1e-9
    keys: npt.NDArray[np.float64] = np.where(
        slack >= 0, feasible, -np.arange(len(slack), dtype=np.float64)
    )
    return keys


def reference_deferral_keys(
    waiting: WaitingQueue,
    now_s: float,
    ttft_s: float,
    step_s: float,
    per_step: float,
    backlog: float,
    excluded: set[int],
    aim_s: float | None = None,
) -> npt.NDArray[np.float64]:
    """Moore-Hodgson written out: feasible requests in (arrival, position) order, the on-time
    ones first (3e12 - rank), then the deferred (2e12 - rank), then the rest (-position);
    each time the newest is late, the largest prompt kept (the latest among equals) goes.
    With ``aim_s`` below the objective, when a request not excluded is infeasible or one is
    deferred, the requests kept by the same walk over those feasible within ``aim_s``,
    against that deadline, go before all (4e12 - rank)."""
    n = len(waiting)
    prompts = waiting.num_prompt_tokens
    arrivals = waiting.arrival_s
    steps = np.ceil(prompts / max(1.0, per_step))
    slack = ttft_s - (now_s - arrivals) - steps * step_s
    feasible = [i for i in range(n) if slack[i] >= 0 and i not in excluded]
    order = sorted(feasible, key=lambda i: (float(arrivals[i]), i))

    def late_ones(candidates: list[int], deadline_s: float) -> set[int]:
        kept: list[int] = []
        late: set[int] = set()
        for i in candidates:
            kept.append(i)
            if deadline_s > 1e10:
                continue
            total = backlog + sum(int(prompts[j]) for j in kept)
            if np.ceil(total / max(1.0, per_step)) * step_s > deadline_s - (now_s - arrivals[i]):
                worst = max(kept, key=lambda j: (int(prompts[j]), order.index(j)))
                kept.remove(worst)
                late.add(worst)
        return late

    late = late_ones(order, ttft_s)
    first: set[int] = set()
    overloaded = bool(late) or len(feasible) < n - len(excluded)
    if aim_s is not None and aim_s < ttft_s and overloaded:
        within = [i for i in order if slack[i] >= ttft_s - aim_s]
        first = set(within) - late_ones(within, aim_s)
    keys = -np.arange(n, dtype=np.float64)
    for rank, i in enumerate(order):
        keys[i] = (4e12 if i in first else 2e12 if i in late else 3e12) - rank
    return keys


class ReferenceTwpSlo(TwpSloPolicy):
    """twp_slo keying every waiting request and sorting them all, every step."""

    def __init__(self, config: TwpSloConfig, profile: EngineProfile) -> None:
        super().__init__(config, profile)
        self.still_forced: set[int] = set()

    def plan(self, state: StepState) -> StepPlan:
        cfg = self.config
        self.kv_guard.update(state.num_total_blocks - state.num_free_blocks, state.num_total_blocks)
        if cfg.use_balance_floor:
            produced = [r.num_output_tokens for r in state.running]
            self.window.set_floor(self._balance_floor(np.array(produced, dtype=np.int64)))
        self._calibrate(state.last_step_latency_s)
        self.window.update(state.last_step_latency_s)
        self.expected.observe(state.running, state.step_index)
        capacity = self.window.capacity()
        prefilling = [r for r in state.running if r.num_output_tokens == 0 or r.is_prefilling]
        num_decoding = len(state.running) - len(prefilling)
        budget = self.prefill_budget(num_decoding)
        if cfg.use_prefill_budget:
            self.budget.open(num_decoding, self._budget_target_ms(), self._calibration)
        self._budget = float(budget)
        scheduled = {r.request_id: 1 for r in state.running if r not in prefilling}
        chunks: list[tuple[int, int]] = []
        late = self._late_prefills(prefilling, state)

        def grant(requests: list[Request]) -> None:
            for r in requests:
                tokens = self._chunk(r)
                if tokens:
                    scheduled[r.request_id] = tokens
                    chunks.append((tokens, r.num_computed_tokens))

        grant([r for r in prefilling if all(r is not x for x in late)])
        reservation = self._begin_reservation(RunningColumns.of(state.running), state)
        admitted: list[Request] = []
        forced: list[int] = []
        free = state.num_free_blocks
        waiting = state.waiting
        # Force-admitted requests running ever since hold at most max_forced_share of the
        # window's slots (at least one).
        self.still_forced = {r.request_id for r in state.running} & self.still_forced
        forced_slots = len(waiting)
        if cfg.max_forced_share < 1:
            forced_slots = max(1, math.floor(cfg.max_forced_share * capacity))
        if len(waiting):
            waited = state.step_index - waiting.enqueued_step
            forced_positions = np.flatnonzero(waited >= cfg.max_wait_steps)
            for request in waiting.iter_at(forced_positions):
                need = state.blocks_for(request.num_tokens)
                idle = not state.running and not admitted
                if (
                    len(self.still_forced) + len(forced) >= forced_slots
                    or need > free
                    or not (reservation is None or idle or reservation.admits(request))
                ):
                    break
                # Priced only once admitted: one left waiting spends no budget.
                tokens = self._chunk(request)
                if not tokens:
                    break
                free -= need
                admitted.append(request)
                forced.append(request.request_id)
                if reservation is not None:
                    reservation.add(request)
                scheduled[request.request_id] = tokens
                chunks.append((tokens, request.num_computed_tokens))
            self.still_forced |= set(forced)
            # Starving requests not force-admitted rank with the rest.
            skip = set(forced_positions[: len(forced)].tolist())
            keys = self._reference_keys(state, budget, skip, late)
            order = [int(i) for i in np.argsort(-keys, kind="stable") if i not in skip]
            for request in waiting.iter_at(order):
                if late and self._is_late(request, request.num_prompt_tokens, state):
                    grant(late)
                    late = []
                need = state.blocks_for(request.num_tokens)
                has_room = len(state.running) + len(admitted) < capacity
                idle = not state.running and not admitted
                fits = self._fits_kv(request, state, need, free, reservation, idle)
                if not (has_room and fits):
                    break
                tokens = self._chunk(request)
                if not tokens:
                    break
                free -= need
                admitted.append(request)
                if reservation is not None:
                    reservation.add(request)
                scheduled[request.request_id] = tokens
                chunks.append((tokens, request.num_computed_tokens))
        grant(late)
        self.expected.admitted(admitted)
        self._observe_mix(admitted)
        self._num_forced = len(forced)
        self._predicted_ms = self._reference_predict_ms(num_decoding, chunks)
        self._predicted_decoding = num_decoding
        return StepPlan(
            admit_ids=tuple(r.request_id for r in admitted),
            num_scheduled_tokens=scheduled,
            forced_ids=frozenset(forced),
        )

    def _reference_keys(
        self, state: StepState, budget: int, excluded: set[int], late: list[Request]
    ) -> npt.NDArray[np.float64]:
        cfg = self.config
        if cfg.use_deadline_ranking:
            per_step = budget if cfg.use_prefill_budget else cfg.min_prefill_tokens
            args = (state.waiting, state.now_s, cfg.ttft_slo_ms / 1000, cfg.itl_target_ms / 1000)
            if cfg.use_deferral:
                backlog = sum(
                    r.num_uncomputed_tokens
                    for r in state.running
                    if r.is_prefilling and all(r is not x for x in late)
                )
                return reference_deferral_keys(
                    *args, per_step, float(backlog), excluded, cfg.ttft_aim_s
                )
            return reference_keys(*args, per_step)
        running = state.running
        remaining = self.expected.running_remaining(running)
        mean = float(remaining.sum()) / len(running) if running else 0.0
        expected = self.expected.queue_totals(state.waiting)
        return reference_scores(
            state.waiting, state.now_s, state.step_index, mean, cfg.base, expected
        )

    def _reference_predict_ms(self, num_decoding: int, chunks: list[tuple[int, int]]) -> float:
        prefill_ms = sum(self.budget.cost_ms(t, c) for t, c in chunks)
        prefill_ms += self._latency.chunks_overhead_ms(len(chunks))
        ms = self._latency.decode_ms(num_decoding) + prefill_ms
        if prefill_ms and num_decoding:
            ms += self.config.mixed_prefill_overhead_ms
        return ms


@settings(max_examples=120, deadline=None)
@given(
    steps=st.lists(snapshots(), min_size=1, max_size=3),
    ablation=st.sampled_from(sorted(VARIANTS)),
    ttft_ms=st.sampled_from([500.0, 2000.0, 20_000.0, 1e12, 1e14]),
    max_wait_steps=st.sampled_from([100, 600]),
)
def test_twp_slo_plans_like_the_full_sort(
    steps: list[Snapshot], ablation: str, ttft_ms: float, max_wait_steps: int
) -> None:
    profile = load_profile("v100-llama-3.2-3b")
    switches: dict[str, Any] = VARIANTS[ablation]
    cfg = replace(
        TwpSloConfig.from_profile(profile, Slo(ttft_ms, 100.0)),
        max_wait_steps=max_wait_steps,
        **switches,
    )
    fast, reference = TwpSloPolicy(cfg, profile), ReferenceTwpSlo(cfg, profile)
    for snapshot in steps:
        state = build(snapshot)
        got, want = fast.plan(state), reference.plan(state)
        assert got == want
        assert telemetry_with_forecast(fast) == telemetry_with_forecast(reference)


def test_one_token_of_budget_left_still_admits() -> None:
    profile = load_profile("v100-llama-3.2-3b")
    cfg = TwpSloConfig.from_profile(profile, Slo(2000.0, 100.0))
    for policy in (TwpSloPolicy(cfg, profile), ReferenceTwpSlo(cfg, profile)):
        budget = policy.prefill_budget(0)
        prefilling = Request(100, budget + 9, 50, 0.0)
        prefilling.num_computed_tokens = 10  # budget - 1 tokens left to prefill
        plan = policy.plan(state([request(0, prompt=40)], [prefilling], now_s=0.5))
        assert plan.admit_ids == (0,)
        assert plan.num_scheduled_tokens == {100: budget - 1, 0: 1}


@settings(max_examples=150, deadline=None)
@given(
    snapshot=snapshots(max_waiting=120),
    ttft_s=st.sampled_from([0.0, 0.5, 2.0, 3.0, 1e9, 1e11, 1e13]),
    step_s=st.sampled_from([0.0, 0.08, 1.0]),
    per_step=st.sampled_from([0.5, 16.0, 64.0, 2048.0]),
    data=st.data(),
)
def test_deadline_order_is_the_stable_sort_of_every_key(
    snapshot: Snapshot, ttft_s: float, step_s: float, per_step: float, data: st.DataObject
) -> None:
    state = build(snapshot)
    waiting = state.waiting
    n = len(waiting)
    excluded = sorted(data.draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n // 2)))
    # Arrivals after now_s too (clock skew), so some slack exceeds the objective.
    now_s = state.now_s - data.draw(st.sampled_from([0.0, 2.5, 1e12]))
    keys = reference_keys(waiting, now_s, ttft_s, step_s, per_step) if n else np.empty(0)
    skip = set(excluded)
    want = [int(i) for i in np.argsort(-keys, kind="stable") if i not in skip]
    got = deadline_order(
        waiting, now_s, ttft_s, step_s, per_step, np.array(excluded, dtype=np.intp)
    )
    assert [r.request_id for r in got] == [waiting[i].request_id for i in want]


def test_a_key_below_the_infeasible_ones_falls_back_to_the_full_sort() -> None:
    # Request 1 "arrives" 2e12 s after now: its slack exceeds 1e12, so its key is negative
    # and ranks below request 0, which waited past the objective (key -0).
    late = request(0, arrival_s=0.0)
    future = request(1, arrival_s=2e12)
    waiting = state([late, future]).waiting
    got = deadline_order(waiting, 100.0, 2.0, 0.08, 64.0, np.empty(0, dtype=np.intp))
    assert [r.request_id for r in got] == [0, 1]
    keys = reference_keys(waiting, 100.0, 2.0, 0.08, 64.0)
    assert keys[1] < keys[0]


# Loaded (compiled, or read from numba's cache) once, outside hypothesis's timed examples.
COMPILED_WALK = compiled_deferrals()


def _walk(compiled: bool) -> DeferralLoop | None:
    """Moore-Hodgson's walk compiled (numba is a dependency: never absent here), or None
    for the Python walk."""
    if not compiled:
        return None
    assert COMPILED_WALK is not None
    return COMPILED_WALK


@pytest.mark.parametrize("compiled", [False, True])
@settings(max_examples=150, deadline=None)
@given(
    snapshot=snapshots(max_waiting=120),
    ttft_s=st.sampled_from([0.5, 2.0, 3.0, 1e11]),
    step_s=st.sampled_from([0.0, 0.08, 1.0]),
    per_step=st.sampled_from([0.5, 16.0, 64.0, 2048.0]),
    backlog=st.sampled_from([0.0, 100.0, 5000.0]),
    aim=st.sampled_from([None, 0.3, 0.7, 1.0]),
    data=st.data(),
)
def test_deferral_order_is_moore_hodgson(
    snapshot: Snapshot,
    ttft_s: float,
    step_s: float,
    per_step: float,
    backlog: float,
    aim: float | None,
    data: st.DataObject,
    compiled: bool,
) -> None:
    aim_s = None if aim is None else aim * ttft_s
    state = build(snapshot)
    waiting = state.waiting
    n = len(waiting)
    excluded = sorted(data.draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n // 2)))
    skip = set(excluded)
    keys = (
        reference_deferral_keys(
            waiting, state.now_s, ttft_s, step_s, per_step, backlog, skip, aim_s
        )
        if n
        else np.empty(0)
    )
    want = [int(i) for i in np.argsort(-keys, kind="stable") if i not in skip]
    got = deadline_order(
        waiting, state.now_s, ttft_s, step_s, per_step, np.array(excluded, dtype=np.intp),
        backlog, _walk(compiled), aim_s,
    )  # fmt: skip
    assert [r.request_id for r in got] == [waiting[i].request_id for i in want]


def test_a_long_prompt_that_would_make_two_short_ones_late_is_deferred() -> None:
    # 100 tokens per 0.1 s step, objective 1 s: the 900-token prompt arrived first, but
    # serving it first (9 steps) would make both 50-token requests late; deferring it
    # meets two deadlines instead of one.
    long, short_a, short_b = request(0, prompt=900), request(1, prompt=50), request(2, prompt=50)
    long.arrival_s, short_a.arrival_s, short_b.arrival_s = 0.0, 0.01, 0.02
    waiting = state([long, short_a, short_b]).waiting
    got = deadline_order(waiting, 0.05, 1.0, 0.1, 100.0, np.empty(0, dtype=np.intp), 0.0)
    assert [r.request_id for r in got] == [1, 2, 0]
    # By least slack alone the long prompt goes first.
    plain = deadline_order(waiting, 0.05, 1.0, 0.1, 100.0, np.empty(0, dtype=np.intp))
    assert next(r.request_id for r in plain) == 0


def _heap_moore_hodgson(
    prompts: list[int], deadlines: list[float], backlog: float, per_step: float, step_s: float
) -> list[int]:
    """Moore and Hodgson's rule, one heap push (and pop when late) per request: the ranks
    deferred, in deadline order."""
    import heapq
    import math

    chosen: list[tuple[int, int]] = []
    deferred = []
    total = backlog
    for rank, prompt in enumerate(prompts):
        heapq.heappush(chosen, (-prompt, -rank))
        total += prompt
        if math.ceil(total / per_step) * step_s > deadlines[rank]:
            longest, latest = heapq.heappop(chosen)
            total += longest
            deferred.append(-latest)
    return sorted(deferred)


@pytest.mark.parametrize("compiled", [False, True])
@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    size=st.sampled_from([50, 600, 3000]),
    spread_s=st.sampled_from([0.0, 0.5, 1.9]),
    per_step=st.sampled_from([16.0, 200.0]),
    backlog=st.sampled_from([0.0, 3000.0]),
)
def test_a_burst_defers_as_one_heap_operation_per_request_would(
    seed: int, size: int, spread_s: float, per_step: float, backlog: float, compiled: bool
) -> None:
    # Thousands of requests arriving within the objective, far more prefill than it allows:
    # the runs of deferrals are skipped over with array tests, and must defer the same.
    from tokenpace.policy.twp_slo.deadline import moore_hodgson

    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, spread_s, size)) if spread_s else np.zeros(size)
    prompts = rng.choice([30, 64, 64, 200, 512], size) if seed % 2 else rng.integers(1, 900, size)
    waiting = WaitingQueue()
    for i in range(size):
        waiting.append(request(i, prompt=int(prompts[i]), arrival_s=float(arrivals[i])))
    now_s, ttft_s, step_s = 2.0, 2.0, 0.09
    feasible = np.arange(size, dtype=np.intp)
    on_time, deferred = moore_hodgson(
        waiting, feasible, now_s, ttft_s, step_s, per_step, backlog, _walk(compiled)
    )
    deadlines = [ttft_s - (now_s - float(a)) for a in arrivals]
    want = _heap_moore_hodgson([int(p) for p in prompts], deadlines, backlog, per_step, step_s)
    assert deferred.tolist() == want
    assert on_time.tolist() == [i for i in range(size) if i not in set(want)]
