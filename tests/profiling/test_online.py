"""The online estimator recovers, follows and resists: synthetic steps from a known profile."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from tokenpace.engine.latency_model import LatencyModel, PrefillChunk, StepShape
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.profiling.online import OnlineCalibrationConfig, OnlineProfileEstimator

# Stated bound: after a change of speed the live l_min is within 10% of the new level in at
# most this many steps (4 to detect the change, a few to refit, up to 3 to publish).
FOLLOW_STEPS = 16


@dataclass(frozen=True, slots=True)
class Step:
    latency_s: float
    num_decode_tokens: int
    num_prefill_tokens: int


def truth() -> EngineProfile:
    base = load_profile("v100-llama-3.2-3b")
    return replace(
        base,
        l_min_ms=30.0,
        alpha_ms=1.5,
        b0=8,
        prefill_ms_per_token=0.2,
        mixed_prefill_overhead_ms=2.0,
        prefill_attention_ms_per_kctx=0.0,
        decode_attention_ms_per_kctx=0.0,
    )


def steps(
    profile: EngineProfile, n: int, rng: np.random.Generator, noise_cv: float = 0.02
) -> list[Step]:
    """Serving-like steps: batches 1-24, a prefill chunk in about a third of them."""
    model = LatencyModel(profile)
    out = []
    for _ in range(n):
        batch = int(rng.integers(1, 25))
        chunk = int(rng.choice([0, 0, 32, 64]))
        chunks = [PrefillChunk(chunk, 0)] if chunk else []
        seconds = model.step_s(batch, chunks) * (1 + noise_cv * rng.standard_normal())
        out.append(Step(seconds, batch, chunk))
    return out


def prior() -> EngineProfile:
    """An offline profile 40% off in every term."""
    t = truth()
    return replace(
        t,
        l_min_ms=t.l_min_ms * 1.4,
        alpha_ms=t.alpha_ms * 0.6,
        prefill_ms_per_token=t.prefill_ms_per_token * 1.4,
        mixed_prefill_overhead_ms=t.mixed_prefill_overhead_ms * 0.6,
    )


def run(estimator: OnlineProfileEstimator, observed: list[Step]) -> list[float]:
    """Feed ``observed``; the published l_min after each step."""
    trace = []
    for i, step in enumerate(observed):
        estimator.observe(step, float(i))
        trace.append(estimator.profile.l_min_ms)
    return trace


def test_converges_to_the_true_terms() -> None:
    rng = np.random.default_rng(0)
    estimator = OnlineProfileEstimator(prior(), OnlineCalibrationConfig())
    run(estimator, steps(truth(), 400, rng))
    live, t = estimator.profile, truth()
    assert live.l_min_ms == pytest.approx(t.l_min_ms, rel=0.03)
    assert live.alpha_ms == pytest.approx(t.alpha_ms, rel=0.1)
    assert live.prefill_ms_per_token == pytest.approx(t.prefill_ms_per_token, rel=0.1)
    assert live.b0 == t.b0  # the knee stays the offline one
    assert estimator.updated_s is not None


def calibrated_with(
    shaped: Callable[[EngineProfile], EngineProfile], seed: int
) -> tuple[EngineProfile, OnlineProfileEstimator]:
    """The true profile made ``shaped`` (a residual table set), and an estimator that
    started from the prior shaped alike and saw 400 of its steps."""
    true = shaped(truth())
    estimator = OnlineProfileEstimator(shaped(prior()), OnlineCalibrationConfig())
    run(estimator, steps(true, 400, np.random.default_rng(seed)))
    return true, estimator


def test_a_measured_decode_residual_is_a_fixed_shape_not_a_bias() -> None:
    # A curve that is not Eq. 2: cheap single rows, a bump at small batches.
    shape = ((1, -12.0), (2, 6.0), (4, 8.0), (8, 0.0), (16, -3.0), (24, 0.0))
    curved, estimator = calibrated_with(lambda p: replace(p, decode_residual_ms=shape), 4)
    live = estimator.profile
    assert live.l_min_ms == pytest.approx(curved.l_min_ms, rel=0.03)
    assert live.alpha_ms == pytest.approx(curved.alpha_ms, rel=0.1)
    assert live.decode_residual_ms == shape
    assert estimator.predict_ms(1, 0) == pytest.approx(30.0 - 12.0, rel=0.05)


def test_a_measured_prefill_residual_is_a_fixed_shape_not_a_bias() -> None:
    # Chunks of 64 tokens run slow (a kernel switch at that row count), 32 ones do not.
    shape = ((32, 0.0), (64, 15.0))
    bent, estimator = calibrated_with(lambda p: replace(p, prefill_residual_ms=shape), 5)
    live = estimator.profile
    assert live.prefill_ms_per_token == pytest.approx(bent.prefill_ms_per_token, rel=0.1)
    assert live.mixed_prefill_overhead_ms == pytest.approx(2.0, abs=1.0)
    assert live.prefill_residual_ms == shape
    expected_ms = 1000 * LatencyModel(bent).step_s(8, [PrefillChunk(64, 0)])
    assert estimator.predict_ms(8, 64) == pytest.approx(expected_ms, rel=0.03)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    "slowed",
    [
        # every term doubles (fewer threads, a lower clock)
        replace(truth(), l_min_ms=60.0, alpha_ms=3.0, prefill_ms_per_token=0.4),
        # a fixed cost joins every step (a sleep, a synchronisation)
        replace(truth(), l_min_ms=60.0),
    ],
    ids=["proportional", "additive"],
)
def test_follows_a_step_change_within_the_stated_steps(slowed: EngineProfile, seed: int) -> None:
    rng = np.random.default_rng(seed)
    estimator = OnlineProfileEstimator(truth(), OnlineCalibrationConfig())
    run(estimator, steps(truth(), 200, rng))
    before = estimator.profile.l_min_ms
    trace = run(estimator, steps(slowed, 60, rng))
    within = [abs(v - 60.0) <= 6.0 for v in trace]
    first = within.index(True)
    assert first <= FOLLOW_STEPS, trace[:20]
    assert all(within[first:]), trace
    assert before == pytest.approx(30.0, rel=0.05)
    assert estimator.num_shifts >= 1
    assert estimator.profile.alpha_ms == pytest.approx(slowed.alpha_ms, rel=0.25)


def test_follows_a_speed_up_too() -> None:
    rng = np.random.default_rng(2)
    estimator = OnlineProfileEstimator(truth(), OnlineCalibrationConfig())
    run(estimator, steps(truth(), 100, rng))
    faster = replace(truth(), l_min_ms=20.0)
    trace = run(estimator, steps(faster, 40, rng))
    assert abs(trace[FOLLOW_STEPS] - 20.0) <= 2.0, trace


def test_lone_outliers_do_not_derail_it() -> None:
    rng = np.random.default_rng(3)
    estimator = OnlineProfileEstimator(truth(), OnlineCalibrationConfig())
    observed = steps(truth(), 300, rng)
    # One step in twenty takes ten times as long (a page fault, a neighbour on the core).
    spiked = [
        replace(s, latency_s=s.latency_s * 10) if i % 20 == 7 else s for i, s in enumerate(observed)
    ]
    trace = run(estimator, spiked)
    assert max(trace[50:]) <= 30.0 * 1.08, max(trace[50:])
    assert estimator.profile.alpha_ms == pytest.approx(1.5, rel=0.15)
    assert estimator.num_shifts == 0


def test_unexcited_terms_keep_their_offline_values() -> None:
    """Every batch below B0 and no prefill: only l_min is observable; alpha stays put."""
    estimator = OnlineProfileEstimator(truth(), OnlineCalibrationConfig())
    for i in range(200):
        estimator.observe(Step(0.045, 4, 0), float(i))
    assert estimator.profile.l_min_ms == pytest.approx(45.0, rel=0.01)
    assert estimator.profile.alpha_ms == pytest.approx(1.5, rel=0.01)
    assert estimator.profile.prefill_ms_per_token == pytest.approx(0.2, rel=0.01)


def test_publishes_every_n_steps_after_the_first_ones() -> None:
    config = OnlineCalibrationConfig(publish_every=4, min_steps=8)
    estimator = OnlineProfileEstimator(truth(), config)
    published = [estimator.observe(Step(0.03, 4, 0), float(i)) is not None for i in range(16)]
    assert [i for i, p in enumerate(published) if p] == [7, 11, 15]
    assert estimator.updated_s == 15.0
    assert estimator.observe(Step(0.0, 4, 0), 16.0) is None  # no latency: ignored
    assert estimator.num_steps == 16
    live = estimator.live()
    assert live.num_steps == 16 and live.b0 == 8 and live.l_min_ms == estimator.profile.l_min_ms


@pytest.mark.parametrize(
    ("field", "value"),
    [("forgetting", 1.5), ("publish_every", 0), ("shift_discount", 0.0), ("shift_votes", 9)],
)
def test_bad_config_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        overrides: dict[str, Any] = {field: value}
        replace(OnlineCalibrationConfig(), **overrides)


def test_a_prefill_floor_is_a_fixed_shape_that_moves_with_l_min() -> None:
    # Prefill-only steps pay 20 ms more than l_min before their tokens.
    floored = replace(truth(), prefill_floor_ms=50.0)
    start = replace(prior(), prefill_floor_ms=prior().l_min_ms + 20.0)
    model = LatencyModel(floored)
    rng = np.random.default_rng(5)
    observed = steps(floored, 300, rng)
    for _ in range(100):
        chunk = int(rng.choice([32, 64, 128]))
        seconds = model.step_s(0, [PrefillChunk(chunk, 0)]) * (1 + 0.02 * rng.standard_normal())
        observed.insert(int(rng.integers(0, len(observed))), Step(seconds, 0, chunk))
    estimator = OnlineProfileEstimator(start, OnlineCalibrationConfig())
    run(estimator, observed)
    live = estimator.profile
    assert live.l_min_ms == pytest.approx(30.0, rel=0.03)
    assert live.prefill_floor_ms == pytest.approx(50.0, rel=0.05)
    assert live.prefill_ms_per_token == pytest.approx(0.2, rel=0.1)
    assert estimator.predict_ms(0, 64) == pytest.approx(50.0 + 64 * 0.2, rel=0.03)


def test_the_steps_context_terms_are_a_fixed_shape_not_absorbed_into_l_min() -> None:
    """Decode attention costs 2 ms per thousand context tokens: told each step's contexts,
    the estimator keeps l_min where it is; counting tokens alone, l_min absorbs the served
    steps' mean attention cost, which the published profile would then charge again."""
    attending = replace(truth(), decode_attention_ms_per_kctx=2.0)
    model = LatencyModel(attending)
    rng = np.random.default_rng(6)
    told = OnlineProfileEstimator(attending, OnlineCalibrationConfig())
    counted = OnlineProfileEstimator(attending, OnlineCalibrationConfig())
    for i in range(300):
        batch = int(rng.integers(1, 25))
        shape = StepShape(tuple(int(c) for c in rng.integers(200, 2000, batch)), ())
        seconds = model.shape_s(shape) * (1 + 0.02 * rng.standard_normal())
        told.observe(Step(seconds, batch, 0), float(i), shape)
        counted.observe(Step(seconds, batch, 0), float(i))
    assert told.profile.l_min_ms == pytest.approx(30.0, rel=0.03)
    assert told.profile.alpha_ms == pytest.approx(1.5, rel=0.1)
    assert counted.profile.l_min_ms > 1.1 * 30.0
