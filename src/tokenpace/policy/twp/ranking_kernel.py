"""The head of TWP's ranking of a long queue, read in size order, in one compiled loop.

``ranking.ranked`` reads a queue of 2,048 or more in size order (``prompt_scan``): the
queue's largest fairness first (``top_fairness``), then slices of 128 scored exactly and
handed out, best first, as soon as nobody unread can beat them. In numpy and Python that is
some 60 array operations and a generator per step that admits anything, about 150 us at
10,000 waiting on a 2-core cloud CPU, whatever the gate takes. Here one loop, compiled by
numba, runs the same scan: the same slices, the same bounds and the same exact scores (the
IEEE operations of ``ranking._scores`` in the same order, no fast-math), so it hands out
the same requests in the same order, up to ``limit`` of them per call; the caller goes on
from there, leaving out those already handed out, or hands over to the whole-queue ranking
where the scan would (``Outcome``).

The one operation that is not plain arithmetic is the token balance's ``exp``: the loop
calls the C library's, numpy calls its own on CPUs where it has vector code for it (AVX-512).
``exp_matches_numpy`` compares the two over a probe of the balance's arguments when this
module is imported; the ranking uses the loop only where they agree on every probe, so the
order is the numpy ranking's.

The loop is compiled for its two signatures (expected outputs as max_tokens integers or as
learned floats) when this module is imported, or loaded from numba's cache; importing fails
with ``ImportError`` where numba is not installed, and the ranking stays in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numba
import numpy as np
import numpy.typing as npt

from tokenpace.policy.loop_compiler import (
    READONLY_FLOATS,
    READONLY_INTS,
    compile_loop,
    contiguous_floats,
    contiguous_ints,
)
from tokenpace.policy.twp import prompt_scan
from tokenpace.policy.twp.prompt_scan import Outcome, ScanInputs

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Positions = npt.NDArray[np.intp]


def _score(
    p: int, enqueued_step: IntArray, arrival_s: FloatArray, prompts: IntArray,
    output: IntArray | FloatArray, now_s: float, step_index: int, mean_remaining: float,
    top: float, w1: float, w2: float, w3: float, t_max: int,
) -> float:  # fmt: skip
    """``ranking._scores`` of the request at position ``p``."""
    starvation = min(1.0, (step_index - enqueued_step[p]) / t_max)
    out = output[p]
    balance = math.exp(-abs(out - mean_remaining) / (mean_remaining + 1.0))
    per_size = (now_s - arrival_s[p]) / (prompts[p] + out)
    fairness = per_size / top if top > 0 else 0.0
    score: float = w1 * starvation + w2 * balance + w3 * fairness
    return score


def _live_position(queue_seqs: IntArray, seq: int) -> int:
    """The queue position holding sequence number ``seq``; -1 when it has left."""
    n = len(queue_seqs)
    at = int(np.searchsorted(queue_seqs, seq))
    if at >= n:
        at = n - 1
    return at if queue_seqs[at] == seq else -1


_score_compiled = numba.njit(inline="always")(_score)
_live_position_compiled = numba.njit(inline="always")(_live_position)


def _head_loop(
    sorted_seqs: IntArray, keys: IntArray, queue_seqs: IntArray, tail_start: int,
    excluded: IntArray, enqueued_step: IntArray, arrival_s: FloatArray, prompts: IntArray,
    output: IntArray | FloatArray, extra: float, now_s: float, oldest_wait: float,
    step_index: int, mean_remaining: float, w1: float, w2: float, w3: float, t_max: int,
    score_ceiling: float, slice_size: int, max_slices: int, limit: int, out: IntArray,
) -> tuple[int, int]:  # fmt: skip
    """Write the first up to ``limit`` positions of the ranking into ``out``; return how
    many and the ``Outcome``. ``prompt_scan.top_fairness`` and ``ranked_by_prompt``, step
    for step."""
    n = len(queue_seqs)
    num_sorted = len(keys)
    if not oldest_wait > 0:
        return 0, 3
    # The queue's largest fairness, read in size order (top_fairness).
    best = -np.inf
    for p in range(tail_start, n):
        value = (now_s - arrival_s[p]) / (prompts[p] + output[p])
        if value > best:
            best = value
    for start in range(0, num_sorted, slice_size):
        if oldest_wait / (keys[start] + extra) < best:
            break
        if start >= max_slices * slice_size:
            return 0, 3
        for i in range(start, min(start + slice_size, num_sorted)):
            p = _live_position_compiled(queue_seqs, sorted_seqs[i])
            if p >= 0:
                value = (now_s - arrival_s[p]) / (prompts[p] + output[p])
                if value > best:
                    best = value
    top = best
    if not top > 0:
        return 0, 3
    # The scan (ranked_by_prompt): a pool of exact scores, handed out best first once no
    # unread request can reach them.
    skip = np.zeros(n, dtype=np.bool_)
    for p in excluded:
        skip[p] = True
    pool = np.empty(n, dtype=np.int64)
    pool_scores = np.empty(n, dtype=np.float64)
    reading = np.empty(max(n - tail_start, slice_size), dtype=np.int64)
    size = 0
    count = 0
    start = -slice_size  # the first read is the unsorted tail, then the slices in order
    while True:
        num_read = 0
        if start < 0:
            for p in range(tail_start, n):
                reading[num_read] = p
                num_read += 1
        else:
            for i in range(start, min(start + slice_size, num_sorted)):
                p = _live_position_compiled(queue_seqs, sorted_seqs[i])
                if p >= 0:
                    reading[num_read] = p
                    num_read += 1
        for k in range(num_read):
            p = reading[k]
            if not skip[p]:
                pool[size] = p
                pool_scores[size] = _score_compiled(
                    p, enqueued_step, arrival_s, prompts, output, now_s, step_index,
                    mean_remaining, top, w1, w2, w3, t_max,
                )  # fmt: skip
                size += 1
        start += slice_size
        if start < num_sorted:
            ceiling = score_ceiling + w3 * (oldest_wait / (keys[start] + extra) / top)
        else:
            ceiling = -np.inf
        num_ready = 0
        for i in range(size):
            if pool_scores[i] >= ceiling:
                num_ready += 1
        if num_ready:
            ready = np.empty(num_ready, dtype=np.int64)
            ready_scores = np.empty(num_ready, dtype=np.float64)
            kept = 0
            taken = 0
            for i in range(size):
                if pool_scores[i] >= ceiling:
                    ready[taken] = pool[i]
                    ready_scores[taken] = pool_scores[i]
                    taken += 1
                else:
                    pool[kept] = pool[i]
                    pool_scores[kept] = pool_scores[i]
                    kept += 1
            size = kept
            # Best score first, equal scores in queue order (a stable sort by position,
            # then by score).
            by_position = np.argsort(ready, kind="mergesort")
            ready = ready[by_position]
            ready_scores = ready_scores[by_position]
            order = np.argsort(-ready_scores, kind="mergesort")
            for i in order:
                out[count] = ready[i]
                count += 1
                if count == limit:
                    return count, 1
        if start >= num_sorted:
            return count, 0
        if start >= max_slices * slice_size:
            return count, 2


_INTS, _FLOATS = READONLY_INTS, READONLY_FLOATS


def _signature(output: numba.types.Type) -> numba.core.typing.Signature:
    i64, f64 = numba.int64, numba.float64
    return numba.types.UniTuple(i64, 2)(
        _INTS, _INTS, _INTS, i64, _INTS, _INTS, _FLOATS, _INTS, output, f64, f64, f64, i64,
        f64, f64, f64, f64, i64, f64, i64, i64, i64, numba.types.Array(i64, 1, "C"),
    )  # fmt: skip


HeadLoop = Callable[..., tuple[int, int]]
_head_compiled = cast(
    HeadLoop,
    compile_loop([_signature(_INTS), _signature(_FLOATS)])(_head_loop),
)


def _exp_loop(values: FloatArray, out: FloatArray) -> None:
    for i in range(len(values)):
        out[i] = math.exp(values[i])


_exp_compiled = compile_loop("void(float64[::1], float64[::1])")(_exp_loop)


def exp_matches_numpy() -> bool:
    """Whether the loop's ``exp`` (the C library's) gives numpy's ``exp`` bit for bit on a
    probe of the token balance's arguments -|L - rbar| / (rbar + 1): 40,000 points from
    -1e-12 to -745 (where exp underflows), spread evenly in log scale and in value."""
    probe = -np.concatenate((np.geomspace(1e-12, 745.0, 20_000), np.linspace(0.0, 50.0, 20_000)))
    compiled = np.empty_like(probe)
    _exp_compiled(probe, compiled)
    return bool(np.array_equal(compiled, np.exp(probe)))


# Decided once, when the module is imported: a property of this machine's libraries.
EXP_MATCHES_NUMPY = exp_matches_numpy()


def ranked_head(
    inputs: ScanInputs,
    enqueued_step: IntArray,
    arrival_s: FloatArray,
    prompts: IntArray,
    output: IntArray | FloatArray,
    excluded: Positions,
    limit: int,
) -> tuple[Positions, Outcome]:
    """Queue positions of the first up to ``limit`` requests of TWP's ranking read in size
    order, leaving out the positions ``excluded``, with how the scan ended (``Outcome``):
    ``prompt_scan.ranked_by_prompt``'s order after ``prompt_scan.top_fairness``, from the
    queue's columns (``enqueued_step``, ``arrival_s``, ``prompts``) and every waiting
    request's expected ``output`` (max_tokens, or learned estimates)."""
    out = np.empty(limit, dtype=np.int64)
    count, outcome = _head_compiled(
        contiguous_ints(inputs.sorted_seqs), contiguous_ints(inputs.keys),
        contiguous_ints(inputs.queue_seqs),
        inputs.tail_start, contiguous_ints(excluded), contiguous_ints(enqueued_step),
        contiguous_floats(arrival_s), contiguous_ints(prompts),
        _column(output),
        inputs.extra, inputs.now_s, inputs.oldest_wait_s, inputs.step_index,
        inputs.mean_remaining, inputs.w_starvation, inputs.w_balance, inputs.w_fairness,
        inputs.t_max_steps, inputs.score_ceiling, prompt_scan.SLICE, prompt_scan.MAX_SLICES,
        limit, out,
    )  # fmt: skip
    positions: Positions = out[:count].astype(np.intp, copy=False)
    return positions, Outcome(outcome)


def _column(output: IntArray | FloatArray) -> IntArray | FloatArray:
    """Expected outputs as the loop takes them: int64 budgets or float64 estimates."""
    if np.issubdtype(output.dtype, np.floating):
        return contiguous_floats(output)
    return contiguous_ints(output)
