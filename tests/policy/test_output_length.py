"""Output lengths learned from finished requests: Kaplan-Meier with censoring, the max_tokens
fallback and cap, and the error report."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from tests.helpers import running
from tokenpace.core.request import FinishReason, Request, RequestStatus
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import build_policy
from tokenpace.policy.output_length import (
    OutputLengthConfig,
    OutputLengthEstimator,
    SurvivalCurve,
)
from tokenpace.policy.twp.policy import TwpPolicy
from tokenpace.policy.twp_slo.policy import TwpSloPolicy
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec


def ints(*values: int) -> np.ndarray:  # type: ignore[type-arg]
    return np.array(values, dtype=np.int64)


def finish(r: Request, length: int) -> None:
    r.token_times_s = [0.0] * length
    r.status = RequestStatus.FINISHED
    r.finish_reason = FinishReason.STOP


def test_kaplan_meier_gives_the_conditional_means_of_the_mix() -> None:
    # 20/50/200 tokens with probabilities 0.5/0.3/0.2: mean 65; a request past 20 tokens is
    # a 50 (0.6) or a 200 (0.4): 110 in all, 90 more.
    curve = SurvivalCurve.fit(ints(*[20] * 50, *[50] * 30, *[200] * 20), ints())
    got = curve.remaining(ints(0, 19, 20, 50, 199), ints(200, 200, 200, 200, 200))
    assert got == pytest.approx([65, 46, 90, 150, 1])
    # A tighter cap truncates: E[min(L, 100)] = 0.5 * 20 + 0.3 * 50 + 0.2 * 100 = 45.
    assert curve.remaining(ints(0), ints(100)) == pytest.approx([45])


@pytest.mark.parametrize("extrapolate", [True, False])
def test_still_running_sums_to_the_expected_remaining_output(extrapolate: bool) -> None:
    # E[min(L, m) - o | L > o] is the sum over t of P(still running t tokens from now).
    curve = SurvivalCurve.fit(ints(*[20] * 50, *[50] * 30, *[200] * 20), ints(120), extrapolate)
    produced, caps = ints(0, 19, 20, 50, 130, 150), ints(200, 200, 200, 300, 400, 160)
    offsets = np.arange(400, dtype=np.int64)
    still = curve.still_running(produced, caps, offsets)
    assert np.all(np.diff(still, axis=1) <= 0) and np.all((still >= 0) & (still <= 1))
    assert still.sum(axis=1) == pytest.approx(curve.remaining(produced, caps))
    # Of the 51 requests past 20 tokens (one censored at 120), 30 finished at 50.
    assert still[2, 40] == pytest.approx(21 / 51)
    assert still[5, 10] == 0  # its cap


def test_estimator_still_running_blends_buckets_as_its_means() -> None:
    estimator = OutputLengthEstimator(OutputLengthConfig(bucket_edges=(256,), prior_weight=4))
    offsets = np.arange(200, dtype=np.int64)
    fallback = estimator.still_running(ints(100), ints(0), ints(150), offsets).dense()
    assert fallback.sum() == 150  # the budget: running until the cap
    batch = [running(i, 100 if i < 20 else 1000, 200, 1) for i in range(40)]
    estimator.observe(batch, 0)
    for r in batch:
        finish(r, 20 if r.num_prompt_tokens == 100 else 100)
    estimator.observe([], 1)
    prompts, produced, caps = ints(100, 1000), ints(0, 5), ints(200, 200)
    still = estimator.still_running(prompts, produced, caps, offsets).dense()
    assert still.sum(axis=1) == pytest.approx(estimator.remaining(prompts, produced, caps))


def test_one_requests_row_is_its_row_of_the_batch_forecast_until_the_next_refit() -> None:
    estimator = OutputLengthEstimator(OutputLengthConfig(bucket_edges=(256,), prior_weight=4))
    offsets = np.arange(64, dtype=np.int64) * 3  # rounding: a grid step of 3 tokens
    rng = np.random.default_rng(0)
    prompts = rng.integers(10, 600, 40)
    produced = rng.integers(0, 100, 40)
    caps = produced + rng.integers(1, 300, 40)

    def agrees(budget: bool = False) -> bool:
        batch = estimator.still_running(prompts, produced, caps, offsets).dense()
        if budget:
            batch = (offsets[None, :] < -(-(caps - produced) // 3)[:, None] * 3).astype(float)
        rows = [
            estimator.still_running_row(int(p), int(o), int(c), offsets, budget)
            for p, o, c in zip(prompts, produced, caps, strict=True)
        ]
        return bool(np.allclose(np.array(rows), batch))

    assert agrees()  # nothing learned: running to the caps
    batch = [running(i, 100 if i < 20 else 1000, 200, 1) for i in range(40)]
    estimator.observe(batch, 0)
    for r in batch[:30]:
        finish(r, 20 if r.num_prompt_tokens == 100 else 100)
    estimator.observe(batch[30:], 1)
    assert agrees() and agrees(budget=True)  # per bucket; rows kept from before are gone
    for r in batch[30:]:
        finish(r, 150)
    estimator.observe([], 2)
    assert agrees()


def test_running_requests_are_censored_not_ignored() -> None:
    # Half finished at 20 tokens, half still running at 100: counting only the finished
    # would say 20. With the survivors' tail at the cap the mean is 0.5 * 20 + 0.5 * 200.
    events, censored = ints(*[20] * 10), ints(*[100] * 10)
    at_cap = SurvivalCurve.fit(events, censored, extrapolate=False)
    assert at_cap.remaining(ints(0), ints(200)) == pytest.approx([110])
    # Extrapolated at the hazard seen so far (ln 2 / 100 per token): still well above 20,
    # below the cap.
    extrapolated = SurvivalCurve.fit(events, censored)
    mean = float(extrapolated.remaining(ints(0), ints(200))[0])
    assert 60 < mean < 110
    # Past every length seen the tail is memoryless and never exceeds the budget.
    late = extrapolated.remaining(ints(150, 199), ints(200, 200))
    assert late[1] == 1 and 1 < late[0] <= 50


def test_estimator_falls_back_to_max_tokens_then_learns_per_bucket() -> None:
    estimator = OutputLengthEstimator(OutputLengthConfig(bucket_edges=(256,), prior_weight=4))
    assert estimator.remaining(ints(100), ints(0), ints(200)) == pytest.approx([200])
    # Short prompts answer in 20 tokens, long ones in 100.
    batch = [running(i, 100, 200, 1) for i in range(20)]
    batch += [running(100 + i, 1000, 200, 1) for i in range(20)]
    estimator.observe(batch, 0)
    for r in batch:
        finish(r, 20 if r.num_prompt_tokens == 100 else 100)
    estimator.observe([], 1)
    short, long = estimator.remaining(ints(100, 1000), ints(0, 0), ints(200, 200))
    # Blend n / (n + 4) = 20 / 24 of the bucket with the pooled mean (60).
    assert short == pytest.approx(20 * 20 / 24 + 60 * 4 / 24)
    assert long == pytest.approx(100 * 20 / 24 + 60 * 4 / 24)
    # Within the cap: E[min(L, 30)] is 30 for the long bucket, 25 pooled.
    capped = estimator.remaining(ints(1000), ints(0), ints(30))
    assert capped == pytest.approx([30 * 20 / 24 + 25 * 4 / 24])
    telemetry = estimator.telemetry()
    assert telemetry["output_observed"] == 40
    # Every prediction was the 200-token fallback: errors 180 and 100.
    assert telemetry["output_mae_tokens"] == pytest.approx(140)
    assert telemetry["output_bias_tokens"] == pytest.approx(140)
    assert telemetry["output_mre"] == pytest.approx((180 / 20 + 100 / 100) / 2)
    assert telemetry["output_spread_tokens"] == 0  # upper bounds never fall short


def test_preempted_and_aborted_requests_teach_nothing() -> None:
    estimator = OutputLengthEstimator(OutputLengthConfig())
    preempted, aborted = running(1, 50, 200, 30), running(2, 50, 200, 40)
    estimator.observe([preempted, aborted], 0)
    preempted.status = RequestStatus.WAITING
    aborted.status = RequestStatus.ABORTED
    aborted.finish_reason = FinishReason.ABORT
    estimator.observe([], 1)
    assert estimator.num_observed == 0
    assert estimator.remaining(ints(50), ints(0), ints(200)) == pytest.approx([200])


def loose_cap_workload() -> list[RequestSpec]:
    """True outputs 20-120 tokens under a 600-token cap, on a small KV cache."""
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0, 10, 100))
    return [
        RequestSpec(float(a), int(rng.integers(100, 400)), 600,
                    output_tokens=int(rng.integers(50, 250)))
        for a in arrivals
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["twp", "twp_slo"])
def test_policies_learn_the_output_length_in_a_run(name: str, paper_profile: EngineProfile) -> None:
    profile = replace(paper_profile, noise_cv=0.0)
    policy = build_policy(name, profile, Slo())
    simulate(loose_cap_workload(), policy, profile, np.random.default_rng(1))
    telemetry = policy.telemetry()
    assert telemetry["output_observed"] >= 90
    # True mean 150 under a 600 cap: the learned estimate is far nearer than the cap.
    assert isinstance(policy, TwpPolicy | TwpSloPolicy)
    estimate = policy.expected.estimator.remaining(ints(250), ints(0), ints(600))
    assert 100 < float(estimate[0]) < 250


def test_kv_reservation_avoids_recompute_where_vllm_default_preempts(
    paper_profile: EngineProfile,
) -> None:
    profile = replace(paper_profile, num_gpu_blocks=400, noise_cv=0.0)
    specs = loose_cap_workload()

    def recomputed(name: str) -> int:
        out = simulate(specs, build_policy(name, profile, Slo()), profile, np.random.default_rng(1))
        assert all(r.status is RequestStatus.FINISHED for r in out.requests)
        return sum(r.num_recomputed_tokens for r in out.requests)

    baseline = recomputed("vllm_default")
    assert baseline > 5000
    assert recomputed("twp_slo") <= 0.1 * baseline
    assert recomputed("twp") <= 0.1 * baseline
    assert recomputed("twp_slo-no_kv_reservation") > recomputed("twp_slo")


def test_length_window_keeps_the_newest_lengths_and_their_sum() -> None:
    from tokenpace.policy.output_length import LengthWindow

    window = LengthWindow(3)
    assert not window and window.total == 0
    for length in (5, 7, 9, 11):  # the fourth forgets the first
        window.append(length)
    assert len(window) == 3 and window.total == 27
    assert sorted(window.values.tolist()) == [7, 9, 11]


def test_survival_fit_counts_as_a_sort_would() -> None:
    # Long lengths are counted by sorting, short ones by a table: the same curve either way.
    events = np.array([3, 3, 8, 70_000, 70_000, 5], dtype=np.int64)
    censored = np.array([4, 90_000], dtype=np.int64)
    curve = SurvivalCurve.fit(events, censored)
    assert curve.starts.tolist() == [0, 3, 5, 8, 70_000, 90_000]
    # At risk: 8 at 3, 5 at 5 (the one censored at 4 gone), 4 at 8, 3 at 70,000.
    assert curve.survival.tolist() == pytest.approx(
        [1.0, 6 / 8, 6 / 8 * 4 / 5, 6 / 8 * 4 / 5 * 3 / 4, 6 / 8 * 4 / 5 * 3 / 4 * 1 / 3,
         6 / 8 * 4 / 5 * 3 / 4 * 1 / 3]
    )  # fmt: skip
    small = SurvivalCurve.fit(events[:3], censored[:1])
    assert small.starts.tolist() == [0, 3, 8, 8] and small.tail_start == 8


def test_one_requests_expected_output_is_kept_until_the_next_refit() -> None:
    estimator = OutputLengthEstimator(OutputLengthConfig(refresh_steps=1000))
    first = [Request(i, 100, 200, 0.0) for i in range(4)]
    estimator.observe(first, 0)
    estimator.admitted(first)
    for i, request in enumerate(first):
        request.token_times_s = [0.0] * (10 + i)
        request.status, request.finish_reason = RequestStatus.FINISHED, FinishReason.STOP
    estimator.observe([], 1)  # learns 10-13 tokens and refits
    fresh = Request(99, 100, 200, 0.0)
    before = estimator.remaining_of(fresh)
    assert (
        before == estimator.remaining(np.array([100]), np.array([0]), np.array([200]))[0]
        and before < 20
    )
    # Longer outputs finish: the next refit moves the estimate; nothing stale is returned.
    more = [Request(10 + i, 100, 200, 0.0) for i in range(8)]
    estimator.observe(more, 2)
    estimator.admitted(more)
    for request in more:
        request.token_times_s = [0.0] * 150
        request.status, request.finish_reason = RequestStatus.FINISHED, FinishReason.STOP
    estimator.observe([], 3)
    assert estimator.remaining_of(fresh) > before + 50


@pytest.mark.parametrize("extrapolate", [True, False])
def test_one_requests_figures_equal_the_batch_figures_exactly(extrapolate: bool) -> None:
    # The scalar paths (one request at a time, as a gate asks) repeat the array paths'
    # arithmetic: equal to the last bit, inside the curve and beyond its longest length.
    rng = np.random.default_rng(5)
    offsets = np.arange(0, 96, 6, dtype=np.int64)
    for top in (40, 300, 5000):
        for _ in range(20):
            events = rng.integers(1, top, int(rng.integers(1, 300)))
            censored = rng.integers(0, top, int(rng.integers(0, 100)))
            curve = SurvivalCurve.fit(events, censored, extrapolate)
            produced = rng.integers(0, int(top * 1.5), 30)
            caps = produced + rng.integers(0, top, 30)
            expected = curve.remaining(produced, caps)
            rows = curve.still_running(produced, caps, offsets)
            for j, (o, m) in enumerate(zip(produced.tolist(), caps.tolist(), strict=True)):
                assert curve.remaining_one(o, m) == expected[j]
                assert np.array_equal(curve.still_running_one(o, m, offsets), rows[j])


def test_one_requests_estimate_equals_the_batch_estimate_exactly() -> None:
    estimator = OutputLengthEstimator(OutputLengthConfig(bucket_edges=(256,), prior_weight=4))
    rng = np.random.default_rng(6)
    batch = [running(i, int(rng.integers(10, 600)), 400, 1) for i in range(60)]
    estimator.observe(batch, 0)
    for r in batch[:45]:
        finish(r, int(rng.integers(1, 300)))
    estimator.observe(batch[45:], 1)  # both buckets learned, 15 censored
    offsets = np.arange(0, 128, 8, dtype=np.int64)
    prompts = rng.integers(10, 600, 40)
    produced = rng.integers(0, 350, 40)
    caps = produced + rng.integers(1, 300, 40)
    expected = estimator.remaining(prompts, produced, caps)
    forecast = estimator.still_running(prompts, produced, caps, offsets).dense()
    columns = zip(prompts.tolist(), produced.tolist(), caps.tolist(), strict=True)
    for j, (p, o, m) in enumerate(columns):
        request = Request(1000 + j, p, m, 0.0)
        request.token_times_s = [0.0] * o
        assert estimator.remaining_of(request) == expected[j]
        # The same rounding to the grid as the batch forecast, and the same blend.
        assert np.array_equal(estimator.still_running_row(p, o, m, offsets), forecast[j])
        # A lower bound of any fresh request's estimate with at least this cap.
        fresh = estimator.remaining(ints(10, 300), ints(0, 0), ints(m, m + 50))
        assert estimator.smallest_fresh(m) <= fresh.min()


def test_curves_are_fitted_when_first_read_from_the_refits_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fits: list[int] = []
    fit = SurvivalCurve.fit

    def counted(*args: Any, **kwargs: Any) -> SurvivalCurve:
        fits.append(1)
        return fit(*args, **kwargs)

    monkeypatch.setattr(SurvivalCurve, "fit", staticmethod(counted))
    reads_at_once, reads_later = (OutputLengthEstimator(OutputLengthConfig()) for _ in range(2))
    batch = [running(i, 100, 200, 1) for i in range(8)]
    for estimator in (reads_at_once, reads_later):
        estimator.observe(batch, 0)
    for i, r in enumerate(batch[:6]):
        finish(r, 10 + 20 * i)
    produced = np.array([len(r.token_times_s) for r in batch[6:]], dtype=np.int64)
    prompts = np.array([100, 100], dtype=np.int64)
    ids = [r.request_id for r in batch[6:]]
    reads_at_once.observe(batch[6:], 1, ids, produced, prompts)
    probe = (ints(100), ints(0), ints(200))
    expected = reads_at_once.remaining(*probe)
    fits.clear()
    reused = produced.copy()
    reads_later.observe(batch[6:], 1, ids, reused, prompts)
    assert not fits and reads_later.fitted  # due, not yet paid
    reused += 50  # a caller reusing its buffer: the refit kept its own copy
    more = [running(100 + i, 100, 200, 1) for i in range(3)]
    reads_later.admitted(more)  # a read: fitted now, from step 1's inputs
    assert len(fits) == 2  # pooled and the one bucket with lengths
    assert np.array_equal(reads_later.remaining(*probe), expected)
