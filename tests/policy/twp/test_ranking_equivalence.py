"""The lazy ranking and the skipped ranking decide exactly as scoring and sorting the whole
queue every step does: a straightforward reference (the paper's rank, a stable full sort,
then the gate) is kept here and compared on snapshots full of ties."""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import request, running, state
from tests.policy.snapshots import Snapshot, build, snapshots, telemetry_with_forecast
from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.core.running import RunningColumns
from tokenpace.core.step import StepPlan, StepState
from tokenpace.policy.common import schedule_tokens
from tokenpace.policy.twp import prompt_scan, ranking
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.gate import GateOutcome, may_admit_any, run_gate
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard
from tokenpace.policy.twp.policy import TwpPolicy


def reference_scores(
    waiting: WaitingQueue,
    now_s: float,
    step_index: int,
    mean_remaining: float,
    cfg: TwpConfig,
    expected: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.float64]:
    """w1 min(1, waited / T_max) + w2 exp(-|L - rbar| / (rbar + 1)) + w3 fairness/max,
    L being ``expected`` (default max_tokens)."""
    output = waiting.max_tokens if expected is None else expected
    starvation = np.minimum(1.0, (step_index - waiting.enqueued_step) / cfg.t_max_steps)
    balance = np.exp(-np.abs(output - mean_remaining) / (mean_remaining + 1.0))
    per_size = (now_s - waiting.arrival_s) / (waiting.num_prompt_tokens + output)
    top = float(per_size.max())
    fairness = per_size / top if top > 0 else np.zeros_like(per_size)
    scores: npt.NDArray[np.float64] = (
        cfg.w_starvation * starvation + cfg.w_balance * balance + cfg.w_fairness * fairness
    )
    return scores


def scan_path(name: str) -> contextlib.ExitStack:
    """Force ``ranked`` down one path whatever the queue's length: "size" (read in size
    order, slices of 3) or "handover" (one slice, then the whole-queue bound); "bound" leaves
    the configured choice (the whole-queue bound below 2,048 waiting)."""
    stack = contextlib.ExitStack()
    if name != "bound":
        stack.enter_context(mock.patch.object(ranking, "_PROMPT_SCAN_MIN", 0))
        stack.enter_context(mock.patch.object(prompt_scan, "SLICE", 3))
        slices = 1 if name == "handover" else 10**9
        stack.enter_context(mock.patch.object(prompt_scan, "MAX_SLICES", slices))
    return stack


# Loaded (compiled, or read from numba's cache) once, outside hypothesis's timed examples;
# None where numba's exp is not numpy's (then every ranking runs in numpy).
COMPILED_HEAD = ranking.compiled_head()


def head_of(compiled: bool) -> ranking.RankedHead | None:
    """The compiled size-order scan, or None for the numpy one."""
    return COMPILED_HEAD if compiled else None


def learned(waiting: WaitingQueue) -> npt.NDArray[np.float64]:
    """Stand-in learned expected outputs: below the budget, not in its order."""
    return ((waiting.max_tokens % 7) * 3.5 + 1.0).astype(np.float64)


