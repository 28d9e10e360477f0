"""Fits of the profile's latency model to sweep measurements (paper Eq. 2 plus prefill)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from tokenpace.engine.latency_model import prefill_residual_at
from tokenpace.profiling.points import DecodePoint, IdlePoint, MixedPoint, PrefillPoint


@dataclass(frozen=True, slots=True)
class Eq2Fit:
    """``l(B) = l_min_ms`` for ``B <= b0``, ``l_min_ms + alpha_ms * (B - b0)`` beyond;
    ``r2`` is the coefficient of determination over the fitted points."""

    l_min_ms: float
    b0: int
    alpha_ms: float
    r2: float

    def predict_ms(self, batch_size: int) -> float:
        return self.l_min_ms + self.alpha_ms * max(0, batch_size - self.b0)


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Prefill cost per token (ms) plus an attention term per token per 1,000 context tokens,
    the fixed overhead (ms) of carrying a chunk inside a decode step, what each chunk beyond
    the first in one step adds (ms), and what a prefill-only step pays before its tokens
    (``floor_ms``; 0 when it is the decode floor the fit was given), and per swept chunk
    size what its lone step measured beyond those terms (``residual_ms``: the profile's
    ``prefill_residual_ms``)."""

    ms_per_token: float
    attention_ms_per_kctx: float
    mixed_overhead_ms: float
    chunk_overhead_ms: float = 0.0
    floor_ms: float = 0.0
    residual_ms: tuple[tuple[int, float], ...] = ()

    def chunk_ms(self, num_tokens: int, context_start: int) -> float:
        """Same formula as ``LatencyModel.prefill_ms``."""
        mean_context = context_start + (num_tokens + 1) / 2
        return num_tokens * (self.ms_per_token + self.attention_ms_per_kctx * mean_context / 1000)


_HUBER_K = 1.345  # Huber's tuning constant: 95% efficiency on Gaussian noise
_IRLS_ROUNDS = 4
_KNEES_PER_BATCH = 4  # knee candidates per unit of batch size


def _arrays(points: Sequence[DecodePoint]) -> tuple[np.ndarray, np.ndarray]:
    if len(points) < 3:
        raise ValueError(f"the Eq. 2 fit needs at least 3 decode points, got {len(points)}")
    batch = np.array([p.batch_size for p in points], dtype=float)
    ms = np.array([p.step_ms for p in points], dtype=float)
    return batch, ms


def _hinge(
    batch: np.ndarray, ms: np.ndarray, weights: np.ndarray, knee: float
) -> tuple[float, float, np.ndarray]:
    """Weighted least squares of ``ms = l_min + alpha * max(0, batch - knee)`` with both
    parameters physical (a step takes time, more requests never less): alpha >= 0 and
    l_min >= 0, each held at 0 where the free fit would cross it (noisy points of a fast
    engine can tilt the line below zero at the knee, and points with a fitted context term
    taken out can fall below zero themselves); returns l_min, alpha and the residuals."""
    hinge = np.maximum(0.0, batch - knee)
    root = np.sqrt(weights)
    design = np.column_stack([np.ones_like(batch), hinge]) * root[:, None]
    (l_min, alpha), *_ = np.linalg.lstsq(design, ms * root, rcond=None)
    leverage = float(np.sum(weights * hinge**2))
    if alpha < 0 or leverage == 0:
        # Flat: the weighted mean, or zero where even that is negative.
        l_min, alpha = max(0.0, float(np.average(ms, weights=weights))), 0.0
    elif l_min < 0:
        # The line through the origin at the knee: alpha = sum(w h ms) / sum(w h^2), held at
        # 0 where the points beyond the knee average below zero.
        l_min, alpha = 0.0, max(0.0, float(np.sum(weights * hinge * ms) / leverage))
    return float(l_min), float(alpha), ms - (l_min + alpha * hinge)


def _r2(ms: np.ndarray, residuals: np.ndarray) -> float:
    total = float(np.sum((ms - ms.mean()) ** 2))
    return 1.0 - float(np.sum(residuals**2)) / total if total > 0 else 1.0


