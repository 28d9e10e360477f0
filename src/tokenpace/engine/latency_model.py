"""Step latency from a profile: the paper's Eq. 2 plus prefill and mixing costs."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpace.engine.profile import EngineProfile


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """A prefill chunk of ``num_tokens`` tokens whose first token sits at ``context_start``."""

    num_tokens: int
    context_start: int


class LatencyModel:
    """Deterministic step latency in seconds (the simulator multiplies in noise)."""

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile

    def decode_ms(self, batch_size: int) -> float:
        """Eq. 2: l_min up to B0, then alpha per extra request."""
        p = self.profile
        return p.l_min_ms + p.alpha_ms * max(0, batch_size - p.b0)

    def prefill_ms(self, chunk: PrefillChunk) -> float:
        """Linear cost per token plus the attention term over the context before and within
        the chunk (mean context of the chunk's tokens)."""
        p = self.profile
        mean_context = chunk.context_start + (chunk.num_tokens + 1) / 2
        per_token = p.prefill_ms_per_token + p.prefill_attention_ms_per_kctx * mean_context / 1000
        return chunk.num_tokens * per_token

    def step_s(
        self, num_decode: int, prefill_chunks: list[PrefillChunk], decode_context_tokens: int = 0
    ) -> float:
        """A step always pays the weight-read floor (decode_ms of its decode batch, l_min when
        only prefill runs) plus the decode attention term over ``decode_context_tokens`` (the
        summed context of the decoding requests); prefill chunks add their cost, plus the
        mixing overhead when they share the step with decode tokens."""
        if num_decode == 0 and not prefill_chunks:
            return 0.0
        ms = self.decode_ms(num_decode)
        ms += self.profile.decode_attention_ms_per_kctx * decode_context_tokens / 1000
        if prefill_chunks:
            ms += sum(self.prefill_ms(c) for c in prefill_chunks)
            if num_decode > 0:
                ms += self.profile.mixed_prefill_overhead_ms
        return ms / 1000.0
