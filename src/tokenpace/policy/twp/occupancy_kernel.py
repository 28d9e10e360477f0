"""The KV reservation's admission tests in compiled loops.

``KvReservation.admits`` asks, for each candidate that the cheap upper bound cannot pass,
whether the batch's forecast plus the candidate's own (``Occupancy.one``) stays within the
cache at every offset: in numpy some ten operations on the grid's 64 offsets, each 1-2 us
of dispatch, for every such candidate of every step (under KV pressure, several a step).
Here one loop, compiled by numba, does the same per offset: the same IEEE operations in the
same order (no fast-math, so no reassociation or fused multiply-add; ``sqrt`` is correctly
rounded in both), so it answers exactly as the numpy test does.

``largest_sizes`` sums the running requests' largest sizes and their squares for the
reservation's cheap upper bound (``KvReservation._bound_fits``), which a step computes once
before its first admission test: in numpy about a dozen operations whatever the batch holds.
The sums add in sequence, numpy's ``sum`` and ``dot`` in blocks, so they may differ in their
last bits; the bound has a relative slack of 1e-9 for rounding and only spares the exact
test when it passes, so the reservation's answers do not depend on them.

The loops are compiled for their signatures when this module is imported (or loaded from
numba's cache); importing fails with ``ImportError`` where numba is not installed, and the
reservation then tests in numpy.
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
from tokenpace.policy.twp.occupancy import Occupancy

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _fits_loop(
    batch_mean: FloatArray,
    batch_variance: FloatArray,
    held_empty: FloatArray,
    still_running: FloatArray,
    held_now: float,
    sigmas: float,
    total_blocks: float,
) -> bool:
    """True if, at every offset k, the batch's mean plus the candidate's (h_k p_k, with
    h_k = held_empty_k + held_now) plus ``sigmas`` standard deviations of the two
    variances summed (the candidate's h_k^2 p_k (1 - p_k), as ``Occupancy.one`` computes
    it) is at most ``total_blocks``; False at the first offset where it is not (NaN
    included, as numpy's ``max`` would)."""
    for k in range(len(batch_mean)):
        held = held_empty[k] + held_now
        p = still_running[k]
        mean = held * p
        variance = held * (mean - mean * p)
        bound = batch_mean[k] + mean
        bound += sigmas * math.sqrt(batch_variance[k] + variance)
        if not bound <= total_blocks:
            return False
    return True


_FLOATS, _INTS = READONLY_FLOATS, READONLY_INTS
_fits_compiled = cast(
    Callable[[FloatArray, FloatArray, FloatArray, FloatArray, float, float, float], bool],
    compile_loop(
        numba.boolean(
            _FLOATS, _FLOATS, _FLOATS, _FLOATS, numba.float64, numba.float64, numba.float64
        )
    )(_fits_loop),
)


def candidate_fits(
    batch: Occupancy,
    held_empty: FloatArray,
    still_running: FloatArray,
    held_now: float,
    sigmas: float,
    total_blocks: float,
) -> bool:
    """Whether a candidate holding ``held_now`` blocks now (tokens over the block size),
    whose row of probabilities of still running is ``still_running``, fits beside the
    ``batch``'s forecast with ``sigmas`` standard deviations of margin in ``total_blocks``
    at every offset. ``held_empty`` is ``occupancy.held_by_empty`` of the grid. Arrays of
    the grid's length."""
    fits = _fits_compiled(
        contiguous_floats(batch.mean), contiguous_floats(batch.variance),
        contiguous_floats(held_empty), contiguous_floats(still_running), float(held_now),
        float(sigmas), float(total_blocks),
    )  # fmt: skip
    return bool(fits)


def _sizes_loop(
    prompts: IntArray, produced: IntArray, caps: IntArray, grid_last: int, grid_step: int,
    block_size: int,
) -> tuple[float, float]:  # fmt: skip
    """Sum over requests of h = (prompt + produced + min(left, grid_last) + grid_step) /
    block_size + 1 (0 for one with no output left, left = cap - produced), and of h^2."""
    total = 0.0
    squares = 0.0
    for j in range(len(prompts)):
        left = caps[j] - produced[j]
        if left > 0:
            reach = left if left < grid_last else grid_last
            size = (prompts[j] + produced[j] + reach + grid_step) / block_size + 1.0
            total += size
            squares += size * size
    return total, squares


_sizes_compiled = cast(
    Callable[[IntArray, IntArray, IntArray, int, int, int], tuple[float, float]],
    compile_loop(
        numba.types.UniTuple(numba.float64, 2)(
            _INTS, _INTS, _INTS, numba.int64, numba.int64, numba.int64
        )
    )(_sizes_loop),
)


def largest_sizes(
    prompts: IntArray, produced: IntArray, caps: IntArray, grid_last: int, grid_step: int,
    block_size: int,
) -> tuple[float, float]:  # fmt: skip
    """The sum of the requests' largest sizes over the forecast grid (blocks; see
    ``KvReservation._largest``) and the sum of their squares."""
    total, squares = _sizes_compiled(
        contiguous_ints(prompts),
        contiguous_ints(produced),
        contiguous_ints(caps),
        grid_last,
        grid_step,
        block_size,
    )
    return float(total), float(squares)
