"""Survival curves fitted, and a batch's expected remaining output and KV forecast rows
read from them, in compiled loops.

``OutputLengthEstimator.remaining`` reads each request's expected remaining output on the
pooled survival curve and on its prompt bucket's, then blends the two. In numpy that is
some 35 array operations whatever the batch holds, each 1-2 us of dispatch: most of TWP's
decision at 256 running requests. Here one loop, compiled by numba, does the same per
element: the arithmetic of ``CurveStack.at``, ``CurveStack.remaining`` and the estimator's
blend, the same IEEE operations in the same order (no fast-math, so no reassociation or
fused multiply-add), so the values are numpy's to the last bit wherever numpy's ``exp``
and ``expm1`` are the C library's. Where numpy evaluates ``exp`` with its own vector code
(CPUs with AVX-512), a value on an extrapolated tail may differ in its last bit.

``fit_tables`` is ``SurvivalCurve.fit``'s Kaplan-Meier fit, which the estimator repeats for
each of its curves after every step in which a request finished: in numpy about 35 array
operations (70-100 us) whatever the curve's size; here a few passes. Its sums
and products run in numpy's order (``cumsum`` and ``cumprod`` add and multiply in
sequence), so the tables are the same to the last bit.

``forecast_rows`` is ``still_running``'s grouping and blended rows for the KV forecast,
element by element in the same way.

Each loop is compiled for its one signature when this module is imported (or loaded from
numba's cache, next to this file or in the user's cache directory): importing it costs
numba's import and that load, and no estimate ever waits for a compiler. Importing fails
with ``ImportError`` where numba is not installed; the estimator then stays on numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numba
import numpy as np
import numpy.typing as npt

from tokenpace.policy.curve_stack import BucketedCurves
from tokenpace.policy.loop_compiler import compile_loop, contiguous_ints
from tokenpace.policy.output_length import COUNT_TABLE_MAX, SurvivalTables, grid_step

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _read(
    base: IntArray, tails: IntArray, hazards: FloatArray, dense: FloatArray,
    cumulative: FloatArray, curve: int, x: int,
) -> tuple[float, float]:  # fmt: skip
    """S(x) and the sum of S(t) for t < x on the stack's curve ``curve`` (``CurveStack.at``
    for one element)."""
    tail = tails[curve]
    flat = (x if x < tail else tail) + base[curve]
    s, area = dense[flat], cumulative[flat]
    beyond_tokens = x - tail
    if beyond_tokens <= 0:
        return s, area
    beyond = float(beyond_tokens)
    h = hazards[curve]
    if h > 0:
        scaled = -h * beyond
        return s * math.exp(scaled), area + s * (-math.expm1(scaled)) / h
    return s, area + s * beyond


_read_compiled = numba.njit(inline="always")(_read)


def _bucket_of(edges: IntArray, prompt: int) -> int:
    """The prompt bucket of ``prompt``: the number of ``edges`` at or below it."""
    bucket = 0
    while bucket < len(edges) and edges[bucket] <= prompt:
        bucket += 1
    return bucket


_bucket_of_compiled = numba.njit(inline="always")(_bucket_of)


def _remaining_on(
    base: IntArray, tails: IntArray, hazards: FloatArray, dense: FloatArray,
    cumulative: FloatArray, curve: int, produced: int, cap: int,
) -> float:  # fmt: skip
    """E[min(L, cap) - produced | L > produced] on curve ``curve`` (``CurveStack.remaining``
    for one element)."""
    s_o, area_o = _read_compiled(base, tails, hazards, dense, cumulative, curve, produced)
    area_m = _read_compiled(base, tails, hazards, dense, cumulative, curve, cap)[1]
    budget = float(cap - produced)
    expected = (area_m - area_o) / s_o if s_o > 0 else budget
    expected = max(expected, 1.0)
    return min(expected, max(budget, 1.0))


_remaining_on_compiled = numba.njit(inline="always")(_remaining_on)


def _blended_loop(
    base: IntArray, tails: IntArray, hazards: FloatArray, dense: FloatArray,
    cumulative: FloatArray, edges: IntArray, stack_index: IntArray, weights: FloatArray,
    bucketed: bool, prompts: IntArray, produced: IntArray, caps: IntArray, out: FloatArray,
) -> None:  # fmt: skip
    """``out[i]``: request i's remaining output on the pooled curve (the stack's 0), blended
    by ``weights[b]`` with its bucket b's curve (``stack_index[b]``, 0: none) once
    ``bucketed``; b is the number of ``edges`` at or below its prompt."""
    for i in range(len(produced)):
        at, cap = produced[i], caps[i]
        value = _remaining_on_compiled(base, tails, hazards, dense, cumulative, 0, at, cap)
        if bucketed:
            bucket = _bucket_of_compiled(edges, prompts[i])
            own_curve = stack_index[bucket]
            if own_curve > 0:
                weight = weights[bucket]
                own = _remaining_on_compiled(
                    base, tails, hazards, dense, cumulative, own_curve, at, cap
                )
                value = weight * own + (1.0 - weight) * value
        out[i] = value


def _fit_loop(events: IntArray, censored: IntArray) -> SurvivalTables:
    """``SurvivalCurve.fit``'s tables of finished lengths ``events`` (at least one, all
    positive) and running requests' tokens ``censored``: the steps' starts and survival,
    the area before each step, and S(x) and its sum below x for x = 0 .. T."""
    num_events = len(events)
    lengths = np.empty(num_events, dtype=np.int64)
    counts = np.empty(num_events, dtype=np.int64)
    # censored_below[k]: the censored lengths below lengths[k].
    censored_below = np.empty(num_events, dtype=np.int64)
    num_lengths = 0
    longest = events.max()
    longest_censored = censored.max() if len(censored) else -1
    if longest <= COUNT_TABLE_MAX:
        finished_at = np.zeros(longest + 1, dtype=np.int64)
        censored_at = np.zeros(longest + 1, dtype=np.int64)
        for value in events:
            finished_at[value] += 1
        for value in censored:
            if value <= longest:  # beyond every event: below none of them
                censored_at[value] += 1
        below = 0
        for value in range(longest + 1):
            if finished_at[value]:
                lengths[num_lengths] = value
                counts[num_lengths] = finished_at[value]
                censored_below[num_lengths] = below
                num_lengths += 1
            below += censored_at[value]
    else:
        exceeded = np.sort(censored)
        below = 0
        for value in np.sort(events):
            if num_lengths and lengths[num_lengths - 1] == value:
                counts[num_lengths - 1] += 1
                continue
            while below < len(exceeded) and exceeded[below] < value:
                below += 1
            lengths[num_lengths] = value
            counts[num_lengths] = 1
            censored_below[num_lengths] = below
            num_lengths += 1
    num_censored = len(censored)
    num_steps = num_lengths + 2
    starts = np.empty(num_steps, dtype=np.int64)
    steps = np.empty(num_steps)
    starts[0], steps[0] = 0, 1.0
    survival = 1.0
    finished_before = 0
    for k in range(num_lengths):
        at_risk = (num_events - finished_before) + (num_censored - censored_below[k])
        survival *= 1.0 - counts[k] / at_risk
        starts[k + 1], steps[k + 1] = lengths[k], survival
        finished_before += counts[k]
    tail_start = max(lengths[num_lengths - 1], longest_censored)
    starts[num_steps - 1], steps[num_steps - 1] = tail_start, steps[num_steps - 2]
    area = np.empty(num_steps)
    area[0] = 0.0
    total = 0.0
    for k in range(num_steps - 1):
        total += steps[k] * (starts[k + 1] - starts[k])
        area[k + 1] = total
    dense = np.empty(tail_start + 1)
    cumulative = np.empty(tail_start + 1)
    for k in range(num_steps):
        end = starts[k + 1] if k + 1 < num_steps else tail_start + 1
        for x in range(starts[k], end):
            dense[x] = steps[k]
            cumulative[x] = area[k] + steps[k] * (x - starts[k])
    return starts, steps, area, dense, cumulative


_fit_compiled = cast(
    Callable[[IntArray, IntArray], SurvivalTables],
    compile_loop(
        "Tuple((int64[::1], float64[::1], float64[::1], float64[::1], float64[::1]))"
        "(int64[::1], int64[::1])"
    )(_fit_loop),
)


def fit_tables(events: IntArray, censored: IntArray) -> SurvivalTables:
    """``SurvivalCurve.fit``'s tables (``starts``, ``survival``, ``area``, ``dense``,
    ``cumulative``) of finished lengths ``events`` (at least one, all positive) and the
    running requests' tokens out ``censored``, to the last bit."""
    return _fit_compiled(contiguous_ints(events), contiguous_ints(censored))


