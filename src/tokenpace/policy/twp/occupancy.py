"""The KV blocks a set of requests is expected to hold over the coming steps.

A running request holds its prompt and output so far, grows by one token a step until it
finishes, then frees everything. Its output length is uncertain: what the policy knows is
the probability p(t) that it is still running t tokens from now (``OutputLengthEstimator.
still_running``: the learned survival curve conditioned on what it has produced, 0 from its
cap on; 1 until the cap when planning with ``max_tokens`` budgets). Over the next
``horizon`` tokens, on a grid of offsets t_k = k x d (k = 0 .. K - 1), a request holding c
tokens now holds at most h_k = (c + t_k + d) / block_size + 1 blocks anywhere in
[t_k, t_k + d) if it still runs at t_k (the +1: a partly filled block), so the batch's held
blocks there are bounded by sum_j h_jk B_jk with B_jk ~ Bernoulli(p_j(t_k)), independent
between requests: mean sum_j h_jk p_jk, variance sum_j h_jk^2 p_jk (1 - p_jk).

Counting each request at its expected final size instead, as if all of them ran to their
expected ends together, overstates the peak where lengths are spread: with half the outputs
short and a fifth four times longer, the short ones free their blocks long before the long
ones grow, and the expected peak is about 0.6 of the sum of expected final sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.policy.output_length import StillRunning, grid_step

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Offsets of the forecast grid: a request is counted up to d = horizon / 64 tokens ahead of
# itself, about one block at the usual 1,024-token caps.
NUM_OFFSETS = 64


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Blocks held at each offset of a forecast grid: expected count and its variance."""

    mean: FloatArray
    variance: FloatArray

    @staticmethod
    def of(
        current_tokens: FloatArray | IntArray,
        still_running: StillRunning,
        offsets: IntArray,
        block_size: int,
    ) -> Occupancy:
        """Requests holding ``current_tokens`` now (n), still running at each offset of the
        grid ``offsets`` (``forecast_offsets``) with the probabilities ``still_running``;
        see the module doc. Requests sharing a row are summed before it is applied."""
        step = float(grid_step(offsets))
        # h_jk = a_j + t_k / block_size: the sums over requests of one row are sums of a_j.
        base = (np.asarray(current_tokens, dtype=np.float64) + step) / block_size + 1.0
        growth = offsets.astype(np.float64) / block_size
        rows, row_of = still_running.rows, still_running.row_of
        count = np.bincount(row_of, minlength=len(rows)).astype(np.float64)
        first = np.bincount(row_of, base, minlength=len(rows))
        second = np.bincount(row_of, base * base, minlength=len(rows))
        uncertain = rows - rows * rows
        mean: FloatArray = first @ rows + growth * (count @ rows)
        variance: FloatArray = (
            second @ uncertain
            + 2.0 * growth * (first @ uncertain)
            + growth * growth * (count @ uncertain)
        )
        return Occupancy(mean, np.maximum(variance, 0.0))

    @staticmethod
    def one(
        current_tokens: int, still_running: FloatArray, held_empty: FloatArray, block_size: int
    ) -> Occupancy:
        """``of`` for one request holding ``current_tokens`` now whose row of probabilities
        is ``still_running``, given ``held_empty = held_by_empty(offsets, block_size)``:
        h_k p_k and h_k^2 p_k (1 - p_k)."""
        held = held_empty + current_tokens / block_size
        mean = held * still_running
        return Occupancy(mean, held * (mean - mean * still_running))

    @staticmethod
    def at_start(blocks: float, num_offsets: int) -> Occupancy:
        """``blocks`` held now and nothing after: a lower bound of any request that holds
        at least that many blocks when admitted."""
        mean = np.zeros(num_offsets)
        mean[0] = blocks
        return Occupancy(mean, np.zeros(num_offsets))


def held_by_empty(offsets: IntArray, block_size: int) -> FloatArray:
    """h_k of a request holding no tokens now (``Occupancy.of``): (t_k + d) / block_size + 1;
    one holding c tokens holds c / block_size more."""
    held: FloatArray = (offsets + float(grid_step(offsets))) / block_size + 1.0
    return held


def forecast_offsets(horizon_tokens: int, num_offsets: int = NUM_OFFSETS) -> IntArray:
    """The grid 0, d, 2d, .. of ``num_offsets`` (at least 2) offsets covering
    ``horizon_tokens``."""
    if num_offsets < 2:
        raise ValueError(f"a forecast needs at least 2 offsets, got {num_offsets}")
    step = max(1, math.ceil(horizon_tokens / num_offsets))
    return np.arange(num_offsets, dtype=np.int64) * step