def fit_eq2(points: Sequence[DecodePoint], b0: int | None = None) -> Eq2Fit:
    """Robust fit of Eq. 2: a hinge whose knee may fall between measured batch sizes,
    weighted against outlying points.

    The knee is searched on a grid of quarter batch sizes between the smallest and largest
    measured batch; for each, ``l_min`` and ``alpha`` (>= 0) are weighted least squares.
    The weights come from iteratively reweighted least squares with Huber's function
    (points whose residual exceeds 1.345 robust standard deviations, estimated from the
    median absolute residual, count in proportion to their distance), so one disturbed
    point cannot move the knee by itself. ``b0`` is the best knee rounded to a whole batch
    (at least 1); ``l_min`` and ``alpha`` are refitted at that ``b0`` with the final weights.
    A curve that rises from B = 1 yields ``b0 = 1``: no flat region. A given ``b0`` fixes the
    knee (a start-up calibration keeps the B0 it was configured with)."""
    batch, ms = _arrays(points)
    knees = np.linspace(batch.min(), batch.max(), int(_KNEES_PER_BATCH * np.ptp(batch)) + 1)
    if b0 is not None:
        knees = np.array([float(b0)])
    weights = np.ones_like(ms)
    floor = 1e-6 * max(1.0, float(np.median(ms)))
    knee = float(batch.min())
    for _ in range(_IRLS_ROUNDS):
        losses = [float(np.sum(weights * _hinge(batch, ms, weights, k)[2] ** 2)) for k in knees]
        knee = float(knees[int(np.argmin(losses))])
        residuals = _hinge(batch, ms, weights, knee)[2]
        scale = max(1.4826 * float(np.median(np.abs(residuals))), floor)
        weights = np.minimum(1.0, _HUBER_K * scale / np.maximum(np.abs(residuals), floor))
    b0 = max(1, round(knee)) if b0 is None else b0
    l_min, alpha, _ = _hinge(batch, ms, weights, float(b0))
    residuals = ms - (l_min + alpha * np.maximum(0.0, batch - b0))
    return Eq2Fit(l_min, b0, alpha, _r2(ms, residuals))


def decode_residuals(
    eq2: Eq2Fit, points: Sequence[DecodePoint], passes: Sequence[DecodePoint] = ()
) -> tuple[tuple[int, float], ...]:
    """Per swept batch size (increasing), the median of what its points measured beyond
    ``eq2`` (ms): the profile's ``decode_residual_ms``, with which the latency model passes
    through every measured point instead of Eq. 2's two segments.

    ``passes`` (every pass of every size, ``Sweep.decode_passes``) sets what counts as
    shape rather than noise: a size's residual is kept only where it exceeds the sweep's
    pass-to-pass spread at that size (its step time times the median, over the sizes
    measured more than once, of each size's range of passes over its median pass), and is
    zero otherwise, so the model follows Eq. 2 where a point's departure from it is within
    what the same point moved between passes. Without passes measured more than once every
    residual is kept."""
    measured = [(p.batch_size, p.step_ms, eq2.predict_ms(p.batch_size)) for p in points]
    return _residual_table(measured, pass_spread(passes))


def _residual_table(
    measured: Sequence[tuple[int, float, float]], noise: float
) -> tuple[tuple[int, float], ...]:
    """Per size (increasing), the median of what its (size, measured ms, modelled ms)
    points measured beyond the model, kept where it exceeds ``noise`` times the size's
    (last) measured step and 0 otherwise."""
    by_size: dict[int, list[float]] = {}
    step_ms: dict[int, float] = {}
    for size, measured_ms, modelled_ms in measured:
        by_size.setdefault(size, []).append(measured_ms - modelled_ms)
        step_ms[size] = measured_ms
    return tuple(
        (size, round(_gated(float(np.median(values)), noise * step_ms[size]), 4))
        for size, values in sorted(by_size.items())
    )


def pass_spread(passes: Sequence[DecodePoint]) -> float:
    """The sweep's relative pass-to-pass spread: over the batch sizes with more than one
    pass, the median of (slowest - fastest pass) / median pass; 0 with none."""
    by_size: dict[int, list[float]] = {}
    for p in passes:
        by_size.setdefault(p.batch_size, []).append(p.step_ms)
    ranges = [relative_range(times) for times in by_size.values() if len(times) > 1]
    return float(np.median(ranges)) if ranges else 0.0


def relative_range(times_ms: Sequence[float]) -> float:
    """(slowest - fastest) / median of one point's passes; 0 when the median is not
    positive."""
    median = float(np.median(times_ms))
    return (max(times_ms) - min(times_ms)) / median if median > 0 else 0.0


def prefill_pass_spread(points: Sequence[PrefillPoint]) -> float:
    """The prefill points' relative pass-to-pass spread: the median of their ``spread``;
    0 with none."""
    return float(np.median([p.spread for p in points])) if points else 0.0


def _gated(residual_ms: float, noise_ms: float) -> float:
    return residual_ms if abs(residual_ms) > noise_ms else 0.0