def _survival(
    base: IntArray, tails: IntArray, hazards: FloatArray, dense: FloatArray, curve: int, x: int
) -> float:
    """S(x) on the stack's curve ``curve`` (``CurveStack.survival_at`` for one element)."""
    tail = tails[curve]
    s: float = dense[(x if x < tail else tail) + base[curve]]
    beyond_tokens = x - tail
    h = hazards[curve]
    if beyond_tokens > 0 and h > 0:
        s *= math.exp(-h * beyond_tokens)
    return s


_survival_compiled = numba.njit(inline="always")(_survival)


def _row_into(
    base: IntArray, tails: IntArray, hazards: FloatArray, dense: FloatArray, curve: int,
    produced: int, cap: int, offsets: IntArray, row: FloatArray,
) -> None:  # fmt: skip
    """P(min(L, cap) > produced + t | L > produced) at each offset t on curve ``curve``
    (``CurveStack.still_running`` for one request), into ``row``."""
    s_o = _survival_compiled(base, tails, hazards, dense, curve, produced)
    scale = 1.0 / s_o if s_o > 0 else 0.0
    for k in range(len(offsets)):
        ratio = (
            _survival_compiled(base, tails, hazards, dense, curve, produced + offsets[k]) * scale
            if s_o > 0
            else 1.0
        )
        row[k] = ratio * (1.0 if offsets[k] < cap - produced else 0.0)


