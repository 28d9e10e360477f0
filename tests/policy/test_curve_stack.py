"""Survival curves stacked: one pass over several curves gives each curve's own figures, to
the last bit, and the estimator's two ways of estimating a batch agree."""

from __future__ import annotations

import numpy as np

from tests.helpers import running
from tests.policy.test_output_length import finish
from tokenpace.policy.curve_stack import CurveStack
from tokenpace.policy.output_length import (
    OutputLengthConfig,
    OutputLengthEstimator,
    SurvivalCurve,
)


def _curves(rng: np.random.Generator) -> list[SurvivalCurve]:
    """Curves of different lengths, with a tail beyond the longest length (h > 0) and
    without (h = 0)."""
    curves = []
    for top, extrapolate in ((40, True), (300, False), (2000, True), (90, False)):
        events = rng.integers(1, top, int(rng.integers(5, 300)))
        censored = rng.integers(0, 2 * top, int(rng.integers(1, 50)))  # some outlive all
        curves.append(SurvivalCurve.fit(events, censored, extrapolate))
    return curves


def test_a_stack_reads_each_elements_own_curve_exactly() -> None:
    rng = np.random.default_rng(3)
    curves = _curves(rng)
    assert any(c.tail_hazard > 0 for c in curves) and any(c.tail_hazard == 0 for c in curves)
    stack = CurveStack.of(curves)
    offsets = np.arange(0, 256, 16, dtype=np.int64)
    n = 400
    which = rng.integers(0, len(curves), n)
    # Inside each curve and beyond its longest length.
    produced = rng.integers(0, 3000, n)
    caps = produced + rng.integers(0, 3000, n)
    s, area = stack.at(which, produced)
    remaining = stack.remaining(which, produced, caps)
    rows = stack.still_running(which, produced, caps, offsets)
    for c, curve in enumerate(curves):
        mine = np.flatnonzero(which == c)
        alone = CurveStack.of((curve,))
        alone_s, alone_area = alone.at(0, produced[mine])
        assert np.array_equal(s[mine], alone_s) and np.array_equal(area[mine], alone_area)
        assert np.array_equal(s[mine], curve.survival_at(produced[mine]))
        assert np.array_equal(remaining[mine], curve.remaining(produced[mine], caps[mine]))
        assert np.array_equal(rows[mine], curve.still_running(produced[mine], caps[mine], offsets))
        for j in mine[:20].tolist():
            assert curve.remaining_one(int(produced[j]), int(caps[j])) == remaining[j]


def test_long_and_short_batches_get_the_same_estimates() -> None:
    # A batch longer than the stacked pass takes (a long waiting queue) is estimated curve
    # by curve; the same requests in short slices go through the stack.
    estimator = OutputLengthEstimator(OutputLengthConfig(bucket_edges=(100, 300), prior_weight=8))
    rng = np.random.default_rng(4)
    batch = [running(i, int(rng.integers(10, 600)), 400, 1) for i in range(120)]
    estimator.observe(batch, 0)
    for r in batch[:90]:
        finish(r, int(rng.integers(1, 300)))
    estimator.observe(batch[90:], 1)
    n = 3000
    prompts = rng.integers(10, 600, n)
    produced = rng.integers(0, 500, n)
    caps = produced + rng.integers(1, 600, n)
    offsets = np.arange(0, 128, 8, dtype=np.int64)
    whole = estimator.remaining(prompts, produced, caps)
    whole_rows = estimator.still_running(prompts, produced, caps, offsets).dense()
    for start in range(0, n, 250):
        at = slice(start, start + 250)
        assert np.array_equal(estimator.remaining(prompts[at], produced[at], caps[at]), whole[at])
        rows = estimator.still_running(prompts[at], produced[at], caps[at], offsets).dense()
        assert np.array_equal(rows, whole_rows[at])
    # Each bucket's own curve weighs in: the same progress gets another estimate.
    short, long = (estimator.remaining(np.full(n, p), produced, caps) for p in (10, 500))
    assert not np.array_equal(short, long)