def fit_eq2_discrete(points: Sequence[DecodePoint]) -> Eq2Fit:
    """The earlier fit, kept to compare run-to-run spread: ordinary least squares with B0
    restricted to the measured batch sizes (the one with the smallest squared error)."""
    batch, ms = _arrays(points)
    best: Eq2Fit | None = None
    best_sse = float("inf")
    for b0 in sorted({p.batch_size for p in points}):
        l_min, alpha, residuals = _hinge(batch, ms, np.ones_like(ms), float(b0))
        sse = float(np.sum(residuals**2))
        if sse < best_sse - 1e-12:
            best_sse = sse
            best = Eq2Fit(l_min, int(b0), alpha, _r2(ms, residuals))
    assert best is not None
    return best


def fit_decode_attention(points: Sequence[DecodePoint]) -> float:
    """Decode cost per request per 1,000 context tokens (ms), from steps timed at several
    context lengths: least squares of ``step_ms = c_B + d * B * context / 1000`` with one
    intercept per batch size. Clamped at 0; 0 when fewer than two contexts were timed."""
    sizes = sorted({p.batch_size for p in points})
    if len({p.context for p in points}) < 2 or not sizes:
        return 0.0
    rows = []
    for p in points:
        row = [1.0 if p.batch_size == size else 0.0 for size in sizes]
        rows.append([*row, p.batch_size * p.context / 1000])
    ms = np.array([p.step_ms for p in points], dtype=float)
    solution, *_ = np.linalg.lstsq(np.array(rows), ms, rcond=None)
    return max(0.0, float(solution[-1]))


def without_context(points: Sequence[DecodePoint], per_kctx_ms: float) -> list[DecodePoint]:
    """Decode points with the context term removed, so Eq. 2 fits batch size alone."""
    return [
        DecodePoint(p.batch_size, p.context,
                    p.step_ms - per_kctx_ms * p.batch_size * p.context / 1000, p.cv)
        for p in points
    ]  # fmt: skip


def fit_prefill(
    points: Sequence[PrefillPoint],
    floor_ms: float,
    mixed: Sequence[MixedPoint] = (),
    residuals: bool = False,
) -> PrefillFit:
    """Least squares of ``step_ms = f + p * C + a * C * mean_context / 1000`` over
    prefill-only steps; ``a`` clamped at 0 and ``p`` at 0. The floor ``f`` is fitted where
    the points tell it apart from the other terms (at least three points, two chunk sizes)
    and kept when it lies above ``floor_ms``, the latency model's decode step with nothing
    decoding (a prefill-only step pays at least the weight read): on a CPU a lone chunk
    runs the projections at its own row count, and its fixed cost is not the batch-1
    decode step's (a 16-token chunk took 64.5 ms where batch 1 decoded in 28 ms and the
    curve beyond it starts near 40 ms). Otherwise ``f = floor_ms`` and ``floor_ms`` of the
    fit is 0. The mixing overhead is what a decode step with one chunk costs beyond the
    decode step plus the chunk's model cost: the median over the ``mixed`` points, so that
    one chunk size the engine runs slowly does not set it (clamped at 0; 0 without mixed
    points). The per-chunk overhead is what a split step (the same tokens as k chunks)
    costs beyond its one-chunk step and the chunks' model costs, over k - 1: the median
    over the points whose split was timed (clamped at 0; 0 when none was). With a single
    prefill point the attention term is 0: one point cannot tell the two terms apart. Where
    the floor is ``floor_ms`` and lies so high that the per-token term would come out at 0
    while the points rise with the chunk, the per-token term is the points' own slope.

    With ``residuals``, each chunk size timed at context 0 gets one: what its step measured
    beyond the floor and the line, kept where it exceeds the prefill points' pass-to-pass
    spread (the median over the points of their ``spread``) times the step and 0
    otherwise, as the decode residual is gated (``decode_residuals``). The mixing and
    per-chunk overheads are then fitted with it, at the mixed step's decode and prefill
    tokens together as the latency model applies it (``LatencyModel.step_residual_ms``),
    so a step size the engine runs slowly does not count as mixing cost."""
    if not points:
        raise ValueError("the prefill fit needs at least one prefill point")
    chunk = np.array([p.num_tokens for p in points], dtype=float)
    mean_context = np.array([p.context_start for p in points], dtype=float) + (chunk + 1) / 2
    step_ms = np.array([p.step_ms for p in points], dtype=float)
    fitted_floor, per_token, attention = _prefill_terms(chunk, mean_context, step_ms, None)
    if not fitted_floor > floor_ms:  # also when the points do not determine it (NaN)
        fitted_floor = 0.0
        _, per_token, attention = _prefill_terms(chunk, mean_context, step_ms, floor_ms)
        if per_token <= 0 and len(set(chunk.tolist())) > 1:
            # The decode floor lies above the prefill steps (decode timed in a slow phase of
            # the machine, 71 ms where a 32-token prefill took less): the points' own slope.
            per_token = max(0.0, float(np.polyfit(chunk, step_ms, 1)[0]))
    fit = PrefillFit(per_token, attention, 0.0, floor_ms=fitted_floor)
    if residuals:
        noise = prefill_pass_spread(points)
        floor = fitted_floor or floor_ms
        fit = replace(fit, residual_ms=_prefill_residuals(fit, floor, points, noise))
    if not mixed:
        return fit
    sizes, values = [t for t, _ in fit.residual_ms], [ms for _, ms in fit.residual_ms]
    overhead = statistics.median(
        point.mixed_ms - point.decode_ms - fit.chunk_ms(point.chunk, 0)
        - prefill_residual_at(sizes, values, point.batch_size + point.chunk)
        for point in mixed
    )  # fmt: skip
    per_chunk = [_per_chunk_ms(fit, point) for point in mixed if point.split_chunks > 1]
    return replace(
        fit,
        mixed_overhead_ms=max(0.0, overhead),
        chunk_overhead_ms=max(0.0, statistics.median(per_chunk)) if per_chunk else 0.0,
    )


