"""KV-aware admission against the batch's forecast KV occupancy, so that KV pressure is met
by waiting, not by preempting and recomputing.

The running requests and the ones a step admits are forecast over their coming tokens
(``occupancy``): at each offset of the grid, the blocks they are expected to hold and that
count's variance, from each request's learned probability of still running then. A
candidate is admitted only if, at every offset, the expected blocks of the batch with it
plus ``sigmas`` standard deviations fit in the KV cache. The standard deviation is the
margin learned from the estimate's error: the spread of the output lengths seen, as the
survival curve has them, conditioned on each request's progress. While the batch's lengths
stay within it, no running request is preempted. Planning with ``max_tokens`` budgets
(nothing learned), every request runs to its cap and the variance is 0: the test is then
exact, never preempting. Forced (starving) admissions wait for the reservation too: a
starving request goes first, but not at a running one's expense.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.request import Request
from tokenpace.policy.output_length import StillRunning, ints_of
from tokenpace.policy.twp.occupancy import (
    NUM_OFFSETS,
    Occupancy,
    forecast_offsets,
    held_by_empty,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
# (prompts, produced, caps, offsets) -> P(still running t tokens from now).
StillRunningOf = Callable[[IntArray, IntArray, IntArray, IntArray], StillRunning]
# The same for one request: (prompt, produced, cap, offsets) -> its row.
StillRunningRowOf = Callable[[int, int, int, IntArray], FloatArray]
# (batch's forecast, held_by_empty, candidate's row, blocks it holds now, sigmas, total
# blocks) -> whether it fits: ``occupancy_kernel.candidate_fits``.
CandidateFits = Callable[[Occupancy, FloatArray, FloatArray, float, float, float], bool]
# (prompts, produced, caps, grid's last offset, grid step, block size) -> the sum of the
# largest sizes and of their squares: ``occupancy_kernel.largest_sizes``.
LargestSizes = Callable[[IntArray, IntArray, IntArray, int, int, int], tuple[float, float]]


@dataclass(frozen=True, slots=True)
class CompiledTests:
    """``occupancy_kernel``'s loops: a candidate tested against the forecast, and the
    running requests' largest sizes summed for the cheap bound."""

    candidate_fits: CandidateFits
    largest_sizes: LargestSizes


def compiled_tests() -> CompiledTests | None:
    """The reservation's tests compiled (``occupancy_kernel``), None where numba is not
    installed. Its module compiles the loops (or loads them from numba's cache) on its
    first import."""
    try:
        from tokenpace.policy.twp import occupancy_kernel as kernel
    except ImportError:
        return None
    return CompiledTests(kernel.candidate_fits, kernel.largest_sizes)


