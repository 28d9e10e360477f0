"""The simulated engine: step latency from a profile, KV cache as block counts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenpace.core.step import ScheduledChunk, StepResult
from tokenpace.engine.kv_blocks import BlockAccountant, BlockAccountedEngine
from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import EngineProfile

SIM_TOKEN_ID = 0
_MIN_NOISE_FACTOR = 0.2


class SimEngine(BlockAccountedEngine):
    """Implements the Engine protocol in virtual time.

    A chunk is a decode token when its request already has output and only the newest token
    is uncomputed; anything else is prefill (including recompute after preemption). Latency
    is the profile's model times ``max(0.2, 1 + noise_cv * N(0, 1))`` drawn from ``rng``.
    The simulator never ends a request early: it stops at ``max_tokens``.
    """

    def __init__(self, profile: EngineProfile, rng: np.random.Generator) -> None:
        self.profile = profile
        self._latency = LatencyModel(profile)
        self._rng = rng
        self._blocks = BlockAccountant(profile.num_gpu_blocks, profile.block_size)

    def execute(self, chunks: Sequence[ScheduledChunk]) -> StepResult:
        num_decode = 0
        decode_context = 0
        prefill: list[PrefillChunk] = []
        sampled: dict[int, int] = {}
        for chunk in chunks:
            request = chunk.request
            if chunk.num_tokens <= 0 or chunk.num_tokens > request.num_uncomputed_tokens:
                raise ValueError(
                    f"request {request.request_id}: cannot compute {chunk.num_tokens} tokens "
                    f"({request.num_uncomputed_tokens} uncomputed)"
                )
            self._blocks.allocate(request, chunk.num_tokens)
            if request.is_prefilling:
                prefill.append(PrefillChunk(chunk.num_tokens, request.num_computed_tokens))
            else:
                num_decode += 1
                decode_context += request.num_computed_tokens
            request.num_computed_tokens += chunk.num_tokens
            if request.num_computed_tokens == request.num_tokens:
                sampled[request.request_id] = SIM_TOKEN_ID
        latency = self._latency.step_s(num_decode, prefill, decode_context)
        if self.profile.noise_cv > 0 and latency > 0:
            factor = 1.0 + self.profile.noise_cv * float(self._rng.standard_normal())
            latency *= max(_MIN_NOISE_FACTOR, factor)
        return StepResult(
            latency_s=latency,
            sampled_token_ids=sampled,
            stopped_ids=frozenset(),
            num_prefill_tokens=sum(c.num_tokens for c in prefill),
            num_decode_tokens=num_decode,
            num_used_blocks=self._blocks.num_used_blocks,
            num_total_blocks=self._blocks.num_total_blocks,
        )

    def free(self, request_id: int) -> None:
        self._blocks.free(request_id)
