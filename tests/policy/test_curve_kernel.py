"""The compiled batch estimate gives the numpy path's values: to the last bit without an
extrapolated tail, within rounding of ``exp`` on one."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tokenpace.policy
import tokenpace.policy.twp
from tests.helpers import running
from tests.policy.test_output_length import finish
from tokenpace.policy.output_length import OutputLengthConfig, OutputLengthEstimator, SurvivalCurve
from tokenpace.policy.twp.kv_reservation import compiled_tests
from tokenpace.policy.twp.ranking import compiled_head
from tokenpace.policy.twp_slo.deadline import compiled_deferrals


def taught(compiled: bool, extrapolate: bool) -> OutputLengthEstimator:
    """An estimator that has seen the same 150 finished requests and 50 still running: the
    buckets below 100 and 100-300 tokens have curves of their own, 300-2,000 has a handful
    of requests and >= 2,000 none (the pooled curve alone)."""
    config = OutputLengthConfig(
        bucket_edges=(100, 300, 2000), prior_weight=8, extrapolate_tail=extrapolate,
        compiled=compiled,
    )  # fmt: skip
    return _teach(OutputLengthEstimator(config))


def _teach(estimator: OutputLengthEstimator) -> OutputLengthEstimator:
    rng = np.random.default_rng(11)
    batch = [running(i, int(rng.integers(10, 700)), 600, 1) for i in range(200)]
    estimator.observe(batch, 0)
    for r in batch[:150]:
        finish(r, int(rng.integers(1, 250)))
    for r in batch[150:]:
        r.token_times_s = [0.0] * int(rng.integers(1, 400))  # some outlive every finish
    estimator.observe(batch[150:], 1)
    return estimator


@pytest.mark.parametrize("extrapolate", [False, True])
def test_the_compiled_loop_gives_the_numpy_estimates(extrapolate: bool) -> None:
    numpy_path, compiled = taught(False, extrapolate), taught(True, extrapolate)
    assert compiled.compiled and not numpy_path.compiled
    rng = np.random.default_rng(12)
    for n in (1, 7, 256, 3000):  # 3000: the numpy path goes curve by curve
        prompts = rng.integers(10, 3000, n)
        produced = rng.integers(0, 600, n)  # inside the curves and beyond their T
        caps = produced + rng.integers(1, 900, n)
        expected = numpy_path.remaining(prompts, produced, caps)
        got = compiled.remaining(prompts, produced, caps)
        if extrapolate:
            # exp and expm1 may be numpy's own vector code on one side, the C library's on
            # the other: the last bit of a tail's value may differ.
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
        else:
            np.testing.assert_array_equal(got, expected)
    # Strided views are read as the same values (copied into the loop's contiguous input).
    assert np.allclose(
        compiled.remaining(prompts[::2], produced[::2], caps[::2]), expected[::2],
        rtol=1e-12, atol=0,
    )  # fmt: skip


def test_the_compiled_loop_blends_each_bucket_with_the_pooled_curve() -> None:
    estimator = taught(True, True)
    produced, caps = np.full(4, 30), np.full(4, 600)
    # One prompt per bucket: each of the first three has its own curve, the last reads the
    # pooled curve alone, which is what an estimator without buckets gives.
    by_bucket = estimator.remaining(np.array([50, 200, 1000, 2500]), produced, caps)
    assert len(set(by_bucket.tolist())) == 4
    # One bucket for every prompt: its curve is the pooled one, so the blend is too.
    pooled_only = _teach(OutputLengthEstimator(OutputLengthConfig(bucket_edges=(100_000,))))
    assert pooled_only.remaining(np.array([2500]), produced[:1], caps[:1])[0] == pytest.approx(
        by_bucket[3], rel=1e-12
    )


def test_the_compiled_fit_gives_the_numpy_tables() -> None:
    from tokenpace.policy.curve_kernel import fit_tables

    rng = np.random.default_rng(13)
    cases = [
        (np.array([5]), np.zeros(0, dtype=np.int64)),  # one finish, nobody running
        (np.array([20] * 50 + [50] * 30 + [200] * 20), np.array([120])),
        (np.array([3, 3, 9]), np.array([0, 1, 3, 3, 40])),  # censored at, below and beyond
        (rng.integers(60_000, 70_000, 300), rng.integers(0, 80_000, 40)),  # sorted, not counted
    ]
    for _ in range(40):
        top = int(rng.choice([10, 300, 5000]))
        events = rng.integers(1, top, int(rng.integers(1, 600)))
        cases.append((events, rng.integers(0, 2 * top, int(rng.integers(0, 300)))))
    for events, censored in cases:
        for extrapolate in (False, True):
            in_numpy = SurvivalCurve.fit(events, censored, extrapolate)
            compiled = SurvivalCurve.fit(events, censored, extrapolate, fit_tables)
            for field in ("starts", "survival", "area", "dense", "cumulative"):
                np.testing.assert_array_equal(getattr(compiled, field), getattr(in_numpy, field))
            assert compiled.tail_start == in_numpy.tail_start
            assert compiled.tail_hazard == in_numpy.tail_hazard
            assert compiled.num_events == in_numpy.num_events


@pytest.mark.parametrize("extrapolate", [False, True])
def test_the_compiled_forecast_groups_and_reads_as_numpy_does(extrapolate: bool) -> None:
    numpy_path, compiled = taught(False, extrapolate), taught(True, extrapolate)
    rng = np.random.default_rng(14)
    for n, step in ((0, 4), (1, 1), (60, 1), (454, 8), (3000, 16)):
        offsets = np.arange(64, dtype=np.int64) * step
        prompts = rng.integers(10, 3000, n)
        produced = rng.integers(0, 700, n)  # inside the curves and beyond their T
        caps = produced + rng.integers(-5, 900, n)  # some at or past their caps
        want = numpy_path.still_running(prompts, produced, caps, offsets)
        got = compiled.still_running(prompts, produced, caps, offsets)
        np.testing.assert_array_equal(got.row_of, want.row_of)
        for mine, theirs in zip(got.representatives, want.representatives, strict=True):
            np.testing.assert_array_equal(mine, theirs)
        if extrapolate:
            np.testing.assert_allclose(got.rows, want.rows, rtol=1e-12, atol=0)
        else:
            np.testing.assert_array_equal(got.rows, want.rows)


def test_without_numba_the_policies_stay_on_numpy_and_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A module set to None in sys.modules raises ImportError on import, as a missing numba
    # makes the compiled modules do.
    monkeypatch.setitem(sys.modules, "tokenpace.policy.curve_kernel", None)
    monkeypatch.delattr(tokenpace.policy, "curve_kernel", raising=False)
    monkeypatch.setitem(sys.modules, "tokenpace.policy.twp_slo.deferral_kernel", None)
    for name in ("occupancy_kernel", "ranking_kernel"):
        monkeypatch.setitem(sys.modules, f"tokenpace.policy.twp.{name}", None)
        monkeypatch.delattr(tokenpace.policy.twp, name, raising=False)
    assert compiled_deferrals() is None
    assert compiled_tests() is None
    assert compiled_head() is None
    without = taught(True, False)
    assert not without.compiled
    prompts, produced, caps = np.array([50, 200, 2500]), np.full(3, 30), np.full(3, 600)
    expected = taught(False, False).remaining(prompts, produced, caps)
    np.testing.assert_array_equal(without.remaining(prompts, produced, caps), expected)
