"""The step-level engine interface every engine implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenpace.core.request import Request
from tokenpace.core.step import ScheduledChunk, StepResult


class Engine(Protocol):
    """Runs steps and owns the KV cache.

    Contract: the caller only executes chunks whose blocks fit (it checks
    ``num_blocks_needed`` against ``num_free_blocks`` and preempts otherwise), calls
    ``free`` exactly once for every request that leaves the engine (finished, aborted or
    preempted), and never schedules a request for more tokens than it has uncomputed.
    """

    @property
    def block_size(self) -> int: ...

    @property
    def num_total_blocks(self) -> int: ...

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def max_running(self) -> int | None:
        """The most requests the engine holds at once (None: only KV blocks bound them)."""
        ...

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Additional blocks ``request`` needs to compute ``num_new_tokens`` more tokens."""
        ...

    def execute(self, chunks: Sequence[ScheduledChunk]) -> StepResult:
        """Run one step: compute each chunk, sample a token for every request whose tokens
        are now all computed, and report the step latency and KV usage."""
        ...

    def free(self, request_id: int) -> None:
        """Release every block held by ``request_id`` (no-op if it holds none)."""
        ...