def _prefill_residuals(
    fit: PrefillFit, floor_ms: float, points: Sequence[PrefillPoint], noise: float
) -> tuple[tuple[int, float], ...]:
    """Per chunk size timed at context 0 (increasing), the median of what its points
    measured beyond ``floor_ms`` and ``fit``'s line, gated by ``noise`` (``fit_prefill``);
    empty when every one is 0."""
    measured = [
        (p.num_tokens, p.step_ms, floor_ms + fit.chunk_ms(p.num_tokens, 0))
        for p in points
        if p.context_start == 0
    ]
    residuals = _residual_table(measured, noise)
    return residuals if any(ms for _, ms in residuals) else ()


def _per_chunk_ms(fit: PrefillFit, point: MixedPoint) -> float:
    """What each chunk beyond the first of ``point``'s split step adds (ms)."""
    k = point.split_chunks
    tokens_ms = k * fit.chunk_ms(point.split_chunk, 0) - fit.chunk_ms(point.chunk, 0)
    return (point.split_ms - point.mixed_ms - tokens_ms) / (k - 1)


def _prefill_terms(
    chunk: np.ndarray, mean_context: np.ndarray, step_ms: np.ndarray, floor_ms: float | None
) -> tuple[float, float, float]:
    """(floor, per token, attention per 1,000 context tokens) of prefill-only steps: the
    floor fixed at ``floor_ms``, or fitted when None and the points determine it (else
    NaN); the attention term dropped (0) when it comes out negative or the points are too
    few for it; the per-token term clamped at 0."""
    fitted = floor_ms is None
    target = step_ms if floor_ms is None else step_ms - floor_ms
    columns = [np.ones_like(chunk)] if fitted else []
    design = np.column_stack([*columns, chunk, chunk * mean_context / 1000])
    if fitted and (len(chunk) < 3 or np.linalg.matrix_rank(design) < 3):
        return float("nan"), 0.0, 0.0
    terms, *_ = np.linalg.lstsq(design, target, rcond=None)
    if terms[-1] < 0 or len(chunk) < design.shape[1]:
        terms, *_ = np.linalg.lstsq(design[:, :-1], target, rcond=None)
        terms = np.append(terms, 0.0)
    floor = float(terms[0]) if floor_ms is None else floor_ms
    return floor, max(0.0, float(terms[-2])), float(terms[-1])


# The wake cost counts only above this share of the step it delays: below it, the difference
# of two medians of three steps is within a CPU's step-to-step noise.
IDLE_WAKE_MIN_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class IdleWakeFit:
    """What the first step after idle pays (``wake_ms``) and from how long an idle gap
    (``after_s``); both 0 when the sweep saw no such cost."""

    wake_ms: float = 0.0
    after_s: float = 0.0


def fit_idle_wake(points: Sequence[IdlePoint]) -> IdleWakeFit:
    """Per idle gap, the median over repeats of (step after the gap - the same step at
    once). The wake cost is that of the longest gap, kept when it exceeds
    ``IDLE_WAKE_MIN_SHARE`` of the warm step; it applies from the shortest gap whose cost
    reached half of it (a gap that a CPU sleeps through pays the whole cost, a shorter
    one none). No points: no cost."""
    if not points:
        return IdleWakeFit()
    gaps = sorted({p.gap_s for p in points})
    extra = {
        gap: statistics.median(p.after_idle_ms - p.warm_ms for p in points if p.gap_s == gap)
        for gap in gaps
    }
    wake = extra[gaps[-1]]
    warm = statistics.median(p.warm_ms for p in points)
    if wake <= IDLE_WAKE_MIN_SHARE * warm:
        return IdleWakeFit()
    after = next(gap for gap in gaps if extra[gap] >= wake / 2)
    return IdleWakeFit(wake, after)
