"""Block accounting for a paged KV cache (counts only; storage belongs to each engine)."""

from __future__ import annotations

from tokenpace.core.request import Request


class BlockAccountant:
    """Tracks how many fixed-size KV blocks each request holds.

    Blocks are allocated as tokens are computed (``ceil(computed / block_size)`` per request)
    and returned on ``free``. ``allocate`` refuses to exceed capacity.
    """

    def __init__(self, num_total_blocks: int, block_size: int) -> None:
        if num_total_blocks <= 0:
            raise ValueError(f"num_total_blocks must be positive, got {num_total_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_total_blocks = num_total_blocks
        self.block_size = block_size
        self._held: dict[int, int] = {}
        self._num_used = 0

    @property
    def num_used_blocks(self) -> int:
        return self._num_used

    @property
    def num_free_blocks(self) -> int:
        return self.num_total_blocks - self._num_used

    def blocks_held(self, request_id: int) -> int:
        return self._held.get(request_id, 0)

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        target = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, target - self._held.get(request.request_id, 0))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(request, num_new_tokens) <= self.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int) -> None:
        # Inlined num_blocks_needed: this runs for every scheduled request every step.
        held = self._held.get(request.request_id, 0)
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - held
        if needed <= 0:
            return
        if needed > self.num_total_blocks - self._num_used:
            raise MemoryError(
                f"request {request.request_id} needs {needed} blocks, {self.num_free_blocks} free"
            )
        self._held[request.request_id] = held + needed
        self._num_used += needed

    def free(self, request_id: int) -> None:
        self._num_used -= self._held.pop(request_id, 0)


class BlockAccountedEngine:
    """The Engine protocol's block queries, answered from the ``_blocks`` accountant an
    engine sets up in its constructor."""

    _blocks: BlockAccountant
    # The most requests held at once; None: only the blocks bound them.
    _max_running: int | None = None

    @property
    def block_size(self) -> int:
        return self._blocks.block_size

    @property
    def max_running(self) -> int | None:
        return self._max_running

    @property
    def num_total_blocks(self) -> int:
        return self._blocks.num_total_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._blocks.num_free_blocks

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        blocks = self._blocks
        target = -(-(request.num_computed_tokens + num_new_tokens) // blocks.block_size)
        return max(0, target - blocks._held.get(request.request_id, 0))