class ReferenceTwp(TwpPolicy):
    """TWP scoring every waiting request and sorting them all, every step."""

    def plan(self, state: StepState) -> StepPlan:
        cfg = self.config
        self.kv_guard.update(state.num_total_blocks - state.num_free_blocks, state.num_total_blocks)
        window = self.window.update(state.last_step_latency_s, len(state.waiting))
        self.expected.observe(state.running, state.step_index)
        remaining = self.expected.running_remaining(state.running)
        load = float(remaining.sum())
        reservation = self._begin_reservation(RunningColumns.of(state.running), state)
        outcome = GateOutcome(token_load=load, num_free_blocks=state.num_free_blocks)
        forced_ids: list[int] = []
        waiting = state.waiting
        if len(waiting):
            mean = load / len(remaining) if len(remaining) else 0.0
            expected = self.expected.queue_totals(waiting)
            scores = reference_scores(waiting, state.now_s, state.step_index, mean, cfg, expected)
            forced = np.flatnonzero(state.step_index - waiting.enqueued_step >= cfg.t_max_steps)
            for request in waiting.iter_at(forced):
                need = state.blocks_for(request.num_tokens)
                expected_left = self.expected.remaining_of(request)
                idle = load == 0 and not outcome.admitted
                if need > outcome.num_free_blocks or not (
                    reservation is None or idle or reservation.admits(request)
                ):
                    break
                outcome.admitted.append(request)
                outcome.token_load += expected_left
                outcome.num_free_blocks -= need
                if reservation is not None:
                    reservation.add(request)
                forced_ids.append(request.request_id)
            skip = set(forced.tolist())
            order = [int(i) for i in np.argsort(-scores, kind="stable") if i not in skip]
            run_gate(
                waiting.iter_at(order), outcome, window, self.kv_guard, state.block_size,
                self.expected.remaining_of, reservation,
            )  # fmt: skip
        self.expected.admitted(outcome.admitted)
        self._token_load = outcome.token_load
        self._num_forced = len(forced_ids)
        return StepPlan(
            admit_ids=tuple(r.request_id for r in outcome.admitted),
            num_scheduled_tokens=schedule_tokens(
                [*state.running, *outcome.admitted], cfg.chunk_tokens
            ),
            forced_ids=frozenset(forced_ids),
        )


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(snapshots(), min_size=1, max_size=3),
    t_max=st.sampled_from([100, 1000]),
    share=st.sampled_from([0.0, 0.25, 1.0]),
    path=st.sampled_from(["bound", "size", "handover"]),
    compiled=st.booleans(),
)
def test_twp_plans_like_the_full_sort(
    steps: list[Snapshot], t_max: int, share: float, path: str, compiled: bool
) -> None:
    # share 0 scores everyone in the first round, 1 never does: both paths are covered.
    cfg = TwpConfig(t_max_steps=t_max, compiled_ranking=compiled)
    fast, reference = TwpPolicy(cfg), ReferenceTwp(cfg)
    with (
        mock.patch.object(ranking, "_MAX_CONTENDER_SHARE", share),
        mock.patch.object(ranking, "_HEAD_LIMIT", 2),
        scan_path(path),
    ):
        for snapshot in steps:
            state = build(snapshot)
            got, want = fast.plan(state), reference.plan(state)
            assert got == want
            assert telemetry_with_forecast(fast) == telemetry_with_forecast(reference)


