"""The simulated engine: step latency from a profile, KV cache as block counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tokenpace.core.step import ScheduledChunk, StepResult
from tokenpace.engine.kv_blocks import BlockAccountant, BlockAccountedEngine
from tokenpace.engine.latency_model import LatencyModel, StepShape
from tokenpace.engine.profile import EngineProfile

SIM_TOKEN_ID = 0
_MIN_NOISE_FACTOR = 0.2


class SimEngine(BlockAccountedEngine):
    """Implements the Engine protocol in virtual time.

    A chunk is a decode token when its request already has output and only the newest token
    is uncomputed; anything else is prefill (including recompute after preemption). Latency
    is the profile's model times ``max(0.2, 1 + noise_cv * N(0, 1))`` drawn from ``rng``.

    ``output_lengths`` (request id -> tokens) plays the model's end of sequence: a request
    listed there is reported in ``stopped_ids`` by the step that samples its last token.
    The mapping may grow while the engine runs (a pool adds arrivals); a request missing
    from it runs to its ``max_tokens``. The engine is the only reader: policies never see it.
    """

    def __init__(
        self,
        profile: EngineProfile,
        rng: np.random.Generator,
        output_lengths: Mapping[int, int] | None = None,
        max_running: int | None = None,
    ) -> None:
        if max_running is not None and max_running < 1:
            raise ValueError(f"max_running must be positive, got {max_running}")
        self.profile = profile
        self._max_running = max_running
        self._latency = LatencyModel(profile)
        self._rng = rng
        self._blocks = BlockAccountant(profile.num_gpu_blocks, profile.block_size)
        self._output_lengths: Mapping[int, int] = {} if output_lengths is None else output_lengths

    def execute(self, chunks: Sequence[ScheduledChunk]) -> StepResult:
        shape = StepShape.of(chunks)  # before the requests' computed tokens advance
        sampled: dict[int, int] = {}
        stopped: set[int] = set()
        lengths = self._output_lengths
        for chunk in chunks:
            request = chunk.request
            num_output = len(request.token_times_s)
            num_tokens = request.num_prompt_tokens + num_output
            computed = request.num_computed_tokens
            uncomputed = num_tokens - computed
            if chunk.num_tokens <= 0 or chunk.num_tokens > uncomputed:
                raise ValueError(
                    f"request {request.request_id}: cannot compute {chunk.num_tokens} tokens "
                    f"({uncomputed} uncomputed)"
                )
            self._blocks.allocate(request, chunk.num_tokens)
            request.num_computed_tokens = computed + chunk.num_tokens
            if computed + chunk.num_tokens == num_tokens:
                sampled[request.request_id] = SIM_TOKEN_ID
                if num_output + 1 >= lengths.get(request.request_id, request.max_tokens):
                    stopped.add(request.request_id)
        latency = self._latency.shape_s(shape)
        if self.profile.noise_cv > 0 and latency > 0:
            factor = 1.0 + self.profile.noise_cv * float(self._rng.standard_normal())
            latency *= max(_MIN_NOISE_FACTOR, factor)
        return StepResult(
            latency_s=latency,
            sampled_token_ids=sampled,
            stopped_ids=frozenset(stopped),
            num_prefill_tokens=shape.num_prefill_tokens,
            num_decode_tokens=len(shape.decode_contexts),
            num_used_blocks=self._blocks.num_used_blocks,
            num_total_blocks=self._blocks.num_total_blocks,
        )

    def free(self, request_id: int) -> None:
        self._blocks.free(request_id)
