"""The compiled admission test answers as the numpy one does, to the last bit."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from tokenpace.policy.output_length import StillRunning
from tokenpace.policy.twp.occupancy import Occupancy, forecast_offsets, held_by_empty

kernel = pytest.importorskip("tokenpace.policy.twp.occupancy_kernel")


def _numpy_bound(batch: Occupancy, candidate: Occupancy, sigmas: float) -> float:
    """The largest forecast bound with the candidate, as ``KvReservation._fits`` has it."""
    bound = batch.mean + candidate.mean
    bound += sigmas * np.sqrt(batch.variance + candidate.variance)
    return float(bound.max())


@pytest.mark.parametrize("seed", range(40))
def test_candidate_fits_exactly_where_the_numpy_bound_does(seed: int) -> None:
    rng = np.random.default_rng(seed)
    block_size = int(rng.choice([1, 16, 32]))
    offsets = forecast_offsets(int(rng.integers(1, 4000)))
    held_empty = held_by_empty(offsets, block_size)
    # Rows with certain (0, 1) and uncertain entries, as the survival curves give.
    rows = rng.random((6, len(offsets)))
    rows[rng.random(rows.shape) < 0.3] = 1.0
    rows[rng.random(rows.shape) < 0.2] = 0.0
    current = rng.integers(1, 3000, 6)
    batch = Occupancy.of(current, _each(rows), offsets, block_size)
    sigmas = float(rng.choice([0.0, 1.0, 2.5]))
    row = rows[0] if seed % 2 else rng.random(len(offsets))
    tokens = int(rng.integers(1, 3000))
    candidate = Occupancy.one(tokens, row, held_empty, block_size)
    bound = _numpy_bound(batch, candidate, sigmas)
    # At the bound itself (fits), a last bit below it (does not), and around it.
    for total, fits in ((bound, True), (float(np.nextafter(bound, -np.inf)), False),
                        (bound * 1.5, True), (bound * 0.5, False)):  # fmt: skip
        answer = kernel.candidate_fits(batch, held_empty, row, tokens / block_size, sigmas, total)
        assert answer is fits


def test_nan_in_the_forecast_never_fits() -> None:
    offsets = forecast_offsets(640)
    held_empty = held_by_empty(offsets, 16)
    mean = np.zeros(len(offsets))
    mean[5] = np.nan
    row = np.ones(len(offsets))
    zeros = np.zeros(len(offsets))
    assert not kernel.candidate_fits(Occupancy(mean, zeros), held_empty, row, 1.0, 1.0, 1e9)
    assert kernel.candidate_fits(Occupancy(zeros, zeros), held_empty, row, 1.0, 1.0, 1e9)


def _each(rows: npt.NDArray[np.float64]) -> StillRunning:
    return StillRunning(rows, np.arange(len(rows), dtype=np.int64))


@pytest.mark.parametrize("seed", range(10))
def test_largest_sizes_sum_the_numpy_sizes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 600))
    prompts = rng.integers(1, 4000, n)
    produced = rng.integers(0, 500, n)
    caps = produced + rng.integers(-5, 800, n)  # some at or past their cap
    grid_last, grid_step, block_size = 63 * 13, 13, int(rng.choice([1, 16]))
    left = caps - produced
    reach = np.minimum(left, grid_last)
    sizes = np.where(left > 0, (prompts + produced + reach + grid_step) / block_size + 1.0, 0.0)
    total, squares = kernel.largest_sizes(prompts, produced, caps, grid_last, grid_step, block_size)
    # Summed in sequence, not in numpy's blocks: equal to rounding.
    assert total == pytest.approx(float(sizes.sum()), rel=1e-12, abs=0)
    assert squares == pytest.approx(float(np.dot(sizes, sizes)), rel=1e-12, abs=0)