class KvReservation:
    """The forecast KV occupancy of the running batch plus this step's admissions.

    ``begin`` starts a step from the running requests' columns (prompt tokens, output
    produced, ``max_tokens``); ``admits(request)`` says whether a candidate still fits with
    the margin; ``add(request)`` counts an admitted one. The running batch's forecast is
    computed when first needed in a step, so a step whose gate is closed for other reasons
    does not pay for it. Before computing it, a candidate is tested against an upper bound
    that needs none: every request at its largest size while it may still run, always
    running, with the largest variance a coin can have (``_bound_fits``); only when that
    bound does not fit is the forecast computed, so the decisions are the forecast's, and a
    step far from a full cache never computes it. ``still_running`` gives the probabilities
    the forecast is made of (``ExpectedOutput.still_running``); ``still_running_row``, the
    same for one candidate (``ExpectedOutput.still_running_row``, which reuses rows across
    candidates; by default ``still_running`` of one request). ``compiled``, when given
    (``compiled_tests``), tests a candidate against the forecast in one compiled loop
    instead of building its ``Occupancy`` in numpy, and sums the bound's sizes in another:
    the same answers.
    """

    def __init__(
        self,
        sigmas: float,
        still_running: StillRunningOf,
        still_running_row: StillRunningRowOf | None = None,
        compiled: CompiledTests | None = None,
    ) -> None:
        self.sigmas = sigmas
        self._still_running = still_running
        self._still_running_row = still_running_row or _row_from(still_running)
        self._compiled = compiled
        self._columns: tuple[IntArray, IntArray, IntArray] = (
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
        )
        self._offsets: IntArray | None = None
        # The grid's spacing and last offset as Python numbers (set with ``_offsets``).
        self._grid_step = 1
        self._grid_last = 0
        self._held_empty: FloatArray | None = None
        self._waiting_horizon = 0
        self._block_size = 1
        self._total_blocks = 0
        self._batch: Occupancy | None = None
        self._last: tuple[int, Occupancy] | None = None
        # Sums of the largest sizes (blocks) and of their squares, batch and admissions.
        self._sizes: tuple[float, float] | None = None
        self._pending: list[Request] = []  # admitted while the forecast was not computed

    def begin(
        self,
        prompts: IntArray,
        produced: IntArray,
        caps: IntArray,
        num_total_blocks: int,
        block_size: int,
        waiting_horizon: int,
    ) -> None:
        """A new step: the running requests' columns, the cache, and the most output tokens
        a waiting request may produce (its ``max_tokens``); the forecast reaches as far as
        any of them."""
        self._columns = (prompts, produced, caps)
        self._waiting_horizon = waiting_horizon
        self._offsets = None
        self._held_empty = None
        self._total_blocks = num_total_blocks
        self._block_size = block_size
        self._batch = None
        self._last = None
        self._sizes = None
        self._pending = []

    @property
    def reserved_blocks(self) -> float:
        """The largest expected occupancy (blocks) over the forecast."""
        return float(np.max(self._occupancy().mean))

    @property
    def margin_blocks(self) -> float:
        """The margin (blocks) where the expected occupancy peaks."""
        batch = self._occupancy()
        peak = int(np.argmax(batch.mean))
        return float(self.sigmas * np.sqrt(batch.variance[peak]))

    def telemetry(self) -> dict[str, float]:
        """``kv_reserved_blocks`` (``reserved_blocks``) and ``kv_margin_blocks``
        (``margin_blocks``) when this step has already computed its forecast (an admission
        test, or a read of either property); empty otherwise, so that reading a policy's
        telemetry every step never pays for a forecast that no admission needed (admissions
        decided by the upper bound alone do not compute it)."""
        if self._batch is None:
            return {}
        return {"kv_reserved_blocks": self.reserved_blocks, "kv_margin_blocks": self.margin_blocks}

    def admits(self, request: Request) -> bool:
        """True if ``request`` admitted now keeps the forecast within the cache."""
        size = self._largest_size(request)
        if self._bound_fits(size, size * size):
            return True
        if self._compiled is None:
            return self._fits(self._of(request))
        batch = self._occupancy()
        prompt, produced = request.num_prompt_tokens, len(request.token_times_s)
        offsets = self._grid()
        row = self._still_running_row(prompt, produced, request.max_tokens, offsets)
        return self._compiled.candidate_fits(
            batch, self._held_by_empty(), row,
            (prompt + produced) / self._block_size, self.sigmas, self._total_blocks,
        )  # fmt: skip

    def admits_any(self, smallest_blocks: float) -> bool:
        """False only when no candidate holding at least ``smallest_blocks`` blocks on
        admission could pass ``admits``."""
        return self._bound_fits(smallest_blocks, 0.0) or self._fits(
            Occupancy.at_start(smallest_blocks, NUM_OFFSETS)
        )

    def add(self, request: Request) -> None:
        """Count ``request`` as admitted this step."""
        size = self._largest_size(request)
        total, squares = self._largest_sizes()
        self._sizes = (total + size, squares + size * size)
        if self._batch is None:
            self._pending.append(request)
            return
        own = self._of(request)
        self._batch = Occupancy(self._batch.mean + own.mean, self._batch.variance + own.variance)

    def _bound_fits(self, size: float, square: float) -> bool:
        """The forecast with a candidate of largest size ``size`` (its square ``square``)
        fits for sure: at every offset, each request holds at most its largest size h_j
        and the variance of a count h_j B_j is at most h_j^2 / 4, so the forecast's bound
        is at most sum h_j + sigmas / 2 sqrt(sum h_j^2). A relative 1e-9 covers rounding."""
        total, squares = self._largest_sizes()
        upper = total + size + 0.5 * self.sigmas * math.sqrt(squares + square)
        return upper * (1.0 + 1e-9) <= self._total_blocks

    def _largest_sizes(self) -> tuple[float, float]:
        if self._sizes is None:
            prompts, produced, caps = self._columns
            if self._compiled is not None:
                self._grid()
                self._sizes = self._compiled.largest_sizes(
                    prompts, produced, caps, self._grid_last, self._grid_step, self._block_size
                )
            else:
                sizes = self._largest(prompts + produced, caps - produced)
                self._sizes = (float(sizes.sum()), float(np.dot(sizes, sizes)))
        return self._sizes

    def _largest_size(self, request: Request) -> float:
        """``_largest`` of one request, in scalars."""
        produced = len(request.token_times_s)
        left = request.max_tokens - produced
        if left <= 0:
            return 0.0
        self._grid()
        tokens = request.num_prompt_tokens + produced
        return (tokens + min(left, self._grid_last) + self._grid_step) / self._block_size + 1.0

    def _largest(self, tokens: IntArray, left: IntArray) -> FloatArray:
        """The most blocks each request (``tokens`` held now, ``left`` to its cap) holds at
        any offset where it may still run (h_k = (tokens + t_k + d) / block_size + 1 with
        t_k < left, t_k within the grid); 0 for one that has reached its cap."""
        self._grid()
        reach = np.minimum(left, self._grid_last)
        sizes: FloatArray = np.where(
            left > 0, (tokens + reach + self._grid_step) / self._block_size + 1.0, 0.0
        )
        return sizes

    def _fits(self, candidate: Occupancy) -> bool:
        batch = self._occupancy()
        bound = batch.mean + candidate.mean
        bound += self.sigmas * np.sqrt(batch.variance + candidate.variance)
        return bool(bound.max() <= self._total_blocks)

    def _of(self, request: Request) -> Occupancy:
        if self._last is not None and self._last[0] == request.request_id:
            return self._last[1]
        offsets = self._grid()
        prompt, produced = request.num_prompt_tokens, len(request.token_times_s)
        row = self._still_running_row(prompt, produced, request.max_tokens, offsets)
        own = Occupancy.one(prompt + produced, row, self._held_by_empty(), self._block_size)
        self._last = (request.request_id, own)
        return own

    def _held_by_empty(self) -> FloatArray:
        if self._held_empty is None:
            self._held_empty = held_by_empty(self._grid(), self._block_size)
        return self._held_empty

    def _occupancy(self) -> Occupancy:
        if self._batch is None:
            offsets = self._grid()
            prompts, produced, caps = self._columns
            running = self._still_running(prompts, produced, caps, offsets)
            batch = Occupancy.of(prompts + produced, running, offsets, self._block_size)
            for request in self._pending:
                own = self._of(request)
                batch = Occupancy(batch.mean + own.mean, batch.variance + own.variance)
            self._pending = []
            self._batch = batch
        return self._batch

    def _grid(self) -> IntArray:
        if self._offsets is None:
            _, produced, caps = self._columns
            horizon = max(self._waiting_horizon, int((caps - produced).max()) if len(caps) else 0)
            offsets = forecast_offsets(max(1, horizon), NUM_OFFSETS)
            self._offsets = offsets
            self._grid_step, self._grid_last = int(offsets[1] - offsets[0]), int(offsets[-1])
        return self._offsets


def _row_from(still_running: StillRunningOf) -> StillRunningRowOf:
    """``still_running`` asked about one request."""

    def row(prompt: int, produced: int, cap: int, offsets: IntArray) -> FloatArray:
        grid = still_running(ints_of(prompt), ints_of(produced), ints_of(cap), offsets)
        only: FloatArray = grid.dense()[0]
        return only

    return row
