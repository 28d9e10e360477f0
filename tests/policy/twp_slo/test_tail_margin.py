"""The tail margin: where it settles, what it leaves out, its credit and its bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenpace.policy.twp_slo.tail_margin import FULL_STEP_SHARE, TailMargin

OBJECTIVE_MS = 100.0


def margin(**overrides: float) -> TailMargin:
    settings = {"ceiling": 0.95, "floor": 0.5, "share": 0.005, "gain": 0.02, "credit": 0.1}
    return TailMargin(**{**settings, **overrides})


def serve(tail: TailMargin, noise: np.ndarray, decoding: int = 20) -> np.ndarray:
    """Full steps filled to the margin's target, each ``noise`` times its length; returns
    whether each passed the objective."""
    over = np.empty(len(noise), dtype=bool)
    for i, factor in enumerate(noise):
        over[i] = tail.fraction * OBJECTIVE_MS * factor > OBJECTIVE_MS
        tail.observe(bool(over[i]), decoding, 1.0)
    return over


def test_steps_within_the_configured_margin_leave_it_alone() -> None:
    tail = margin()
    rng = np.random.default_rng(0)
    over = serve(tail, np.exp(rng.normal(0.0, 0.015, 5000)))  # the reference's 1.5% jitter
    assert not over.any()
    assert tail.fraction == pytest.approx(0.95)


def test_the_margin_settles_where_the_allowed_share_of_steps_passes_the_objective() -> None:
    """Log-normal step noise of 0.1: the 99.5th percentile is exp(0.258), so the fraction
    settles near exp(-0.258) = 0.77 and about 0.5% of the steps pass the objective."""
    tail = margin()
    rng = np.random.default_rng(1)
    serve(tail, np.exp(rng.normal(0.0, 0.1, 5000)))
    assert 0.72 < tail.fraction < 0.83
    over = serve(tail, np.exp(rng.normal(0.0, 0.1, 40_000)))
    assert 0.002 < float(over.mean()) < 0.01
    # Without the margin (the configured 0.95), 30% of these steps would pass it.
    assert float(np.mean(0.95 * np.exp(rng.normal(0.0, 0.1, 40_000)) > 1)) > 0.25


def test_a_rare_slow_step_uses_the_credit_not_the_margin() -> None:
    tail = margin()
    for _ in range(3):
        tail.observe(True, 20, 1.0)  # three slow steps: 0.06 of the 0.1 credit
        assert tail.fraction == pytest.approx(0.95)
    for _ in range(3):
        tail.observe(True, 20, 1.0)  # three more: the credit is spent, the margin widens
    assert tail.fraction < 0.95
    assert tail.fraction == pytest.approx(0.95 * math.exp(0.1 - 6 * 0.02 * 0.995))


def test_steps_without_decodes_or_far_below_the_target_are_left_out() -> None:
    tail = margin(credit=0.0)
    tail.observe(True, 0, 1.0)  # prefill alone: no inter-token gap
    tail.observe(True, 20, FULL_STEP_SHARE / 2)  # a small step
    assert tail.fraction == pytest.approx(0.95)
    tail.observe(True, 20, 1.0)
    assert tail.fraction == pytest.approx(0.95 * math.exp(-0.02 * 0.995))


def test_a_step_weighs_its_decodes_against_the_mean_full_step() -> None:
    wide, narrow = margin(credit=0.0), margin(credit=0.0)
    for tail in (wide, narrow):
        for _ in range(50):
            tail.observe(False, 20, 1.0)
    wide.observe(True, 40, 1.0)  # twice the mean batch: twice the gaps over
    narrow.observe(True, 10, 1.0)
    assert math.log(0.95 / wide.fraction) > 1.8 * math.log(0.95 / narrow.fraction)


def test_the_bounds() -> None:
    tail = margin()
    for _ in range(1000):
        tail.observe(True, 20, 1.0)
    assert tail.fraction == pytest.approx(0.5)  # never below the floor
    for _ in range(200_000):
        tail.observe(False, 20, 1.0)
    assert tail.fraction == pytest.approx(0.95)  # never above the configured fraction


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"floor": 0.96}, "floor <= ceiling"),
        ({"share": 0.0}, "share"),
        ({"gain": 0.0}, "gain"),
        ({"credit": -0.1}, "credit"),
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        margin(**overrides)