@settings(max_examples=150, deadline=None)
@given(
    snapshot=snapshots(max_waiting=120),
    mean_remaining=st.sampled_from([0.0, 1.0, 19.5, 50.0, 125.3, 1000.0]),
    share=st.sampled_from([0.0, 1.0]),
    path=st.sampled_from(["bound", "size", "handover"]),
    estimated=st.booleans(),
    compiled=st.booleans(),
    limit=st.sampled_from([1, 3, 32]),
    data=st.data(),
)
def test_ranked_yields_the_stable_sort_of_every_score(
    snapshot: Snapshot,
    mean_remaining: float,
    share: float,
    path: str,
    estimated: bool,
    compiled: bool,
    limit: int,
    data: st.DataObject,
) -> None:
    state = build(snapshot)
    waiting = state.waiting
    n = len(waiting)
    excluded = np.array(
        sorted(data.draw(st.sets(st.integers(0, max(0, n - 1)), max_size=n // 2))) if n else [],
        dtype=np.intp,
    )
    cfg = TwpConfig()
    expected = learned(waiting) if estimated else None
    scores = (
        reference_scores(waiting, state.now_s, state.step_index, mean_remaining, cfg, expected)
        if n
        else np.empty(0)
    )
    skip = set(excluded.tolist())
    want = [int(i) for i in np.argsort(-scores, kind="stable") if i not in skip]
    with (
        mock.patch.object(ranking, "_MAX_CONTENDER_SHARE", share),
        mock.patch.object(ranking, "_HEAD_LIMIT", limit),
        scan_path(path),
    ):
        got = ranking.ranked(
            waiting, state.now_s, state.step_index, mean_remaining, cfg, excluded, expected,
            head_of(compiled),
        )  # fmt: skip
        assert [r.request_id for r in got] == [waiting[i].request_id for i in want]


def random_queue(size: int, rng: np.random.Generator, max_enqueued_step: int) -> WaitingQueue:
    """``size`` requests arriving 1 ms apart, prompts 30-512 tokens, max_tokens 20/50/200,
    each entered the queue at a step below ``max_enqueued_step``."""
    queue = WaitingQueue()
    for i in range(size):
        r = Request(i, int(rng.integers(30, 513)), int(rng.choice([20, 50, 200])), i * 1e-3)
        r.enqueued_step = int(rng.integers(0, max_enqueued_step))
        queue.append(r)
    return queue


def test_a_large_queue_ranks_like_the_full_sort() -> None:
    # 5,000 requests: the round path with few contenders per round, as at scale.
    queue = random_queue(5000, np.random.default_rng(7), 60)
    cfg = TwpConfig()
    for mean in (3.0, 125.0):
        for expected in (None, learned(queue)):
            scores = reference_scores(queue, 20.0, 60, mean, cfg, expected)
            want = np.argsort(-scores, kind="stable")[:300].tolist()
            none = np.empty(0, dtype=np.intp)
            for path, head in (("bound", None), ("size", None), ("size", COMPILED_HEAD)):
                with scan_path(path):
                    got = ranking.ranked(queue, 20.0, 60, mean, cfg, none, expected, head)
                    assert [next(got).request_id for _ in range(300)] == want
            # The configured scan (2,048 waiting or more read in size order, slices of 128).
            for head in (None, COMPILED_HEAD):
                got = ranking.ranked(queue, 20.0, 60, mean, cfg, none, expected, head)
                assert [next(got).request_id for _ in range(300)] == want


def test_a_preempted_request_with_little_budget_left_keeps_the_gate_open() -> None:
    # Window ~400 tokens, K = 390: only a budget of <= 10 tokens fits. The preempted request
    # (max_tokens 200, 195 already streamed) fits; judging by max_tokens would skip it.
    busy = [running(100 + i, prompt=10, max_tokens=200, produced=5) for i in range(2)]
    preempted = request(0, max_tokens=200, arrival_s=0.0)
    preempted.token_times_s = [0.0] * 195
    preempted.output_token_ids = [0] * 195
    fresh = request(1, max_tokens=200, arrival_s=0.5)
    for policy in (TwpPolicy(TwpConfig()), ReferenceTwp(TwpConfig())):
        plan = policy.plan(state([preempted, fresh], busy, now_s=1.0, latency_s=0.043))
        assert plan.admit_ids == (0,)


def test_may_admit_any_decides_on_the_queue_minima() -> None:
    guard = KvHeadroomGuard(TwpConfig())
    guard.update(0, 10_000)  # d_kv = 200 blocks
    small, big = request(0, prompt=16, max_tokens=16), request(1, prompt=600, max_tokens=400)
    queue = state([big, small]).waiting
    busy = GateOutcome(token_load=90.0, num_free_blocks=10_000)
    assert may_admit_any(queue, busy, 106.0, guard, 16)  # 90 + 16 fits
    assert not may_admit_any(queue, busy, 105.0, guard, 16)
    # Idle: the head passes the window whatever its budget; only KV can refuse it.
    assert may_admit_any(queue, GateOutcome(num_free_blocks=10_000), 1.0, guard, 16)
    assert may_admit_any(queue, GateOutcome(num_free_blocks=203), 1.0, guard, 16)  # 2 blocks
    assert not may_admit_any(queue, GateOutcome(num_free_blocks=202), 1.0, guard, 16)