_row_into_compiled = numba.njit(inline="always")(_row_into)


def _forecast_loop(
    base: IntArray, tails: IntArray, hazards: FloatArray, dense: FloatArray,
    edges: IntArray, stack_index: IntArray, weights: FloatArray, bucketed: bool,
    prompts: IntArray, produced: IntArray, caps: IntArray, offsets: IntArray, step: int,
) -> tuple[FloatArray, IntArray, IntArray, IntArray, IntArray]:  # fmt: skip
    """``OutputLengthEstimator.still_running``'s grouping (``StillRunning.group``) and its
    rows, blended over the curves as ``blended_remaining`` blends: (rows, row_of, and the
    rows' produced tokens, caps and buckets)."""
    n = len(produced)
    num_offsets = len(offsets)
    buckets = np.zeros(n, dtype=np.int64)
    progress = np.empty(n, dtype=np.int64)
    left = np.empty(n, dtype=np.int64)
    span = 1
    for j in range(n):
        if bucketed:
            buckets[j] = _bucket_of_compiled(edges, prompts[j])
        progress[j] = produced[j] // step
        to_cap = caps[j] - produced[j]
        left[j] = 0 if to_cap <= 0 else min((to_cap + step - 1) // step, num_offsets)
        span = max(span, progress[j] + 1)
    keys = (buckets * span + progress) * (num_offsets + 1) + left
    order = np.argsort(keys)
    row_of = np.empty(n, dtype=np.int64)
    distinct = np.empty(n, dtype=np.int64)
    num_rows = 0
    for j in order:
        if num_rows == 0 or distinct[num_rows - 1] != keys[j]:
            distinct[num_rows] = keys[j]
            num_rows += 1
        row_of[j] = num_rows - 1
    rows = np.empty((num_rows, num_offsets))
    own = np.empty(num_offsets)
    rep_produced = np.empty(num_rows, dtype=np.int64)
    rep_caps = np.empty(num_rows, dtype=np.int64)
    rep_buckets = np.empty(num_rows, dtype=np.int64)
    for r in range(num_rows):
        rep_left = distinct[r] % (num_offsets + 1)
        rep_progress = distinct[r] // (num_offsets + 1)
        at = (rep_progress % span) * step
        cap = at + rep_left * step
        bucket = rep_progress // span
        rep_produced[r], rep_caps[r], rep_buckets[r] = at, cap, bucket
        row = rows[r]
        _row_into_compiled(base, tails, hazards, dense, 0, at, cap, offsets, row)
        own_curve = stack_index[bucket] if bucketed else 0
        if own_curve > 0:
            weight = weights[bucket]
            _row_into_compiled(base, tails, hazards, dense, own_curve, at, cap, offsets, own)
            for k in range(num_offsets):
                row[k] = weight * own[k] + (1.0 - weight) * row[k]
    return rows, row_of, rep_produced, rep_caps, rep_buckets


_INTS = "int64[::1]"
_FLOATS = "float64[::1]"
_SIGNATURE = (
    f"void({_INTS}, {_INTS}, {_FLOATS}, {_FLOATS}, {_FLOATS}, {_INTS}, {_INTS}, {_FLOATS}, "
    f"boolean, {_INTS}, {_INTS}, {_INTS}, {_FLOATS})"
)
_blended_compiled = cast(Callable[..., None], compile_loop(_SIGNATURE)(_blended_loop))


def blended_remaining(
    curves: BucketedCurves, prompts: IntArray, produced: IntArray, caps: IntArray
) -> FloatArray:
    """Expected remaining output tokens of each request (``prompts``, ``produced``,
    ``caps``: columns of one length), on the pooled curve blended with its prompt bucket's
    as ``curves`` says. The values of ``OutputLengthEstimator``'s numpy path (see the
    module's docstring)."""
    stack = curves.stack
    out = np.empty(len(produced))
    _blended_compiled(
        stack.base, stack.tails, stack.hazards, stack.dense, stack.cumulative,
        curves.edges, curves.stack_index, curves.weights, curves.bucketed,
        contiguous_ints(prompts), contiguous_ints(produced), contiguous_ints(caps), out,
    )  # fmt: skip
    return out


_forecast_compiled = cast(
    Callable[..., tuple[FloatArray, IntArray, IntArray, IntArray, IntArray]],
    compile_loop(
        f"Tuple((float64[:, ::1], {_INTS}, {_INTS}, {_INTS}, {_INTS}))({_INTS}, {_INTS}, "
        f"{_FLOATS}, {_FLOATS}, {_INTS}, {_INTS}, {_FLOATS}, boolean, {_INTS}, {_INTS}, "
        f"{_INTS}, {_INTS}, int64)"
    )(_forecast_loop),
)


def forecast_rows(
    curves: BucketedCurves,
    prompts: IntArray,
    produced: IntArray,
    caps: IntArray,
    offsets: IntArray,
) -> tuple[FloatArray, IntArray, IntArray, IntArray, IntArray]:
    """``OutputLengthEstimator.still_running`` of requests (``prompts``, ``produced``,
    ``caps``) over the forecast grid ``offsets`` (0, d, 2d, ..): the requests grouped as
    ``StillRunning.group`` groups them (by prompt bucket, once ``bucketed``, progress
    rounded down to d, tokens left rounded up), each group's row read on the pooled curve
    and blended with its bucket's as ``curves`` says. Returns (rows, each
    request's row, and each row's produced tokens, cap and bucket): the numpy path's
    values, to the last bit where its exp is the C library's (see the module's
    docstring)."""
    stack = curves.stack
    return _forecast_compiled(
        stack.base, stack.tails, stack.hazards, stack.dense, curves.edges, curves.stack_index,
        curves.weights, curves.bucketed, contiguous_ints(prompts), contiguous_ints(produced),
        contiguous_ints(caps), contiguous_ints(offsets), grid_step(offsets),
    )  # fmt: skip
