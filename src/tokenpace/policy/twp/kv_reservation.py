"""KV-aware admission against the batch's predicted footprint, so that KV pressure is met by
waiting, not by preempting and recomputing.

Every running request will hold, when it finishes, prompt + output tokens. With the output
length estimated (``tokenpace.policy.output_length``), the batch's predicted peak is the sum
of those footprints in blocks (a bound: requests that finish early free their blocks for the
rest). A candidate is admitted only if the predicted peak with it, plus a safety margin,
fits in the KV cache. The margin covers the estimate's error: with e the spread of a
finished request's output beyond its prediction (``ErrorStats.spread``), for n requests with
independent errors ``sigmas`` x e x sqrt(n) tokens. While the batch's true lengths stay
within the margin, no running request is ever preempted. Forced (starving) admissions wait
for the reservation too: a starving request goes first, but not at a running one's expense.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt


class KvReservation:
    """The predicted KV footprint (blocks) of the running batch plus this step's admissions.

    ``begin`` starts a step from the running requests' predicted final sizes (tokens);
    ``admits(blocks)`` says whether a candidate of that predicted size still fits; ``add``
    counts an admitted one.
    """

    def __init__(self, sigmas: float) -> None:
        self.sigmas = sigmas
        self.reserved_blocks = 0
        self.margin_blocks = 0.0
        self._num_requests = 0
        self._total_blocks = 0
        self._block_size = 1
        self._error_tokens = 0.0

    def begin(
        self,
        final_tokens: npt.NDArray[np.float64],
        error_tokens: float,
        num_total_blocks: int,
        block_size: int,
    ) -> None:
        """``final_tokens``: each running request's predicted prompt + output (tokens);
        ``error_tokens``: the spread of one request's output beyond its prediction."""
        self.reserved_blocks = int(np.ceil(final_tokens / block_size).sum())
        self._num_requests = len(final_tokens)
        self._total_blocks = num_total_blocks
        self._block_size = block_size
        self._error_tokens = error_tokens
        self.margin_blocks = self._margin(self._num_requests)

    def blocks(self, final_tokens: float) -> int:
        return math.ceil(final_tokens / self._block_size)

    def admits(self, blocks: int) -> bool:
        """True if a candidate predicted to need ``blocks`` fits with the margin of a batch
        one request larger."""
        margin = self._margin(self._num_requests + 1)
        return self.reserved_blocks + blocks + margin <= self._total_blocks

    def add(self, blocks: int) -> None:
        self.reserved_blocks += blocks
        self._num_requests += 1
        self.margin_blocks = self._margin(self._num_requests)

    def _margin(self, num_requests: int) -> float:
        return self.sigmas * self._error_tokens * math.sqrt(num_requests) / self._block_size
