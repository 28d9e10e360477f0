"""KV-aware admission against the batch's predicted footprint, so that KV pressure is met by
waiting, not by preempting and recomputing.

Every running request holds its prompt and output so far, grows by one token a step until
it has produced its expected remaining output (``tokenpace.policy.output_length``), then
frees everything. The batch's predicted peak is therefore not the sum of the final sizes:
with the requests ordered by expected remaining output r_1 <= ... <= r_n, the ones still
running just before the k-th finishes hold sum_{j >= k} (current_j + r_k) tokens, and the
peak is the largest of these n sums (each request also counted with one partly filled
block). A candidate is admitted only if that peak plus the candidate's own predicted final
size (an upper bound on what it adds to any later instant), plus a safety margin, fits in
the KV cache. The margin covers the estimate's error: with e the spread of a
finished request's output beyond its prediction (``ErrorStats.spread``), for n requests with
independent errors ``sigmas`` x e x sqrt(n) tokens. While the batch's true lengths stay
within the margin, no running request is ever preempted. Forced (starving) admissions wait
for the reservation too: a starving request goes first, but not at a running one's expense.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

# Per-request token counts: integer columns from the step loop, or floats.
TokenCounts = npt.NDArray[np.int64] | npt.NDArray[np.float64]


class KvReservation:
    """The predicted KV footprint (blocks) of the running batch plus this step's admissions.

    ``begin`` starts a step from the running requests' current sizes and expected remaining
    outputs (tokens); ``admits(blocks)`` says whether a candidate of that predicted final
    size still fits; ``add`` counts an admitted one. The batch's peak is computed when first
    needed in a step (an admission test or ``reserved_blocks``), so a step whose gate is
    closed for other reasons does not pay for it.
    """

    def __init__(self, sigmas: float) -> None:
        self.sigmas = sigmas
        self.margin_blocks = 0.0
        self._peak: int | None = 0
        self._current: TokenCounts = np.zeros(0)
        self._remaining: TokenCounts = np.zeros(0)
        self._added_blocks = 0
        self._num_requests = 0
        self._total_blocks = 0
        self._block_size = 1
        self._error_tokens = 0.0

    def begin(
        self,
        current_tokens: TokenCounts,
        remaining_tokens: TokenCounts,
        error_tokens: float,
        num_total_blocks: int,
        block_size: int,
    ) -> None:
        """``current_tokens``: each running request's prompt + output so far;
        ``remaining_tokens``: its expected remaining output; ``error_tokens``: the spread of
        one request's output beyond its prediction."""
        self._current, self._remaining = current_tokens, remaining_tokens
        self._peak = None
        self._added_blocks = 0
        self._num_requests = len(current_tokens)
        self._total_blocks = num_total_blocks
        self._block_size = block_size
        self._error_tokens = error_tokens
        self.margin_blocks = self._margin(self._num_requests)

    @property
    def reserved_blocks(self) -> int:
        """The running batch's predicted peak plus this step's admissions (blocks)."""
        if self._peak is None:
            self._peak = peak_blocks(self._current, self._remaining, self._block_size)
        return self._peak + self._added_blocks

    def blocks(self, final_tokens: float) -> int:
        return math.ceil(final_tokens / self._block_size)

    def admits(self, blocks: int) -> bool:
        """True if a candidate predicted to need ``blocks`` fits with the margin of a batch
        one request larger."""
        margin = self._margin(self._num_requests + 1)
        return self.reserved_blocks + blocks + margin <= self._total_blocks

    def add(self, blocks: int) -> None:
        self._added_blocks += blocks
        self._num_requests += 1
        self.margin_blocks = self._margin(self._num_requests)

    def _margin(self, num_requests: int) -> float:
        return self.sigmas * self._error_tokens * math.sqrt(num_requests) / self._block_size


def peak_blocks(current_tokens: TokenCounts, remaining_tokens: TokenCounts, block_size: int) -> int:
    """The most blocks requests of these current sizes will hold at once while each grows
    by its remaining tokens and then frees its blocks (see the module doc); 0 for none."""
    if not len(current_tokens):
        return 0
    order = np.argsort(remaining_tokens, kind="stable")
    remaining = np.asarray(remaining_tokens, dtype=np.float64)[order]
    current = np.asarray(current_tokens, dtype=np.float64)[order]
    still_running = np.arange(len(current), 0, -1)
    held_before = np.cumsum(current[::-1])[::-1]
    peak_tokens = held_before + still_running * remaining
    return math.ceil(float(np.max(peak_tokens / block_size + still_running)))
